"""The embedded offline model: ``model: embedded`` in a config.

A fresh machine with no network still gets a model that half-works on the quickstart team.
The recipe, deterministic for a seed:

1. A scripted *teacher* plays the quickstart team (orchestrator + adder + subtractor) on
   synthetic arithmetic through the real engine and orchestrator topology, so the warm-start
   transcripts have exactly the message format training will use.  The teacher's
   orchestrator either delegates each step (``CALL adder: 3+4`` ... ``ANSWER: 5``) or, with
   probability ``p_direct``, answers at once.  Both are correct; answering at once is just
   much harder for a tiny model to get right.  The mix is deliberate and documented: the warm
   start leaves the choice of strategy open, and RL has to find out that delegating to the
   specialists pays (the credit methods see who earned the reward).
2. A byte-level BPE tokenizer (digits split) is trained on those transcripts, with a compact
   chat template.
3. A small random ``Qwen2ForCausalLM`` is fine-tuned on the assistant turns for a fixed
   number of AdamW steps (loss on completion tokens only).
4. Model and tokenizer are saved in Hugging Face format under the cache directory
   (``$MAS_CACHE_DIR`` or ``~/.cache/mas``), keyed by a hash of the recipe, and loaded from
   there afterwards.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from mas.agents.agent import Agent
from mas.agents.prompts import render_prompt
from mas.backends.base import GenRequest
from mas.backends.scripted import ScriptedBackend
from mas.config import OrchestratorTopology, SamplingConfig
from mas.agents.parsers import PARSERS

# The role prompts the embedded model was warm-started on.  configs/quickstart.yaml uses these
# exact strings (a test checks it); other roles work too, but the model has never seen them.
ROLES = {
    "orchestrator": "You are the orchestrator. Use CALL adder: a+b or CALL subtractor: a-b, then ANSWER: n.",
    "adder": "You are the adder.",
    "subtractor": "You are the subtractor.",
}
PARSER_OF = {"orchestrator": "orchestrator", "adder": "answer", "subtractor": "answer"}
SPECIALIST_FOR = {"+": "adder", "-": "subtractor"}


@dataclass(frozen=True)
class Recipe:
    version: int = 2  # bump when the recipe code changes, so stale caches are not reused
    seed: int = 0
    tasks: int = 2000  # teacher episodes
    p_direct: float = 0.6  # teacher answers at once instead of delegating
    num_ops: int = 2
    max_operand: int = 9
    vocab_size: int = 384
    hidden_size: int = 96
    num_layers: int = 2
    num_heads: int = 4
    steps: int = 2000
    batch_size: int = 32
    lr: float = 3e-3

    def key(self) -> str:
        return hashlib.sha256(json.dumps(asdict(self), sort_keys=True).encode()).hexdigest()[:12]


def cache_dir() -> Path:
    return Path(os.environ.get("MAS_CACHE_DIR") or Path.home() / ".cache" / "mas")


# ---------------------------------------------------------------------------------------------
# the teacher
# ---------------------------------------------------------------------------------------------


def _compute(a: int, op: str, b: int) -> int:
    return a + b if op == "+" else a - b


class Teacher:
    """The scripted quickstart team: maps a request (agent + messages) to the ideal reply."""

    def __init__(self, p_direct: float, seed: int):
        self.p_direct = p_direct
        self.rng = random.Random(seed)

    def __call__(self, req: GenRequest) -> str:
        messages = req.messages or []
        if req.agent != "orchestrator":
            return f"ANSWER: {_parse_chain(messages[-1]['content'])[0][3]}"
        steps = _parse_chain(messages[1]["content"].removeprefix("Task: "))
        done = sum(1 for m in messages if m["role"] == "assistant")
        if done == 0 and self.rng.random() < self.p_direct:
            return f"ANSWER: {steps[-1][3]}"
        if done == len(steps):
            return f"ANSWER: {steps[-1][3]}"
        a, op, b, _ = steps[done]
        return f"CALL {SPECIALIST_FOR[op]}: {a}{op}{b}"


def _parse_chain(expr: str) -> list[tuple[int, str, int, int]]:
    """'3+4-2' -> [(3,'+',4,7), (7,'-',2,5)]; also handles a leading minus ('-3+4')."""
    nums, ops, cur = [], [], ""
    for i, ch in enumerate(expr):
        if ch in "+-" and cur not in ("", "-"):
            nums.append(int(cur))
            ops.append(ch)
            cur = ""
        else:
            cur += ch
    nums.append(int(cur))
    steps, acc = [], nums[0]
    for op, b in zip(ops, nums[1:]):
        r = _compute(acc, op, b)
        steps.append((acc, op, b, r))
        acc = r
    return steps


def teacher_transcripts(recipe: Recipe, tokenizer) -> list[tuple[list[dict[str, str]], str]]:
    """(messages, completion text) for every turn of the teacher's episodes."""
    from mas.engine import Engine
    from mas.envs.math.synthetic import SyntheticMathConfig, SyntheticMathEnv
    from mas.topologies import build_topology

    env = SyntheticMathEnv(SyntheticMathConfig(name="synthetic_math", num_ops=recipe.num_ops,
                                            max_operand=recipe.max_operand, seed=recipe.seed))
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=16)
    agents = {n: Agent(n, "teacher", role, sampling, PARSERS[PARSER_OF[n]]) for n, role in ROLES.items()}
    topo = build_topology(OrchestratorTopology(kind="orchestrator", orchestrator="orchestrator",
                                               specialists=("adder", "subtractor"), max_turns=2 * recipe.num_ops + 2))
    engine = Engine(topo, agents, {"teacher": tokenizer}, {"teacher": False},
                    ScriptedBackend(Teacher(recipe.p_direct, recipe.seed), {"teacher": tokenizer}), env.score)
    groups = engine.rollout(env.sample_tasks(recipe.tasks), group_size=1, seed=recipe.seed)
    episodes = [g.episodes[0] for g in groups]
    bad = [ep for ep in episodes if ep.reward != 1.0]
    if bad:
        raise RuntimeError(f"teacher failed on {len(bad)} tasks, e.g. {bad[0].task.prompt}: {bad[0].error or bad[0].answer}")
    return [(t.messages, t.text) for ep in episodes for t in ep.turns]


# ---------------------------------------------------------------------------------------------
# build, warm start, cache
# ---------------------------------------------------------------------------------------------


def build_embedded(recipe: Recipe, out: Path, log=print) -> None:
    from mas.tiny import TINY_CHAT_TEMPLATE, tiny_causal_lm, train_tokenizer

    t0 = time.perf_counter()
    torch.manual_seed(recipe.seed)
    provisional = train_tokenizer([" ".join(ROLES.values())], vocab_size=300)
    turns = teacher_transcripts(recipe, provisional)
    corpus = [provisional.apply_chat_template(m + [{"role": "assistant", "content": c}], tokenize=False) for m, c in turns]
    tok = train_tokenizer(corpus, vocab_size=recipe.vocab_size)
    out.parent.mkdir(parents=True, exist_ok=True)
    assert tok.chat_template == TINY_CHAT_TEMPLATE
    model = tiny_causal_lm(tok, hidden_size=recipe.hidden_size, num_layers=recipe.num_layers,
                           num_heads=recipe.num_heads, seed=recipe.seed)
    examples = [(render_prompt(tok, m), tok.encode(c, add_special_tokens=False) + [tok.eos_token_id]) for m, c in turns]
    log(f"embedded model: {len(examples)} teacher turns, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params; warm start...")
    _warm_start(model, examples, recipe, pad_id=tok.pad_token_id)
    model.eval()
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))  # unique: concurrent first runs
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    (tmp / "recipe.json").write_text(json.dumps(asdict(recipe), indent=2))
    try:
        os.replace(tmp, out)
    except OSError:  # another process finished the same (deterministic) build first
        if not (out / "recipe.json").exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"embedded model ready in {time.perf_counter() - t0:.0f}s: {out}")


def _warm_start(model, examples: list[tuple[list[int], list[int]]], recipe: Recipe, pad_id: int) -> None:
    from mas.tiny import sft_batch

    gen = torch.Generator().manual_seed(recipe.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / recipe.steps)
    )
    model.train()
    for _ in range(recipe.steps):
        idx = torch.randint(len(examples), (recipe.batch_size,), generator=gen).tolist()
        loss = model(**sft_batch([examples[i] for i in idx], pad_id)).loss
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()


def embedded_path(recipe: Recipe | None = None, log=print) -> Path:
    """Directory of the embedded model for ``recipe``, building it on first use."""
    recipe = recipe or Recipe()
    path = cache_dir() / "embedded" / recipe.key()
    if not (path / "recipe.json").exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        build_embedded(recipe, path, log=log)
    return path


def load_embedded(recipe: Recipe | None = None):
    """(model, tokenizer) of the embedded model, building and caching it on first use."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = embedded_path(recipe)
    tok = AutoTokenizer.from_pretrained(path)
    tok.padding_side = "left"
    return AutoModelForCausalLM.from_pretrained(path), tok

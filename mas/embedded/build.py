"""Build the embedded model: teacher transcripts -> tokenizer -> warm start -> cache.

1. Every format of the recipe (``formats.py``) runs its scripted teacher through the real
   engine and topology on the format's env, so the transcripts have exactly the messages
   training will produce.
2. A byte-level BPE tokenizer (digits split) is trained on those transcripts, with a compact
   chat template.
3. A small random ``Qwen2ForCausalLM`` is fine-tuned on all formats' assistant turns, pooled,
   for a fixed number of AdamW steps (loss on completion tokens only; batches drawn from
   length-sorted pools, so little of each batch is padding).
   A recipe with a second stage (``Recipe.extend``) starts instead from its base recipe's
   finished model and tokenizer (shipped, cached or built first), and trains it further on
   the base pool plus the added formats' turns.  A research stage (``Recipe.research``) starts
   from the two-stage model the same way and trains on long episodes, each agent's invocation
   one sequence, with the pool replayed beside them, at raised positions.
   Each stage's steps show as a progress bar on stderr (steps, loss, time left) unless the
   caller passes ``progress=False``.
4. Model and tokenizer are saved in Hugging Face format with a manifest (the recipe key and
   every file's sha256; ``artifact.py``): into the cache (``$MAS_CACHE_DIR`` or
   ``~/.cache/mas``) when a run needs a model that was not shipped (``ensure_embedded``), or
   into the shipped artifact (``mas build-embedded --ship``), which a fresh clone uses at once.
"""

from __future__ import annotations

import hashlib
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from mas.agents.agent import Agent
from mas.agents.parsers import PARSERS
from mas.agents.prompts import render_prompt
from mas.rollout.backends.scripted import ScriptedBackend
from mas.config.schema import SamplingConfig

from .artifact import (ARTIFACT_DIR, EmbeddedUnavailable, MANIFEST, cache_folder, embedded_path, load_tokenizer, problem,
                       write_manifest)
from .formats import FORMATS, Format
from .recipe import Recipe

# ---------------------------------------------------------------------------------------------
# teacher transcripts
# ---------------------------------------------------------------------------------------------


Transcript = list[tuple[list[dict[str, str]], str]]  # (messages, completion text) per turn
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def format_transcripts(fmt: Format, episodes: int, seed: int, tokenizer) -> tuple[Transcript, float]:
    """Every turn of ``episodes`` teacher episodes of ``fmt`` (split over its topology variants
    and its worlds), and the teacher's mean reward; raises if the teacher does worse than it should."""
    from mas.rollout.engine import Engine
    from mas.envs import build_env
    from mas.topologies import build_topology

    stream = int(hashlib.sha256(f"{seed}/{fmt.name}".encode()).hexdigest()[:8], 16)  # own tasks per format
    sampling = SamplingConfig(temperature=1.0, max_new_tokens=64)
    agents = {n: Agent(n, "teacher", a.role, sampling, PARSERS[a.parser], tools=a.tools, max_tool_calls=a.max_tool_calls)
              for n, a in fmt.agents.items()}
    turns: Transcript = []
    rewards: list[float] = []
    plays = [(v, topology, w, env_cfg) for v, topology in enumerate(fmt.topologies) for w, env_cfg in enumerate(fmt.envs)]
    for i, (v, topology, w, env_cfg) in enumerate(plays):
        n = episodes // len(plays) + (1 if i < episodes % len(plays) else 0)
        env = build_env(env_cfg.model_copy(update={"seed": stream + w}))
        rng = random.Random(f"{seed}/{fmt.name}/{v}" + (f"/{w}" if fmt.worlds else ""))
        backend = ScriptedBackend(lambda req, rng=rng: fmt.teacher(req, rng), {"teacher": tokenizer})
        engine = Engine(build_topology(topology), agents, {"teacher": tokenizer}, {"teacher": False}, backend, env.score,
                        tools=getattr(env, "tools", None))
        try:
            groups = engine.rollout(env.sample_tasks(n), group_size=1, seed=seed)
        finally:
            engine.close()
        for group in groups:
            ep = group.episodes[0]
            if ep.status != "ok":
                raise RuntimeError(f"format {fmt.name!r}: the teacher's episode on {ep.task.prompt!r} ended "
                                   f"{ep.status}: {ep.error or [t.text for t in ep.turns]}")
            rewards.append(ep.reward)
            turns += [(t.messages, t.text) for t in ep.turns if fmt.train_agents is None or t.agent in fmt.train_agents]
    mean = sum(rewards) / max(len(rewards), 1)
    if rewards and mean < fmt.min_teacher_reward:
        raise RuntimeError(f"format {fmt.name!r}: the teacher's mean reward {mean:.3f} is below {fmt.min_teacher_reward}")
    return turns, mean


def teacher_transcripts(recipe: Recipe, tokenizer, log=print, mix: tuple[tuple[str, int], ...] | None = None) -> Transcript:
    """The pooled turns of every format of ``recipe`` (or of ``mix``)."""
    turns: Transcript = []
    for name, episodes in recipe.formats if mix is None else mix:
        got, reward = format_transcripts(FORMATS[name], episodes, recipe.seed, tokenizer)
        log(f"  {name}: {episodes} teacher episodes, {len(got)} turns, teacher reward {reward:.2f}")
        turns += got
    return turns


# ---------------------------------------------------------------------------------------------
# build, warm start, cache
# ---------------------------------------------------------------------------------------------


def build_embedded(recipe: Recipe, out: Path, log=print, progress: bool = True) -> None:
    """The recipe's last stage (the warm start, its second stage, or a research stage, each from
    the one before it) saved to ``out``; ``progress``: a bar on stderr for each stage's steps."""
    t0 = time.perf_counter()
    if recipe.research:
        model, base = _research_stage(recipe, log, progress)
    elif recipe.extend:
        model, base = _second_stage(recipe, log, progress)
    else:
        model, tok = _first_stage(recipe, log, progress)
    model.eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=out.name + ".", dir=out.parent))  # unique: concurrent first runs
    model.save_pretrained(tmp)
    if recipe.research or recipe.extend:  # the base's tokenizer files byte for byte (saving a loaded one adds loader settings)
        for name in TOKENIZER_FILES:
            shutil.copyfile(base / name, tmp / name)
    else:
        tok.save_pretrained(tmp)
    write_manifest(tmp, recipe, {"torch": torch.__version__, "transformers": _version("transformers")})
    try:
        os.replace(tmp, out)
    except OSError:  # another process finished the same (deterministic) build first
        if not (out / MANIFEST).exists():
            raise
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"embedded model ready in {time.perf_counter() - t0:.0f}s: {out}")


def _provisional_turns(recipe: Recipe, log=print, mix: tuple[tuple[str, int], ...] | None = None) -> tuple[Transcript, Any]:
    """Every format's teacher turns (``recipe.formats``, or ``mix``), rendered with a tokenizer of
    the role prompts alone (the model's own tokenizer is trained on these turns, so it cannot
    exist yet)."""
    from mas.models.tiny import train_tokenizer

    mix = recipe.formats if mix is None else mix
    roles = [a.role for name, _ in recipe.formats for a in FORMATS[name].agents.values()]  # the warm start's, whatever the mix
    provisional = train_tokenizer([" ".join(roles)], vocab_size=300)
    log(f"embedded model: teacher transcripts of {len(mix)} formats...")
    return teacher_transcripts(recipe, provisional, log=log, mix=mix), provisional


def _examples(tok, turns: Transcript) -> list[tuple[list[int], list[int]]]:
    return [(render_prompt(tok, m), tok.encode(c, add_special_tokens=False) + [tok.eos_token_id]) for m, c in turns]


def _first_stage(recipe: Recipe, log=print, progress: bool = True):
    """Teacher transcripts -> tokenizer -> a new model warm-started on them."""
    from mas.models.tiny import TINY_CHAT_TEMPLATE, tiny_causal_lm, train_tokenizer

    torch.manual_seed(recipe.seed)
    turns, provisional = _provisional_turns(recipe, log)
    corpus = [provisional.apply_chat_template(m + [{"role": "assistant", "content": c}], tokenize=False) for m, c in turns]
    tok = train_tokenizer(corpus, vocab_size=recipe.vocab_size)
    assert tok.chat_template == TINY_CHAT_TEMPLATE
    model = tiny_causal_lm(tok, hidden_size=recipe.hidden_size, num_layers=recipe.num_layers,
                           num_heads=recipe.num_heads, seed=recipe.seed)
    examples = _examples(tok, turns)
    log(f"embedded model: {len(examples)} teacher turns, {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params; "
        f"warm start ({recipe.steps} steps)...")
    _fit(model, [(_rows(examples), recipe.batch_size, None)], recipe.steps, recipe.lr, recipe.seed, pad_id=tok.pad_token_id,
         log=log, stage="warm start", progress=progress)
    return model, tok


def _base_model(recipe: Recipe, log=print, progress: bool = True) -> tuple[Any, Any, Path]:
    """The finished model of the recipe this one's last stage starts from (shipped, cached or
    built now), its tokenizer and its folder; torch seeded for the stage."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    base = ensure_embedded(recipe.base(), log=log, progress=progress)
    hf_logging.disable_progress_bar()  # a 26-tensor model needs no loading bar
    tok = load_tokenizer(base)
    model = AutoModelForCausalLM.from_pretrained(base)
    torch.manual_seed(recipe.seed)
    return model, tok, base


def _second_stage(recipe: Recipe, log=print, progress: bool = True) -> tuple[Any, Path]:
    """The base recipe's finished model (shipped, cached or built now), trained ``extend_steps``
    more on the base pool plus the ``extend`` formats' turns with the base's tokenizer; and the
    base's folder."""
    model, tok, base = _base_model(recipe, log, progress)
    turns, _ = _provisional_turns(replace(recipe, formats=(*recipe.formats, *recipe.extend), extend=()), log)
    examples = _examples(tok, turns)
    log(f"embedded model: second stage from {base.name}, {len(examples)} teacher turns ({recipe.extend_steps} steps)...")
    _fit(model, [(_rows(examples), recipe.batch_size, None)], recipe.extend_steps, recipe.extend_lr, recipe.seed,
         pad_id=tok.pad_token_id, log=log, stage="second stage", progress=progress)
    return model, base


def _batches(lengths: list[int], batch_size: int, gen: torch.Generator, pool: int = 50):
    """Index batches forever: shuffle, sort pools of ``pool`` batches by length, cut into
    batches, shuffle the batches (so each batch holds turns of similar length)."""
    while True:
        order = torch.randperm(len(lengths), generator=gen).tolist()
        batches = []
        for start in range(0, len(order), pool * batch_size):
            chunk = sorted(order[start:start + pool * batch_size], key=lambda i: lengths[i])
            batches += [chunk[i:i + batch_size] for i in range(0, len(chunk), batch_size)]
        for b in torch.randperm(len(batches), generator=gen).tolist():
            yield batches[b]


def _research_stage(recipe: Recipe, log=print, progress: bool = True) -> tuple[Any, Path]:
    """The model this stage starts from (``recipe.base()``, the two-stage model; shipped, cached
    or built now), trained ``research_steps`` more on the ``research`` formats' episodes, each
    agent invocation one sequence (``_sequences``) at its own length, and on their first turns
    alone; its positions raised to ``recipe.positions``.  And the base's folder.

    The earlier stages' pool is replayed beside them by distillation from the base model itself
    (learning without forgetting, arXiv:1606.09282): the model is held to the base's own
    next-token distributions on those turns.  Replaying the turns' labels instead trained the
    pool further, which raised every arithmetic config's start (the quickstart's 0.290 -> 0.405,
    greedy) and cut what RL had left to gain (docs/benchmarks/research_stage.md)."""
    from transformers import AutoModelForCausalLM

    model, tok, base = _base_model(recipe, log, progress)
    model.config.max_position_embeddings = recipe.positions
    pool, _ = _provisional_turns(replace(recipe, formats=(*recipe.formats, *recipe.extend), extend=(), research=()), log)
    research, _ = _provisional_turns(recipe, log, mix=recipe.research)
    examples = _examples(tok, research)
    rows = _sequences(examples)
    firsts = [ex for ex, follows in zip(examples, _continues(examples)) if not follows]  # each invocation's first turn
    longest = max(len(ids) for ids, _ in rows)
    if longest > recipe.positions:
        raise RuntimeError(f"a research sequence of {longest} tokens is longer than the recipe's {recipe.positions} positions")
    log(f"embedded model: research stage from {base.name}, {len(rows)} invocations of {len(research)} turns (longest "
        f"{longest} tokens) beside {len(pool)} pool turns ({recipe.research_steps} steps)...")
    frozen = AutoModelForCausalLM.from_pretrained(base).eval().requires_grad_(False)  # the base, to distil the pool from
    streams = [(rows, recipe.research_batch_size, None), (_rows(firsts), recipe.research_first_turns, None),
               (_rows(_examples(tok, pool)), recipe.batch_size, frozen)]
    _fit(model, [s for s in streams if s[1] > 0], recipe.research_steps, recipe.research_lr, recipe.seed,
         pad_id=tok.pad_token_id, log=log, stage="research stage", progress=progress)
    return model, base


def _rows(examples: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[int]]]:
    """(prompt, completion) examples as (ids, labels) rows, the loss on the completion."""
    return [(p + c, [-100] * len(p) + c) for p, c in examples]


def _continues(examples: list[tuple[list[int], list[int]]]) -> list[bool]:
    """Per example: whether it continues the invocation of the example before it, i.e. its prompt
    starts with all of that invocation so far (a tool round: the call, then its results)."""
    out, so_far = [], []
    for p, c in examples:
        follows = bool(so_far) and len(p) > len(so_far) and p[: len(so_far)] == so_far
        so_far = p + c
        out.append(follows)
    return out


def _sequences(examples: list[tuple[list[int], list[int]]]) -> list[tuple[list[int], list[int]]]:
    """Consecutive turns of one invocation as one (ids, labels) row, the loss on each completion:
    a turn that continues the one before it (``_continues``) extends that row; any other turn
    starts a new one.  Each turn's tokens are then scored once, with exactly the context its own
    example gives it."""
    rows: list[tuple[list[int], list[int]]] = []
    for (p, c), follows in zip(examples, _continues(examples)):
        if follows:
            ids, labels = rows[-1]
            new = p[len(ids):]
            rows[-1] = (ids + new + c, labels + [-100] * len(new) + c)
        else:
            rows.append((p + c, [-100] * len(p) + c))
    return rows


Stream = tuple[list[tuple[list[int], list[int]]], int, Any]  # (rows, batch size, None or a frozen model to distil)


def _fit(model, streams: list[Stream], steps: int, lr: float, seed: int, pad_id: int, log=print, log_every: int = 500,
         stage: str = "warm start", progress: bool = True) -> None:
    """AdamW for ``steps`` steps (50 of warm-up, then linear decay to 5%); each step draws one
    batch from each stream (``(rows, batch size, teacher)``: batches of rows of similar length)
    and takes the sum of their mean losses, one forward pass each: the cross-entropy of the
    rows' labels, or, where the stream has a frozen ``teacher`` model, the KL divergence from the
    teacher's next-token distributions at the labelled positions (``_distillation``).

    ``progress``: a bar on stderr named for the ``stage``, with its steps, the streams' mean
    losses since the last ``log`` line and the time left (a stage runs for minutes to an hour);
    the every-``log_every``-steps lines go to ``log`` either way (a log file has no bar)."""
    from mas.models.tiny import sequence_batch

    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / steps))
    draws = [(rows, _batches([len(ids) for ids, _ in rows], size, gen), teacher) for rows, size, teacher in streams]
    model.train()
    t0, running = time.perf_counter(), [0.0] * len(streams)
    bar = tqdm(total=steps, desc=stage, unit="step", file=sys.stderr, dynamic_ncols=True, disable=not progress)
    try:
        for step in range(steps):
            opt.zero_grad()
            for k, (rows, batches, teacher) in enumerate(draws):
                batch = sequence_batch([rows[i] for i in next(batches)], pad_id)
                loss = model(**batch).loss if teacher is None else _distillation(model, teacher, batch)
                loss.backward()
                running[k] += loss.item()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            since = step % log_every + 1  # steps in ``running``
            losses = " + ".join(f"{r / since:.3f}" for r in running)
            bar.set_postfix_str(f"loss {losses}", refresh=False)
            bar.update()
            if since == log_every:
                with tqdm.external_write_mode(file=sys.stderr):  # the line above the bar, not through it
                    log(f"  {stage} step {step + 1}/{steps}: loss {losses} ({time.perf_counter() - t0:.0f}s)")
                running = [0.0] * len(streams)
    finally:
        bar.close()


def _distillation(model, teacher, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """Mean KL(teacher || model) of the next-token distributions at the positions whose next
    token is labelled (the completions): the model is held to what the teacher says there, all
    of it, not only to the token the transcript holds."""
    inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
    at = batch["labels"][:, 1:] != -100  # [b, S-1]: position t predicts token t+1
    logp = torch.log_softmax(model(**inputs).logits[:, :-1][at].float(), dim=-1)  # [n, V]
    with torch.no_grad():
        target = torch.log_softmax(teacher(**inputs).logits[:, :-1][at].float(), dim=-1)  # [n, V]
    return torch.nn.functional.kl_div(logp, target, log_target=True, reduction="batchmean")


def ensure_embedded(recipe: Recipe | None = None, log=print, progress: bool = True) -> Path:
    """The verified embedded model for ``recipe`` (``artifact.embedded_path``): the shipped one,
    or one built into the cache now when none may be used (saying why first; ``progress``: the
    build's bars on stderr)."""
    recipe = recipe or Recipe()
    try:
        return embedded_path(recipe)
    except EmbeddedUnavailable as e:
        log(f"{e}\nbuilding it now")
    out = cache_folder(recipe)
    out.parent.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(out, ignore_errors=True)  # a refused copy (stale or corrupt) is replaced, never used
    build_embedded(recipe, out, log=log, progress=progress)
    return embedded_path(recipe)


def ship(log=print, progress: bool = True) -> Path:
    """Make the project's recipe the shipped artifact (``mas build-embedded --ship``): the build
    already in the cache when it is there and verifies (the one that was measured: a build depends
    on the machine's floating point and thread count, so a rebuild is a different model), else a
    new build."""
    recipe = Recipe()
    fresh = ARTIFACT_DIR.with_name(ARTIFACT_DIR.name + ".new")
    shutil.rmtree(fresh, ignore_errors=True)
    cached = cache_folder(recipe)
    if cached.is_dir() and problem(cached, recipe.key()) is None:
        log(f"shipping the cached build {cached.name} (verified against its manifest)")
        shutil.copytree(cached, fresh)
    else:
        build_embedded(recipe, fresh, log=log, progress=progress)
    shutil.rmtree(ARTIFACT_DIR, ignore_errors=True)
    os.replace(fresh, ARTIFACT_DIR)
    return ARTIFACT_DIR


def _version(dist: str) -> str:
    from importlib.metadata import version

    return version(dist)

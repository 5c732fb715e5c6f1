"""A tiny model warm-started to act in a research team, for end-to-end runs with real tools.

A random-weight model never writes ``<tool_call>``, so a smoke run with one would never touch
the tool path.  ``warm_research_model`` fine-tunes a tiny model for a few seconds on a fixed
mix of behaviours per role, rendered with the team's own role prompts (tool prompt included):

    orchestrator  CALL <each specialist>: find it | ANSWER: yes
    tool agents   a valid search call | a read call | a malformed call (no closing brace) | a report
    verdict       REJECT (a graph routes to the search agent) | ACCEPT
    other agents  ANSWER: yes

The user message is shaped like the one the topology sends: ``Task: <question>`` for an
orchestrator, the bare question standing in for a specialist's subtask, and for a graph node
the task plus a short made-up transcript (a node reads every earlier message).

Sampled at temperature 1 the model then produces all of these, so a 3-step run records valid
and malformed tool calls with their observations.  Nothing about the engine, the tools or the
learner is replaced.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

from mas.agents.agent import build_agents
from mas.agents.prompts import render_prompt
from mas.config.schema import RunConfig
from mas.envs import build_env
from mas.models.tiny import sft_batch, tiny_causal_lm, train_tokenizer

VALID_SEARCH = '<tool_call>{"name": "search", "arguments": {"query": "film director"}}</tool_call>'
VALID_READ = '<tool_call>{"name": "read", "arguments": {"title": "Shirley Temple"}}</tool_call>'
MALFORMED = '<tool_call>{"name": "search", "arguments": {"query": "film director"}</tool_call>'


def _targets(cfg: RunConfig, agent: str) -> list[tuple[str, float]]:
    topo = cfg.topology
    if getattr(topo, "orchestrator", None) == agent:
        specialists = list(topo.specialists)
        return [(f"CALL {s}: find it", 0.7 / len(specialists)) for s in specialists] + [("ANSWER: yes", 0.3)]
    if cfg.agent(agent).tools:
        return [(VALID_SEARCH, 0.4), (VALID_READ, 0.15), (MALFORMED, 0.3), ("Found it: the film.", 0.15)]
    if cfg.agent(agent).parser == "verdict":
        return [("REJECT: search for the director.", 0.75), ("ACCEPT", 0.25)]
    return [("ANSWER: yes", 1.0)]


def warm_research_model(
    cfg: RunConfig, out: Path, steps: int = 70, seed: int = 0, hidden_size: int = 64, call_tokens: bool = False
) -> Path:
    """Build, warm-start and save (HF format) a tiny model for the agents of ``cfg``; returns ``out``.

    ``call_tokens``: add each target tool call to the tokenizer as one token.  A few seconds of
    training rarely teach the tiny model to spell a 24-token JSON call after a 400-token prompt
    (most of its calls come out garbled, i.e. malformed); with one token per call it picks valid
    and malformed calls in about the trained proportions.  The calls are still plain text to
    the engine: parsed, checked and run by the real tool path.

    Runs on one torch thread (a module fixture runs before the per-test one-thread fixture, and
    on a busy 2-core machine spinning OpenMP threads slow this many-fold)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _warm(cfg, out, steps, seed, hidden_size, call_tokens)
    finally:
        torch.set_num_threads(threads)


def _sees_task(cfg: RunConfig, agent: str) -> bool:
    """The agent's user message starts with ``Task: <question>`` (an orchestrator)."""
    return getattr(cfg.topology, "orchestrator", None) == agent


def _graph_user(cfg: RunConfig, question: str, rng: random.Random) -> str:
    """A graph node's user message: the task and 0-2 transcript lines (``agent: reply``) of other nodes."""
    lines = [f"Task: {question}"]
    for _ in range(rng.randint(0, 2)):
        other = rng.choice([a.name for a in cfg.agents])
        replies = [c for c, _ in _targets(cfg, other) if "<tool_call>" not in c]
        lines.append(f"{other}: {rng.choice(replies)}")
    return "\n".join(lines)


def _warm(cfg: RunConfig, out: Path, steps: int, seed: int, hidden_size: int, call_tokens: bool) -> Path:
    rng = random.Random(seed)
    env = build_env(cfg.env)
    questions = [t.prompt for t in env.sample_tasks(24)]
    plain = build_agents(cfg.agents, cfg.team.name, getattr(env, "tools", {}))
    pairs: list[tuple[list[dict], str]] = []
    for name, agent in plain.items():
        choices, weights = zip(*_targets(cfg, name))
        for q in questions:
            if cfg.topology.kind == "graph":  # a node reads the task and the transcript so far
                pairs += [(agent.messages(_graph_user(cfg, q, rng)), c) for c in rng.choices(choices, weights, k=3)]
                continue
            user = f"Task: {q}" if _sees_task(cfg, name) else q
            pairs += [(agent.messages(user), c) for c in rng.choices(choices, weights, k=3)]
    texts = [m["content"] for ms, _ in pairs[:40] for m in ms] + [c for _, c in pairs]
    tok = train_tokenizer(texts, vocab_size=1000)
    if call_tokens:  # each target call is one token: learning which call to make, not how to spell JSON
        tok.add_tokens(sorted({c for _, c in pairs if c.startswith("<tool_call>")}))
    model = tiny_causal_lm(tok, hidden_size=hidden_size, num_layers=2, num_heads=4, max_positions=2048, seed=seed)
    examples = [(render_prompt(tok, ms), tok.encode(c, add_special_tokens=False) + [tok.eos_token_id]) for ms, c in pairs]
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    model.train()
    for _ in range(steps):
        batch = [examples[i] for i in torch.randint(len(examples), (8,), generator=gen).tolist()]
        loss = model(**sft_batch(batch, tok.pad_token_id)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out

"""Does the embedded model copy the names a research episode needs?  And how fast does it learn to?

``cpu_facts``'s researcher must write into its tool calls names it has just read: the person from
the question into ``search`` and ``read``, the organisation from the paragraph read into the
second ``search``; its reply is the city the second search showed, and the answerer copies that
city.  For a held-out question every one of those names is new, so only
a model that copies can do it.  This measures, on ``--eval`` of ``cpu_facts``'s held-out people
(corpus seed 0, never trained on), greedy and teacher-forced along the flawless teacher's path
(``mas.embedded.teachers.FactsTeacher`` with no flaw, played through the real engine, tools and
chat template), how often a model writes each name exactly once it is given the text before it:

    search person   <tool_call>{"name": "search", "arguments": {"query": "   -> the person
    read person     <tool_call>{"name": "read", "arguments": {"title": "     -> the person
    search org      <tool_call>{"name": "search", "arguments": {"query": "   -> the organisation
    reply           (the reply's start)                                       -> "<city>."
    answer          ANSWER:                                                   -> the city

Forcing the text before the name leaves the researcher's decisions out (the shipped build replies
after one search 60% of the time by design): what is measured is the copying alone.

Two modes:

    python bench/embedded_research_stage.py --model embedded            # a build as it is (or a folder)
    python bench/embedded_research_stage.py --train runs/stage --steps 3000   # train one, measuring as it goes

``--tokens`` also says where each copy fails, token by token (``token_odds``): the shipped build
misses a held-out surname at its first letter, the token after a lone space, and copies the rest.

``--train`` trains the shipped build further on the flawless teacher's episodes over
``--worlds`` other generated worlds (fresh names only: no person of ``cpu_facts``'s world), each
agent invocation one sequence at its own length (the build's research stage does the same with
the flawed teacher and the pool replayed beside it: ``mas/embedded/build.py``), saving the model
and measuring every ``--every`` steps.  Nothing is asserted; the figures go to docs/benchmarks/research_stage.md.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SLOTS = ("search person", "read person", "search org", "reply", "answer")


def teacher_episodes(team, cfg, world_cfg, n: int, seed: int = 0):
    """The flawless teacher's episodes on ``world_cfg``'s training questions: per episode its
    turns ``(prompt_ids, completion_ids)`` in order (4 researcher turns, then the answerer's)."""
    import dataclasses

    from mas.embedded.formats import FACTS_PATH
    from mas.training.warmup import teacher_demonstrations

    run_cfg = cfg.model_copy(update={"env": world_cfg})
    demos, reward = teacher_demonstrations(dataclasses.replace(team, cfg=run_cfg), n, FACTS_PATH.teacher, seed=seed)
    if reward != 1.0:
        raise SystemExit(f"the flawless teacher scored {reward} on world {world_cfg.corpus_seed}")
    out, current = [], []
    for agent, turn in demos:
        current.append(turn)
        if agent == "answerer":
            out.append(current)
            current = []
    return out


def held_out_episodes(team, cfg, n: int):
    """The flawless teacher's episodes on ``n`` of ``cpu_facts``'s held-out questions (its world,
    the held-out split as the training split of a copy of the world, so the teacher plays them)."""
    from mas.envs.research.facts import generate_world

    env = cfg.env
    world = generate_world(env.corpus_seed, env.num_train, env.num_eval, env.num_cities)
    people = {c.person for c in world.held_out}
    # the same world, every chain in the training split: the held-out ones are the last num_eval
    everything = env.model_copy(update={"num_train": env.num_train + env.num_eval - 1, "num_eval": 1})
    tok = team.runtime.tokenizers[team.agents["researcher"].policy]
    eps = teacher_episodes(team, cfg, everything, env.num_train + env.num_eval - 1)
    return [ep for ep in eps if any(p in tok.decode(ep[0][0]) for p in people)][:n]


def slot_prefixes(tok, ep):
    """Per slot: (prompt ids plus the completion's own tokens before the name, the expected rest)."""
    out = []
    cuts = ('"query": "', '"title": "', '"query": "', "", "ANSWER: ")
    for (p, c), cut in zip(ep, cuts):
        text = tok.decode(c, skip_special_tokens=True)
        head = text[: text.index(cut) + len(cut)]
        k = max(k for k in range(len(c) + 1) if head.startswith(tok.decode(c[:k], skip_special_tokens=True)))
        rest = text[len(tok.decode(c[:k], skip_special_tokens=True)):]
        if cut.startswith('"'):
            rest = rest[: rest.index('"', len(head) - len(text) + len(rest))]  # up to the name's closing quote
        out.append((p + c[:k], rest))
    return out


def copy_accuracy(model, tok, held_out) -> dict[str, float]:
    """Share of each slot whose greedy continuation starts with exactly the expected text."""
    import torch

    model.eval()
    hits = dict.fromkeys(SLOTS, 0)
    with torch.no_grad():
        for ep in held_out:
            for name, (ids, rest) in zip(SLOTS, slot_prefixes(tok, ep)):
                want = len(tok.encode(rest, add_special_tokens=False)) + 8
                out = model.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                                     max_new_tokens=want, do_sample=False, pad_token_id=tok.pad_token_id,
                                     eos_token_id=tok.eos_token_id)
                text = tok.decode(out[0, len(ids):], skip_special_tokens=True)
                hits[name] += text.startswith(rest)
    model.train()
    return {k: round(v / max(len(held_out), 1), 3) for k, v in hits.items()}


def token_odds(model, tok, held_out) -> dict[str, dict[str, float]]:
    """Where a copy fails: per slot, teacher-forced along the expected name, the mean probability
    of the right token and how often it is the greedy one, at the name's first token, at a token
    that follows a lone space (a surname's first letter: " ", "L", ...), and at the others."""
    import torch

    model.eval()
    seen: dict = {}
    with torch.no_grad():
        for ep in held_out:
            for name, (ids, rest) in zip(SLOTS, slot_prefixes(tok, ep)):
                want = tok.encode(rest, add_special_tokens=False)
                logp = model(torch.tensor([ids + want])).logits[0, len(ids) - 1:-1].log_softmax(-1)
                for j, t in enumerate(want):
                    kind = "first" if j == 0 else "after space" if tok.decode([want[j - 1]]) == " " else "other"
                    seen.setdefault(name, {}).setdefault(kind, []).append((logp[j, t].exp().item(), int(logp[j].argmax()) == t))
    model.train()
    return {name: {kind: {"n": len(v), "p": round(sum(p for p, _ in v) / len(v), 3),
                          "greedy": round(sum(ok for _, ok in v) / len(v), 3)} for kind, v in kinds.items()}
            for name, kinds in seen.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="embedded", help="measure this model (embedded, or a Hugging Face folder)")
    ap.add_argument("--train", type=Path, help="train the shipped build further into this folder, measuring every --every steps")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every", type=int, default=250)
    ap.add_argument("--worlds", type=int, default=40, help="corpus seeds --first-seed.. (480 episodes each)")
    ap.add_argument("--first-seed", type=int, default=1000)
    ap.add_argument("--batch-size", type=int, default=32, help="agent invocations a step")
    ap.add_argument("--reply-batch", type=int, default=0,
                    help="also this many reply-only rows a step: the researcher's last turn, the loss on it alone")
    ap.add_argument("--first-batch", type=int, default=0,
                    help="also this many first turns a step on their own (the search for the person), as the build's "
                         "research_first_turns")
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--positions", type=int, default=2048)
    ap.add_argument("--eval", type=int, default=40, help="held-out people of cpu_facts (corpus seed 0)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tokens", action="store_true", help="also where each copy fails, token by token (token_odds)")
    ap.add_argument("--json", type=Path, help="also write the rows here")
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from mas.config.schema import load_config
    from mas.embedded.artifact import embedded_path, load_tokenizer
    from mas.embedded.build import _rows, _sequences
    from mas.envs.research.facts import generate_world
    from mas.models.tiny import sequence_batch
    from mas.training.team import build_team

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    folder = embedded_path() if args.model == "embedded" else Path(args.model)
    cfg = load_config(REPO / "configs" / "cpu_facts.yaml", [f"policies.{p}.model={folder}" for p in ("scout", "writer")])
    team = build_team(cfg)  # the team's tokenizer, engine and tools; the measured model is loaded apart
    tok = load_tokenizer(folder)
    held_out = held_out_episodes(team, cfg, args.eval)
    model = AutoModelForCausalLM.from_pretrained(folder)
    if args.train is None:
        row = {"model": str(args.model), "held_out": len(held_out), **copy_accuracy(model, tok, held_out)}
        if args.tokens:
            row["tokens"] = token_odds(model, tok, held_out)
        print(json.dumps(row))
        if args.json:
            args.json.write_text(json.dumps(row, indent=1))
        team.close()
        return

    t0 = time.perf_counter()
    home = {c.person for c in generate_world(cfg.env.corpus_seed, cfg.env.num_train, cfg.env.num_eval, cfg.env.num_cities).chains}
    train_eps = []
    for s in range(args.first_seed, args.first_seed + args.worlds):
        world = cfg.env.model_copy(update={"corpus_seed": s, "num_train": 499, "num_eval": 1})
        shared = home & {c.person for c in generate_world(s, 499, 1, cfg.env.num_cities).chains}
        if shared:
            raise SystemExit(f"world {s} names people of cpu_facts's world: {sorted(shared)[:5]}")
        train_eps += teacher_episodes(team, cfg, world, 480, seed=s)
    rows_train = _sequences([turn for ep in train_eps for turn in ep])
    rows_reply = _rows([ep[3] for ep in train_eps])  # the researcher's reply alone, the loss on it
    rows_first = _rows([ep[0] for ep in train_eps])  # the first search alone: the person copied from the question
    print(f"{len(train_eps)} teacher episodes from {args.worlds} worlds in {time.perf_counter() - t0:.0f}s; "
          f"{len(held_out)} held-out episodes; longest sequence {max(len(i) for i, _ in rows_train)} tokens", flush=True)
    model.config.max_position_embeddings = args.positions
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 50) * max(0.05, 1 - s / args.steps))
    gen = torch.Generator().manual_seed(args.seed)
    rows = [{"step": 0, **copy_accuracy(model, tok, held_out)}]
    print(json.dumps(rows[-1]), flush=True)
    running, t1 = 0.0, time.perf_counter()
    for step in range(args.steps):
        pick = torch.randint(len(rows_train), (args.batch_size,), generator=gen).tolist()
        opt.zero_grad()
        loss = model(**sequence_batch([rows_train[i] for i in pick], tok.pad_token_id)).loss
        if args.reply_batch:
            pick = torch.randint(len(rows_reply), (args.reply_batch,), generator=gen).tolist()
            loss = loss + model(**sequence_batch([rows_reply[i] for i in pick], tok.pad_token_id)).loss
        if args.first_batch:
            pick = torch.randint(len(rows_first), (args.first_batch,), generator=gen).tolist()
            loss = loss + model(**sequence_batch([rows_first[i] for i in pick], tok.pad_token_id)).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        running += loss.item()
        if (step + 1) % args.every == 0:
            rows.append({"step": step + 1, "loss": round(running / args.every, 4), "s": round(time.perf_counter() - t1),
                         **copy_accuracy(model, tok, held_out)})
            running = 0.0
            print(json.dumps(rows[-1]), flush=True)
            model.save_pretrained(args.train / f"step{step + 1}")
            tok.save_pretrained(args.train / f"step{step + 1}")
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    team.close()


if __name__ == "__main__":
    main()

"""Can the embedded model learn to copy a person's name into a search call?

``cpu_facts``'s first step is the researcher's first tool call: it must write the name the
question holds into ``{"query": ...}``.  For a held-out question that name was never seen in
training, so only a model that copies from its prompt can make the call.  This fine-tunes the
shipped embedded model on exactly that turn (the config's role prompt, ``Task: <question>``,
the teacher's call) and measures, every ``--every`` steps, how many held-out questions
(``cpu_facts``'s own, corpus seed 0) get a greedy call that names the person:

- ``--names world``: the 400 training people of ``cpu_facts``'s world, as its warm-up sees them;
- ``--names fresh``: a new person for every demonstration, drawn from worlds of other corpus
  seeds (never a held-out name), so a name cannot be remembered, only copied.

    python bench/embedded_name_copy.py --names world --steps 3000
    python bench/embedded_name_copy.py --names fresh --steps 6000

``--from-scratch`` trains a new model of the recipe's size instead (the turn alone, so what is
learnt is the copy), on the shipped tokenizer or, with ``--space-capitals``, on the same one with
a token for each capital letter after a space ("ĠL"): the shipped one writes " Lobiar" as " ",
"L", ..., so the surname's first letter follows a space, the commonest token of the prompt, and a
model that copies by "the token after the one I just wrote" has dozens of candidates for it.

    python bench/embedded_name_copy.py --from-scratch --steps 3000
    python bench/embedded_name_copy.py --from-scratch --space-capitals --steps 3000

``surname`` counts calls whose query holds the surname (enough for BM25: every surname names
one person); ``exact`` counts the query equal to the name.  Nothing is asserted: the counts go
to docs/benchmarks/research_stage.md.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
QUERY = re.compile(r'"query":\s*"([^"]*)"')


def space_capitals(tok):
    """``tok`` with one more token per capital letter after a space ("ĠA" .. "ĠZ", byte-level),
    merged before any other pair, so that every word of a name starts with a token of its own."""
    import string

    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    from mas.models.tiny import SPECIAL_TOKENS

    spec = json.loads(tok.backend_tokenizer.to_str())
    vocab, merges = spec["model"]["vocab"], spec["model"]["merges"]
    pair = (lambda a, b: [a, b]) if merges and isinstance(merges[0], list) else (lambda a, b: f"{a} {b}")
    next_id = max([*vocab.values(), *(t["id"] for t in spec["added_tokens"])]) + 1
    new = []
    for c in string.ascii_uppercase:
        if "\u0120" + c not in vocab:
            vocab["\u0120" + c] = next_id
            next_id += 1
            new.append(pair("\u0120", c))
    spec["model"]["merges"] = new + merges
    out = PreTrainedTokenizerFast(tokenizer_object=Tokenizer.from_str(json.dumps(spec)), pad_token=tok.pad_token,
                                  eos_token=tok.eos_token, additional_special_tokens=SPECIAL_TOKENS[2:])
    out.padding_side, out.chat_template = tok.padding_side, tok.chat_template
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--names", choices=["world", "fresh"], default="fresh")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--every", type=int, default=500)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--lr", type=float, default=2e-3, help="cpu_facts's warm-up rate")
    ap.add_argument("--eval", type=int, default=50, help="held-out questions")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--from-scratch", action="store_true", help="a new model of the recipe's size, not the shipped one")
    ap.add_argument("--space-capitals", action="store_true",
                    help="with --from-scratch: the shipped tokenizer plus a token for each capital after a space")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.space_capitals and not args.from_scratch:
        ap.error("--space-capitals needs --from-scratch (the shipped model has no embeddings for the new tokens)")

    import torch

    from mas.config.schema import load_config
    from mas.embedded.artifact import load_embedded
    from mas.envs.research.facts import QUESTION, generate_world
    from mas.models.tiny import sft_batch
    from mas.tools import tool_call_text

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = load_config(REPO / "configs" / "cpu_facts.yaml")
    role = next(a.role for a in cfg.agents if a.name == "researcher")
    env = cfg.env
    world = generate_world(env.corpus_seed, env.num_train, env.num_eval, env.num_cities)
    held_out = [c.person for c in world.held_out][: args.eval]
    model, tok = load_embedded()
    if args.from_scratch:
        from mas.embedded.recipe import Recipe
        from mas.models.tiny import tiny_causal_lm

        if args.space_capitals:
            tok = space_capitals(tok)
        r = Recipe()
        model = tiny_causal_lm(tok, hidden_size=r.hidden_size, num_layers=r.num_layers, num_heads=r.num_heads,
                               seed=args.seed)

    def prompt(person: str) -> list[int]:
        messages = [{"role": "system", "content": role},
                    {"role": "user", "content": f"Task: {QUESTION.format(person=person)}"}]
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)

    def completion(person: str) -> list[int]:
        return tok(tool_call_text("search", {"query": person}))["input_ids"] + [tok.eos_token_id]

    if args.names == "world":
        pool = [c.person for c in world.train]
        draw = lambda rng: rng.choice(pool)  # noqa: E731
    else:
        banned, fresh, corpus_seed = set(held_out), [], 1000

        def draw(rng: random.Random) -> str:
            nonlocal corpus_seed
            while not fresh:
                w = generate_world(corpus_seed, env.num_train + env.num_eval, 1, env.num_cities)
                fresh.extend(c.person for c in w.chains if c.person not in banned)
                rng.shuffle(fresh)
                corpus_seed += 1
            return fresh.pop()

    def evaluate() -> dict[str, float]:
        model.eval()
        exact = surname = 0
        with torch.no_grad():
            for person in held_out:
                ids = prompt(person)
                out = model.generate(torch.tensor([ids]), max_new_tokens=64, do_sample=False)
                m = QUERY.search(tok.decode(out[0, len(ids):], skip_special_tokens=True))
                query = m.group(1) if m else ""
                exact += query == person
                surname += person.split()[-1] in query
        model.train()
        return {"exact": exact / len(held_out), "surname": surname / len(held_out)}

    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    rng = random.Random(args.seed)
    rows, seen, losses, start = [], set(), [], time.perf_counter()
    for step in range(1, args.steps + 1):
        names = [draw(rng) for _ in range(args.batch_size)]
        seen.update(names)
        loss = model(**sft_batch([(prompt(n), completion(n)) for n in names], tok.pad_token_id)).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
        if step % args.every == 0 or step == args.steps:
            row = {"step": step, "loss": sum(losses) / len(losses), "distinct_names": len(seen), **evaluate(),
                   "s": round(time.perf_counter() - start)}
            losses = []
            rows.append(row)
            print(f"step {step:5d}  loss {row['loss']:.4f}  names seen {row['distinct_names']:6d}  held-out calls naming "
                  f"the person: exact {row['exact']:.2f}, surname {row['surname']:.2f}  ({row['s']} s)", flush=True)
    if args.json:
        args.json.write_text(json.dumps({"names": args.names, "lr": args.lr, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()

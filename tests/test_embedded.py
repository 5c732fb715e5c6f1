"""The embedded offline model: teachers of every format, recipe hash, determinism, cache, and
the shipped configs that must use exactly the warm-started prompts."""

from __future__ import annotations

import dataclasses
import random
import re
from pathlib import Path

import pytest
import torch
import yaml

from mas.rollout.backends.base import GenRequest
from mas.config.schema import validate_config
from mas.embedded import FORMATS, Recipe, warm_started_roles
from mas.embedded.build import build_embedded, ensure_embedded, format_transcripts
from mas.embedded.artifact import write_manifest
from mas.topologies.teaching import chain_steps, value, worked
from mas.models.tiny import train_tokenizer

ROOT = Path(__file__).parents[1]
SMALL = Recipe(formats=(("orchestrator", 12), ("chain", 6)), steps=3, hidden_size=32, num_layers=1, num_heads=2, vocab_size=300,
               extend=(), research=())


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer([" ".join(r for roles in warm_started_roles().values() for r in roles.values())], vocab_size=300)


def turns_of(tok, name, episodes=60):
    turns, reward = format_transcripts(FORMATS[name], episodes, 0, tok)
    return [(m, c) for m, c in turns], reward


def by_role(turns, fmt, agent):
    return [(m, c) for m, c in turns if m[0]["content"] == FORMATS[fmt].agents[agent].role]


def test_chain_arithmetic():
    assert chain_steps("3+4-2") == [(3, "+", 4, 7), (7, "-", 2, 5)]
    assert chain_steps("-3+4") == [(-3, "+", 4, 1)]
    assert chain_steps("12-15") == [(12, "-", 15, -3)]
    assert worked("7-9+3") == "7-9=-2 -2+3=1" and value("7-9+3") == 1


def test_orchestrator_teacher_delegates_or_answers_at_once(tok):
    turns, reward = turns_of(tok, "orchestrator")
    assert reward == 1.0
    first = [c for m, c in by_role(turns, "orchestrator", "orchestrator") if len(m) == 2]
    assert len(first) == 60
    assert 0.45 <= sum(c.startswith("ANSWER") for c in first) / 60 <= 0.75  # p_direct = 0.6
    assert all(re.fullmatch(r"CALL (adder: \d+\+\d+|subtractor: -?\d+-\d+)", c) for c in first if c.startswith("CALL"))
    for m, c in by_role(turns, "orchestrator", "adder"):
        a, op, b, r = chain_steps(m[-1]["content"])[0]
        assert op == "+" and c == f"ANSWER: {r}"  # specialists only ever see their own operator


def test_debate_teacher_answers_at_once_or_works_it_out(tok):
    turns, reward = turns_of(tok, "debate", 40)
    assert reward == 1.0
    debaters = [c for m, c in turns if m[0]["content"].startswith("You are debater")]
    assert len(debaters) == 40 * 6  # 3 debaters x 2 rounds
    worked_share = sum("=" in c for c in debaters) / len(debaters)
    assert 0.25 <= worked_share <= 0.55  # 1 - p_direct
    rounds2 = [m for m, c in turns if "Other answers from the previous round" in m[-1]["content"]]
    assert len(rounds2) == 40 * 3
    judge = by_role(turns, "debate", "judge")
    assert len(judge) == 20  # half the episodes use the judge variant
    for m, c in judge:
        question = m[-1]["content"].splitlines()[0].removeprefix("Question: ")
        assert c == f"ANSWER: {value(question)}"


def test_chain_teacher_rejects_every_wrong_answer_and_passes_right_ones_lazily(tok):
    turns, reward = turns_of(tok, "chain", 80)
    assert reward == 1.0
    verdicts = by_role(turns, "chain", "verifier")
    rejects = [c for m, c in verdicts if c.endswith("REJECT")]
    bare = [c for m, c in verdicts if c == "ACCEPT"]
    assert rejects and bare and len(bare) > len(verdicts) / 2  # the lazy verifier's rubber stamp is its mode
    for m, c in verdicts:
        task = m[-1]["content"].splitlines()[0].removeprefix("Task: ")
        latest = int(m[-1]["content"].rsplit("ANSWER: ", 1)[1])
        assert c.endswith("REJECT") == (latest != value(task))
        assert c == "ACCEPT" or c.startswith(worked(task))
    retries = [c for m, c in by_role(turns, "chain", "solver") if "verifier: " in m[-1]["content"]]
    assert len(retries) == len(rejects) and all("=" in c for c in retries)  # after a REJECT it works it out


def test_graph_teacher_skips_or_does_the_work(tok):
    turns, reward = turns_of(tok, "graph", 60)
    assert reward == 1.0
    checks = by_role(turns, "graph", "checker")
    first = [c for m, c in checks if "\n" not in m[-1]["content"]]
    assert len(first) == 60 and 0.45 <= first.count("ACCEPT") / 60 <= 0.75
    for m, c in by_role(turns, "graph", "worker"):
        task = m[-1]["content"].splitlines()[0].removeprefix("Task: ")
        done = m[-1]["content"].count("\nworker: ")
        a, op, b, r = chain_steps(task)[done]
        assert c == f"{a}{op}{b}={r}"


def test_graph_worker_format_trains_the_worker_alone_on_every_step(tok):
    turns, reward = turns_of(tok, "graph_worker", 30)
    assert reward == 1.0  # the checker always rejects until the steps are done: every episode right
    assert len(turns) == 30 * 2  # two-operation tasks: two worker steps, and no checker or answerer turn
    for m, c in turns:
        assert m[0]["content"] == FORMATS["graph"].agents["worker"].role
        task = m[-1]["content"].splitlines()[0].removeprefix("Task: ")
        a, op, b, r = chain_steps(task)[m[-1]["content"].count("\nworker: ")]
        assert c == f"{a}{op}{b}={r}"
    assert "train_agents" not in FORMATS["graph"].spec() and FORMATS["graph_worker"].spec()["train_agents"] == ["worker"]


@pytest.mark.parametrize("fmt, episodes, agents", [("team_conjunctive", 100, ("left", "right")), ("team_relay", 25, tuple(f"s{k}" for k in range(1, 9)))])
def test_parts_specialists_see_only_their_part_and_mostly_work_it_out(tok, fmt, episodes, agents):
    turns, reward = turns_of(tok, fmt, episodes)
    assert reward == 1.0 and len(turns) == episodes * len(agents)
    direct = 0
    for m, c in turns:
        assert [x["role"] for x in m] == ["system", "user"]  # no other agent's message
        part = re.fullmatch(r"Task: (\d[\d+-]*)", m[-1]["content"]).group(1)  # one chain, nothing else
        assert c in (f"ANSWER: {value(part)}", f"{worked(part)} ANSWER: {value(part)}")
        direct += c.startswith("ANSWER")
    assert 0.1 <= direct / len(turns) <= 0.3  # p_direct = 0.2: a specialist mostly works its part out


def test_saboteur_solver_format_trains_the_solver_alone_working_every_answer_out(tok):
    turns, reward = turns_of(tok, "saboteur_solver", 40)
    assert len(turns) == 40 and reward < 0.75  # one solver turn per episode; the reviewer still overrules
    for m, c in turns:
        assert m[0]["content"] == FORMATS["team_saboteur"].agents["solver"].role
        task = m[-1]["content"].splitlines()[0].removeprefix("Task: ")
        assert c == f"{worked(task)} ANSWER: {value(task)}"
    assert FORMATS["saboteur_solver"].spec()["train_agents"] == ["solver"]


def test_saboteur_teacher_overrules_with_near_misses(tok):
    turns, reward = turns_of(tok, "team_saboteur", 80)
    reviews = by_role(turns, "team_saboteur", "reviewer")
    overrules = [(m, c) for m, c in reviews if c != "ACCEPT"]
    assert reward == pytest.approx(1 - len(overrules) / 80) and 0.45 <= len(overrules) / 80 <= 0.75
    for m, c in overrules:
        task = m[-1]["content"].splitlines()[0].removeprefix("Task: ")
        assert c.startswith("REJECT ANSWER: ") and 1 <= abs(int(c.split(": ")[1]) - value(task)) <= 2


def test_teachers_are_deterministic_for_a_seed():
    req = GenRequest("p", [1], 1.0, 1.0, 0, 8, agent="orchestrator",
                     messages=[{"role": "system", "content": "x"}, {"role": "user", "content": "Task: 1+2-3"}])
    teacher = FORMATS["orchestrator"].teacher

    def moves(seed):
        rng = random.Random(seed)
        return [teacher(req, rng) for _ in range(20)]

    assert moves(0) == moves(0) and moves(0) != moves(1)


def test_recipe_key_follows_the_formats():
    base = Recipe()
    assert Recipe().key() == base.key()
    assert Recipe(formats=base.formats[:-1]).key() != base.key()
    fmt = FORMATS["chain"]
    changed = dataclasses.replace(fmt, teacher=dataclasses.replace(fmt.teacher, p_lazy=0.5))
    assert changed.spec() != fmt.spec()  # a teacher's knob is part of the hash
    with pytest.raises(ValueError, match="unknown warm-start formats"):
        Recipe(formats=(("nope", 1),))


def test_a_varied_recipe_changes_what_it_names_and_nothing_else():
    base = Recipe()
    assert base.varied([]) == base
    v = base.varied(["steps=8000", "lr=0.002", "formats.graph=1600", "formats.team_relay=0"])
    assert (v.steps, v.lr, v.seed, v.hidden_size) == (8000, 0.002, base.seed, base.hidden_size)
    assert isinstance(v.steps, int) and isinstance(v.lr, float)
    assert [n for n, _ in v.formats] == [n for n, _ in base.formats if n != "team_relay"]  # order kept, 0 drops it
    assert dict(v.formats)["graph"] == 1600
    assert {k: e for k, e in v.formats if k != "graph"} == {k: e for k, e in base.formats if k not in ("graph", "team_relay")}
    assert v.key() != base.key() and base.varied(["formats.graph=1600"]).key() != base.key()
    # the variant built by changing Recipe's defaults has the same key (its docs figures name it)
    assert base.varied(["formats.graph=1600"]) == Recipe(formats=tuple((n, 1600 if n == "graph" else e) for n, e in base.formats))


@pytest.mark.parametrize("change, message", [
    ("steps", "expected KEY=VALUE"), ("nope=1", "unknown key"), ("formats.nope=5", "unknown format 'nope'"),
    ("extend.nope=5", "unknown format 'nope'"), ("extend_steps=many", "invalid literal"),
    ("steps=many", "invalid literal"), ("formats.graph=lots", "invalid literal")])
def test_a_bad_recipe_change_is_refused_by_name(change, message):
    with pytest.raises(ValueError, match=re.escape(f"recipe change {change!r}") + ".*" + message):
        Recipe().varied([change])


def test_build_embedded_builds_a_variant_into_its_own_cache_folder(tmp_path, monkeypatch, capsys):
    from mas.cli import main
    from mas.embedded.artifact import ARTIFACT_DIR, cache_folder

    monkeypatch.setenv("MAS_CACHE_DIR", str(tmp_path / "cache"))
    built = []
    monkeypatch.setattr("mas.embedded.build.build_embedded", lambda recipe, out, log: built.append((recipe, out)))
    assert main(["build-embedded", "--recipe", "formats.graph=1600", "--recipe", "seed=2"]) == 0
    variant = Recipe().varied(["formats.graph=1600", "seed=2"])
    assert built == [(variant, cache_folder(variant))] and str(cache_folder(variant)).startswith(str(tmp_path))
    assert f"cached: {cache_folder(variant)}" in capsys.readouterr().out
    assert main(["build-embedded", "--recipe", "steps=x"]) == 2
    assert "recipe change 'steps=x'" in capsys.readouterr().err
    shipped = sorted(p.name for p in ARTIFACT_DIR.iterdir())
    assert main(["build-embedded", "--ship", "--recipe", "steps=7000"]) == 2  # a variant never overwrites the artifact
    assert "--ship takes the project's recipe" in capsys.readouterr().err
    assert len(built) == 1 and sorted(p.name for p in ARTIFACT_DIR.iterdir()) == shipped


def test_a_missing_variant_names_the_variant_command_not_the_ship_one(tmp_path, monkeypatch):
    from mas.embedded import EmbeddedUnavailable, embedded_path

    monkeypatch.setenv("MAS_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(EmbeddedUnavailable, match=r"variant .* `mas build-embedded --recipe KEY=VALUE`") as e:
        embedded_path(Recipe().varied(["seed=5"]))
    assert "--ship" not in str(e.value)


def test_a_second_stage_has_its_own_key_and_a_one_stage_recipe_keeps_its_old_one():
    two = Recipe().base()  # the project's recipe without its research stage
    assert Recipe().research and two == dataclasses.replace(Recipe(), research=())
    assert two.extend and two.base() == dataclasses.replace(two, extend=())
    assert two.key() != two.base().key()
    assert two.varied(["extend_steps=700"]).key() != two.key() and two.varied(["extend_lr=0.001"]).key() != two.key()
    assert two.varied(["extend.saboteur_solver=0"]) == two.base()
    # the second stage's knobs are not in a one-stage key: caches and figures named by it stay valid
    one = two.base()
    assert dataclasses.replace(one, extend_steps=1, extend_lr=0.1).key() == one.key()
    assert "saboteur_solver" not in dict(two.formats)  # taught in the second stage only
    with pytest.raises(ValueError, match="unknown warm-start formats"):
        Recipe(extend=(("nope", 1),))


def test_a_second_stage_starts_from_its_base_model_and_keeps_its_tokenizer(tmp_path, monkeypatch):
    from safetensors.torch import load_file

    from mas.embedded.artifact import cache_folder, problem

    torch.set_num_threads(1)
    monkeypatch.setenv("MAS_CACHE_DIR", str(tmp_path / "cache"))
    base_recipe = dataclasses.replace(SMALL, lr=0.5)  # a base far from any fresh init (Adam moves each weight ~lr a step)
    two = dataclasses.replace(base_recipe, extend=(("saboteur_solver", 6),), extend_steps=2)
    said = []
    build_embedded(two, tmp_path / "two", log=said.append)
    base = cache_folder(base_recipe)
    assert problem(base, base_recipe.key()) is None  # the base was built first, into the cache
    assert problem(tmp_path / "two", two.key()) is None
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        assert (tmp_path / "two" / name).read_bytes() == (base / name).read_bytes(), name
    w1, w2 = load_file(base / "model.safetensors"), load_file(tmp_path / "two" / "model.safetensors")
    assert w1.keys() == w2.keys() and not all(torch.equal(w1[k], w2[k]) for k in w1)  # trained further
    assert max((w1[k] - w2[k]).abs().max().item() for k in w1) < 1e-3  # from the base's weights, not a new init
    first = int(re.search(r"embedded model: (\d+) teacher turns", " ".join(said)).group(1))
    second = re.search(rf"second stage from {base_recipe.key()}, (\d+) teacher turns", " ".join(said))
    assert second and int(second.group(1)) == first + 6  # the base pool again, plus one solver turn per episode


def test_a_research_stage_has_its_own_key_and_the_two_stage_recipe_keeps_its_old_one():
    three = Recipe().varied(["research.facts=19200"])
    assert three == Recipe()  # the project's recipe: the shipped artifact is this build
    assert three.research and three.base() == dataclasses.replace(three, research=())
    # the two-stage build's key, which the shipped figures before the research stage name (docs/benchmarks/archive.md)
    assert three.base().key() == "851c280c22da" and three.base().base().key() == "49feff5a05f4"
    # pinned: a change to the facts format or its teacher is a new research build (the builds in
    # docs/benchmarks/research_stage.md, 7275deab8cc7 and b5b378912523, had the teacher reply with a sentence)
    assert three.key() == "c29fdeb610b3"
    for change in ("research_steps=10", "research_lr=0.001", "research_batch_size=4", "positions=1024", "research.facts=100",
                   "research_first_turns=8"):
        assert three.varied([change]).key() != three.key(), change
    assert three.varied(["research.facts=0"]) == three.base()
    two = three.base()  # the research stage's knobs are not in a recipe without one
    assert dataclasses.replace(two, research_steps=1, research_lr=0.1, positions=64).key() == two.key()
    assert "facts" not in dict(three.formats) and "facts" not in dict(three.extend)
    with pytest.raises(ValueError, match="unknown warm-start formats"):
        Recipe(research=(("nope", 1),))
    # the unshipped second research stage and later-turns stream are gone (docs/benchmarks/research_stage.md)
    for change in ("research2.facts_path=19200", "research_later_turns=32"):
        with pytest.raises(ValueError, match="unknown key"):
            three.varied([change])


def test_turns_of_one_invocation_become_one_sequence_with_a_loss_on_each_turn():
    from mas.embedded.build import _sequences

    examples = [([1, 2], [3, 9]),                 # a first call: prompt 1 2, completion 3 <eos=9>
                ([1, 2, 3, 9, 4], [5, 9]),        # its result (4) appended: the same invocation
                ([7], [8, 9]),                    # another agent's turn: a new row
                ([1, 2, 3, 9, 6], [5, 9])]        # extends an earlier row, not the last one: a new row
    assert _sequences(examples) == [
        ([1, 2, 3, 9, 4, 5, 9], [-100, -100, 3, 9, -100, 5, 9]),
        ([7, 8, 9], [-100, 8, 9]),
        ([1, 2, 3, 9, 6, 5, 9], [-100, -100, -100, -100, -100, 5, 9])]


def test_the_research_format_plays_cpu_facts_team_as_the_config_writes_it():
    """FACTS lists no config (its stage is not shipped), so the usual configs check does not
    cover it: the prompts, limits, tools and env besides the corpus are cpu_facts's own."""
    from mas.embedded.formats import FACTS

    cfg = validate_config(yaml.safe_load((ROOT / "configs" / "cpu_facts.yaml").read_text()))
    for name, spec in FACTS.agents.items():
        agent = cfg.agent(name)
        assert (spec.role, spec.parser, spec.max_new_tokens) == (agent.role, agent.parser, agent.sampling.max_new_tokens), name
        assert (tuple(spec.tools), spec.max_tool_calls) == (tuple(agent.tools), agent.max_tool_calls if agent.tools else 0), name
    assert FACTS.env.model_dump() == cfg.env.model_dump()
    ignore = {"corpus_seed", "num_train", "num_eval"}
    assert all({k: v for k, v in w.model_dump().items() if k not in ignore} ==
               {k: v for k, v in cfg.env.model_dump().items() if k not in ignore} for w in FACTS.worlds)


def test_the_research_worlds_name_no_person_of_cpu_facts_world():
    from mas.embedded.formats import FACTS
    from mas.envs.research.facts import generate_world

    cfg = validate_config(yaml.safe_load((ROOT / "configs" / "cpu_facts.yaml").read_text()))
    home = generate_world(cfg.env.corpus_seed, cfg.env.num_train, cfg.env.num_eval, cfg.env.num_cities)
    names = {c.person for c in home.chains}  # training and held-out people alike
    seen = set()
    # (organisations are a syllable, an ending and a kind, 6,000 names: worlds share some, each
    # based in a city of its own world's choosing, so a remembered one would mislead, not help)
    for w in FACTS.worlds:
        world = generate_world(w.corpus_seed, w.num_train, w.num_eval, w.num_cities)
        people = {c.person for c in world.train}
        assert not people & names, (w.corpus_seed, sorted(people & names)[:5])
        seen |= people
    assert len(FACTS.worlds) == 40 and len(seen) > 15_000  # fresh names: far more than one world's 400


def test_research_teacher_copies_every_name_from_what_it_has_read(tok):
    from mas.tools import parse_tool_calls
    from mas.embedded.formats import FACTS
    from mas.envs.research.facts import generate_world

    turns, reward = turns_of(tok, "facts", 80)
    chains = {c.person: c for w in FACTS.worlds for c in generate_world(w.corpus_seed, w.num_train, w.num_eval,
                                                                         w.num_cities).train}
    researcher, answerer = by_role(turns, "facts", "researcher"), by_role(turns, "facts", "answerer")
    assert len(answerer) == 80 and len(researcher) >= 2 * 80
    direct = full = detours = 0
    for m, c in researcher:
        person = re.search(r"organisation that (.+) founded\?", m[1]["content"]).group(1)
        chain = chains[person]
        calls = [(k.name, k.arguments) for x in m if x["role"] == "assistant" for k in parse_tool_calls(x["content"])]
        if not calls:
            assert c == tool_call(("search", {"query": person}))
        elif c == f"{chain.birthplace}.":
            direct += 1
            assert calls == [("search", {"query": person})]  # only after the first search
        elif c == f"{chain.city}.":
            full += 1
            assert calls[-1] == ("search", {"query": chain.org}) and ("read", {"title": person}) in calls
        else:
            assert c in (tool_call(("read", {"title": person})), tool_call(("search", {"query": chain.org})),
                         tool_call(("search", {"query": chain.birthplace})))
            detours += c == tool_call(("search", {"query": chain.birthplace}))
    assert direct + full == 80 and 0.45 <= direct / 80 <= 0.75  # p_direct = 0.6
    assert 0 < detours < full  # p_detour = 0.3 of the full episodes
    assert reward == pytest.approx(full / 80)
    for m, c in answerer:
        reply = [line for line in m[-1]["content"].splitlines() if line.startswith("researcher: ") and "<tool_call>" not in line]
        assert c == f"ANSWER: {reply[-1].removeprefix('researcher: ').rstrip('.')}"


def test_the_whole_path_format_searches_reads_and_searches_again_in_every_episode(tok):
    """facts_path, demonstrations for a research stage: cpu_facts's team and prompts (FACTS's),
    with neither of its flaws, so every researcher invocation is the same four turns."""
    from mas.embedded.formats import FACTS, FACTS_PATH
    from mas.envs.research.facts import generate_world

    assert (FACTS_PATH.agents, FACTS_PATH.env, FACTS_PATH.worlds) == (FACTS.agents, FACTS.env, FACTS.worlds)
    turns, reward = turns_of(tok, "facts_path", 40)
    chains = {c.person: c for w in FACTS.worlds for c in generate_world(w.corpus_seed, w.num_train, w.num_eval,
                                                                         w.num_cities).train}
    researcher = by_role(turns, "facts_path", "researcher")
    assert len(researcher) == 4 * 40 and len(by_role(turns, "facts_path", "answerer")) == 40
    for k in range(40):
        person = re.search(r"organisation that (.+) founded\?", researcher[4 * k][0][1]["content"]).group(1)
        chain = chains[person]
        assert [c for _, c in researcher[4 * k:4 * k + 4]] == [
            tool_call(("search", {"query": person})), tool_call(("read", {"title": person})),
            tool_call(("search", {"query": chain.org})), f"{chain.city}."]
    assert reward == 1.0


def tool_call(call):
    from mas.tools import tool_call_text

    return tool_call_text(*call)


def test_a_research_stage_starts_from_its_base_at_raised_positions(tmp_path, monkeypatch):
    from safetensors.torch import load_file
    from transformers import AutoConfig

    from mas.embedded.artifact import cache_folder, problem

    torch.set_num_threads(1)
    monkeypatch.setenv("MAS_CACHE_DIR", str(tmp_path / "cache"))
    three = dataclasses.replace(SMALL, research=(("facts", 40),), research_steps=2, research_batch_size=4, positions=1536)
    said = []
    build_embedded(three, tmp_path / "three", log=said.append)
    base = cache_folder(SMALL)
    assert problem(base, SMALL.key()) is None and problem(tmp_path / "three", three.key()) is None
    assert AutoConfig.from_pretrained(tmp_path / "three").max_position_embeddings == 1536
    assert AutoConfig.from_pretrained(base).max_position_embeddings == 512
    assert (tmp_path / "three" / "tokenizer.json").read_bytes() == (base / "tokenizer.json").read_bytes()
    w1, w2 = load_file(base / "model.safetensors"), load_file(tmp_path / "three" / "model.safetensors")
    assert not all(torch.equal(w1[k], w2[k]) for k in w1)
    line = re.search(r"research stage from \w+, (\d+) invocations of (\d+) turns \(longest (\d+) tokens\) beside (\d+) pool",
                     " ".join(said))
    assert line and int(line.group(1)) == 2 * 40  # the researcher's turns of an episode are one row, the answerer's another
    assert int(line.group(2)) > int(line.group(1)) and 300 < int(line.group(3)) <= 1536
    first = int(re.search(r"embedded model: (\d+) teacher turns", " ".join(said)).group(1))
    assert int(line.group(4)) == first  # the base's pool, replayed


def test_build_is_deterministic_and_cached(tmp_path, monkeypatch):
    torch.set_num_threads(1)
    build_embedded(SMALL, tmp_path / "a", log=lambda *_: None)
    build_embedded(SMALL, tmp_path / "b", log=lambda *_: None)
    from safetensors.torch import load_file

    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert (tmp_path / "a" / "tokenizer.json").read_text() == (tmp_path / "b" / "tokenizer.json").read_text()
    monkeypatch.setenv("MAS_CACHE_DIR", str(tmp_path / "cache"))
    built = []

    def fake_build(recipe, out, log, progress):
        built.append(out)
        out.mkdir(parents=True)
        (out / "config.json").write_text("{}")
        write_manifest(out, recipe)

    monkeypatch.setattr("mas.embedded.build.build_embedded", fake_build)
    p1 = ensure_embedded(SMALL, log=lambda *_: None)
    p2 = ensure_embedded(SMALL, log=lambda *_: None)
    assert p1 == p2 and len(built) == 1 and str(p1).startswith(str(tmp_path / "cache"))
    assert ensure_embedded(Recipe(seed=1), log=lambda *_: None) != p1  # a different recipe is a different cache entry


# ---------------------------------------------------------------------------------------------
# shipped configs <-> warm-started formats
# ---------------------------------------------------------------------------------------------

# Teams from other frameworks (AutoGen, LangGraph) render messages their own way: their shipped
# configs run on the embedded model to show the wiring and train, but it was not warm-started on
# those formats (they borrow the quickstart's role prompts), and the not-warm-started warning says so.
# Configs that mix the embedded model with real models (configs/smol_heterogeneous.yaml) are real-model
# teams: their other agents speak formats of their own; only their embedded agents must use warm-started prompts.
FRAMEWORK_KINDS = ("autogen", "langgraph", "openai")  # teams in code: their prompts are the code's
_CONFIGS = sorted((ROOT / "configs").glob("*.yaml"))
_MODELS = {p: {pol.get("model") for pol in yaml.safe_load(p.read_text())["policies"].values()} for p in _CONFIGS}
_EMBEDDED = [p for p in _CONFIGS if _MODELS[p] == {"embedded"}]
# Configs with a format warm-up of their own (``trainer.warmup``: configs/cpu_facts.yaml, a research
# protocol the embedded model was never warm-started on; configs/team_fork_n*.yaml, the relay's prompt
# re-taught to answer at once more often than not) teach their prompts before RL instead.
_OWN_WARMUP = {p for p in _EMBEDDED if yaml.safe_load(p.read_text()).get("trainer", {}).get("warmup")}
EMBEDDED_CONFIGS = [p for p in _EMBEDDED if yaml.safe_load(p.read_text())["topology"]["kind"] not in FRAMEWORK_KINDS
                    and p not in _OWN_WARMUP]
MIXED_CONFIGS = [p for p in _CONFIGS if "embedded" in _MODELS[p] and len(_MODELS[p]) > 1]


FORK = ["team_fork_n2.yaml", "team_fork_n4.yaml", "team_fork_n8.yaml"]  # the relay's prompt, re-taught to answer at once


def test_the_configs_outside_the_warm_start_are_exactly_the_framework_teams_and_those_with_a_format_warmup():
    assert sorted(p.name for p in _EMBEDDED if p not in EMBEDDED_CONFIGS) == [
        "autogen_selector.yaml", "cpu_facts.yaml", "langgraph_custom.yaml", "openai_agents_as_tools.yaml",
        "openai_agents_handoffs.yaml", "openai_autogen_reflection.yaml", "openai_dspy_program.yaml",
        "openai_langgraph_evaluator.yaml", "openai_smolagents_manager.yaml", "openai_team.yaml", *FORK]
    assert sorted(p.name for p in _OWN_WARMUP) == [
        "cpu_facts.yaml", "openai_agents_as_tools.yaml", "openai_agents_handoffs.yaml", "openai_autogen_reflection.yaml",
        "openai_dspy_program.yaml", "openai_langgraph_evaluator.yaml", "openai_smolagents_manager.yaml", *FORK]


def test_every_format_names_shipped_configs_and_every_embedded_config_has_a_format():
    listed = {c for f in FORMATS.values() for c in f.configs}
    assert all((ROOT / c).is_file() for c in listed), sorted(c for c in listed if not (ROOT / c).is_file())
    assert {str(p.relative_to(ROOT)) for p in EMBEDDED_CONFIGS} == listed
    assert {"configs/cpu_orchestrator.yaml", "configs/cpu_debate.yaml", "configs/cpu_chain.yaml",
            "configs/cpu_graph.yaml", "configs/team_conjunctive.yaml", "configs/team_saboteur.yaml",
            "configs/team_relay_n2.yaml", "configs/team_relay_n4.yaml", "configs/team_relay_n8.yaml"} <= listed


@pytest.mark.parametrize("path", EMBEDDED_CONFIGS, ids=lambda p: p.stem)
def test_config_uses_exactly_the_warm_started_prompts(path):
    rel = str(path.relative_to(ROOT))
    fmt = next(f for f in FORMATS.values() if rel in f.configs)
    cfg = validate_config(yaml.safe_load(path.read_text()))
    assert all(p.model == "embedded" for p in cfg.policies.values())
    for agent in cfg.agents:
        spec = fmt.agents[agent.name]
        assert (agent.role, agent.parser) == (spec.role, spec.parser), agent.name
        assert agent.sampling.max_new_tokens >= spec.max_new_tokens, agent.name  # room for the longest taught reply
        assert (tuple(agent.tools), agent.max_tool_calls if agent.tools else 0) == (spec.tools, spec.max_tool_calls), agent.name
        assert not (agent.tools and agent.tools_prompt), agent.name  # the taught role says how to call them, as written
    taught = [t.model_dump() for t in fmt.topologies]
    free = {"seed", "heldout_fraction"}
    if fmt.any_size:  # a parts team of any size: the first k agents of the taught sequence, env.size = k
        k = len(cfg.topology.sequence)
        taught = [{**t, "sequence": t["sequence"][:k]} for t in taught]
        assert cfg.env.size == k
        free.add("size")
    assert cfg.topology.model_dump() in taught
    assert cfg.env.name == fmt.env.name
    assert {k: v for k, v in cfg.env.model_dump().items() if k not in free} == \
        {k: v for k, v in fmt.env.model_dump().items() if k not in free}



def test_there_is_a_mixed_config():
    assert [p.name for p in MIXED_CONFIGS] == ["smol_heterogeneous.yaml"]


@pytest.mark.parametrize("path", MIXED_CONFIGS, ids=lambda p: p.stem)
def test_embedded_agents_beside_real_models_use_warm_started_prompts(path):
    cfg = validate_config(yaml.safe_load(path.read_text()))
    specs = {(spec.role, spec.parser): spec for fmt in FORMATS.values() for spec in fmt.agents.values()}
    embedded = [a for a in cfg.agents if cfg.policies[a.policy].model == "embedded"]
    assert embedded
    for agent in embedded:
        spec = specs.get((agent.role, agent.parser))
        assert spec is not None, f"{agent.name}: {agent.role!r} ({agent.parser}) is no warm-started prompt"
        assert agent.sampling.max_new_tokens >= spec.max_new_tokens, agent.name


def test_the_research_stage_holds_the_pool_to_the_base_by_kl_at_the_labelled_positions():
    """KL(teacher || model) of the next-token distributions, averaged over the positions whose
    next token is labelled, by hand on a 2-token vocabulary, against a loop over positions."""
    import math
    from types import SimpleNamespace

    from mas.embedded.build import _distillation

    def fixed(logits):  # a "model" whose logits are given, [b, S, V]
        return lambda **_: SimpleNamespace(logits=torch.tensor(logits, requires_grad=True))

    teacher = fixed([[[0.0, math.log(3)], [0.0, 0.0], [math.log(3), 0.0]]])  # p = (1/4, 3/4), (1/2, 1/2), (3/4, 1/4)
    model = fixed([[[0.0, 0.0], [0.0, math.log(3)], [0.0, 0.0]]])           # q = (1/2, 1/2), (1/4, 3/4), (1/2, 1/2)
    batch = {"input_ids": torch.zeros(1, 3, dtype=torch.long), "attention_mask": torch.ones(1, 3, dtype=torch.long),
             "labels": torch.tensor([[-100, 5, 5]])}  # tokens 1 and 2 labelled: positions 0 and 1 predict them
    kl0 = 0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5)
    kl1 = 0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75)
    got = _distillation(model, teacher, batch)
    assert got.item() == pytest.approx((kl0 + kl1) / 2)  # position 2 predicts nothing labelled: left out
    p = torch.softmax(teacher().logits[0].detach(), -1)
    q = torch.softmax(model().logits[0].detach(), -1)
    loop = [sum(float(p[t, v]) * math.log(float(p[t, v]) / float(q[t, v])) for v in range(2)) for t in (0, 1)]
    assert got.item() == pytest.approx(sum(loop) / 2)
    same = _distillation(teacher, teacher, batch)
    assert same.item() == pytest.approx(0.0, abs=1e-7)

"""The facts env: a generated two-hop research task.  The world is deterministic and pinned, held-out
questions name nothing a training question names, every question can be answered by searching
(a scripted searcher that reads only tool results finds every answer), the search results hide
what the design says they hide, and scores and turn verification read the tool turns."""

from __future__ import annotations

import hashlib
import re

import pytest
from typing import Annotated, Union

from pydantic import Field, TypeAdapter, ValidationError

from mas.tools import ToolCall, run_tool_call
from mas.envs import ENV_CONFIGS, ENV_TOOLS, build_env
from mas.envs.research import FactsConfig, FactsEnv, generate_world
from mas.envs.research.facts import QUESTION, Chain
from mas.types import Episode, Task, Turn

CFG = FactsConfig(name="facts")
EnvSection = Annotated[Union[ENV_CONFIGS], Field(discriminator="name")]


@pytest.fixture(scope="module")
def env() -> FactsEnv:
    return build_env(CFG)


def digest(world) -> str:
    return hashlib.sha256("\n".join(f"{p.title}|{p.text}" for p in world.paragraphs()).encode()).hexdigest()


def test_the_world_is_the_same_for_a_seed_and_differs_between_seeds():
    a, b = generate_world(0, 400, 100, 16), generate_world(0, 400, 100, 16)
    assert a == b and digest(a) == digest(b)
    assert digest(generate_world(1, 400, 100, 16)) != digest(a)


def test_the_default_world_is_pinned(env):
    world = env.world
    assert len(world.chains) == 500 and len(world.cities) == 16 and len(env.corpus) == 1016
    assert world.chains[0] == Chain(person="Bedro Truviin", birthplace="Lorwick", job="luthier", founded=1986,
                                    org="Driora Company", kind="trading company", city="Pelford", members=362)
    assert env.eval_tasks(1)[0].prompt == "In which city is the organisation that Stigrul Fubrain founded?"
    assert digest(world) == "b1c8fd539dcae6cf4de0a0d5edd54b7724fc7b8f551d78311b823ad914ee778f"


def test_the_world_does_not_depend_on_the_stream_seed():
    assert digest(build_env(FactsConfig(name="facts", seed=7)).world) == digest(generate_world(0, 400, 100, 16))


def test_held_out_questions_name_no_entity_of_a_training_question(env):
    train_text = " ".join(t.prompt for t in env.sample_tasks(env.num_train))
    train_words = set(re.findall(r"\w+", train_text))
    held_out = env.world.held_out
    assert len(held_out) == env.num_eval == 100
    for c in held_out:
        # the person's surname and the organisation's own word are in no training question
        assert c.person.split()[1] not in train_words and c.org.split()[0] not in train_words
        assert c.person not in train_text and c.org not in train_text
    train_entities = {e for c in env.world.train for e in (c.person, c.org)}
    assert not train_entities & {e for c in held_out for e in (c.person, c.org)}
    # every supporting paragraph of a held-out question is reached by no training question
    train_support = {t for task in env.sample_tasks(env.num_train) for t in task.meta["supporting"]}
    assert not train_support & {t for task in env.eval_tasks(env.num_eval) for t in task.meta["supporting"]}


def test_the_answer_is_never_the_birthplace_and_every_chain_is_its_own(env):
    chains = env.world.chains
    assert all(c.city != c.birthplace for c in chains)
    assert len({c.person for c in chains}) == len({c.org for c in chains}) == len(chains)
    assert {c.city for c in chains} <= {p.title for p in env.world.cities}


def call(env: FactsEnv, name: str, **arguments) -> str:
    record, observation = run_tool_call(ToolCall(name, arguments), env.tools)
    assert record["valid"], observation
    return observation


def scripted_search(env: FactsEnv, question: str) -> tuple[str, list[str]]:
    """Answer a question from tool results only: search the person the question names, read the
    top result, search the organisation the paragraph says they founded, take the city its result
    names.  Returns the answer and the tool observations."""
    before, after = QUESTION.split("{person}")
    person = re.fullmatch(re.escape(before) + "(.+)" + re.escape(after), question).group(1)
    found = call(env, "search", query=person)
    title = re.search(r"^1\. (.+?): ", found, re.MULTILINE).group(1)
    paragraph = call(env, "read", title=title)
    org = re.search(r"founded the (.+?) in \d+\.", paragraph).group(1)
    second = call(env, "search", query=org)
    city = re.search(r"^1\. .+?: The .+? is based in (\w+)\.", second, re.MULTILINE).group(1)
    return city, [found, paragraph, second]


def test_a_scripted_searcher_answers_every_question(env):
    tasks = env.sample_tasks(env.num_train) + env.eval_tasks(env.num_eval)
    answers = [scripted_search(env, t.prompt)[0] for t in tasks]
    assert [a for a, t in zip(answers, tasks) if a != t.answer] == []
    assert len(tasks) == 500


def test_a_persons_search_result_shows_the_birthplace_and_hides_the_organisation(env):
    for c in env.world.chains:
        found = call(env, "search", query=c.person)
        first = found.splitlines()[1]
        assert first.startswith(f"1. {c.person}: ") and c.birthplace in first and c.org not in first
        assert c.city not in found.splitlines()[1]
        assert f"1. {c.org}: The {c.org} is based in {c.city}." in call(env, "search", query=c.org)


def episode_with(task: Task, observations: list[list[str]], answer: str | None) -> Episode:
    turns = [Turn(agent="researcher", policy="p", index=i, parent=None, messages=[], prompt_ids=[], completion_ids=[], logprobs=[],
                  text="<tool_call>..</tool_call>", observations=obs,
                  tool_calls=[{"name": "search", "arguments": {}, "valid": True, "error": None}] * len(obs))
             for i, obs in enumerate(observations)]
    return Episode(task=task, group_id=0, sample_id=0, seed=0, turns=turns, answer=answer)


def test_score_records_em_f1_and_whether_the_tool_calls_reached_both_paragraphs(env):
    task = env.eval_tasks(1)[0]
    _, (found, paragraph, second) = scripted_search(env, task.prompt)
    one_hop = episode_with(task, [[found]], "Harhaven")
    assert env.score(one_hop) == 0.0
    assert one_hop.info["scores"] == {"em": 0.0, "f1": 0.0, "support_any": 1.0, "support_all": 0.0}
    both = episode_with(task, [[found], [paragraph], [second]], f"the {task.answer}.")
    assert env.score(both) == 1.0
    assert both.info["scores"] == {"em": 1.0, "f1": 1.0, "support_any": 1.0, "support_all": 1.0}
    assert build_env(FactsConfig(name="facts", reward="f1")).score(episode_with(task, [], f"{task.answer} city")) == pytest.approx(2 / 3)
    assert env.score(episode_with(task, [], None)) == 0.0


def test_the_turn_verifier_scores_a_tool_turn_by_whether_it_reached_a_supporting_paragraph(env):
    task = env.eval_tasks(1)[0]
    c = env.world.held_out[0]
    ep = episode_with(task, [[call(env, "search", query=c.person)], [call(env, "search", query=c.birthplace)]], None)
    assert [env.verify_turn(ep, t) for t in ep.turns] == [1.0, 0.0]
    ep.turns[0].tool_calls = []
    assert env.verify_turn(ep, ep.turns[0]) is None  # a turn without tool calls is the outcome's to judge


def test_the_config_is_an_env_section_with_the_research_tools():
    section = TypeAdapter(EnvSection).validate_python({"name": "facts", "num_eval": 20})
    assert isinstance(section, FactsConfig) and section.num_eval == 20
    assert ENV_TOOLS["facts"] == ("search", "read")
    with pytest.raises(ValidationError, match="num_cities"):
        FactsConfig(name="facts", num_cities=1)
    with pytest.raises(ValidationError, match="extra"):
        FactsConfig(name="facts", path="x")
    FactsConfig(name="facts", num_train=400, num_eval=100)  # the largest world: 500 chains
    with pytest.raises(ValidationError, match="num_train \\+ num_eval is 501"):
        FactsConfig(name="facts", num_train=401, num_eval=100)


def test_the_stream_resumes_and_eval_is_a_prefix(env):
    fresh = build_env(CFG)
    fresh.sample_tasks(7)
    state = fresh.state_dict()
    again = build_env(CFG)
    again.load_state_dict(state)
    assert [t.task_id for t in again.sample_tasks(5)] == [t.task_id for t in fresh.sample_tasks(5)]
    assert fresh.eval_tasks(3) == fresh.eval_tasks(10)[:3]
    with pytest.raises(ValueError, match="held-out"):
        fresh.eval_tasks(101)

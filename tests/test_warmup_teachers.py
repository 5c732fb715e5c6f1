"""The scripted teachers of the real-model teams (mas/training/warmup.py): where each reads its task in a
framework's messages, what it writes, its deliberate weakness, and that it knows training tasks
only.  Hand-made requests, no model."""

from __future__ import annotations

import json
import random

import pytest

from mas.agents.parsers import parse_answer, parse_verdict
from mas.tools import parse_tool_calls, tool_results_message
from mas.rollout.backends.base import GenRequest
from mas.topologies.teaching import ChainTeacher, FactsTeacher
from mas.envs.math.gsm8k import SAMPLE_DIR, GSM8KConfig
from mas.envs.research import FactsConfig, FactsEnv
from mas.envs.research.hotpotqa import HotpotQAConfig, HotpotQAEnv
from mas.topologies.framework_teaching import (FrameworkChainTeacher, SelectorTeacher, arithmetic_task, chain_transcript,
                                               claimed_answer)
from mas.topologies.task_teaching import Facts, ResearchTeacher, SolutionChainTeacher, gsm8k_solutions, hotpotqa_facts

RNG = random.Random(0)


def req(agent: str, *messages: tuple[str, str]) -> GenRequest:
    return GenRequest(policy="p", prompt_ids=[1], temperature=1.0, top_p=1.0, top_k=0, max_new_tokens=8, agent=agent,
                      messages=[{"role": r, "content": c} for r, c in messages])


# ---------------------------------------------------------------------------------------------
# reading the task where a framework puts it
# ---------------------------------------------------------------------------------------------

AUTOGEN_SELECTOR = ("user: 8-5\n\n\nWho should solve this task, ['adder', 'subtractor']? Reply with one name.")


@pytest.mark.parametrize("messages, task", [
    ([("system", "You are the adder. For 3+4 reply ANSWER: 7"), ("user", "8-5")], "8-5"),  # an AutoGen participant
    ([("system", "Route: adder for 3+4."), ("user", AUTOGEN_SELECTOR)], "8-5"),  # the AutoGen selector's history
    ([("user", "adder: 3+4 is 7\nuser: 9 - 2\nWho next?")], "9-2"),  # a 'user: ' line wins over quoted agents
    ([("user", AUTOGEN_SELECTOR), ("assistant", "I pick 3+4"), ("user", "No valid name was mentioned.")], "8-5"),
    ([("user", "5-2 = 3?")], "5-2"),  # the embedded LangGraph graph's checker
    ([("user", "Task: 1-6\nProposed answer: -5")], "1-6"),  # examples/graphs.py build_smol's checker
    ([("user", "Question: 12+7-3")], "12+7-3"),
])
def test_arithmetic_task_is_read_where_the_framework_put_it(messages, task):
    assert arithmetic_task([{"role": r, "content": c} for r, c in messages]) == task


@pytest.mark.parametrize("text", ["What is the capital of France?", "version 3.5-2", "x2-4", ""])
def test_no_arithmetic_task_is_an_error(text):
    with pytest.raises(ValueError, match="no arithmetic task"):
        arithmetic_task([{"role": "user", "content": text}])


def test_arithmetic_task_reads_degenerate_text_in_linear_time():
    text = "1" + " -" * 200_000 + "x"  # a backtracking pattern would take quadratic time here
    with pytest.raises(ValueError):
        arithmetic_task([{"role": "user", "content": text}])


@pytest.mark.parametrize("text, claim", [
    ("5-2 = 3?", "3"), ("Task: 5-2\nProposed answer: -3", "-3"), ("Task: 5-2\nProposed answer: (none)", None),
    ("Task: 5 - 2\nProposed answer: 5-2=3", "3"),
])
def test_claimed_answer_is_the_last_number_after_the_task(text, claim):
    assert claimed_answer(text, "5-2") == claim


def test_chain_transcript_keeps_multi_line_turns_together():
    text = "Task: Tom has 3 apples.\nHow many?\nsolver: 3 apples.\nThat is all.\nANSWER: 3\nverifier: REJECT\nsolver: ANSWER: 4"
    task, turns = chain_transcript(text, ("solver", "verifier"))
    assert task == "Tom has 3 apples.\nHow many?"
    assert turns == [("solver", "3 apples.\nThat is all.\nANSWER: 3"), ("verifier", "REJECT"), ("solver", "ANSWER: 4")]


# ---------------------------------------------------------------------------------------------
# LangGraph solver/checker: the chain teacher on the framework's messages
# ---------------------------------------------------------------------------------------------


def framework_teacher(**knobs) -> FrameworkChainTeacher:
    return FrameworkChainTeacher(ChainTeacher(solver="solver", **knobs), solver="solver", checker="checker")


def test_framework_solver_answers_at_once_or_works_it_out():
    first = req("solver", ("system", "Compute it."), ("user", "9-4"))
    assert framework_teacher(p_direct=1.0, p_slip=0.0)(first, RNG) == "ANSWER: 5"
    assert framework_teacher(p_direct=0.0)(first, RNG) == "9-4=5 ANSWER: 5"
    slips = {framework_teacher(p_direct=1.0, p_slip=1.0)(first, random.Random(s)) for s in range(20)}
    assert "ANSWER: 5" not in slips and all(parse_answer(t)[1] for t in slips)  # near misses, still in the format


def test_a_rejected_framework_solver_always_works_it_out():
    retry = req("solver", ("user", "9-4"), ("assistant", "ANSWER: 6"), ("user", "The checker said: 9-4=5 REJECT\nSolve it again."))
    assert framework_teacher(p_direct=1.0)(retry, RNG) == "9-4=5 ANSWER: 5"


@pytest.mark.parametrize("message", ["Task: 9-4\nProposed answer: {}", "9-4 = {}?"])
def test_framework_checker_rejects_wrong_answers_and_accepts_right_ones(message):
    wrong = req("checker", ("user", message.format(6)))
    right = req("checker", ("user", message.format(5)))
    assert parse_verdict(framework_teacher(p_lazy=0.0)(wrong, RNG))[0]["verdict"] == "reject"
    assert framework_teacher(p_lazy=1.0)(right, RNG) == "ACCEPT"  # the lazy rubber stamp (the weakness)
    assert framework_teacher(p_lazy=0.0)(right, RNG) == "9-4=5 ACCEPT"
    nothing = req("checker", ("user", "Task: 9-4\nProposed answer: (none)"))
    assert parse_verdict(framework_teacher()(nothing, RNG))[0]["verdict"] == "reject"


# ---------------------------------------------------------------------------------------------
# AutoGen selector team
# ---------------------------------------------------------------------------------------------

ROUTES = (("+", "adder"), ("-", "subtractor"))


def test_selector_routes_by_operation_and_misroutes_as_told():
    ask = req("selector", ("system", "Route adder for 3+4"), ("user", AUTOGEN_SELECTOR))
    assert SelectorTeacher("selector", ROUTES, p_misroute=0.0)(ask, RNG) == "subtractor"
    assert SelectorTeacher("selector", ROUTES, p_misroute=1.0)(ask, RNG) == "adder"
    picks = [SelectorTeacher("selector", ROUTES, p_misroute=0.4)(ask, random.Random(s)) for s in range(400)]
    assert 0.3 < picks.count("adder") / len(picks) < 0.5


def test_each_specialist_does_its_own_operation():
    teacher = SelectorTeacher("selector", ROUTES)
    assert teacher(req("subtractor", ("system", "..."), ("user", "8-5")), RNG) == "ANSWER: 3"
    assert teacher(req("adder", ("system", "..."), ("user", "8-5")), RNG) == "ANSWER: 13"  # misrouted: wrong, by design
    assert teacher(req("adder", ("user", "8+5")), RNG) == "ANSWER: 13"


# ---------------------------------------------------------------------------------------------
# GSM8K solver/verifier
# ---------------------------------------------------------------------------------------------

Q = "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips did Natalia sell altogether in April and May?"
WORKED = "Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 clips altogether in April and May. ANSWER: 72"


def gsm8k_teacher(**knobs) -> SolutionChainTeacher:
    return SolutionChainTeacher(solutions={Q: (WORKED, "72")}, **knobs)


def test_gsm8k_solutions_are_the_training_problems_worked_solutions_without_annotations():
    solutions = gsm8k_solutions(GSM8KConfig(name="gsm8k", source="sample"))
    assert len(solutions) == 200  # the sample's training split
    assert solutions[Q] == (WORKED, "72")
    assert all("<<" not in w and "####" not in w and w.endswith(f"ANSWER: {a}") for w, a in solutions.values())
    held_out = [json.loads(line)["question"] for line in (SAMPLE_DIR / "gsm8k_test_sample.jsonl").read_text().splitlines()]
    assert not {" ".join(q.split()) for q in held_out} & set(solutions)
    assert all(parse_answer(w)[0]["answer"] == a for w, a in solutions.values())


def test_gsm8k_solver_answers_at_once_or_writes_the_worked_solution():
    first = req("solver", ("system", "Solve."), ("user", f"Task: {Q}"))
    assert gsm8k_teacher(p_direct=0.0)(first, RNG) == WORKED
    assert gsm8k_teacher(p_direct=1.0, p_slip=0.0)(first, RNG) == "ANSWER: 72"
    assert gsm8k_teacher(p_direct=1.0, p_slip=1.0)(first, RNG) in {"ANSWER: 70", "ANSWER: 71", "ANSWER: 73", "ANSWER: 74"}
    retry = req("solver", ("user", f"Task: {Q}\nsolver: ANSWER: 71\nverifier: REJECT"))
    assert gsm8k_teacher(p_direct=1.0)(retry, RNG) == WORKED


def test_gsm8k_verifier_reads_a_multi_line_solution_and_checks_it_against_the_gold():
    right = req("verifier", ("user", f"Task: {Q}\nsolver: 48/2 = 24 in May.\n48 + 24 = 72.\nANSWER: 72"))
    wrong = req("verifier", ("user", f"Task: {Q}\nsolver: 48/2 = 24 in May.\nANSWER: 24"))
    unparsed = req("verifier", ("user", f"Task: {Q}\nsolver: I do not know."))
    assert gsm8k_teacher(p_lazy=1.0)(right, RNG) == "ACCEPT"
    assert parse_verdict(gsm8k_teacher(p_lazy=0.0)(right, RNG))[0]["verdict"] == "accept"
    assert gsm8k_teacher()(wrong, RNG) == "REJECT"
    assert gsm8k_teacher()(unparsed, RNG) == "REJECT"


def test_gsm8k_teacher_knows_training_problems_only():
    with pytest.raises(KeyError, match="training problems only"):
        gsm8k_teacher()(req("solver", ("user", "Task: A held-out problem?")), RNG)


# ---------------------------------------------------------------------------------------------
# HotpotQA researcher -> answerer
# ---------------------------------------------------------------------------------------------

HQ = "Who wrote the 1959 story?"
PARAGRAPH = "Mrs. Bixby: \"Mrs. Bixby\" is a short story. It was written by Roald Dahl in 1959. It was adapted for TV."
FACTS = Facts(answers=("Roald Dahl",), supporting=("Mrs. Bixby", "Roald Dahl"), read="Mrs. Bixby")
SEARCH = ('search("Who wrote the 1959 story?", k=2): 2 result(s)\n1. Kiss and Tell: a 1945 film ...\n'
          '2. Mrs. Bixby: "Mrs. Bixby" is a short story ...')


def research(**knobs) -> ResearchTeacher:
    return ResearchTeacher(questions={HQ: FACTS}, researcher="researcher", **knobs)


def researcher_turn(rounds: list[tuple[str, str]], p_direct: float = 0.0, seed: int = 0) -> str:
    messages = [("system", "You find facts."), ("user", f"Task: {HQ}")]
    for call, result in rounds:
        messages += [("assistant", call), ("user", f"<tool_response>\n{result}\n</tool_response>\n(tool calls left: 1)")]
    return research(p_direct=p_direct)(req("researcher", *messages), random.Random(seed))


def test_researcher_searches_with_the_question_then_reads_the_paragraph_that_holds_the_answer():
    search = parse_tool_calls(researcher_turn([]))
    assert [(c.name, c.arguments) for c in search] == [("search", {"query": HQ})]
    read = parse_tool_calls(researcher_turn([("<tool_call>...</tool_call>", SEARCH)]))
    assert [(c.name, c.arguments) for c in read] == [("read", {"title": "Mrs. Bixby"})]
    reply = researcher_turn([("s", SEARCH), ("r", PARAGRAPH)])
    assert reply == "Mrs. Bixby: It was written by Roald Dahl in 1959."


def test_researcher_replies_from_the_search_results_at_once_with_p_direct():
    reply = researcher_turn([("s", SEARCH)], p_direct=1.0)
    assert "<tool_call>" not in reply and reply == "Kiss and Tell: a 1945 film"


def test_researcher_replies_when_its_tool_budget_is_spent():
    messages = [("user", f"Task: {HQ}"), ("assistant", "s"),
                ("user", f"<tool_response>\n{SEARCH}\n</tool_response>\nYou have used all your tool calls. Reply now, without a tool call.")]
    assert "<tool_call>" not in research()(req("researcher", *messages), RNG)


def test_answerer_answers_from_the_evidence_or_guesses():
    read = f"Task: {HQ}\nresearcher: <tool_call>s</tool_call>\n<tool_response>\n{SEARCH}\n</tool_response>\nresearcher: It was written by Roald Dahl."
    unread = f"Task: {HQ}\nresearcher: <tool_call>s</tool_call>\n<tool_response>\n{SEARCH}\n</tool_response>\nresearcher: Kiss and Tell: a 1945 film"
    assert research()(req("answerer", ("user", read)), RNG) == "ANSWER: Roald Dahl"
    assert research()(req("answerer", ("user", unread)), RNG) == "ANSWER: Kiss and Tell"  # the guess: top result's title


def test_hotpotqa_facts_cover_the_training_questions_and_read_the_paragraph_with_the_answer():
    cfg = HotpotQAConfig(name="hotpotqa", source="sample")
    facts = hotpotqa_facts(cfg)
    env = HotpotQAEnv(cfg)
    assert len(facts) == env.num_train == 150
    assert not {" ".join(t.prompt.split()) for t in env.eval_tasks(env.num_eval)} & set(facts)  # training only
    holds = sum(any(a.lower() in env.corpus.get(f.read).text.lower() for a in f.answers) for f in facts.values())
    assert holds == len(facts)  # in the sample every answer is in a supporting paragraph
    with pytest.raises(KeyError, match="training questions only"):
        research()(req("researcher", ("user", "Task: another question")), RNG)


# ---------------------------------------------------------------------------------------------
# researcher -> answerer on the generated two-hop facts
# ---------------------------------------------------------------------------------------------

FACTS_ENV = FactsEnv(FactsConfig(name="facts"))
CHAIN = FACTS_ENV.world.train[0]  # Bedro Truviin, born in Lorwick, founded the Driora Company, based in Pelford
CITIES = tuple(p.title for p in FACTS_ENV.world.cities)


def facts_teacher(**knobs) -> FactsTeacher:
    return FactsTeacher(researcher="researcher", **knobs)


def tool(name: str, **arguments) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


def facts_researcher(rounds: list[str], seed: int = 0, left: int = 1, **knobs) -> str:
    """The researcher's next turn after the calls ``rounds``, each answered by the env's own tool."""
    messages = [("system", "You find facts."), ("user", f"Task: {CHAIN.question}")]
    for call in rounds:
        (c,) = parse_tool_calls(call)
        messages += [("assistant", call), ("user", tool_results_message([FACTS_ENV.tools[c.name].fn(**c.arguments)], left))]
    return facts_teacher(**knobs)(req("researcher", *messages), random.Random(seed))


def calls_of(text: str) -> list[tuple[str, dict]]:
    return [(c.name, c.arguments) for c in parse_tool_calls(text)]


def test_facts_researcher_searches_reads_searches_again_and_names_the_city():
    knobs = {"p_direct": 0.0, "p_detour": 0.0}
    path = []
    while True:
        turn = facts_researcher(path, **knobs)
        if "<tool_call>" not in turn:
            break
        path.append(turn)
    assert [calls_of(t)[0] for t in path] == [("search", {"query": "Bedro Truviin"}), ("read", {"title": "Bedro Truviin"}),
                                              ("search", {"query": "Driora Company"})]
    assert turn == "Pelford."  # the city alone: the embedded model copies the last name it read


def test_facts_researcher_replies_after_one_search_with_p_direct_and_detours_with_p_detour():
    first = tool("search", query=CHAIN.person)
    assert facts_researcher([first], p_direct=1.0) == "Lorwick."  # the birthplace: a wrong answer
    read = tool("read", title=CHAIN.person)
    assert calls_of(facts_researcher([first, read], p_direct=0.0, p_detour=1.0)) == [("search", {"query": "Lorwick"})]
    detour = tool("search", query=CHAIN.birthplace)
    assert calls_of(facts_researcher([first, read, detour], p_detour=1.0)) == [("search", {"query": "Driora Company"})]
    directs = sum("<tool_call>" not in facts_researcher([first], seed=s, p_direct=0.6) for s in range(400))
    assert 200 <= directs <= 280  # 60% of 400


def test_facts_researcher_replies_when_its_budget_is_spent():
    first, read = tool("search", query=CHAIN.person), tool("read", title=CHAIN.person)
    assert facts_researcher([first, read], left=0, p_direct=0.0) == "Lorwick."


def test_facts_teacher_copies_from_what_it_read_so_it_plays_any_question_of_any_world():
    """It knows no world: a held-out question and another corpus seed's world are played alike
    (which questions a warm-up poses is its task stream's business: training ones only)."""
    for env in (FACTS_ENV, FactsEnv(FactsConfig(name="facts", corpus_seed=7))):
        chain = env.world.held_out[0]
        messages = [("system", "r"), ("user", f"Task: {chain.question}")]
        teacher, rng, turn = facts_teacher(p_direct=0.0, p_detour=0.0), random.Random(0), ""
        for _ in range(4):
            turn = teacher(req("researcher", *messages), rng)
            if "<tool_call>" not in turn:
                break
            (c,) = parse_tool_calls(turn)
            messages += [("assistant", turn), ("user", tool_results_message([env.tools[c.name].fn(**c.arguments)], 3))]
        assert turn == f"{chain.city}."


def test_facts_answerer_answers_the_city_of_the_researchers_reply():
    evidence = (f"Task: {CHAIN.question}\nresearcher: {tool('search', query=CHAIN.person)}\n<tool_response>\n"
                f"1. Bedro Truviin: Bedro Truviin was born in Lorwick and ...\n</tool_response>\nresearcher: ")
    teacher = facts_teacher()
    assert teacher(req("answerer", ("user", evidence + "Pelford.")), RNG) == "ANSWER: Pelford"
    assert teacher(req("answerer", ("user", evidence + "Lorwick.")), RNG) == "ANSWER: Lorwick"
    # a sentence ending in the city (a reply template of another team) is read the same way
    assert teacher(req("answerer", ("user", evidence + "The Driora Company is based in Pelford.")), RNG) == "ANSWER: Pelford"


def test_facts_reply_template_is_the_teachers_knob():
    first, read, second = tool("search", query=CHAIN.person), tool("read", title=CHAIN.person), tool("search", query=CHAIN.org)
    sentence = "The city is {city}."
    assert facts_researcher([first, read, second], p_direct=0.0, p_detour=0.0, reply=sentence) == "The city is Pelford."
    assert facts_researcher([first], p_direct=1.0, reply=sentence) == "The city is Lorwick."


@pytest.mark.parametrize("reply", ["Found it.", "{city} is the city", "The city: {city}", "{town}.", "{city."])
def test_a_facts_reply_template_the_answerer_cannot_read_is_refused(reply):
    with pytest.raises(ValueError, match="must end with"):
        FactsTeacher(reply=reply)

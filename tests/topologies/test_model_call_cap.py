"""The cap on a framework team's model calls, derived from the team's own termination (issue 54).

AutoGen's SelectorGroupChat "web search / analysis" team stops after 25 messages, and each
speaker selection may take 3 model calls: up to 25 x (3 + 1) = 100 calls, past the old fixed cap
of 64, so every long episode failed as a team that "never terminates".  Now:

* left out, ``topology.max_model_calls`` is derived from what the team's termination allows (a
  factory's team is read as it is built; a LangGraph graph's ``recursion_limit``);
* ``mas validate`` warns when a cap set in the config is below that;
* the message at the cap says what was seen, and that the termination had not been reached;
  only a team with no readable termination is said to perhaps never end.
"""

from __future__ import annotations

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.teams import SelectorGroupChat
from team_helpers import team_config
from test_engine import scripted_engine
from test_framework_limits import TASKS, guarded_rollout

from mas.config.checks import config_warnings, meaning_errors
from mas.config.schema import validate_config
from mas.topologies.autogen import autogen_shape, team_bound, yaml_bound
from mas.topologies.autogen_client import MasModelClient
from mas.topologies.registry import get_topology

SPECIALISTS = ("planning_agent", "web_search_agent", "data_analyst_agent")


def search_web(query: str) -> str:
    """Search the web for information."""
    return "no results"


def percentage_change(start: float, end: float) -> float:
    """Percentage change between two numbers."""
    return (end - start) / start * 100


def web_search_team(clients):
    """The AgentChat docs' selector team: a planner, two specialists with tools, and a stop on
    TERMINATE or after 25 messages; the selector's model calls go to the mas agent 'selector'."""
    planner = AssistantAgent("planning_agent", clients["planning_agent"], system_message="You plan.",
                             description="Plans the work.")
    searcher = AssistantAgent("web_search_agent", clients["web_search_agent"], tools=[search_web],
                              system_message="You search.", description="Searches the web.")
    analyst = AssistantAgent("data_analyst_agent", clients["data_analyst_agent"], tools=[percentage_change],
                             system_message="You analyse.", description="Computes changes.")
    termination = TextMentionTermination("TERMINATE") | MaxMessageTermination(max_messages=25)
    return SelectorGroupChat([planner, searcher, analyst], model_client=clients["selector"],
                             termination_condition=termination, allow_repeated_speaker=True)


def selector_config(**topology) -> dict:
    cfg = team_config("m", "chain")
    cfg["agents"] = [{"name": "selector", "policy": "main", "role": "You pick.", "parser": "raw",
                      "sampling": {"max_new_tokens": 6}}] + [
        {"name": n, "policy": "main", "role": "You work.", "parser": "answer", "sampling": {"max_new_tokens": 6}}
        for n in SPECIALISTS]
    cfg["policies"].pop("judge")
    cfg["topology"] = {"kind": "autogen", "factory": "test_model_call_cap:web_search_team", **topology}
    return cfg


def never_picks(req) -> str:
    """The selector never names a speaker (AutoGen tries 3 times, then keeps the last one); nobody says TERMINATE."""
    return "hmm" if req.agent == "selector" else "still working"


def test_the_docs_selector_team_reads_as_100_calls():
    team = web_search_team({n: MasModelClient(None, n) for n in ("selector", *SPECIALISTS)})
    bound = team_bound(team)
    assert bound is not None and bound.calls == 25 * (3 + 1) == 100
    assert bound.termination == "max 25 messages" and bound.how == "25 messages x (3 selector tries + 1 call per message)"
    assert get_topology("autogen").turn_limit(validate_config(selector_config()).topology) == 100


def test_left_out_the_cap_lets_the_selector_team_reach_its_own_termination(tiny_tokenizer):
    """Under the old fixed cap of 64 this episode failed at call 65; it ends by its 25 messages."""
    engine, backend = scripted_engine(selector_config(), never_picks, tiny_tokenizer)
    (ep,) = guarded_rollout(engine, TASKS[:1])
    assert ep.status == "ok", ep.error
    assert backend.requests == 24 * 4  # 24 messages after the task, each after 3 selector tries
    assert engine.take_faults()[0]["model_call_limit"] == 0


def test_a_cap_set_below_the_termination_is_a_validate_warning_and_a_stop_worded_by_what_was_seen(tiny_tokenizer):
    cfg = validate_config(selector_config(max_model_calls=64), check=meaning_errors)
    (warning,) = [w for w in config_warnings(cfg) if w[0] == ("topology", "max_model_calls")]
    assert warning[1] == 64 and warning[2].startswith(
        "topology.max_model_calls=64 is below the ~100 model calls the team's termination allows (25 messages x "
        "(3 selector tries + 1 call per message))")
    assert not [w for w in config_warnings(validate_config(selector_config(max_model_calls=100))) if w[0][0] == "topology"]
    assert not [w for w in config_warnings(validate_config(selector_config())) if w[0][0] == "topology"]

    engine, backend = scripted_engine(selector_config(max_model_calls=10), never_picks, tiny_tokenizer)
    (ep,) = guarded_rollout(engine, TASKS[:1])
    assert ep.status == "error" and backend.requests == 10
    assert ep.error.startswith("model call limit: the team made 10 model calls in this episode (selector 8, planning_agent 2)")
    assert "stopped at the cap of topology.max_model_calls=10 after 3 messages (the task's included)" in ep.error
    assert "the team's termination (max 25 messages) had not been reached" in ep.error
    assert "never" not in ep.error and "raise topology.max_model_calls" in ep.error


def test_a_yaml_team_reads_its_termination_from_the_config_as_from_the_team_it_builds():
    """``yaml_bound`` (validate, no team built) and ``team_bound`` (the team an episode runs) agree."""
    from types import SimpleNamespace

    from mas.topologies.autogen import AutogenTeam

    cfg = selector_config()
    cfg["topology"] = {"kind": "autogen", "team": "selector", "selector": "selector",
                       "termination": {"text": "TERMINATE", "max_messages": 25}}
    run = validate_config(cfg, check=meaning_errors)
    agents = {a.name: SimpleNamespace(role=a.role, tools=(), max_tool_calls=a.max_tool_calls) for a in run.agents}
    ctx = SimpleNamespace(agents=agents, tools={})
    clients = {n: MasModelClient(None, n) for n in agents}
    built = AutogenTeam(run.topology)._yaml_team(ctx, clients)
    assert team_bound(built) == yaml_bound(run.topology, run.agent_names, {}) and team_bound(built).calls == 100
    # with max_turns below the message count, the turns bound the team
    short = run.topology.model_copy(update={"max_turns": 5})
    assert yaml_bound(short, run.agent_names, {}).how == "5 turns x (3 selector tries + 1 call per message)"
    assert autogen_shape(run.topology, run.agent_names)[0] == "selector"


def test_a_team_with_tools_counts_their_iterations_and_the_reflection():
    from autogen_agentchat.teams import RoundRobinGroupChat

    clients = {n: MasModelClient(None, n) for n in ("a", "b")}
    a = AssistantAgent("a", clients["a"], tools=[search_web], max_tool_iterations=3, reflect_on_tool_use=True)
    b = AssistantAgent("b", clients["b"])
    team = RoundRobinGroupChat([a, b], termination_condition=MaxMessageTermination(10) & MaxMessageTermination(12))
    bound = team_bound(team)
    assert bound.calls == 12 * (3 + 1) and bound.how == "12 messages x 4 calls per message"
    assert team_bound(RoundRobinGroupChat([a, b], termination_condition=TextMentionTermination("X"))) is None


# --- LangGraph: the recursion_limit is the graph's termination ---------------------------------------


def graph_config(**topology) -> dict:
    cfg = team_config("m", "chain")
    cfg["topology"] = {"kind": "langgraph", "builder": "test_framework_limits:endless_graph", "answer_key": "answer",
                       **topology}
    return cfg


def test_a_graph_runs_to_its_recursion_limit_rather_than_the_old_cap(tiny_tokenizer):
    engine, backend = scripted_engine(graph_config(recursion_limit=100), lambda req: "ANSWER: 4", tiny_tokenizer)
    (ep,) = guarded_rollout(engine, TASKS[:1])
    assert ep.status == "truncated" and backend.requests == 100  # one model call per super-step, 100 steps
    assert engine.take_faults()[0]["model_call_limit"] == 0
    assert get_topology("langgraph").turn_limit(validate_config(graph_config(recursion_limit=100)).topology) == 100
    assert get_topology("langgraph").turn_limit(validate_config(graph_config()).topology) == 64  # 25 steps: the default


def test_a_graph_cap_below_its_recursion_limit_is_said_at_validate_and_at_the_stop(tiny_tokenizer):
    cap = 70
    cfg = validate_config(graph_config(recursion_limit=100, max_model_calls=cap), check=meaning_errors)
    (warning,) = [w for w in config_warnings(cfg) if w[0] == ("topology", "max_model_calls")]
    assert f"topology.max_model_calls={cap} is below the ~100 model calls" in warning[2]
    assert "(100 super-steps x 1 model call per step, the most one node's code names)" in warning[2]
    engine, _ = scripted_engine(graph_config(recursion_limit=100, max_model_calls=cap), lambda req: "ANSWER: 4",
                                tiny_tokenizer)
    (ep,) = guarded_rollout(engine, TASKS[:1])
    assert ep.status == "error" and f"made {cap} model calls in this episode (lead 35, checker 35)" in ep.error
    assert "the team's termination (recursion_limit 100 super-steps) had not been reached" in ep.error

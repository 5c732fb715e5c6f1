"""mas validate's context check (mas/training/context_plan.py): an agent whose conversation can
outgrow its model's positions is named, with the bound worked out from the env's own tools."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from mas.tools import ToolParam, ToolSpec
from mas.cli import main
from mas.config.schema import load_config
from mas.training.context_plan import CHAT_OVERHEAD, context_bounds, longest_tool_response
from mas.types import Task

FACTS = str(Path(__file__).parents[1] / "configs" / "cpu_facts.yaml")


class CharTokenizer:
    """One token per character: the bound can be written down by hand."""

    def encode(self, text, add_special_tokens=False):
        return list(text)


def facts_like_env():
    """A two-paragraph corpus behind search (k results of 'title: text') and read."""
    docs = {"Alpha": "a" * 30, "Beta": "b" * 50}

    def search(query, k=1):
        hits = sorted(docs)[:k]
        return "\n".join([f"search: {len(hits)}"] + [f"{i}. {t}: {docs[t][:10]}" for i, t in enumerate(hits, 1)])

    def read(title):
        return f"{title}: {docs[title]}"

    tools = {"search": ToolSpec("search", "", (ToolParam("query", "str", ""), ToolParam("k", "int", "", required=False)), search),
             "read": ToolSpec("read", "", (ToolParam("title", "str", ""),), read)}
    tasks = [Task("t0", "Who?", "x"), Task("t1", "Which city?", "y")]
    return SimpleNamespace(tools=tools, sample_tasks=lambda n: tasks[:n])


def test_the_longest_tool_response_reads_every_title_the_searches_found():
    env = facts_like_env()
    got = longest_tool_response(env, SimpleNamespace(max_k=2), env.sample_tasks(2))
    assert got == "Beta: " + "b" * 50  # read of the longer paragraph, found by the k=2 search


def test_the_bound_adds_role_task_heard_replies_tool_rounds_and_the_own_reply():
    env = facts_like_env()
    agents = {
        "researcher": SimpleNamespace(name="researcher", policy="p", role="r" * 7, tools=("search", "read"), max_tool_calls=3,
                                      sampling=SimpleNamespace(max_new_tokens=20)),
        "answerer": SimpleNamespace(name="answerer", policy="q", role="w" * 5, tools=(), max_tool_calls=4,
                                    sampling=SimpleNamespace(max_new_tokens=8)),
    }
    cfg = SimpleNamespace(agents=list(agents.values()), agent=agents.__getitem__, env=SimpleNamespace(max_k=2),
                          topology=SimpleNamespace(kind="chain", sequence=["researcher", "answerer"]))
    rows = context_bounds(cfg, lambda p: CharTokenizer(), lambda p: {"p": 100, "q": 512}[p], env)
    response = len("<tool_response>\n" + "Beta: " + "b" * 50 + "\n</tool_response>")  # 89
    task = len("Which city?")
    calls = {"search": len('<tool_call>{"name": "search", "arguments": {}}</tool_call>'),  # the params have no example
             "read": len('<tool_call>{"name": "read", "arguments": {}}</tool_call>')}
    assert rows[0] == {"agent": "researcher", "policy": "p", "positions": 100, "tool_calls": 3, "tool_response_tokens": response,
                       "bound": CHAT_OVERHEAD + 7 + task + 0 + 3 * (20 + response) + 20,
                       "max_new_tokens": 20, "call_tokens": calls}
    # the answerer calls no tools, but the chain's transcript shows it the researcher's three tool
    # rounds with their results and its final reply
    heard = 3 * (20 + response) + 20
    assert rows[1]["bound"] == CHAT_OVERHEAD + 5 + task + heard + 0 + 8 and rows[1]["tool_calls"] == 0


def test_mas_validate_warns_when_the_embedded_research_team_outgrows_its_positions(capsys):
    """The embedded build's research stage trains 2,048 positions: cpu_facts as shipped (4 tool
    calls, about 1,870 tokens) fits them, and twice its tool calls do not (the 512 of the build
    before that stage were outgrown by the shipped config itself)."""
    assert main(["validate", "-q", FACTS]) == 0
    assert "its conversation can reach about" not in capsys.readouterr().err
    more = "agents.researcher.max_tool_calls=8"
    assert main(["validate", "-q", FACTS, more]) == 0
    err = capsys.readouterr().err
    assert "agents.researcher: its conversation can reach about" in err and "past the 2048 positions" in err
    assert "agents.answerer: its conversation can reach about" in err  # the researcher's results are in its transcript
    assert main(["validate", "-q", "--strict", FACTS, more]) == 1


def test_mas_validate_warns_when_a_reply_cannot_hold_one_tool_call(capsys):
    """cpu_facts shipped max_new_tokens 64 while its calls take 72 to 82 of the embedded model's
    tokens: every call was cut before its closing tag, and the team could never read a paragraph."""
    assert main(["validate", "-q", FACTS]) == 0
    assert "cannot hold one tool call" not in capsys.readouterr().err  # as shipped: 96
    assert main(["validate", "-q", FACTS, "agents.researcher.sampling.max_new_tokens=64"]) == 0
    err = capsys.readouterr().err
    assert ("agents.researcher.sampling.max_new_tokens=64 cannot hold one tool call (the tools' example calls take "
            "'search' 82, 'read' 72 tokens of policy 'scout')") in err
    assert "agents.answerer.sampling" not in err  # no tools, nothing to cut


def test_a_team_that_fits_gets_no_context_warning(capsys):
    cfg = load_config(FACTS, ["agents.researcher.max_tool_calls=1", "env.read_chars=50",
                              "env.snippet_chars=20", "env.max_k=1"])
    from mas.training.context_plan import context_issues

    assert context_issues(cfg) == []

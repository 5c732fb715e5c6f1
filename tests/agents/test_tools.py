"""The tool-call format: parsing, argument checks, observations for every kind of mistake."""

from __future__ import annotations

import pytest

from mas.tools import (
    ToolError,
    ToolParam,
    ToolSpec,
    parse_tool_calls,
    run_tool_call,
    tool_results_message,
    tools_prompt,
)


def _lookup(title: str) -> str:
    if title == "boom":
        raise RuntimeError("index corrupted")
    if title != "Paris":
        raise ToolError(f"no paragraph titled {title!r}")
    return "Paris: capital of France."


TOOLS = {
    "search": ToolSpec("search", "find paragraphs",
                       (ToolParam("query", "str", "words", example="Paris"), ToolParam("k", "int", "results", required=False, default=3, example=2)),
                       lambda query, k=3: f"{k} hits for {query}"),
    "read": ToolSpec("read", "read a paragraph", (ToolParam("title", "str", "title", example="Paris"),), _lookup),
}


def run(text: str):
    return [run_tool_call(c, TOOLS) for c in parse_tool_calls(text)]


def test_well_formed_calls_run_in_order_with_defaults():
    text = ('I will look. <tool_call>{"name": "search", "arguments": {"query": " river Paris "}}</tool_call>\n'
            '<tool_call>\n```json\n{"name": "read", "arguments": {"title": "Paris"}}\n```\n</tool_call>')
    (r1, o1), (r2, o2) = run(text)
    assert r1 == {"name": "search", "arguments": {"query": "river Paris", "k": 3}, "valid": True, "error": None}
    assert o1 == "3 hits for river Paris"
    assert r2["valid"] and o2 == "Paris: capital of France."


def test_no_block_is_no_call():
    assert parse_tool_calls("ANSWER: Paris") == []


@pytest.mark.parametrize(
    "text,error",
    [
        ('<tool_call>{"name": "search", "arguments": {"query": "x"}}', "no closing </tool_call>"),
        ("<tool_call></tool_call>", "empty"),
        ('<tool_call>{"name": "search", "arguments": {"query": "x"</tool_call>', "not valid JSON"),
        ("<tool_call>search(query='x')</tool_call>", "not valid JSON"),  # Python-call syntax is not evaluated
        ('<tool_call>["search"]</tool_call>', "must be a JSON object, found list"),
        ('<tool_call>{"tool": "search"}</tool_call>', "unknown key(s) ['tool']"),
        ('<tool_call>{"arguments": {}}</tool_call>', "no 'name'"),
        ('<tool_call>{"name": "search", "arguments": "x"}</tool_call>', "'arguments' must be a JSON object"),
        ('<tool_call>{"name": "google", "arguments": {}}</tool_call>', "unknown tool 'google'; you can call read, search"),
        ('<tool_call>{"name": "search", "arguments": {}}</tool_call>', "needs the argument 'query'"),
        ('<tool_call>{"name": "search", "arguments": {"query": "x", "n": 2}}</tool_call>', "unknown argument(s) ['n']"),
        ('<tool_call>{"name": "search", "arguments": {"query": "x", "k": "2"}}</tool_call>', "must be an integer"),
        ('<tool_call>{"name": "search", "arguments": {"query": "x", "k": true}}</tool_call>', "must be an integer"),
        ('<tool_call>{"name": "search", "arguments": {"query": "  "}}</tool_call>', "non-empty string"),
        ('<tool_call>{"name": "read", "arguments": {"title": "Lyon"}}</tool_call>', "no paragraph titled 'Lyon'"),
        ('<tool_call>{"name": "read", "arguments": {"title": "boom"}}</tool_call>', "read failed: RuntimeError: index corrupted"),
        ('<tool_call>{"name": "search", "arguments": ' + "[" * 100_000 + "</tool_call>", "nested too deeply"),  # used to raise
        ("<tool_call>```json\n" + " \n" * 5_000 + "}</tool_call>", "not valid JSON"),  # an unclosed fence: linear time
        ('<tool_call>```json\n{"name": "search", "arguments": {"query": "x"}}', "no closing </tool_call>"),
    ],
)
def test_every_malformed_call_gives_an_explanatory_observation(text, error):
    [(record, observation)] = run(text)
    assert record["valid"] is False and error in record["error"]
    assert observation.startswith("error: ") and error in observation


def test_format_errors_show_a_correct_example():
    [(_, obs)] = run("<tool_call>oops</tool_call>")
    assert '<tool_call>{"name": "search", "arguments": {"query": "Paris", "k": 2}}</tool_call>' in obs


def test_prompt_lists_signatures_format_and_budget():
    text = tools_prompt([TOOLS["search"], TOOLS["read"]], max_calls=3)
    assert "at most 3 calls" in text
    assert "- search(query: str, k: int = 3): find paragraphs" in text and "- read(title: str)" in text
    assert '<tool_call>{"name": "search", "arguments": {"query": "Paris", "k": 2}}</tool_call>' in text


@pytest.mark.parametrize("appended", [True, False])
def test_the_tools_prompt_is_appended_to_the_role_unless_the_agent_says_not(appended):
    from mas.agents.agent import build_agent
    from mas.config.schema import AgentConfig

    cfg = AgentConfig(name="scout", policy="p", role="Find it.", tools=("search", "read"), max_tool_calls=3, tools_prompt=appended)
    agent = build_agent(cfg, "team", TOOLS)
    assert agent.role == ("Find it.\n\n" + tools_prompt([TOOLS["search"], TOOLS["read"]], max_calls=3) if appended else "Find it.")
    assert agent.tools == ("search", "read") and agent.max_tool_calls == 3  # the tools are there either way


def test_results_message_wraps_each_observation_and_counts_down():
    assert tool_results_message(["a", "b"], 2) == "<tool_response>\na\n</tool_response>\n<tool_response>\nb\n</tool_response>\n(tool calls left: 2)"
    assert tool_results_message(["a"], 0).endswith("You have used all your tool calls. Reply now, without a tool call.")


def test_a_fence_around_the_json_is_tolerated_and_only_a_whole_fence_counts():
    [(ok, _)] = run('<tool_call>```json {"name": "search", "arguments": {"query": "x"}} ```</tool_call>')
    [(plain, _)] = run('<tool_call>```{"name": "search", "arguments": {"query": "x"}}```</tool_call>')
    [(half, _)] = run('<tool_call>```json {"name": "search", "arguments": {"query": "x"}}</tool_call>')
    assert ok["valid"] and plain["valid"] and not half["valid"]
    [(empty, _)] = run("<tool_call>``````</tool_call>")
    assert "empty" in empty["error"]


def test_a_message_with_more_blocks_than_the_limit_reads_the_first_ones_and_one_error():
    from mas.tools import MAX_BLOCKS

    calls = parse_tool_calls('<tool_call>{"name": "read", "arguments": {"title": "Paris"}}</tool_call>' * 100_000)
    assert len(calls) == MAX_BLOCKS + 1 and all(c.name == "read" for c in calls[:MAX_BLOCKS])
    assert "more than" in calls[-1].error


def test_a_tool_that_returns_something_other_than_text_is_an_error():
    tools = {"n": ToolSpec("n", "a number", (), lambda: 7)}
    [(record, obs)] = [run_tool_call(c, tools) for c in parse_tool_calls('<tool_call>{"name": "n"}</tool_call>')]
    assert not record["valid"] and record["fault"] == "tool_error" and "returned int" in obs

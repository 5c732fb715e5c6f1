"""An orchestrator that calls a solver agent and a checker agent as tools, with the OpenAI Agents SDK as its docs write it.

The shape is the SDK docs' "agents as tools" pattern (its translation example): specialist
``Agent``s turned into tools with ``as_tool(tool_name=..., tool_description=...)``, and an
orchestrator ``Agent`` whose instructions say to use them, in order.  Unlike a handoff, the
orchestrator keeps the conversation: each agent-tool runs its agent on the text the orchestrator
passes as the tool's one argument (``input``), and its final output comes back as the tool's
result.  Here the orchestrator calls ``solve_problem`` with the question, then ``check_answer``
with the question and the proposed answer, then replies; so every agent speaks in every episode
that follows the protocol (the triage team of ``openai_agents_handoffs.py`` asks one tutor only).

What differs from the docs (examples/README.md) is what ``openai_agents_handoffs.py`` changes,
for the reasons its docstring gives: each agent's model is an ``OpenAIChatCompletionsModel`` on a
per-call ``AsyncOpenAI`` client at the ``base_url`` and API key mas passes in, named after the
YAML agent; tracing is off; the prompts ask for ``ANSWER: <number>``; the client is closed when
the run ends.

Trained with mas: ``configs/openai_agents_as_tools.yaml`` (``kind: openai``).
"""

from __future__ import annotations

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(disabled=True)


async def run_team(task: str, base_url: str, api_key: str) -> str:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)

    solver_agent = Agent(
        name="solver_agent",
        instructions="You solve the user's arithmetic problem. Work it out, then reply with ANSWER: <number>.",
        model=OpenAIChatCompletionsModel(model="solver", openai_client=client),
    )
    checker_agent = Agent(
        name="checker_agent",
        instructions=("You check a proposed answer to an arithmetic problem. Work the problem out yourself, "
                      "then reply with ANSWER: <number>, the correct result."),
        model=OpenAIChatCompletionsModel(model="checker", openai_client=client),
    )
    orchestrator_agent = Agent(
        name="orchestrator_agent",
        instructions=(
            "You are a math agent. You use the tools given to you to answer the user's question. "
            "You call solve_problem with the question, then check_answer with the question and the proposed answer. "
            "You never answer on your own; when the check is done, reply with ANSWER: <number>."
        ),
        tools=[
            solver_agent.as_tool(
                tool_name="solve_problem",
                tool_description="Solve the user's arithmetic problem",
            ),
            checker_agent.as_tool(
                tool_name="check_answer",
                tool_description="Check a proposed answer to the user's arithmetic problem",
            ),
        ],
        model=OpenAIChatCompletionsModel(model="orchestrator", openai_client=client),
    )

    try:
        result = await Runner.run(orchestrator_agent, task)
    finally:
        await client.close()  # its connections, before the episode's event loop closes
    return str(result.final_output)

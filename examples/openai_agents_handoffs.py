"""A triage agent that hands off to specialists, written with the OpenAI Agents SDK as its docs write it.

The shape is the SDK quickstart's homework-tutor team: a ``Triage Agent`` whose only job is to
pick a specialist, and specialists with a ``handoff_description``; the SDK offers the handoffs to
the triage agent as tools (``transfer_to_addition_tutor``, ...), and the agent it hands off to
answers with the conversation so far.  Here the specialists split arithmetic by operation, so the
triage agent's choice matters.

What differs from the docs (examples/README.md): the model of each agent is an
``OpenAIChatCompletionsModel`` on an ``AsyncOpenAI`` client whose ``base_url`` and API key are the
ones mas passes in, with the model named after the YAML agent (the SDK docs' recipe for "other
LLM providers"), and tracing is off (the SDK would otherwise export traces to OpenAI, and mas runs
with no network).  The client is made per call, not set globally with
``set_default_openai_client``, because mas runs many episodes at once, each at its own address.
The prompts ask for ``ANSWER: <number>``, the env's answer format.  The client is closed when
the run ends: each episode's code runs on an event loop of its own, and a client left open can
print "Event loop is closed" when its connections are collected after that loop has ended.

Trained with mas: ``configs/openai_agents_handoffs.yaml`` (``kind: openai``).
"""

from __future__ import annotations

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(disabled=True)


async def run_team(task: str, base_url: str, api_key: str) -> str:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)

    addition_tutor = Agent(
        name="Addition Tutor",
        handoff_description="Specialist agent for sums",
        instructions="You help with addition problems. Work it out, then reply with ANSWER: <number>.",
        model=OpenAIChatCompletionsModel(model="addition_tutor", openai_client=client),
    )
    subtraction_tutor = Agent(
        name="Subtraction Tutor",
        handoff_description="Specialist agent for differences",
        instructions="You help with subtraction problems. Work it out, then reply with ANSWER: <number>.",
        model=OpenAIChatCompletionsModel(model="subtraction_tutor", openai_client=client),
    )
    triage_agent = Agent(
        name="Triage Agent",
        instructions="You determine which agent to use based on the user's homework question.",
        handoffs=[addition_tutor, subtraction_tutor],
        model=OpenAIChatCompletionsModel(model="triage", openai_client=client),
    )

    try:
        result = await Runner.run(triage_agent, task)
    finally:
        await client.close()  # its connections, before the episode's event loop closes
    return str(result.final_output)

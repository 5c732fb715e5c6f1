"""An OpenAI Agents SDK team on the Responses API (``OpenAIResponsesModel``, the SDK's model for
OpenAI's own API), for the endpoint's Responses tests.  The YAML agents are the test team's
lead (triage), helper (addition) and checker (subtraction)."""

from __future__ import annotations

import mas  # noqa: F401 - first, so that `agents` is the SDK, not this repository's folder
from agents import Agent, OpenAIResponsesModel, Runner, set_tracing_disabled
from openai import AsyncOpenAI

set_tracing_disabled(disabled=True)


async def triage_team(task: str, base_url: str, api_key: str) -> str:
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0)
    addition = Agent(name="Addition Tutor", handoff_description="Specialist agent for sums",
                     instructions="You help with addition. Reply with ANSWER: <number>.",
                     model=OpenAIResponsesModel(model="helper", openai_client=client))
    subtraction = Agent(name="Subtraction Tutor", handoff_description="Specialist agent for differences",
                        instructions="You help with subtraction. Reply with ANSWER: <number>.",
                        model=OpenAIResponsesModel(model="checker", openai_client=client))
    triage = Agent(name="Triage Agent", instructions="You pick the agent for the user's question.",
                   handoffs=[addition, subtraction], model=OpenAIResponsesModel(model="lead", openai_client=client))
    try:
        result = await Runner.run(triage, task)
    finally:
        await client.close()
    return str(result.final_output)

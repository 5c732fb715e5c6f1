"""A primary agent and a critic taking turns until the critic approves, written with AutoGen
AgentChat and ``OpenAIChatCompletionClient`` as AgentChat's teams tutorial writes it.

The team is the tutorial's reflection pattern: a ``RoundRobinGroupChat`` of a ``primary``
``AssistantAgent`` and a ``critic`` that says ``APPROVE`` when it is satisfied, stopped by a
``TextMentionTermination`` or, as the termination tutorial combines them, a
``MaxMessageTermination``.

What differs from the docs (examples/README.md): each agent has its own
``OpenAIChatCompletionClient`` whose ``model`` is the YAML agent's name (the docs share one client),
with ``base_url`` and ``api_key`` from mas and the ``model_info`` AutoGen asks for when the model
name is not an OpenAI model's; and the prompts ask for ``ANSWER: <number>``, the env's answer
format.  Unlike ``kind: autogen`` (``examples/teams.py``), nothing of mas is imported: the team
talks to the endpoint mas serves for the episode, as it would to any OpenAI-compatible server.

Trained with mas: ``configs/openai_autogen_reflection.yaml`` (``kind: openai``).
"""

from __future__ import annotations

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.teams import RoundRobinGroupChat
from autogen_ext.models.openai import OpenAIChatCompletionClient

# What AutoGen needs to know about a model it does not know by name.
MODEL_INFO = {"vision": False, "function_calling": True, "json_output": False, "family": "unknown",
              "structured_output": False}


async def run_team(task: str, base_url: str, api_key: str) -> str:
    primary_client = OpenAIChatCompletionClient(model="primary", base_url=base_url, api_key=api_key,
                                                model_info=MODEL_INFO, max_retries=0)
    critic_client = OpenAIChatCompletionClient(model="critic", base_url=base_url, api_key=api_key,
                                               model_info=MODEL_INFO, max_retries=0)

    primary_agent = AssistantAgent(
        "primary",
        model_client=primary_client,
        system_message="You are a helpful AI assistant. Solve the problem and reply with ANSWER: <number>.",
    )
    critic_agent = AssistantAgent(
        "critic",
        model_client=critic_client,
        system_message="Provide constructive feedback on the answer. Respond with 'APPROVE' when it is right.",
    )
    termination = TextMentionTermination("APPROVE") | MaxMessageTermination(5)
    team = RoundRobinGroupChat([primary_agent, critic_agent], termination_condition=termination)

    result = await team.run(task=task)
    await primary_client.close()
    await critic_client.close()
    answers = [m.content for m in result.messages if m.source == "primary" and isinstance(m.content, str)]
    return answers[-1] if answers else ""

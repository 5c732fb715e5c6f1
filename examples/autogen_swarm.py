"""An AutoGen Swarm whose agents hand off to each other, written the way the AgentChat docs write
their swarm teams, made trainable by mas (examples/autogen_swarm.yaml).

The docs' swarm: a planner that sends its plan and hands the work to one specialist at a time
(``handoffs=[...]``: each handoff is a ``transfer_to_<name>`` tool call), specialists that do
their part (one with a Python function as its tool) and hand back to the planner, and a stop when
someone writes TERMINATE or hands off to the user.  Here the task is an arithmetic expression, so
the specialists are a calculator (its tool: ``examples.calculator.calculate``) and a checker.

In training nobody answers a handoff to the user: it ends the episode (``HandoffTermination``),
with the team's latest answer, if any.

What differs from the docs' code:
* the model clients: ``build`` receives one mas client per agent where the docs create one
  ``OpenAIChatCompletionClient(model=...)`` for all;
* the one prompt change: the agents are asked for the result as ``ANSWER: <number>``, the env's
  answer format.  The topology reads the team's answer as the most recent ``ANSWER: n`` in the
  chat, by the parser of the agent that wrote it;
* a message-count stop beside the docs' two, so that an untrained policy that neither hands
  off nor terminates ends its episode cleanly (the model-call cap would fail it).
"""

from __future__ import annotations

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import HandoffTermination, MaxMessageTermination, TextMentionTermination
from autogen_agentchat.teams import Swarm

from examples.calculator import calculate

PLANNER = """You plan the work on the task and coordinate the specialists:
- calculator: works out arithmetic with a calculator tool
- checker: checks a result by working it out again
Send your plan first, then hand off to one specialist at a time.
When the specialists are done, state the result as ANSWER: <number> and write TERMINATE."""

CALCULATOR = """You are the calculator. Work out the arithmetic with the calculate tool.
Give the result as ANSWER: <number>, then hand back to the planner."""

CHECKER = """You are the checker. Check the result by working it out again.
Give the result as ANSWER: <number>, then hand back to the planner."""

MAX_MESSAGES = 12


def build(clients):
    """The team; ``clients`` maps each mas agent name to its model client."""
    planner = AssistantAgent("planner", clients["planner"], handoffs=["calculator", "checker", "user"],
                             system_message=PLANNER)
    calculator = AssistantAgent("calculator", clients["calculator"], handoffs=["planner"], tools=[calculate],
                                system_message=CALCULATOR)
    checker = AssistantAgent("checker", clients["checker"], handoffs=["planner"], system_message=CHECKER)
    termination = (HandoffTermination(target="user") | TextMentionTermination("TERMINATE")
                   | MaxMessageTermination(max_messages=MAX_MESSAGES))
    return Swarm([planner, calculator, checker], termination_condition=termination)

"""An AutoGen SelectorGroupChat with a planner and tool-using specialists, written the way the
AgentChat docs write their selector team, made trainable by mas (examples/autogen_selector_planner.yaml).

The docs' team: a planning agent that splits the task and hands out subtasks, specialists that
do them (one of them with a Python function as its tool), a selector model that reads the
conversation and names the next speaker, and a stop when someone writes TERMINATE or after a
number of messages.  Here the task is an arithmetic expression, so the specialists are a
calculator (its tool: ``examples.calculator.calculate``) and a checker.

What differs from the docs' code:
* the model clients: ``build`` receives one mas client per agent (``clients["planner"]``, ...)
  where the docs create ``OpenAIChatCompletionClient(model=...)`` once and share it;
* the one prompt change: the agents are asked to give the result as ``ANSWER: <number>``,
  the env's answer format.  The topology reads the team's answer as the most recent
  ``ANSWER: n`` in the chat, by the parser of the agent that wrote it.
"""

from __future__ import annotations

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.teams import SelectorGroupChat

from examples.calculator import calculate

PLANNER = """You plan. You split the task you are given into small subtasks and give each one to a team member.
Your team:
- calculator: works out arithmetic with a calculator tool
- checker: checks a result by working it out again
You do not do the subtasks yourself. Give a subtask as: <member>: <subtask>
When all subtasks are done, state the result as ANSWER: <number> and end with TERMINATE."""

CALCULATOR = """You are the calculator. Use the calculate tool for the arithmetic you are asked to do.
Give the result as ANSWER: <number>."""

CHECKER = """You are the checker. Work the result out again and say whether it is right.
Give the result as ANSWER: <number>."""

SELECTOR_PROMPT = """Pick the team member who should act next.

{roles}

The conversation so far:
{history}

Choose one of {participants}. The planner speaks before the others start working.
Reply with the name only."""

MAX_MESSAGES = 10  # the docs stop at 25; a one-line sum needs fewer


def build(clients):
    """The team; ``clients`` maps each mas agent name to its model client."""
    planner = AssistantAgent(
        "planner", clients["planner"], system_message=PLANNER,
        description="Plans the work: speaks first on a new task, and hands subtasks to the others.")
    calculator = AssistantAgent(
        "calculator", clients["calculator"], tools=[calculate], system_message=CALCULATOR,
        description="Does arithmetic with a calculator tool.")
    checker = AssistantAgent(
        "checker", clients["checker"], system_message=CHECKER,
        description="Checks a result by working it out again.")
    termination = TextMentionTermination("TERMINATE") | MaxMessageTermination(max_messages=MAX_MESSAGES)
    return SelectorGroupChat(
        [planner, calculator, checker],
        model_client=clients["selector"],  # the speaker selection is the mas agent 'selector'
        termination_condition=termination,
        selector_prompt=SELECTOR_PROMPT,
        allow_repeated_speaker=True,  # as in the docs: the planner may speak twice in a row
    )

"""An ordinary AutoGen AgentChat team, made trainable by mas (configs/autogen_selector.yaml).

A SelectorGroupChat: a selector model reads the task and picks the adder or the subtractor,
which answers.  The only mas-specific line is the signature: the factory receives its model
clients (one per agent name in the YAML) instead of creating them, e.g. where it had
``OpenAIChatCompletionClient(model="gpt-4o")`` it now uses ``clients["adder"]``.
"""

from __future__ import annotations

from autogen_agentchat.agents import AssistantAgent
from autogen_agentchat.conditions import MaxMessageTermination, TextMentionTermination
from autogen_agentchat.teams import SelectorGroupChat

SELECTOR_PROMPT = "Who solves this, {participants}?\n{history}\nReply with one name."


def build(clients):
    """The team; ``clients`` maps each mas agent name to its model client."""
    adder = AssistantAgent("adder", clients["adder"], system_message="You are the adder.",
                           description="adds two numbers")
    subtractor = AssistantAgent("subtractor", clients["subtractor"], system_message="You are the subtractor.",
                                description="subtracts a number from another")
    return SelectorGroupChat(
        [adder, subtractor],
        model_client=clients["selector"],  # the selector's model calls are the mas agent 'selector'
        selector_prompt=SELECTOR_PROMPT,
        termination_condition=TextMentionTermination("ANSWER", sources=["adder", "subtractor"]) | MaxMessageTermination(4),
        max_selector_attempts=1,
    )

"""What can go wrong in a rollout: the fault kinds, each with what it counts, and the counter an
engine keeps of them per step (the metrics' ``faults``)."""

from __future__ import annotations

from collections import Counter

# what can go wrong in a rollout, counted per step in the metrics ("faults")
FAULT_KINDS: dict[str, str] = {
    "agent_error": "episodes stopped by an exception in agent or topology code",
    "backend_error": "failed generations of agent turns, and batches that failed as a whole (their requests are then retried one at a time)",
    "episode_timeout": "episodes over runtime.episode_timeout_s (their model calls refused from then on, so a team that never stops unwinds)",
    "model_call_limit": "episodes of a framework team (kind: autogen, langgraph or openai) stopped at topology.max_model_calls model calls",
    "context_overflow": "generations of a framework team (kind: autogen, langgraph or openai) whose prompt plus max_new_tokens "
                        "passed the positions of the policy's model: the reply cut to fit, or, where the prompt alone filled "
                        "them, read past them (mas.rollout.positions)",
    "tool_choice_unmet": "replies that did not make the tool call a tool_choice asked for ('required' or a named "
                         "function; the endpoint's, LangChain's bind_tools, AutoGen's create): the reply starts as that "
                         "call, but what the model "
                         "wrote after the start made no valid one (an unknown name, JSON that does not close)",
    "response_format_unmet": "text replies to a request for JSON (the OpenAI-compatible endpoint's response_format, an "
                             "AutoGen agent's json_output or output_content_type, LangChain's with_structured_output "
                             "in json_schema or json_mode): the reply starts with '{' (where no tool is offered), but is not one JSON object, or "
                             "lacks a property its schema requires",
    "score_error": "episodes whose reward function raised or returned NaN/inf (scored 0)",
    "tool_error": "tool calls that raised (a ToolError, the tool's answer to a bad argument, is not a fault)",
    "tool_timeout": "tool calls stopped at runtime.tool_timeout_s",
    "tool_memory": "tool calls stopped at runtime.tool_memory_mb",
    "critic_error": "critiques that got no reply (the credit method's fallback applies)",
    "verifier_error": "turn verifier calls that raised or returned something other than a score in [0, 1] or None (the turn got no score)",
    "verifier_timeout": "turn verifier calls stopped at verifier.timeout_s (the turn got no score)",
}


class Faults:
    """Counts of each fault kind, and the first message of each, since the last ``take``."""

    def __init__(self) -> None:
        self.counts: Counter[str] = Counter()
        self.messages: dict[str, str] = {}

    def add(self, kind: str, message: str) -> None:
        if kind not in FAULT_KINDS:
            raise KeyError(f"unknown fault kind {kind!r}; valid: {sorted(FAULT_KINDS)}")
        self.counts[kind] += 1
        self.messages.setdefault(kind, message)

    def take(self) -> tuple[dict[str, int], dict[str, str]]:
        """(count of every kind, zeros included; first message of each kind seen), then reset."""
        out = {k: self.counts[k] for k in FAULT_KINDS}, dict(self.messages)
        self.counts.clear()
        self.messages.clear()
        return out

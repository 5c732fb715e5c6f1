"""Prompts against the positions a policy's model reads, checked as a team whose prompts are code runs.

``mas validate``'s context check (``mas.training.context_plan``) bounds what the built-in
topologies render; a team that is code (an AutoGen factory, a LangGraph graph, a team behind
the OpenAI-compatible endpoint) renders what its code decides, so only the engine sees its
prompts.  A model trained for P positions reads nothing sensible past them, and transformers
only warns.  So each generation the framework adapters ask for (``EpisodeContext.call`` with
``fit_positions=True``, its tool rounds included) is fitted to its model here, before it reaches
the backend:

* a prompt that leaves room gets a completion budget of at most ``P - prompt`` tokens (its
  ``max_new_tokens`` cut to fit; the reply ends ``length`` there), counted as the fault
  ``context_overflow`` with the agent, the prompt's length, the budget and the limit;
* a prompt of P tokens or more is counted as that fault too, with a message that says so (the
  model reads past what it was trained on, and its reply is unreliable), and is generated as
  before.  Stopping the episode instead would fail every episode of the shipped smolagents
  example (configs/openai_smolagents_manager.yaml: smolagents' own prompt is about 3,650 of the
  embedded model's tokens, past its 2,048 positions) until that example moves to a longer
  context; the step's warnings name the agent and the lengths meanwhile.

P is the ``max_position_embeddings`` of the model the policy's tokenizer was loaded with (its
folder's ``config.json``, read offline), else the tokenizer's own ``model_max_length`` where it
gives a real one; where neither is known (a tokenizer built in memory) nothing is checked.
"""

from __future__ import annotations

from typing import Any

UNBOUNDED = 10**8  # a tokenizer's model_max_length at or past this means "not set" (transformers says 1e30)


def model_positions(tokenizer: Any) -> int | None:
    """The positions the model behind ``tokenizer`` reads, where they can be known offline (module docstring)."""
    source = getattr(tokenizer, "name_or_path", "") or ""
    if source:
        try:
            from transformers import AutoConfig

            positions = getattr(AutoConfig.from_pretrained(source, local_files_only=True), "max_position_embeddings", None)
        except Exception:  # noqa: BLE001 - no config beside the tokenizer (a GGUF's own, a remote model): try the tokenizer
            positions = None
        if isinstance(positions, int) and positions > 0:
            return positions
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < UNBOUNDED else None


def fit_budget(agent: str, policy: str, prompt_tokens: int, budget: int, positions: int | None) -> tuple[int, str | None]:
    """``(budget, note)``: the completion budget a generation of ``agent`` gets so that prompt plus
    completion stay within ``positions`` (None: unknown, nothing checked), and the fault's message
    where they do not (None where they do): the budget cut to fit, or, for a prompt that fills the
    positions alone, left as it is (module docstring)."""
    if positions is None or prompt_tokens + budget <= positions:
        return budget, None
    where = (f"context overflow: agent {agent!r}: its prompt of {prompt_tokens} tokens plus max_new_tokens {budget} "
             f"passes the {positions} positions of policy {policy!r}'s model")
    fix = ("shorten what the team's code sends this agent (fewer or shorter messages, tool results), lower its "
           "max_new_tokens, or use a model with a longer context")
    if prompt_tokens >= positions:
        return budget, (f"{where}, and the prompt alone fills them: the model reads past what it was trained on, so "
                        f"its reply is unreliable; {fix}")
    room = positions - prompt_tokens
    return room, f"{where}: its reply was cut to {room} tokens to stay within them; {fix}"

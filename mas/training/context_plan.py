"""Whether a team's conversations fit its models' positions: ``mas validate``'s context check.

A model trained for P positions (the embedded model: 512) reads nothing sensible past them: a
research agent whose searches and reads pile up in its prompt runs past them after a few calls,
and transformers only warns at run time.  ``context_issues`` bounds, per agent, the longest
prompt plus reply an episode can give it, in its own tokenizer's tokens, and names each agent
whose bound exceeds its model's ``max_position_embeddings``:

    bound = chat overhead + role + the longest of a sample of the env's tasks
            + what the agents before it in a chain said (their replies and tool rounds with results)
            + max_tool_calls x (max_new_tokens + the longest tool response measured)
            + its own reply (max_new_tokens)

It also names each tool-using agent whose ``max_new_tokens`` cannot hold one call of its tools
(the tool's own example call, in the agent's tokens): such a reply is cut before
``</tool_call>``, and every call fails to parse.  The same for what a framework team's own
protocol needs of a reply, where the topology's kind says (its optional ``reply_needs(cfg)``:
an AutoGen swarm agent's ``transfer_to_<agent>`` handoff call, a selector's participant names):
``reply_issues`` names the agent, its budget and the tokens the longest such text takes.

Tool responses are measured, not guessed: the env's own ``search`` is run on the sampled tasks'
questions at the largest k the env allows, and its own ``read`` on every title those searches
return; any other tool runs once with its prompt example.  The bound is an upper estimate of
what the topology renders (an agent need not use all its calls); it is a warning, and says so.
Models whose config or tokenizer cannot be read offline are skipped, and so are GGUF files (reading
their metadata takes tens of seconds; SmolLM2's 8,192 positions hold any shipped team).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

# the bound itself is computed where the memory plan also reads it (a prompt's length sizes the
# rollout's generate calls): mas.learning.memory_plan
from mas.learning.memory_plan import CHAT_OVERHEAD, TASK_SAMPLE, context_bounds, longest_tool_response  # noqa: F401
from mas.topologies import kind_of


def reply_issues(cfg: Any, tokenizer_of: Callable[[str], Any]) -> list[str]:
    """Agents whose ``max_new_tokens`` cannot hold a text their team's protocol needs whole in one
    reply (the kind's ``reply_needs``: ``(agent, what, text, effect)``), in the agent's own tokens;
    ``tokenizer_of(policy)`` may give None to skip a policy."""
    needs_of = getattr(kind_of(cfg.topology), "reply_needs", None)
    if needs_of is None:
        return []
    longest: dict[str, tuple[int, str, str]] = {}  # agent -> (tokens, what, effect) of its longest need
    for agent_name, what, text, effect in needs_of(cfg):
        if agent_name not in cfg.agent_names:
            continue
        tok = tokenizer_of(cfg.agent(agent_name).policy)
        if tok is None:
            continue
        n = len(tok.encode(text, add_special_tokens=False))
        if n > longest.get(agent_name, (0, "", ""))[0]:
            longest[agent_name] = (n, what, effect)
    out = []
    for agent_name, (n, what, effect) in longest.items():
        agent = cfg.agent(agent_name)
        budget = agent.sampling.max_new_tokens
        if n > budget:
            out.append(f"agents.{agent_name}.sampling.max_new_tokens={budget} cannot hold {what}, which takes {n} tokens "
                       f"of policy {agent.policy!r}: every such reply is cut before it ends ({effect}). Raise it: "
                       f"agents.{agent_name}.sampling.max_new_tokens={n} or more")
    return out


def context_issues(cfg: Any) -> list[str]:
    """Warnings for agents whose conversations can outgrow their models' positions (module docstring)."""
    from transformers import AutoTokenizer

    from mas.embedded.artifact import embedded_path
    from mas.envs import build_env
    from mas.models.sources import is_gguf_model
    from mas.learning.memory_plan import model_config

    cache: dict[str, tuple[Any, int | None]] = {}
    tokenizers: dict[str, Any] = {}

    def tokenizer_of(policy: str) -> Any:
        """The policy's tokenizer whatever its positions (None: not readable offline, or a GGUF file)."""
        if policy not in tokenizers:
            tok = model_of(policy)[0]
            model = cfg.policies[policy].model
            if tok is None and not is_gguf_model(model):
                try:
                    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
                except Exception:  # not readable offline: nothing to measure
                    tok = None
            tokenizers[policy] = tok
        return tokenizers[policy]

    def model_of(policy: str) -> tuple[Any, int | None]:
        if policy not in cache:
            model = cfg.policies[policy].model
            if is_gguf_model(model):
                cache[policy] = (None, None)
                return cache[policy]
            try:
                positions = getattr(model_config(model), "max_position_embeddings", None)
                tok = AutoTokenizer.from_pretrained(str(embedded_path())) if model == "embedded" else None
                if tok is None and positions is not None and positions <= 4096:  # only a short context needs the count
                    tok = AutoTokenizer.from_pretrained(model, local_files_only=True)
            except Exception:  # not readable offline: nothing to check
                positions, tok = None, None
            cache[policy] = (tok, positions)
        return cache[policy]

    try:
        replies = reply_issues(cfg, tokenizer_of)
    except Exception:  # noqa: BLE001 - the team's code did not build: the `errors` hook says why
        replies = []
    try:
        env = build_env(cfg.env)
    except Exception:  # the env's data are not here: `mas validate` reports that on its own (data_issues)
        return replies
    rows = context_bounds(cfg, lambda p: model_of(p)[0], lambda p: model_of(p)[1], env)
    out = replies
    for r in rows:
        cut = {t: n for t, n in r["call_tokens"].items() if n > r["max_new_tokens"]}
        if cut:
            sizes = ", ".join(f"{t!r} {n}" for t, n in cut.items())
            out.append(f"agents.{r['agent']}.sampling.max_new_tokens={r['max_new_tokens']} cannot hold one tool call "
                       f"(the tools' example calls take {sizes} tokens of policy {r['policy']!r}): every "
                       f"such reply is cut before </tool_call> and its call fails. Raise max_new_tokens")
        if r["bound"] > r["positions"]:
            calls = (f", {r['tool_calls']} tool calls of up to {r['tool_response_tokens']} tokens of results each"
                     if r["tool_calls"] else "")
            out.append(f"agents.{r['agent']}: its conversation can reach about {r['bound']} tokens{calls}, past the "
                       f"{r['positions']} positions of policy {r['policy']!r}'s model: what lies beyond is read badly or "
                       f"not at all. Lower max_tool_calls, the env's snippet_chars/read_chars/max_k or max_new_tokens, "
                       f"or use a model with a longer context")
    return out

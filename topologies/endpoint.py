"""``kind: openai``: a team written against the OpenAI API, run unmodified against an endpoint mas serves.

The kind is named after the protocol the team's code speaks, as ``autogen`` and ``langgraph`` are
named after theirs: any code that calls OpenAI's chat completions (the ``openai`` client, the
OpenAI Agents SDK, AutoGen's ``OpenAIChatCompletionClient``, LangChain's ``ChatOpenAI``, CrewAI,
DSPy) is trained by changing only its ``base_url``, its API key string and its model names.

``entry: "pkg.mod:run_team"`` names your function::

    def run_team(task: str, base_url: str, api_key: str) -> str      # or: async def

It receives the task's prompt and the episode's ``base_url`` (``http://127.0.0.1:<port>/<token>/v1``;
the token is the episode's secret) and returns the team's answer.  Inside it, each agent is a
model: ``client.chat.completions.create(model="solver", ...)`` is a turn of the YAML agent
``solver``, sampled from that agent's policy (its LoRA adapter, its sampling settings, its token
budget) and recorded with the exact prompt and completion token ids (``mas.rollout.endpoint``).  A
framework that cannot set a model per agent names it in the ``X-Mas-Agent`` header or in the path
(``.../<token>/agents/solver/v1``).  The answer is read like an agent's reply: ``ANSWER: 5``
gives 5 (``parse_answer``), any other text is the answer as it is.

The function runs in a worker thread (an ``async def`` on an event loop of its own there), so a
blocking client never holds up the engine's loop; the engine batches its requests with every other
episode's.  ``processes: N`` runs it in N worker processes of its own instead (each episode on a
thread there), so the team's client code does not share the engine's GIL
(``mas.process.team_processes``).  The episode ends at ``max_model_calls`` model calls and at ``runtime.episode_timeout_s``:
from then on its requests get 404/410 errors, which the team's client raises, and the episode is a
failed one with the fault counted (``model_call_limit``, ``episode_timeout``).

Requests use the agent's sampling settings; ``request_sampling: true`` uses a request's
``temperature`` and ``top_p`` instead.  ``max_tokens`` is capped by the agent's ``max_new_tokens``.

The env's tools an agent has in YAML (``tools: [search]``) need nothing in the team's code: mas
runs them inside that agent's request, as for the other framework kinds, and the reply is the
agent's answer after its tool rounds.  Tools the request offers (``tools=[...]``) are the team's:
the reply carries the ``tool_calls`` the model wrote, the team runs them and sends the results.

Replays and interventions (C3, SHARP, CCPO) re-run the entry point with the engine's script:
frozen turns come back from the record token for token, masked agents reply ``[masked]``.  That
needs code whose requests depend only on the replies so far (no clock, no random routing); other
code gets the engine's ``ReplayDivergence`` naming the agent and turn.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any, Literal

from pydantic import Field

from mas.agents.parsers import parse_answer
from mas.errors import MissingDependencyError
from mas.process.team_processes import shared_team_processes
from mas.refs import RefError, import_ref
from mas.topologies.adapters import MAX_MODEL_CALLS_HELP
from mas.topologies.framework_teaching import framework_teacher
import mas.topologies.registry as registry
from mas.topologies.registry import Drawing, Edge, Issue, register_topology
from mas.types import EpisodeContext, Outcome, Section

ENTRY_ARGS = ("base_url", "api_key")  # passed by keyword, after the task
WORKER_MB = 70  # resident memory of a team worker with the openai client imported (docs/bring_your_own_team.md)


class OpenAITopology(Section):
    kind: Literal["openai"]
    entry: str = Field(
        description="'package.module:function' running your team: called as function(task, base_url=..., api_key=...) "
        "(sync or async), it returns the team's answer; each agent is the model named by its YAML name."
    )
    max_model_calls: int = Field(64, ge=1, description=MAX_MODEL_CALLS_HELP)
    processes: int = Field(
        0, ge=0, le=64, description="Run the entry point in this many worker processes of its own (fresh interpreters), started at the first "
        "episode, each episode on a thread there: the team's client code then runs beside the engine instead of under "
        "its GIL (mas.process.team_processes). 0: on worker threads of the engine's process. The entry's module must be "
        "importable by a fresh interpreter, and a return value that does not pickle comes back as its text."
    )
    request_sampling: bool = Field(
        False, description="Sample with the temperature and top_p a request sends; false: with the agent's sampling "
        "settings (what RL explores with; a request's max_tokens and stop always apply)."
    )


def entry_errors(ref: str) -> list[str]:
    """Why ``ref`` cannot be the team's entry point ([] when it can, or when only a package its module
    imports is missing here: ``entry_warnings`` says what installs it)."""
    try:
        fn = import_ref(ref)
    except RefError as e:
        return [] if e.missing else [str(e)]
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []  # a builtin or C callable: trusted
    try:
        sig.bind("task", base_url="http://127.0.0.1/v1", api_key="key")
    except TypeError as e:
        return [f"{ref} must accept (task, base_url=..., api_key=...): {e}"]
    return []


def entry_warnings(ref: str) -> list[str]:
    """A package the entry point's module imports that is not installed (a framework the team is
    written in: the `serve` extra installs those of the shipped examples), with what installs it.
    The config may be right; this environment cannot run it, so ``mas validate`` warns and ``mas
    train`` stops where it imports the entry point, with the same message."""
    try:
        import_ref(ref)
    except RefError as e:
        return [str(e)] if e.missing else []
    return []


def read_answer(value: Any) -> str | None:
    """The team's answer from what the entry point returned: ``ANSWER: x`` gives x, other text itself."""
    if value is None:
        return None
    text = str(value).strip()
    parsed, valid = parse_answer(text)
    return parsed["answer"] if valid else (text or None)


class EndpointTeam:
    """Runs the user's entry point once per episode against the episode's endpoint."""

    def __init__(self, cfg: OpenAITopology):
        self.cfg = cfg
        try:
            self.entry = import_ref(cfg.entry)
        except RefError as e:
            if e.missing:  # `mas train` without the framework the team is written in: one line, no traceback
                raise MissingDependencyError(f"topology.entry: {e}") from None
            raise

    async def run(self, ctx: EpisodeContext) -> Outcome:
        loop = asyncio.get_running_loop()
        async with ctx.endpoint(self.cfg.max_model_calls, self.cfg.request_sampling) as door:
            args = (ctx.task.prompt,)
            kwargs = {"base_url": door.base_url, "api_key": door.api_key}
            if self.cfg.processes:  # in a worker process (mas.process.team_processes), on a thread there
                running = shared_team_processes(self.cfg.processes).run(self.cfg.entry, *args, **kwargs)
            else:  # on a worker thread of this process
                call = functools.partial(self.entry, *args, **kwargs)
                work = (functools.partial(asyncio.run, _awaited(call)) if inspect.iscoroutinefunction(self.entry) else call)
                running = loop.run_in_executor(None, work)
            try:
                value = await running
            except Exception as exc:  # noqa: BLE001 - the client wraps the engine's error: raise the original
                door.rethrow(exc)
            door.rethrow()
        return Outcome(answer=read_answer(value))


async def _awaited(call: Any) -> Any:
    return await call()


def build_endpoint(cfg: OpenAITopology) -> EndpointTeam:
    return EndpointTeam(cfg)


@register_topology
class OpenAIEndpoint:
    name = "openai"
    config = OpenAITopology
    build = staticmethod(build_endpoint)

    def agents(self, topo: OpenAITopology) -> dict[str, str] | None:
        return None  # the team's code decides which agents it asks

    def last_speakers(self, topo: OpenAITopology) -> list[str]:
        return []

    def last_speaker_note(self, topo: OpenAITopology) -> str | None:
        return None

    def main_agent(self, topo: OpenAITopology) -> str | None:
        return None

    def parts(self, topo: OpenAITopology) -> tuple[str, ...] | None:
        return None

    def transcript_order(self, topo: OpenAITopology) -> list[str] | None:
        return None

    def turn_limit(self, topo: OpenAITopology) -> int:
        return topo.max_model_calls  # every turn is a request, and the cap ends the episode

    def refs(self, topo: OpenAITopology, names: list[str]) -> list[Issue]:
        return []  # the models the code asks for are agent names, checked per request (404 otherwise)

    def errors(self, cfg: Any) -> list[Issue]:
        return [(("topology", "entry"), cfg.topology.entry, m) for m in entry_errors(cfg.topology.entry)]

    def protocol_errors(self, cfg: Any) -> list[Issue]:
        return []

    def warnings(self, cfg: Any) -> list[Issue]:
        return [(("topology", "entry"), cfg.topology.entry, m) for m in entry_warnings(cfg.topology.entry)]

    def drawing(self, cfg: Any) -> Drawing:
        """The team's code as one box, and the agents it may ask (it is code: who speaks when is decided there)."""
        t, names = cfg.topology, cfg.agent_names
        start, end = registry.START, registry.END
        box = f"entry {t.entry}"
        edges = [Edge(start, box, "task")] + [Edge(box, a, "chat completions") for a in names] + [Edge(box, end, "its answer")]
        note = (f"the team is code ({t.entry}) that calls an OpenAI-compatible endpoint: who speaks when is decided there "
                f"and cannot be drawn from the config; its models are the agents {', '.join(names)}")
        return Drawing([start, box, *names, end], edges, {a: a for a in names}, bound=f"at most {t.max_model_calls} model calls",
                       note=note)

    def side_processes(self, cfg: Any) -> str | None:
        n = cfg.topology.processes
        if not n:  # the team's code on threads of this process: what its framework loads as it runs is not planned
            return ("the team's code runs in this process (topology.processes: 0); what its framework loads as it "
                    "first runs is not planned (DSPy's litellm client: about 180 MB)")
        return (f"topology.processes: {n} worker process{'es' if n > 1 else ''} for the team's code beside this one, "
                f"about {WORKER_MB} MB each with the openai client imported (more with a framework's own imports)")

    def teacher(self, cfg: Any, knobs: dict[str, float], demo_env: Any) -> Any:
        """The generic framework teacher: it reads each request's messages (and the tools described in
        its system message) as the model behind the endpoint would."""
        return framework_teacher(cfg, demo_env(), knobs)

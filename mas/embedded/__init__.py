"""The embedded offline model: ``model: embedded`` in a config.

A fresh machine with no network still gets a model that half-works on every built-in
topology (orchestrator, debate with a vote or a judge, chain with a verifier loop, graph) and
on the team tasks of ``envs/team``: a tiny Qwen2 warm-started on scripted teachers' transcripts
of each of those teams, built in-process on first use and cached.

* ``formats.py``: the warm-start formats (topology, agents with their exact role prompts and
  parsers, env, teacher); ``FORMATS`` is the list, and every format names the shipped
  configs that use its prompts.
* ``teachers.py``: the scripted teachers, each with a deliberate, documented flaw that RL
  can fix.
* ``build.py``: the recipe, the build (transcripts, tokenizer, warm start) and the cache.
* ``fit.py``: the check that warns when a team on the embedded model is not one it was
  warm-started for (after the first evaluation or step of training).
"""

from .build import Recipe, build_embedded, cache_dir, embedded_path, format_transcripts, load_embedded, teacher_transcripts
from .formats import FORMATS, AgentSpec, Format

__all__ = ["FORMATS", "AgentSpec", "Format", "Recipe", "build_embedded", "cache_dir", "embedded_path",
           "format_transcripts", "load_embedded", "teacher_transcripts", "warm_started_roles"]


def warm_started_roles() -> dict[str, dict[str, str]]:
    """The role prompts the embedded model was warm-started on: format -> agent -> role."""
    return {name: FORMATS[name].roles for name, _ in Recipe().formats}

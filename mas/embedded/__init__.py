"""The embedded offline model: ``model: embedded`` in a config.

A fresh machine with no network still gets a model that half-works on every built-in
topology (orchestrator, debate with a vote or a judge, chain with a verifier loop, graph) and
on the team tasks of ``envs/team``: a tiny Qwen2 warm-started on scripted teachers' transcripts
of each of those teams.  It ships with the package (``artifact/``, what the project's recipe
builds, checked by its manifest), so a fresh clone uses it at once; a recipe the artifact was
not built from is built into the cache on first use.

* ``formats.py``: the warm-start formats (topology, agents with their exact role prompts and
  parsers, env, teacher); ``FORMATS`` is the list, and every format names the shipped
  configs that use its prompts.
* ``teachers.py``: the scripted teachers, each with a deliberate, documented flaw that RL
  can fix.
* ``recipe.py``: what is built, and its key.
* ``artifact.py``: the shipped model and the cache: which folder may be used (its manifest's
  key and file hashes), and loading it.  This is all a policy needs to load ``model: embedded``.
* ``build.py``: the build (transcripts, tokenizer, warm start), imported by the layers that
  may run it (the team builder, ``mas build-embedded``): it runs the engine and topologies.
* ``fit.py``: the check that warns when a team on the embedded model is not one it was
  warm-started for (after the first evaluation or step of training).
"""

from .artifact import ARTIFACT_DIR, EmbeddedUnavailable, embedded_path, load_embedded
from .formats import FORMATS, AgentSpec, Format
from .recipe import Recipe

__all__ = ["ARTIFACT_DIR", "FORMATS", "AgentSpec", "EmbeddedUnavailable", "Format", "Recipe", "embedded_path",
           "load_embedded", "warm_started_roles"]


def warm_started_roles() -> dict[str, dict[str, str]]:
    """The role prompts the embedded model was warm-started on: format -> agent -> role."""
    return {name: FORMATS[name].roles for name, _ in Recipe().formats}

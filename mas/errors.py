"""Error types that modules of every layer raise or catch.

They live at the bottom (docs/architecture.md, "Layering: imports point down") so that, say, the hub
access (``mas.models.hub``) raises the same error as the model sources (``mas.models.sources``) and the
policy loader without importing them, the Ray cluster setup (``mas.runtime``) raises what the
metrics writer raises, and the CLI catches one type wherever it was raised.  The modules that
held them before re-export them (``mas.models.sources.ModelLoadError``, hence
``mas.agents.policy.ModelLoadError``; ``mas.training.metrics.MissingDependencyError``), so existing
imports keep working.
"""


class ModelLoadError(OSError):
    """A policy's model or tokenizer could not be loaded; the message names the policy and model."""


class MissingDependencyError(RuntimeError):
    """An optional package a config asks for is not installed; the message says what to install."""


class CheckpointError(OSError):
    """A checkpoint's file is missing or damaged; the message names the file, and the policy where it is one's."""

"""The framework teacher (``FrameworkTeacher``, for any AutoGen or LangGraph team) lives in
``mas.topologies.framework_teaching`` now (a topology kind owns its scripted teacher, docs/architecture.md
"Kinds are plugins"); this module re-exports it so that the old import path still works."""

from mas.topologies.framework_teaching import (  # noqa: F401
    HANDOFF,
    TOOLS_HEADER,
    FrameworkTeacher,
    TaskBook,
    Tool,
    _key,
    _occurs,
    asked_words,
    framework_teacher,
    offered_tools,
    prefixed,
    said_by,
    transcript,
)
from mas.topologies.autogen import autogen_shape  # noqa: F401,E402

"""The embedded model's scripted teachers live in ``mas.topologies.teaching`` now (a topology kind
owns its scripted teacher, docs/architecture.md "Kinds are plugins"); this module re-exports them so that
the old import path still works."""

from mas.topologies.teaching import (  # noqa: F401
    ChainTeacher,
    DebateTeacher,
    FactsTeacher,
    GraphTeacher,
    NoTeacher,
    OrchestratorTeacher,
    RelayTeacher,
    SaboteurTeacher,
    Step,
    Teacher,
    _PERSON,
    _REPLY_CITY,
    _seen,
    _tool_calls_so_far,
    answer_of,
    chain_steps,
    slipped,
    solve,
    step_text,
    task_line,
    transcript_lines,
    user_text,
    value,
    worked,
)

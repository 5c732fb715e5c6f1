"""Example team code that shipped configs name: an AutoGen team factory (``examples.teams``), a
LangGraph builder (``examples.graphs``) and a task set with its reward (``examples.rewards``).

Configs name them as ``"examples.teams:build"``; mas imports such references with the current
directory first on ``sys.path`` (as ``python -m`` does), so ``mas train configs/...`` run at
the repository root finds this package without installing it.  Your own package works the
same way from your project's root, or installed.
"""

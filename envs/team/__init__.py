"""Team tasks with a designed credit structure (synthetic, CPU-sized).

``team_conjunctive``: two specialists must both be right, each on its own part (an AND).
``team_saboteur``: a later turn may overrule the first answer, and is sometimes harmful.
``team_relay``: N specialists must all be right, each on its own part; N is a parameter.
``team_fork``: the relay's tasks, each specialist deciding to answer at once or work its part out; the
reward is the fraction of parts right.
Each module's docstring says what an episode-level baseline cannot tell apart there and what
a per-agent method can; ``configs/team_*.yaml`` are the teams they are designed for.  Each
records its ground truth of who did their job on ``episode.info["designed"]`` (``envs/base.py``).
Their tasks are made of ``synthetic_math`` chains (``chains.py``: the stream, splits, state dict and
description they share); ``parts.py`` judges the parts of a parts task.  Each module registers
its env and turn verifier when imported.
"""

# they register in this order (envs/__init__.py); fork.py imports relay.py, so the relay comes before it
from .conjunctive import TeamConjunctiveConfig, TeamConjunctiveEnv
from .saboteur import TeamSaboteurConfig, TeamSaboteurEnv
from .relay import TeamRelayConfig, TeamRelayEnv
from .fork import TeamForkConfig, TeamForkEnv

__all__ = ["TeamConjunctiveConfig", "TeamConjunctiveEnv", "TeamForkConfig", "TeamForkEnv", "TeamRelayConfig", "TeamRelayEnv", "TeamSaboteurConfig",
           "TeamSaboteurEnv"]

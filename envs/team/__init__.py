"""Team tasks with a designed credit structure (synthetic, CPU-sized).

``team_conjunctive``: two specialists must both be right, each on its own part (an AND).
``team_saboteur``: a later turn may overrule the first answer, and is sometimes harmful.
Each module's docstring says what an episode-level baseline cannot tell apart there and what
a per-agent method can; ``configs/team_*.yaml`` are the teams they are designed for.
"""

from .conjunctive import TeamConjunctiveConfig, TeamConjunctiveEnv
from .saboteur import TeamSaboteurConfig, TeamSaboteurEnv

__all__ = ["TeamConjunctiveConfig", "TeamConjunctiveEnv", "TeamSaboteurConfig", "TeamSaboteurEnv"]

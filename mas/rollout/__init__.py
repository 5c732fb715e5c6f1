"""The rollout: the engine that plays joint episodes, the packed scoring of their turns, the
sandbox that tools run in, and the backends that sample agent turns (``backends/``)."""

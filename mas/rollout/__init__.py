"""The rollout: the engine that plays joint episodes, and the backends that sample agent turns
(``backends/``)."""

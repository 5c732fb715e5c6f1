"""Process: what every floor may call about the process it runs in.

Crash-test pause points (``fault_points``), resident-memory accounting and release (``memory``),
and the sandbox that runs tool code in a subprocess with a time and memory limit (``sandbox``)."""

"""Training: the team, the trainer's step, the supervised format warm-up, and the run it writes
(checkpoints, metrics, callbacks, run directories), with the stop signals ``mas train`` serves.
The update math it drives lives a floor down, in ``mas.learning``.

The folder is not named ``train``: ``mas.train`` is the Python API's function."""

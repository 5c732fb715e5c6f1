"""Training: the team, the trainer's step, the learner, the supervised format warm-up, and the run
it writes (checkpoints, metrics, callbacks, run directories), with the process utilities it needs
(memory release, crash-test pause points, stop signals).

The folder is not named ``train``: ``mas.train`` is the Python API's function."""

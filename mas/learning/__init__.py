"""Learning: the update math, below the runtime that runs it.

The learner (the packed PPO-clip update of one policy), supervised steps on demonstrations (the
format warm-up's), log-probabilities of packed turns (``logprobs``: what a policy assigns to the
tokens a turn sampled; not the env's score, which is the reward), and the memory plan (what a
policy's update and generation will hold, and the savers that keep it within the device)."""

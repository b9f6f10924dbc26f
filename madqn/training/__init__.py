"""Training: the acting loop, the learner set, the trainers (in-process, overlap, Ray), checkpoints and the
hooks that log a run."""

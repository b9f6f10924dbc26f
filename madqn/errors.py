"""User-facing errors: the CLI prints them as one line and exits non-zero (``--debug`` shows the traceback)."""


class MadqnError(Exception):
    """A problem with the user's input (env spec, config, run directory, checkpoint), not a bug."""


class ConfigError(MadqnError):
    """A config key, type or value is wrong; the message names the key."""


class CheckpointError(MadqnError):
    """A checkpoint is missing, corrupt, foreign or incompatible with the run's config."""


class NonFiniteError(MadqnError):
    """Training diverged: NaN/Inf in Q-values, TD errors or weights (the message names step and learner)."""

"""``CheckpointError``: a checkpoint that cannot be served (its own module, so every reader of checkpoint files
can raise it without importing another's)."""


class CheckpointError(ValueError):
    """A checkpoint that cannot be served; the message names the file or tensor."""

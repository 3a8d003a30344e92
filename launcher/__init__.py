"""The ``ignis`` launcher: the top floor, which starts the processes and imports none of their internals."""

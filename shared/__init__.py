"""Code used by more than one ignis process: the wire protocols and their codecs, flag parsing, the runtime
directory and its locks, the tier layout, tokenizer files, sampling limits, the metrics base, logging.

Nothing here imports torch at module import time.
"""

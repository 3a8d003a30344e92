"""Prompt reuse on the device tier: retained entries (pages + state image), their slots and index.

Pure Python bookkeeping (no torch): the scheduler asks the store where a
request can resume and where a capture goes; the runner moves the bytes.
"""

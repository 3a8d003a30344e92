"""Paged attention over the KV pool: KV write, prefill/extend and decode.

``reference.py`` holds the torch twins (the CPU serving path and the ground
truth for the Triton forms beside them).
"""

"""Depthwise causal conv1d with SiLU over per-sequence conv states: varlen prefill and one-step update.

``reference.py`` holds the torch twins (the CPU serving path and the ground
truth for the Triton forms beside them).
"""

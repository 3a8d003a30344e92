"""Fused per-layer elementwise chains: norms (plain, with the residual add, gated), rotary, gates.

``reference.py`` holds the torch twins (the model's exact torch math, the CPU
serving path and the ground truth); ``triton_norms.py`` and
``triton_pointwise.py`` hold the Triton forms, one launch per op.
"""

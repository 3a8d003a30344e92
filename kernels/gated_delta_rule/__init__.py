"""The gated delta rule of Gated DeltaNet: chunked varlen prefill and recurrent decode.

``reference.py`` holds the torch twins (the CPU serving path and the ground
truth for the Triton forms beside them): ``triton_recurrent.py`` (decode),
``triton_chunk.py`` (prefill: its state and output passes and the wrapper)
with ``triton_wy.py`` (the prefill's per-chunk WY kernel).
"""

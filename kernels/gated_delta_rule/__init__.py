"""The gated delta rule of Gated DeltaNet: chunked varlen prefill and recurrent decode.

``reference.py`` holds the torch twins (the CPU serving path and the ground
truth for the Triton forms beside them).
"""

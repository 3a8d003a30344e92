"""Compute kernels: Triton forms and their pure-torch reference twins, one folder per op."""

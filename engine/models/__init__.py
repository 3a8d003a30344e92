"""Model definitions of the hybrid families (Qwen3.5 dense, Qwen3-Next MoE) and their config."""

"""Helpers shared by test folders: checkpoints that carry Qwen's real tokenizers."""

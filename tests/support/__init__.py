"""Helpers shared by test folders: checkpoints that carry Qwen's real tokenizers, replayed traces, the reuse
differential harness, image prompts and their transformers reference."""

"""The tier daemon: KV-RAM arena, KV-disk files and the copies between them and engine memory."""

"""The engine process: model, KV pool, live state, scheduler, prefix index and tier policy."""

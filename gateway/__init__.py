"""The gateway process: OpenAI-compatible HTTP API, templates, tokenizing and streaming."""

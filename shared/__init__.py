"""Code used by more than one ignis process: wire protocol, config, stamps, hashing, CLI.

Nothing here imports torch at module import time.
"""

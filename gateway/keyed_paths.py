"""Which routes need the API key (with ``--api-key``): what the gateway checks and what /openapi.json says.

Every ``/v1`` route; ``/tokenize``, ``/detokenize``, ``/tokenizer_info``
(they read the tokenizer and template); ``/invocations`` (it generates);
``/server_info`` and ``/get_server_info`` (they tell the settings, the chat
template among them); the cache resets and the profiler.
"""

from __future__ import annotations

from ignis.gateway.cache_reset import RESET_PATHS
from ignis.gateway.profiling_api import PROFILE_PATHS

TOKENIZER_PATHS = ("/tokenize", "/detokenize", "/tokenizer_info")
GENERATING_PATHS = ("/invocations",)
SETTINGS_PATHS = ("/get_server_info", "/server_info")
KEYED = TOKENIZER_PATHS + GENERATING_PATHS + SETTINGS_PATHS + RESET_PATHS + PROFILE_PATHS


def needs_key(path: str) -> bool:
    """Whether a request for ``path`` must carry the API key (when one is configured)."""
    return path.startswith("/v1") or path in KEYED

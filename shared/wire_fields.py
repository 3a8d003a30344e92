"""Strict field checks and array framing shared by every wire message.

A message's fields are checked when it is built (by the sender) and again when
it is decoded (from a peer), with the same functions, so a value that cannot be
sent can never be received either. Checks are exact about types: ``True`` is
not an integer, ``"1"`` is not a number, a float is not a token id.

Array frames carry token ids as little-endian int32 (``<i4``), 4 bytes per
token, no header, no padding:

    frame = | t0 (4 B LE) | t1 (4 B LE) | ... | t[n-1] (4 B LE) |

Pure Python plus numpy; no torch.
"""

from __future__ import annotations

import functools
import math
import struct
from collections.abc import Iterable, Sequence
from typing import Annotated

import numpy as np

MAX_TOKEN_ID = 2**31 - 1
"""Largest token id the int32 frames can hold."""

MAX_FRAME_TOKENS = 1 << 24
"""Most token ids in one array frame (64 MiB); more is refused as garbage."""

MAX_INT = 2**63 - 1
"""Largest integer any header field may hold."""

MAX_TEXT_CHARS = 8192
"""Longest human-readable message (an error's or a refusal's words) any message carries."""

MAX_GRAMMAR_CHARS = 4 << 20
"""Longest grammar (llguidance's JSON or Lark text) a Generate may carry."""

TOKEN_DTYPE = np.dtype("<i4")

TokenFrame = Annotated[tuple[int, ...], "int32 token ids, one array frame"]
"""Declared type of a message field that travels as its own array frame (layout above), not in the header."""


class WireError(ValueError):
    """A message that cannot be encoded or decoded; the message says which part and why."""


def check_int(name: str, value: object, lo: int = 0, hi: int = MAX_INT) -> int:
    """``value`` as an int in ``[lo, hi]``; bools and floats are refused."""
    if type(value) is not int:
        raise TypeError(f"{name} must be an integer, got {type(value).__name__}")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return value


def check_opt_int(name: str, value: object, lo: int = 0, hi: int = MAX_INT) -> int | None:
    """``None`` or an int in ``[lo, hi]``."""
    return None if value is None else check_int(name, value, lo, hi)


def check_float(name: str, value: object, lo: float, hi: float) -> float:
    """``value`` as a finite float in ``[lo, hi]``; ints are widened, bools refused."""
    if type(value) not in (int, float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if isinstance(value, float) and math.isnan(value):
        raise ValueError(f"{name} must not be NaN")
    if not lo <= value <= hi:
        raise ValueError(f"{name} must be in [{lo}, {hi}], got {value}")
    return float(value)


def check_bool(name: str, value: object) -> bool:
    if type(value) is not bool:
        raise TypeError(f"{name} must be true or false, got {type(value).__name__}")
    return value


def check_str(name: str, value: object, max_chars: int, *, allow_empty: bool = True) -> str:
    if type(value) is not str:
        raise TypeError(f"{name} must be a string, got {type(value).__name__}")
    if not allow_empty and not value:
        raise ValueError(f"{name} must not be empty")
    if len(value) > max_chars:
        raise ValueError(f"{name} is {len(value)} characters, at most {max_chars} allowed")
    return value


def check_choice(name: str, value: object, choices: Sequence[str]) -> str:
    if type(value) is not str or value not in choices:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}, got {value!r}")
    return value


class TokenIds(tuple):
    """A tuple of token ids already known to be valid (it came out of an int32 frame).

    Only ``frame_to_tokens`` makes one; ``check_token_ids`` passes it through
    without looking at every element again.
    """

    __slots__ = ()


def check_token_ids(name: str, value: object, max_len: int = MAX_FRAME_TOKENS) -> tuple[int, ...]:
    """A tuple of token ids, each an int in ``[0, MAX_TOKEN_ID]``; lists are accepted."""
    if type(value) is TokenIds and len(value) <= max_len:
        return value
    if not isinstance(value, (tuple, list)):
        raise TypeError(f"{name} must be a list of token ids, got {type(value).__name__}")
    if len(value) > max_len:
        raise ValueError(f"{name} has {len(value)} tokens, at most {max_len} allowed")
    for i, t in enumerate(value):
        if type(t) is not int or not 0 <= t <= MAX_TOKEN_ID:
            raise ValueError(f"{name}[{i}] must be a token id in [0, {MAX_TOKEN_ID}], got {t!r}")
    return tuple(value)


def check_logprob(name: str, value: object) -> float:
    """A log probability: a float <= 0 (a tiny positive rounding error is allowed) or -inf."""
    if type(value) not in (int, float):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if math.isnan(value) or value > 1e-3:
        raise ValueError(f"{name} must be a log probability (<= 0), got {value}")
    return float(value)


def logprobs_to_json(values: Iterable[float]) -> list[float | None]:
    """JSON has no infinity: -inf travels as null."""
    return [None if v == -math.inf else v for v in values]


def logprobs_from_json(name: str, values: object) -> tuple[float, ...]:
    if not isinstance(values, list):
        raise TypeError(f"{name} must be a list, got {type(values).__name__}")
    return tuple(-math.inf if v is None else check_logprob(f"{name}[{i}]", v) for i, v in enumerate(values))


def tokens_to_frame(token_ids: Sequence[int]) -> bytes:
    """Pack already checked token ids into one little-endian int32 frame."""
    return np.asarray(token_ids, dtype=TOKEN_DTYPE).tobytes()


def frame_to_tokens(name: str, frame: bytes | bytearray | memoryview) -> TokenIds:
    """Unpack an int32 frame, refusing ragged lengths, oversize frames and negative ids."""
    size = memoryview(frame).nbytes
    if size % TOKEN_DTYPE.itemsize:
        raise WireError(f"{name} frame is {size} bytes, not a multiple of {TOKEN_DTYPE.itemsize} (int32 token ids)")
    if size // TOKEN_DTYPE.itemsize > MAX_FRAME_TOKENS:
        raise WireError(f"{name} frame holds {size // 4} tokens, at most {MAX_FRAME_TOKENS} allowed")
    n = size // TOKEN_DTYPE.itemsize
    if n <= _SMALL_FRAME:  # a round's few tokens: struct is cheaper than numpy's per-call overhead
        ids = _small_frame(n).unpack(frame)
        if ids and min(ids) < 0:
            raise WireError(f"{name} frame holds a negative token id ({min(ids)})")
        return TokenIds(ids)
    arr = np.frombuffer(frame, dtype=TOKEN_DTYPE)
    if arr.size and int(arr.min()) < 0:
        raise WireError(f"{name} frame holds a negative token id ({int(arr.min())})")
    return TokenIds(arr.tolist())


_SMALL_FRAME = 512
"""Frames of at most this many tokens are read with ``struct`` (one compiled format per length)."""


@functools.cache
def _small_frame(n: int) -> struct.Struct:
    return struct.Struct(f"<{n}i")

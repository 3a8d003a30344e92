"""The E8P-style codebook of hq-e8-2b: 2**16 points of E8 +/- 1/4, one 16-bit code per 8 values.

A codebook point is ``z + delta * (1, ..., 1)`` with::

    z      in (Z + 1/2)^8 with sum(z) even        (the half-integer coset of E8)
    |z|    one of the 256 PATTERNS below          (absolute values, in order)
    delta  +1/4 or -1/4

PATTERNS: indices 0..226 are every absolute-value vector of that coset with
``|z|^2 <= 10`` (entries 1/2, 3/2, 5/2), sorted by norm and then
lexicographically; indices 227..255 are 29 vectors of norm 12 with five 3/2
and three 1/2, the first 29 in lexicographic order of the positions of their
three 1/2 entries. After the randomized Hadamard rotation the coordinates of a
group are exchangeable, so which 29 of the 56 such vectors are taken does not
change the expected error.

Code bits (uint16, stored as int16)::

    15 ........ 8 | 7     | 6 ........ 0
    pattern index | shift | signs of z_0 .. z_6   (1 = negative)
                    0: +1/4, 1: -1/4

The sign of ``z_7`` is implied: ``sum(z)`` is even exactly when the number of
negative entries has the parity of ``sum(|z|)`` (each flip moves the sum by an
odd integer), so 256 patterns x 2**7 signs x 2 shifts = 2**16 distinct points.

``PACKED[p]`` (int32) is what the kernels read: ``2|z_i|`` (1, 3 or 5) in bits
``3i .. 3i+2`` for i = 0..7, and ``sum(|z|) mod 2`` in bit 24.
"""

from __future__ import annotations

import functools
import itertools

import torch

GROUP = 8
"""Values per code."""
NUM_PATTERNS = 256
PARITY_BIT = 24
SHIFT = 0.25


def _patterns() -> list[tuple[int, ...]]:
    """The 256 patterns as tuples of ``2|z_i|`` (odd integers 1, 3, 5)."""
    small = [p for p in itertools.product((1, 3, 5), repeat=GROUP) if sum(v * v for v in p) <= 40]
    small.sort(key=lambda p: (sum(v * v for v in p), p))
    extra = []
    for halves in itertools.combinations(range(GROUP), 3):
        extra.append(tuple(1 if i in halves else 3 for i in range(GROUP)))
        if len(extra) == NUM_PATTERNS - len(small):
            break
    out = small + extra
    if len(small) != 227 or len(out) != NUM_PATTERNS:
        raise AssertionError(f"codebook: {len(small)} small patterns, {len(out)} in all")
    return out


PATTERNS_X2 = _patterns()


@functools.lru_cache(maxsize=None)
def pattern_table() -> torch.Tensor:
    """[256, 8] fp32: |z| of each pattern (the encoder's search table)."""
    return torch.tensor(PATTERNS_X2, dtype=torch.float32) / 2


@functools.lru_cache(maxsize=None)
def pattern_parity() -> torch.Tensor:
    """[256] int32: sum(|z|) mod 2 of each pattern."""
    return torch.tensor([(sum(p) // 2) % 2 for p in PATTERNS_X2], dtype=torch.int32)


@functools.lru_cache(maxsize=None)
def pattern_norms() -> torch.Tensor:
    """[256] fp32: |z|^2 of each pattern."""
    return pattern_table().pow(2).sum(-1)


@functools.lru_cache(maxsize=None)
def _packed_cpu() -> torch.Tensor:
    words = []
    for p in PATTERNS_X2:
        w = 0
        for i, v in enumerate(p):
            w |= v << (3 * i)
        w |= ((sum(p) // 2) % 2) << PARITY_BIT
        words.append(w)
    return torch.tensor(words, dtype=torch.int32)


_PACKED: dict = {}


def packed_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """[256] int32 PACKED table on ``device`` (one copy per device)."""
    dev = torch.device(device)
    if dev not in _PACKED:
        _PACKED[dev] = _packed_cpu().to(dev)
    return _PACKED[dev]


def decode_codes(codes: torch.Tensor) -> torch.Tensor:
    """Codes (any int dtype, low 16 bits used) -> points [..., 8] fp32, in codebook units."""
    c = codes.to(torch.int32) & 0xFFFF
    word = packed_table(codes.device)[(c >> 8).long()].unsqueeze(-1)
    i = torch.arange(GROUP, device=codes.device, dtype=torch.int32)
    mag = ((word >> (3 * i)) & 7).float() * 0.5
    signs = (c & 0x7F).unsqueeze(-1)
    par = signs ^ (signs >> 4)
    par = par ^ (par >> 2)
    par = (par ^ (par >> 1)) & 1  # parity of the 7 stored sign bits
    neg = torch.where(i == 7, par ^ ((word >> PARITY_BIT) & 1), (signs >> i.clamp(max=6)) & 1)
    shift = torch.where((c >> 7) & 1 == 1, -SHIFT, SHIFT).unsqueeze(-1)
    return torch.where(neg == 1, -mag, mag) + shift


def all_points() -> torch.Tensor:
    """[65536, 8] fp32: every codebook point, row = code (tests and brute-force checks)."""
    return decode_codes(torch.arange(1 << 16, dtype=torch.int32))

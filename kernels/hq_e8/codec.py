"""The hq-e8-2b codec in torch: rotation, page-row layout, encode and decode.

A token row of one layer's keys (or values) is the ``Hkv`` head vectors of
that token, ``V = Hkv * D`` values. Encoding a row:

1. rotate each head vector by the fixed randomized Hadamard transform
   ``x' = H_B diag(s) x`` (``s``: +-1 signs from ``SEED``; ``H_B``: the
   orthonormal Walsh-Hadamard transform on blocks of ``B`` values, ``B`` the
   largest power of two dividing ``D``, so ``B = D`` for head dims 64, 128,
   256; a head dim of 192 is rotated in three blocks of 64);
2. cut the rotated row into blocks of 64 values, each with one scale
   ``rms(block) / SCALE_TARGET`` rounded to bf16;
3. cut each block into groups of 8 and store the code of the codebook point
   nearest to ``group / scale`` (``codebook.py``).

A head dim that is not a multiple of 8, or a row ``Hkv * D`` that is not a
multiple of 64, is refused at load (``check_shape``). When ``D < 64`` a scale
block spans ``64 / D`` heads of the same token.

Page layout (one layer, keys; values alike), int16 throughout::

    pages[p] : [64 rows][R]        R = V/8 + V/64 int16 = 2.25 bits per value
    row r (token 64*p + r):
    +--------+--------+-----+------------+---------+-----+-------------+
    | code 0 | code 1 | ... | code V/8-1 | scale 0 | ... | scale V/64-1 |
    +--------+--------+-----+------------+---------+-----+-------------+
      code g  : rotated values 8g .. 8g+7 of the row (value h*D + d is
                rotated head h, coordinate d)
      scale s : bf16 bits (positive, so the int16 is >= 0) of values 64s .. 64s+63

Qwen3.5-27B (16 full layers, 4 kv heads of 256): R = 144, so a token takes
16 * 2 * 144 * 2 = 9,216 bytes where bf16 takes 65,536.

The attention kernels work in the rotated domain: they rotate the query once
(``q . k = (Rq) . (Rk)``), score it against decoded codes, accumulate the
decoded values and rotate the output back once, so no key is ever
un-rotated and no dequantized copy of the pool exists.
"""

from __future__ import annotations

import functools

import torch

from ignis.kernels.hq_e8 import codebook

GROUP = codebook.GROUP
SCALE_BLOCK = 64
"""Values per scale."""
SCALE_TARGET = 1.04
"""RMS of a block in codebook units (measured best for Gaussian data: 1.02-1.06 all within 0.3%)."""
SEED = 0x1E8E8
"""Seed of the rotation's sign flips (fixed: pages written under another seed decode to noise)."""
FORMAT = "hq-e8-2b"


def check_shape(num_kv_heads: int, head_dim: int) -> None:
    """Raise ValueError when a model's KV heads cannot be stored as hq-e8-2b."""
    if head_dim % GROUP:
        raise ValueError(f"--kv-format {FORMAT}: head dim {head_dim} is not a multiple of {GROUP}")
    if (num_kv_heads * head_dim) % SCALE_BLOCK:
        raise ValueError(f"--kv-format {FORMAT}: {num_kv_heads} kv heads x {head_dim} values per token is "
                         f"not a multiple of {SCALE_BLOCK}")


def row_width(num_kv_heads: int, head_dim: int) -> int:
    """int16 per token row of one layer's keys or values: V/8 codes + V/64 scales."""
    check_shape(num_kv_heads, head_dim)
    v = num_kv_heads * head_dim
    return v // GROUP + v // SCALE_BLOCK


def hadamard_block(head_dim: int) -> int:
    """B: the largest power of two dividing the head dim."""
    return head_dim & -head_dim


def _splitmix64(state: int) -> tuple[int, int]:
    state = (state + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return state, z ^ (z >> 31)


@functools.lru_cache(maxsize=None)
def rotation_signs(head_dim: int) -> tuple[float, ...]:
    """The +-1 sign flips of a head dim: bit 0 of successive splitmix64 outputs from SEED."""
    state, out = SEED, []
    for _ in range(head_dim):
        state, z = _splitmix64(state)
        out.append(-1.0 if z & 1 else 1.0)
    return tuple(out)


def fwht(x: torch.Tensor, block: int) -> torch.Tensor:
    """Orthonormal fast Walsh-Hadamard transform of each ``block`` values of the last dim."""
    shape = x.shape
    y = x.reshape(-1, shape[-1] // block, block)
    h = 1
    while h < block:
        y = y.view(y.shape[0], y.shape[1], block // (2 * h), 2, h)
        a, b = y[:, :, :, 0], y[:, :, :, 1]
        y = torch.stack((a + b, a - b), dim=3).view(y.shape[0], y.shape[1], block)
        h *= 2
    return (y * block ** -0.5).reshape(shape)


@functools.lru_cache(maxsize=None)
def _rotation_cpu(head_dim: int) -> torch.Tensor:
    signs = torch.tensor(rotation_signs(head_dim), dtype=torch.float64)
    m = fwht(torch.diag(signs), hadamard_block(head_dim))  # row i = rotate(e_i)
    return m.float()


_ROTATIONS: dict = {}


def rotation_matrix(head_dim: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[D, D] fp32 M with ``rotate(x) = x @ M`` (orthogonal: ``unrotate(y) = y @ M.T``)."""
    key = (head_dim, torch.device(device))
    if key not in _ROTATIONS:
        _ROTATIONS[key] = _rotation_cpu(head_dim).to(key[1])
    return _ROTATIONS[key]


def rotate(x: torch.Tensor) -> torch.Tensor:
    """Head vectors [..., D] -> rotated, fp32 (one matmul, so one launch on CUDA)."""
    return x.float() @ rotation_matrix(x.shape[-1], x.device)


def unrotate(y: torch.Tensor) -> torch.Tensor:
    """Inverse of ``rotate``, fp32."""
    return y.float() @ rotation_matrix(y.shape[-1], y.device).T


def to_bf16_bits(s: torch.Tensor) -> torch.Tensor:
    """Positive fp32 -> int32 holding its bf16 bits, rounded to nearest even."""
    bits = s.float().contiguous().view(torch.int32)
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def from_bf16_bits(bits: torch.Tensor) -> torch.Tensor:
    """int (low 16 bits = bf16) -> fp32."""
    return ((bits.to(torch.int32) & 0xFFFF) << 16).view(torch.float32)


def to_int16(x: torch.Tensor) -> torch.Tensor:
    """int32 in [0, 65536) -> int16 with the same 16 bits."""
    return torch.where(x >= 32768, x - 65536, x).to(torch.int16)


def block_scale_bits(blocks: torch.Tensor) -> torch.Tensor:
    """[M, 64] fp32 rotated values -> [M] int32 bf16 bits of their scales."""
    rms = (blocks * blocks).sum(-1).div(SCALE_BLOCK).sqrt()
    return to_bf16_bits(rms / SCALE_TARGET)


def _ordered_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over the last dim (8) left to right, as the Triton encoder adds."""
    acc = x[..., 0]
    for i in range(1, x.shape[-1]):
        acc = acc + x[..., i]
    return acc


def nearest_codes(u: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """[N, 8] fp32 in codebook units -> [N] int32 codes of the nearest points.

    Per shift and pattern the best signs follow the coordinates' signs; when
    their count of negatives has the wrong parity the coordinate whose flip
    costs least (smallest ``|z_i| |u_i|``) is flipped. The sums run over the 8
    coordinates in order, as the Triton encoder's do; ties go to the lower
    pattern, the +1/4 shift and the lower coordinate.
    """
    out = torch.empty(u.shape[0], dtype=torch.int32, device=u.device)
    mags = codebook.pattern_table().to(u.device)
    par = codebook.pattern_parity().to(u.device)
    norms = codebook.pattern_norms().to(u.device)
    bit = torch.arange(7, device=u.device, dtype=torch.int32)
    for c0 in range(0, u.shape[0], chunk):
        uc = u[c0:c0 + chunk].float()
        best_dist = best_code = None
        for shift_bit, delta in ((0, codebook.SHIFT), (1, -codebook.SHIFT)):
            w = uc - delta
            aw = w.abs()
            neg = (w < 0).to(torch.int32)
            corr = torch.zeros(w.shape[0], codebook.NUM_PATTERNS, device=u.device)
            least = torch.full_like(corr, float("inf"))
            prod = torch.empty_like(corr)
            for i in range(GROUP):
                torch.mul(aw[:, i:i + 1], mags[:, i], out=prod)
                corr.add_(prod)
                torch.minimum(least, prod, out=least)
            sq = _ordered_sum(w * w)
            negs = neg.sum(1)
            wrong = (negs % 2).unsqueeze(1) != par
            score = 2.0 * (corr - torch.where(wrong, 2.0 * least, 0.0)) - norms
            top, pat = score.max(dim=1)
            dist = sq - top
            # flip the cheapest coordinate of the chosen pattern when its parity is wrong
            prods = aw * mags[pat]
            flip = prods.argmin(dim=1)
            fix = wrong.gather(1, pat.unsqueeze(1)).squeeze(1) & (flip < 7)
            signs = (neg[:, :7] << bit).sum(1)
            signs = signs ^ torch.where(fix, 1 << flip.clamp(max=6).to(torch.int32), 0)
            code = (pat.to(torch.int32) << 8) | (shift_bit << 7) | signs
            if best_dist is None:
                best_dist, best_code = dist, code
            else:
                take = dist < best_dist
                best_code = torch.where(take, code, best_code)
        out[c0:c0 + chunk] = best_code
    return out


def encode_rows(rows: torch.Tensor) -> torch.Tensor:
    """Rotated rows [N, V] fp32 -> packed rows [N, V/8 + V/64] int16 (codes, then scales)."""
    n, v = rows.shape
    blocks = rows.float().reshape(n * (v // SCALE_BLOCK), SCALE_BLOCK)
    bits = block_scale_bits(blocks)
    scale = from_bf16_bits(bits)
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    u = (blocks * inv.unsqueeze(1)).reshape(-1, GROUP)
    codes = nearest_codes(u).reshape(n, v // GROUP)
    return torch.cat([to_int16(codes), to_int16(bits.reshape(n, v // SCALE_BLOCK))], dim=1)


def decode_rows(packed: torch.Tensor, values: int) -> torch.Tensor:
    """Packed rows [..., R] -> rotated rows [..., V] fp32."""
    ncode = values // GROUP
    lead = packed.shape[:-1]
    pts = codebook.decode_codes(packed[..., :ncode])  # [..., V/8, 8]
    scale = from_bf16_bits(packed[..., ncode:])  # [..., V/64]
    pts = pts.reshape(*lead, values // SCALE_BLOCK, SCALE_BLOCK) * scale.unsqueeze(-1)
    return pts.reshape(*lead, values)


def quantize_kv(x: torch.Tensor) -> torch.Tensor:
    """Keys or values [T, Hkv, D] (any float dtype) -> packed rows [T, R] int16."""
    t, hkv, d = x.shape
    return encode_rows(rotate(x).reshape(t, hkv * d))


def dequantize_kv(packed: torch.Tensor, num_kv_heads: int, head_dim: int) -> torch.Tensor:
    """Packed rows [..., R] -> keys or values [..., Hkv, D] fp32 (decoded and un-rotated)."""
    rows = decode_rows(packed, num_kv_heads * head_dim)
    return unrotate(rows.reshape(*packed.shape[:-1], num_kv_heads, head_dim))

"""Triton form of ``chunk_gated_delta_rule``: varlen chunked prefill from the state pool.

The chunked (WY / UT-transform) form, in three kernels over chunks of
``BT = 64`` tokens (a sequence's last chunk may be short; it is padded with
k = v = g = beta = 0, which leaves the result unchanged, exactly as the twin
pads):

1. ``_chunk_wy_kernel`` (``triton_wy.py``), one program per (chunk, value
   head), all chunks of all sequences in parallel. With ``gc`` the in-chunk
   cumsum of g and
   ``A = strictly_lower(beta_i k_i.k_j exp(gc_i - gc_j))``, it inverts the unit
   lower-triangular ``I + A`` blockwise in registers (the scheme of fla's
   ``solve_tril``): A is built as its 4 x 4 grid of ``BC = 16`` square blocks,
   the four diagonal blocks are inverted by forward substitution (14 steps,
   all four at once), and the inverses are merged 16 -> 32 -> 64 with
   ``inv([[P, 0], [Q, R]]) = [[P^-1, 0], [-R^-1 Q P^-1, R^-1]]`` in 16 small
   dots, always IEEE fp32. It then writes::

       u = (I + A)^-1 (beta * v)               [T, Hv, Dv] fp32 scratch
       w = (I + A)^-1 (beta * exp(gc) * k)     [T, Hv, Dk] fp32 scratch

   (A form computing A as one [BT, Dk] x [Dk, BT] dot and w, u as
   [BT, BT] x [BT, 64] dots of re-read k and v rows compiled without spills
   but ran slower on the H200: 63.8 against 52.4 ms over the 48 layers of an
   8K chunk; docs/performance.md.)

   Its grid is sized from the shapes alone, ``(T + (BT - 1) * B) // BT``
   chunks (each sequence leaves under one chunk unused); a program finds its
   sequence in ``chunk_end``, the cumsum of the sequences' chunk counts made
   on the device, and the spare programs past the last chunk return at once.
   The call makes no host-device sync.

2. ``_chunk_state_kernel``, the state pass: one program per (sequence, value
   head, block of ``BV`` value columns) walks that sequence's chunks in order
   with its ``[Dk, BV]`` slice of the fp32 state in registers, doing only what
   the recurrence needs, two dots per chunk::

       h[chunk] = S                             chunk-start state, to scratch
       v_new    = u - w S                       written over u in place
       S        = exp(gc_last) S + k^T (exp(gc_last - gc) * v_new)

   It reads the initial state at ``state[slots[b]]`` and writes the final one
   back there; no other slot is touched. A sequence's chunks are numbered
   from ``chunk_end[b - 1]``, so every chunk of the call has its own h row.

3. ``_chunk_out_kernel``, one program per (chunk, value head, value block),
   all in parallel like kernel 1 (same device-side chunk lookup)::

       o = exp(gc) * (q h[chunk]) + (causal(q k^T * exp(gc_i - gc_j))) v_new

q and k are L2-normalised in-kernel and q scaled by Dk**-0.5, as in the twin.
fp32 inputs use IEEE fp32 dots and keep h in fp32 (within ~1e-6 of the twin);
bf16/fp16 inputs use tf32 dots on the fp32 intermediates and keep h in bf16,
as fla does: h only feeds the output's inter-chunk term, so its rounding adds
~1e-3 relative to the outputs (tests: 3.97e-3 -> 4.19e-3 against the twin,
the bf16 rounding of the outputs dominating) and never touches the carried state,
and it halves the largest scratch and its traffic. The inversion's dots stay
IEEE fp32 either way.

Scratch, for T tokens in B sequences, NC = (T + (BT - 1) * B) // BT chunks
(the grid bound; each sequence leaves under one chunk unused)::

    u / v_new, w : 4 * T * Hv * (Dk + Dv) bytes            fp32
    h            : NC * Hv * Dk * Dv * (4 fp32 | 2 bf16) bytes

(``chunk_scratch_bytes``; at the 27B's Hv = 48, Dk = Dv = 128 and one 8K
sequence: 384 MiB + 192 MiB in bf16.) The engine's memory plan sets this
aside at its prefill token budget.

Parallelism and tiles (``default_blocks``; ``blocks=`` overrides them). On
one long sequence kernel 1 and kernel 3 run T / BT * Hv programs (times
Dv / BV for kernel 3), the state pass Hv * Dv / BV programs sequential over
T / BT chunks. At the 27B shapes (Hv = 48, Dk = Dv = 128, bf16, sm_90):

- state pass, BV = 32, 4 warps, 1 stage: 192 programs, 211 registers and
  56 KiB of shared memory each, so two fit on an SM and all 192 are resident
  on 132 SMs at once (8 warps needed ~200 registers at 256 threads: one per
  SM, a second wave for 60 of them). 2 stages would prefetch the next chunk
  but take 128 KiB of shared memory, one program per SM again. BV = 64 halves
  the re-reads of w but leaves 36 SMs idle with 96 programs.
- output pass, BV = 64, 4 warps: 112 KiB of shared memory each; q k^T is
  recomputed per value block (Dv / BV times), so halving the value blocks
  halves that work. On an H200 (bench/gpu_check.py's ``gdn_tiles`` sweep, 8K
  tokens) the whole forward took 2.34 ms with it against 2.49 ms at BV = 32
  (164 registers, 88 KiB, two per SM) and 2.62 ms at BV = 64 with 8 warps
  (245 registers, one per SM). For Dk > 128 (8 warps) the output pass keeps
  BV = 32.
  The launch is one axis, (chunk, value head, value block) with the value
  block fastest, so a chunk's q and k rows are read by neighbouring programs.

The serial part is now two [BT, Dk] x [Dk, BV]-sized dots and their loads per
chunk, against five before (with the q and k loads of the output) in one
kernel: about fla's ``chunk_fwd_h`` + ``chunk_fwd_o``, without fla's split of
the state over key blocks. Estimated, not yet measured, for one 8K sequence
at the 27B shapes: the state pass ~0.2-0.3 ms per layer (128 steps, each
about one round trip to memory plus two small dots), the output pass ~0.2 ms
(~0.6 GB of traffic), against 3.6 ms for the single sequential kernel before.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ignis.kernels.gated_delta_rule.triton_wy import BC, _chunk_wy_kernel, chunk_sequence, chunk_span, load_qk_rows

BT = 64
SEQ_BLOCK = 128  # sequences read per step of the chunk-parallel kernels' chunk lookup


@triton.jit
def _chunk_state_kernel(
    k, g, u_buf, w_buf, h_buf, state, slots, cu_seqlens, chunk_end,
    s_k_t, s_k_h, s_k_d, s_g_t, s_g_h, s_u_t, s_u_h, s_w_t, s_w_h, s_h_c, s_h_h,
    s_s_n, s_s_h, s_s_k, s_s_v,
    REP: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, PREC: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    iv = tl.program_id(2)
    hk = h // REP
    slot = tl.load(slots + b).to(tl.int64)
    bos = tl.load(cu_seqlens + b).to(tl.int64)
    eos = tl.load(cu_seqlens + b + 1).to(tl.int64)
    ic = tl.load(chunk_end + b - 1, mask=b > 0, other=0).to(tl.int64)  # the sequence's first global chunk
    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = iv * BV + tl.arange(0, BV)
    k_mask = offs_k < K
    v_mask = offs_v < V

    s_mask = k_mask[:, None] & v_mask[None, :]
    p_s = state + slot * s_s_n + h * s_s_h + offs_k[:, None] * s_s_k + offs_v[None, :] * s_s_v
    p_h = h_buf + h * s_h_h + offs_k[:, None] * V + offs_v[None, :]
    b_s = tl.load(p_s, mask=s_mask, other=0.0).to(tl.float32)
    for c0 in range(bos, eos, BT):
        tok = c0 + offs_t
        t_mask = tok < eos
        tl.store(p_h + ic * s_h_c, b_s.to(h_buf.dtype.element_ty), mask=s_mask)
        b_w = tl.load(w_buf + tok[:, None] * s_w_t + h * s_w_h + offs_k[None, :],
                      mask=t_mask[:, None] & k_mask[None, :], other=0.0)
        u_mask = t_mask[:, None] & v_mask[None, :]
        p_u = u_buf + tok[:, None] * s_u_t + h * s_u_h + offs_v[None, :]
        v_new = tl.load(p_u, mask=u_mask, other=0.0) - tl.dot(b_w, b_s, input_precision=PREC)
        tl.store(p_u, v_new, mask=u_mask)  # u becomes v_new in place: this program alone owns these rows
        b_k = load_qk_rows(k, tok, hk, s_k_t, s_k_h, s_k_d, offs_k, t_mask, k_mask)
        b_g = tl.load(g + tok * s_g_t + h * s_g_h, mask=t_mask, other=0.0).to(tl.float32)
        gc = tl.cumsum(b_g, 0)
        # the chunk's total decay is gc's last row (padded rows add g = 0), not a separate sum: the two
        # round apart, and g_last - gc must be exactly 0 at the last token, whose update weighs most
        # under strong decay (the carried state then drifts from the twin's by ~1e-5)
        g_last = tl.sum(tl.where(offs_t == BT - 1, gc, 0.0), 0)
        # k^T (exp(g_last - gc) * v_new): the decay scales the shared token axis, so it goes on the narrow side
        v_dec = v_new * tl.exp(g_last - gc)[:, None]
        b_s = b_s * tl.exp(g_last) + tl.dot(tl.trans(b_k), v_dec, input_precision=PREC)
        ic += 1
    tl.store(p_s, b_s.to(state.dtype.element_ty), mask=s_mask)


@triton.jit(do_not_specialize=["n_seqs"])  # varies with the batch: one compiled variant serves all
def _chunk_out_kernel(
    q, k, g, u_buf, h_buf, cu_seqlens, chunk_end, n_seqs, out, scale,
    s_q_t, s_q_h, s_q_d, s_k_t, s_k_h, s_k_d, s_g_t, s_g_h, s_u_t, s_u_h, s_h_c, s_h_h,
    s_o_t, s_o_h, s_o_d,
    REP: tl.constexpr, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, NV: tl.constexpr,
    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, BS: tl.constexpr, PREC: tl.constexpr,
):
    # launch order (chunk, value head, value block), the last fastest: the programs that read one
    # chunk's q and k rows (its value blocks, and the REP value heads of a key head) run together
    pid = tl.program_id(0)
    iv = pid % NV
    h = (pid // NV) % H
    ic = pid // (NV * H)
    b = chunk_sequence(chunk_end, n_seqs, ic, BS)
    if b >= n_seqs:  # the grid's tail past the last chunk has nothing to do
        return
    bos, eos = chunk_span(chunk_end, cu_seqlens, b, ic, BT)
    hk = h // REP
    offs_t = tl.arange(0, BT)
    offs_k = tl.arange(0, BK)
    offs_v = iv * BV + tl.arange(0, BV)
    k_mask = offs_k < K
    v_mask = offs_v < V
    tok = bos + offs_t
    t_mask = tok < eos

    b_q = load_qk_rows(q, tok, hk, s_q_t, s_q_h, s_q_d, offs_k, t_mask, k_mask) * scale
    b_k = load_qk_rows(k, tok, hk, s_k_t, s_k_h, s_k_d, offs_k, t_mask, k_mask)
    gc = tl.cumsum(tl.load(g + tok * s_g_t + h * s_g_h, mask=t_mask, other=0.0).to(tl.float32), 0)
    b_h = tl.load(h_buf + ic.to(tl.int64) * s_h_c + h * s_h_h + offs_k[:, None] * V + offs_v[None, :],
                  mask=k_mask[:, None] & v_mask[None, :], other=0.0).to(tl.float32)
    v_new = tl.load(u_buf + tok[:, None] * s_u_t + h * s_u_h + offs_v[None, :],
                    mask=t_mask[:, None] & v_mask[None, :], other=0.0)
    causal = offs_t[:, None] >= offs_t[None, :]
    decay = tl.exp(tl.where(causal, gc[:, None] - gc[None, :], float("-inf")))
    intra = tl.dot(b_q, tl.trans(b_k), input_precision=PREC) * decay
    # (exp(gc) * q) h as exp(gc) * (q h): both dots then read the same q operand
    b_o = tl.dot(b_q, b_h, input_precision=PREC) * tl.exp(gc)[:, None]
    b_o += tl.dot(intra, v_new, input_precision=PREC)
    tl.store(out + tok[:, None] * s_o_t + h * s_o_h + offs_v[None, :] * s_o_d,
             b_o.to(out.dtype.element_ty), mask=t_mask[:, None] & v_mask[None, :])


class ChunkBlocks(NamedTuple):
    """Tiles of the two passes after kernel 1 (value columns per program, warps, pipeline stages),
    and kernel 1's warps and register cap (0: the defaults, 8 warps for Dk + Dv > 128 else 4, no cap)."""
    state_bv: int
    state_warps: int
    state_stages: int
    out_bv: int
    out_warps: int
    wy_warps: int = 0
    wy_maxnreg: int = 0


def default_blocks(dk: int, dv: int) -> ChunkBlocks:
    """The tiles for key width ``dk`` and value width ``dv`` (see the module docstring for why)."""
    bk = max(16, triton.next_power_of_2(dk))
    bdv = max(16, triton.next_power_of_2(dv))
    warps = 8 if bk > 128 else 4
    return ChunkBlocks(state_bv=min(32, bdv), state_warps=warps, state_stages=1,
                       out_bv=min(64 if warps == 4 else 32, bdv), out_warps=warps)


def chunk_scratch_bytes(tokens: int, seqs: int, hv: int, dk: int, dv: int, half_states: bool) -> int:
    """Device scratch one call allocates for ``tokens`` tokens in ``seqs`` sequences: u (later
    v_new) and w in fp32, and the chunk-start states in fp32, or bf16 when ``half_states``
    (bf16/fp16 inputs). Mirrored by ``ignis.engine.memory_plan.gdn_scratch_bytes``."""
    chunks = (tokens + (BT - 1) * seqs) // BT
    return 4 * tokens * hv * (dk + dv) + (2 if half_states else 4) * chunks * hv * dk * dv


def _chunk_ends(cu_seqlens: torch.Tensor, total: int, bsz: int) -> tuple[torch.Tensor, int]:
    """chunk_end[b]: chunks in sequences 0..b, made on the device, and the chunk-parallel grids'
    chunk count, bounded from the shapes alone (no sync)."""
    chunk_end = torch.cumsum(torch.div(cu_seqlens[1:] - cu_seqlens[:-1] + (BT - 1), BT, rounding_mode="floor"), 0)
    return chunk_end, (total + (BT - 1) * bsz) // BT


def _wy_pass(k, v, g, beta, cu_seqlens, chunk_end, n_chunks: int, bsz: int,
             tiles: ChunkBlocks) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel 1: u [T, Hv, Dv] and w [T, Hv, Dk], fp32 scratch."""
    total, hk, dk = k.shape
    hv, dv = v.shape[1], v.shape[2]
    u_buf = torch.empty((total, hv, dv), dtype=torch.float32, device=v.device)
    w_buf = torch.empty((total, hv, dk), dtype=torch.float32, device=v.device)
    bk = max(16, triton.next_power_of_2(dk))
    bdv = max(16, triton.next_power_of_2(dv))
    _chunk_wy_kernel[(n_chunks, hv)](
        k, v, g, beta, cu_seqlens, chunk_end, bsz, u_buf, w_buf,
        *k.stride(), *v.stride(), *g.stride(), *beta.stride(),
        u_buf.stride(0), u_buf.stride(1), w_buf.stride(0), w_buf.stride(1),
        REP=hv // hk, K=dk, V=dv, BT=BT, BC=BC, BK=bk, BDV=bdv, BS=SEQ_BLOCK,
        PREC="ieee" if v.dtype == torch.float32 else "tf32",
        num_warps=tiles.wy_warps or (8 if bk + bdv > 128 else 4), num_stages=1,
        maxnreg=tiles.wy_maxnreg or None,
    )
    return u_buf, w_buf


def chunk_wy(k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, cu_seqlens: torch.Tensor,
             blocks: ChunkBlocks | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel 1 alone (tests, and bench/gpu_check's timing of it): per chunk of the sequences of
    ``cu_seqlens``, u = (I + A)^-1 (beta * v) [T, Hv, Dv] and w = (I + A)^-1 (beta * exp(gc) * k)
    [T, Hv, Dk] in fp32, k L2-normalised, gc the in-chunk cumsum of g."""
    total, bsz = k.shape[0], cu_seqlens.shape[0] - 1
    if total == 0 or bsz == 0:
        raise ValueError(f"chunk_wy: no tokens to transform ({total} tokens in {bsz} sequences)")
    chunk_end, n_chunks = _chunk_ends(cu_seqlens, total, bsz)
    return _wy_pass(k, v, g, beta, cu_seqlens, chunk_end, n_chunks, bsz,
                    blocks or default_blocks(k.shape[2], v.shape[2]))


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
    blocks: ChunkBlocks | None = None,
) -> torch.Tensor:
    """Varlen chunked prefill from each sequence's state; final states written back.

    q, k [T, Hk, Dk], v [T, Hv, Dv], g/beta [T, Hv], state [S, Hv, Dk, Dv] read
    and written at ``slots`` [B], cu_seqlens [B + 1]. Returns [T, Hv, Dv] in v's dtype.
    ``blocks`` overrides the tiles of the three kernels (``default_blocks``).
    """
    total, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    bsz = slots.shape[0]
    if total == 0 or bsz == 0:
        return out
    dev = v.device
    chunk_end, n_chunks = _chunk_ends(cu_seqlens, total, bsz)
    tiles = blocks or default_blocks(dk, dv)
    u_buf, w_buf = _wy_pass(k, v, g, beta, cu_seqlens, chunk_end, n_chunks, bsz, tiles)
    h_dtype = torch.float32 if v.dtype == torch.float32 else torch.bfloat16
    h_buf = torch.empty((n_chunks, hv, dk, dv), dtype=h_dtype, device=dev)
    bk = max(16, triton.next_power_of_2(dk))
    prec = "ieee" if v.dtype == torch.float32 else "tf32"
    rep = hv // hk
    _chunk_state_kernel[(bsz, hv, triton.cdiv(dv, tiles.state_bv))](
        k, g, u_buf, w_buf, h_buf, state, slots, cu_seqlens, chunk_end,
        *k.stride(), *g.stride(), u_buf.stride(0), u_buf.stride(1), w_buf.stride(0), w_buf.stride(1),
        h_buf.stride(0), h_buf.stride(1), *state.stride(),
        REP=rep, K=dk, V=dv, BT=BT, BK=bk, BV=tiles.state_bv, PREC=prec,
        num_warps=tiles.state_warps, num_stages=tiles.state_stages,
    )
    nv = triton.cdiv(dv, tiles.out_bv)
    _chunk_out_kernel[(n_chunks * hv * nv,)](
        q, k, g, u_buf, h_buf, cu_seqlens, chunk_end, bsz, out, dk ** -0.5,
        *q.stride(), *k.stride(), *g.stride(), u_buf.stride(0), u_buf.stride(1),
        h_buf.stride(0), h_buf.stride(1), *out.stride(),
        REP=rep, H=hv, K=dk, V=dv, NV=nv, BT=BT, BK=bk, BV=tiles.out_bv, BS=SEQ_BLOCK, PREC=prec,
        num_warps=tiles.out_warps,
    )
    return out

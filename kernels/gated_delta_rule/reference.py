"""Torch twins of the gated delta rule (Gated DeltaNet's recurrence).

Per value head, with state ``S`` [Dk, Dv] (fp32) and per-token decay
``g`` (log space, <= 0) and write strength ``beta``::

    S   <- exp(g_t) * S
    S   <- S + k_t (beta_t * (v_t - S^T k_t))^T
    o_t  = S^T q_t

q and k are L2-normalised here and q is scaled by Dk**-0.5. Shapes (packed
varlen, fla's dialect)::

    q, k  : [T, Hk, Dk]     Hv % Hk == 0; value head h reads key head h // (Hv // Hk)
    v     : [T, Hv, Dv]
    g     : [T, Hv]  fp32   beta : [T, Hv]
    state : [S, Hv, Dk, Dv] fp32 pool of per-sequence states, addressed by
            ``slots`` [B]; read as the initial state, overwritten with the final one
    cu_seqlens : [B + 1]

Outputs come back in v's dtype, [T, Hv, Dv].
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

CHUNK = 64


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def _prepare(q, k, num_v_heads):
    rep = num_v_heads // q.shape[-2]
    if rep > 1:
        q = q.repeat_interleave(rep, dim=-2)
        k = k.repeat_interleave(rep, dim=-2)
    q = l2norm(q.float())
    k = l2norm(k.float())
    return q * (q.shape[-1] ** -0.5), k


def _chunked_one(q, k, v, g, beta, state):
    """One sequence: q, k [n, H, Dk] (prepared), v [n, H, Dv] fp32, g/beta [n, H]; state [H, Dk, Dv]."""
    n = q.shape[0]
    pad = (-n) % CHUNK
    q, k, v = (F.pad(x.transpose(0, 1), (0, 0, 0, pad)) for x in (q, k, v))  # [H, n+pad, D]
    g, beta = (F.pad(x.transpose(0, 1), (0, pad)) for x in (g, beta))  # [H, n+pad]
    h = q.shape[0]
    nc = (n + pad) // CHUNK
    q, k, v = (x.reshape(h, nc, CHUNK, x.shape[-1]) for x in (q, k, v))
    g = g.reshape(h, nc, CHUNK).cumsum(-1)
    beta = beta.reshape(h, nc, CHUNK, 1)

    lower = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).tril()
    decay = (g.unsqueeze(-1) - g.unsqueeze(-2)).masked_fill(~lower, float("-inf")).exp()
    k_beta = k * beta
    # WY form: (I + strictly-lower(k_beta k^T * decay)) X = rhs
    system = (k_beta @ k.transpose(-1, -2)) * decay
    u = torch.linalg.solve_triangular(system, v * beta, upper=False, unitriangular=True)
    w = torch.linalg.solve_triangular(system, k_beta * g.exp().unsqueeze(-1), upper=False, unitriangular=True)
    intra = (q @ k.transpose(-1, -2)) * decay
    q_dec = q * g.exp().unsqueeze(-1)
    k_dec = k * (g[..., -1:] - g).exp().unsqueeze(-1)
    chunk_decay = g[..., -1].exp()
    out = torch.empty_like(v)
    s = state
    for c in range(nc):
        v_new = u[:, c] - w[:, c] @ s
        out[:, c] = q_dec[:, c] @ s + intra[:, c] @ v_new
        s = s * chunk_decay[:, c, None, None] + k_dec[:, c].transpose(-1, -2) @ v_new
    return out.reshape(h, nc * CHUNK, -1)[:, :n].transpose(0, 1), s


def _stepped(q, k, v, g, beta, state, slots, starts, n):
    """Sequences of ``n`` tokens each, starting at rows ``starts``, a step at a time, all at once.

    The recurrence itself, batched over the sequences: for a verify chunk of
    1 + k positions this is a few small ops a step, where the chunked form
    pads every sequence to a 64-row chunk and solves two triangular systems."""
    rows = starts.unsqueeze(1) + torch.arange(n, device=starts.device)  # [B, n]
    q, k, v, g, beta = (x[rows] for x in (q, k, v, g, beta))  # [B, n, H, ...]
    decay = g.exp()
    s = state[slots].float()  # [B, H, Dk, Dv]
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    for i in range(n):
        s = s * decay[:, i, :, None, None]
        mem = torch.einsum("bhkv,bhk->bhv", s, k[:, i])
        s = s + k[:, i].unsqueeze(-1) * ((v[:, i] - mem) * beta[:, i].unsqueeze(-1)).unsqueeze(-2)
        out[:, i] = torch.einsum("bhkv,bhk->bhv", s, q[:, i])
    state[slots] = s.to(state.dtype)
    return rows.reshape(-1), out.reshape(-1, *out.shape[2:])


STEPPED_MAX = 8  # sequences up to this long step through the recurrence (verify chunks, short tails)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
    cu_seqlens: torch.Tensor,
) -> torch.Tensor:
    """Varlen chunked prefill from each sequence's state; final states written back.

    Sequences of at most ``STEPPED_MAX`` tokens run the recurrence a step at a
    time, those of one length together (the same arithmetic as decode steps)."""
    hv = v.shape[-2]
    qf, kf = _prepare(q, k, hv)
    vf, gf, bf = v.float(), g.float(), beta.float()
    out = torch.empty(v.shape, dtype=torch.float32, device=v.device)
    cu = cu_seqlens.tolist()
    slot_list = slots.tolist()
    short: dict[int, list[int]] = {}
    for b, slot in enumerate(slot_list):
        s, e = cu[b], cu[b + 1]
        if e == s:
            continue
        if e - s <= STEPPED_MAX:
            short.setdefault(e - s, []).append(b)
            continue
        o, final = _chunked_one(qf[s:e], kf[s:e], vf[s:e], gf[s:e], bf[s:e], state[slot].float())
        out[s:e] = o
        state[slot] = final.to(state.dtype)
    for n, group in short.items():
        starts = torch.tensor([cu[b] for b in group], device=q.device)
        idx = torch.tensor([slot_list[b] for b in group], device=q.device)
        rows, o = _stepped(qf, kf, vf, gf, bf, state, idx, starts, n)
        out[rows] = o
    return out.to(v.dtype)


def recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    slots: torch.Tensor,
) -> torch.Tensor:
    """One decode step for B sequences (q, k [B, Hk, Dk], v [B, Hv, Dv]); states updated in place."""
    hv = v.shape[-2]
    qf, kf = _prepare(q, k, hv)
    idx = slots.long()
    s = state[idx].float()  # [B, H, Dk, Dv]
    s = s * g.float().exp()[..., None, None]
    mem = (s * kf.unsqueeze(-1)).sum(dim=-2)
    delta = (v.float() - mem) * beta.float().unsqueeze(-1)
    s = s + kf.unsqueeze(-1) * delta.unsqueeze(-2)
    out = (s * qf.unsqueeze(-1)).sum(dim=-2)
    state[idx] = s.to(state.dtype)
    return out.to(v.dtype)

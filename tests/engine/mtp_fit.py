"""Fit a multi-token-prediction head to a model's own greedy outputs, in seconds (tiny models).

The head learns to predict, from the target's hidden state at position p and
the token at p+1, the target's greedy token at p+2. Fitted on the greedy
continuations of a few prompts, it drafts what the target then accepts: long
accepts in the speculative-decoding tests and the drafter bench.
"""

from __future__ import annotations

import torch

from ignis.engine.forward_batch import ForwardBatch, SeqChunk
from ignis.engine.models.state import ModelState
from tests.engine.mtp_reference import random_head


def target_hidden(model, ids: list[int]) -> torch.Tensor:
    """The target's final-normed hidden states of ``ids`` [T, h] (fp32, a plain tensor autograd may use)."""
    pages = -(-len(ids) // 64)
    state = ModelState.allocate(model.cfg, num_pages=pages, lanes=1, dtype=model.embed_tokens.weight.dtype)
    with torch.inference_mode():
        x = model.body(ForwardBatch.build([SeqChunk(ids, 0, list(range(pages)), 0)]), state)
        normed = model.norm(x, model._ops(x.device)).float()
    return normed.clone()


def fit_head(model, family: str, text: dict, sequences: list[tuple[list[int], int]], steps: int = 100,
             lr: float = 1e-2, seed: int = 0, negatives: int = 0):
    """A ``ReferenceMtp`` fitted to ``sequences``: (token ids, where the greedy output starts) each.

    Rows whose label is a greedy output token are the ones that count. ``negatives`` > 0: a sampled
    softmax over the labels and that many random other ids per step, for vocabularies too large
    to score whole on a CPU in seconds."""
    head = random_head(family, text, seed)
    head.train()
    weight = model.head_weight().detach().float()
    table = model.embed_tokens.weight.detach().float()
    rows = [len(ids) - 2 for ids, _ in sequences]  # row p: (hidden p, token p + 1) -> token p + 2
    width = max(rows)
    emb = torch.zeros(len(sequences), width, table.shape[1])
    hid = torch.zeros_like(emb)
    labels = torch.full((len(sequences), width), -100)
    for b, ((ids, out_start), n) in enumerate(zip(sequences, rows)):
        emb[b, :n] = table[torch.tensor(ids[1:n + 1])]
        hid[b, :n] = target_hidden(model, ids)[:n]
        labels[b, :n] = torch.tensor(ids[2:])
        labels[b, : max(0, out_start - 2)] = -100  # prompt tokens are not the model's to predict
    positions = torch.arange(width).expand(len(sequences), width)
    opt = torch.optim.Adam(head.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    kept = labels[labels >= 0].unique()
    for _ in range(steps):  # padding rows sit after each sequence's last: causal rows never see them
        opt.zero_grad()
        cols, target = weight, labels
        if negatives:
            others = torch.randint(0, weight.shape[0], (negatives,), generator=gen)
            ids = torch.cat([kept, others[~torch.isin(others, kept)]])
            cols = weight[ids]
            target = torch.where(labels >= 0, torch.searchsorted(kept, labels.clamp(min=0)), labels)
        logits = head(emb, hid, positions) @ cols.T
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), target.flatten(), ignore_index=-100).backward()
        opt.step()
    return head.eval()

"""A plain-torch multi-token-prediction head: the reference the engine's ``MtpHead`` is checked against.

Written from the public description of the Qwen3.5 / Qwen3-Next head: the
next token's embedding and the target's last hidden state, each through its
own zero-centred RMSNorm, concatenated (embedding first), projected by ``fc``
to the hidden size, one full-attention decoder layer, a final norm, and the
target's LM head. The decoder layer and the final norm are transformers' own
(a one-layer ``Qwen3_5TextModel`` / ``Qwen3NextModel`` fed ``inputs_embeds``:
its ``norm`` is the head's ``mtp.norm``), so the layer is checked against an
independent implementation. The module is trainable (tests fit it with Adam).

``mtp_checkpoint_tensors`` names its parameters as released checkpoints do
(``mtp.*``, one tensor per expert), ready to be written next to a target.
"""

from __future__ import annotations

import torch
from torch import nn

MTP_CONFIG_KEY = {"qwen3_5": "mtp_num_hidden_layers", "qwen3_next": "num_nextn_predict_layers"}


def text_config(family: str) -> dict:
    """The text config of ``make_checkpoint(family)`` (interval4, 4 layers, untied)."""
    from tests.engine.checkpoints import TINY_MOE, TINY_TEXT, layer_types

    text = dict(TINY_TEXT, layer_types=layer_types("interval4", 4), tie_word_embeddings=False)
    if family == "qwen3_next":
        text.update(TINY_MOE)
    return text


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + weight.float())


def _layer_model(family: str, text: dict):
    cfg = dict(text, num_hidden_layers=1, layer_types=["full_attention"])
    if family == "qwen3_next":
        from transformers import Qwen3NextConfig, Qwen3NextModel

        return Qwen3NextModel(Qwen3NextConfig(**cfg))
    from transformers import Qwen3_5TextConfig, Qwen3_5TextModel

    return Qwen3_5TextModel(Qwen3_5TextConfig(**cfg))


class ReferenceMtp(nn.Module):
    """The head over one sequence: row i = (token after position i, hidden state of position i)."""

    def __init__(self, family: str, text: dict):
        super().__init__()
        h = text["hidden_size"]
        self.eps = text.get("rms_norm_eps", 1e-6)
        self.pre_fc_norm_embedding = nn.Parameter(torch.zeros(h))
        self.pre_fc_norm_hidden = nn.Parameter(torch.zeros(h))
        self.fc = nn.Linear(2 * h, h, bias=False)
        self.body = _layer_model(family, text)
        self.body.embed_tokens = None  # the target's table is the head's: passed in as embeddings

    def forward(self, embeddings: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """embeddings, hidden: [T, h] or [B, T, h] (hidden: the target's final-normed states), positions
        [T] or [B, T]; -> the head's output, same leading shape. Rows attend causally within a sequence."""
        single = embeddings.dim() == 2
        if single:
            embeddings, hidden, positions = embeddings[None], hidden[None], positions[None]
        x = self.fc(torch.cat([rms_norm(embeddings, self.pre_fc_norm_embedding, self.eps),
                               rms_norm(hidden, self.pre_fc_norm_hidden, self.eps)], dim=-1))
        out = self.body(inputs_embeds=x, position_ids=positions, use_cache=False).last_hidden_state
        return out[0] if single else out

    def checkpoint_tensors(self, num_experts: int) -> dict[str, torch.Tensor]:
        """The head's parameters under the names released checkpoints give them."""
        out = {
            "mtp.pre_fc_norm_embedding.weight": self.pre_fc_norm_embedding,
            "mtp.pre_fc_norm_hidden.weight": self.pre_fc_norm_hidden,
            "mtp.fc.weight": self.fc.weight,
        }
        for name, t in self.body.state_dict().items():
            if name.endswith("experts.gate_up_proj"):
                inter = t.shape[1] // 2
                base = "mtp." + name.removesuffix("gate_up_proj")
                for e in range(num_experts):
                    out[f"{base}{e}.gate_proj.weight"] = t[e, :inter]
                    out[f"{base}{e}.up_proj.weight"] = t[e, inter:]
            elif name.endswith("experts.down_proj"):
                base = "mtp." + name.removesuffix("down_proj")
                for e in range(num_experts):
                    out[f"{base}{e}.down_proj.weight"] = t[e]
            else:
                out["mtp." + name] = t
        return {k: v.detach().clone().contiguous() for k, v in out.items()}


def reference_from_checkpoint(path, family: str, text: dict) -> ReferenceMtp:
    """The head written in a checkpoint directory (``mtp.*`` in any of its safetensors files)."""
    from pathlib import Path

    from safetensors.torch import load_file

    found = {}
    for f in sorted(Path(path).glob("*.safetensors")):
        found.update({k: v.float() for k, v in load_file(f).items() if k.startswith("mtp.")})
    head = ReferenceMtp(family, text)
    want = head.checkpoint_tensors(text.get("num_experts", 0))
    if set(want) != set(found):
        raise ValueError(f"{path}: mtp.* tensors differ from a whole head: {sorted(set(want) ^ set(found))[:5]}")
    params = {"pre_fc_norm_embedding": found["mtp.pre_fc_norm_embedding.weight"],
              "pre_fc_norm_hidden": found["mtp.pre_fc_norm_hidden.weight"], "fc.weight": found["mtp.fc.weight"]}
    for name, t in head.body.state_dict().items():
        if name.endswith("experts.gate_up_proj"):
            base = "mtp." + name.removesuffix("gate_up_proj")
            t = torch.stack([torch.cat([found[f"{base}{e}.gate_proj.weight"], found[f"{base}{e}.up_proj.weight"]])
                             for e in range(t.shape[0])])
        elif name.endswith("experts.down_proj"):
            base = "mtp." + name.removesuffix("down_proj")
            t = torch.stack([found[f"{base}{e}.down_proj.weight"] for e in range(t.shape[0])])
        else:
            t = found["mtp." + name]
        params["body." + name] = t
    head.load_state_dict(params, strict=True)
    return head.float().eval()


def random_head(family: str, text: dict, seed: int) -> ReferenceMtp:
    """A head with seeded random weights, norms included (so every weight matters)."""
    torch.manual_seed(seed)
    head = ReferenceMtp(family, text)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in head.named_parameters():
            if "norm" in name or name.startswith("pre_fc"):
                p.copy_(torch.randn(p.shape, generator=gen) * 0.2)
    return head.float().eval()

"""The Qwen3.5 vision tower: patches in, one prompt embedding per merged patch block out.

Module names match the checkpoints' ``model.visual.*`` names without that
prefix (``blocks.0.attn.qkv.weight``, ``merger.linear_fc1.weight``), so the
loader's vision tensors go straight into ``load_state_dict``. Per image:

    patches [N, C*T*P*P] --patch_embed (the Conv3d as one matmul)--> [N, D]
      + learned positions, bilinearly resampled (align_corners) from the
        square ``grid_per_side`` table to the image's ``gh x gw`` grid
      -> depth x (x + attn(norm1 x); x + mlp(norm2 x))
           attention: bidirectional within the image, 2-D rotary over the
           head: [h freqs | w freqs] twice (half-split form), fp32 rotation
      -> merger: LayerNorm, 4 consecutive patches (one m x m block) concatenated,
         fc1, GELU, fc2  -> [N / m^2, out_hidden]

Patches arrive in merge-block order (``engine.models.image_patches``), so a
merged block is ``m*m`` consecutive rows.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ignis.engine.models.layers import embedding
from ignis.engine.models.vision_config import VisionConfig
from ignis.shared.image_grid import ImageGrid


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def block_order_rows_cols(grid: ImageGrid, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Row and column of each patch, in merge-block order ([N] each)."""
    m = grid.merge_size
    rows = torch.arange(grid.grid_h, device=device).view(grid.grid_h // m, 1, m, 1)
    cols = torch.arange(grid.grid_w, device=device).view(1, grid.grid_w // m, 1, m)
    shape = (grid.grid_h // m, grid.grid_w // m, m, m)
    return rows.expand(shape).reshape(-1), cols.expand(shape).reshape(-1)


class VisionAttention(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.num_heads = cfg.num_heads
        self.qkv = nn.Linear(cfg.hidden_size, 3 * cfg.hidden_size, bias=True)
        self.proj = nn.Linear(cfg.hidden_size, cfg.hidden_size, bias=True)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x: [N, D] one image; cos/sin: [N, head_dim] fp32."""
        n = x.shape[0]
        q, k, v = self.qkv(x).view(n, 3, self.num_heads, -1).unbind(1)  # [N, H, hd] each
        c, s = cos.unsqueeze(1), sin.unsqueeze(1)
        q = (q.float() * c + _rotate_half(q.float()) * s).to(x.dtype)
        k = (k.float() * c + _rotate_half(k.float()) * s).to(x.dtype)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1))
        return self.proj(out.transpose(0, 1).reshape(n, -1))


class VisionMLP(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.linear_fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=True)
        self.linear_fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=True)
        self.approximate = "tanh" if cfg.hidden_act == "gelu_pytorch_tanh" else "none"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.gelu(self.linear_fc1(x), approximate=self.approximate))


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.norm2 = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.attn = VisionAttention(cfg)
        self.mlp = VisionMLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), cos, sin)
        return x + self.mlp(self.norm2(x))


class PatchEmbed(nn.Module):
    """The checkpoint's Conv3d (stride = kernel) applied as one matmul over flattened patches."""

    def __init__(self, cfg: VisionConfig):
        super().__init__()
        kernel = (cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size)
        self.proj = nn.Conv3d(cfg.in_channels, cfg.hidden_size, kernel_size=kernel, stride=kernel, bias=True)

    def forward(self, patches: torch.Tensor) -> torch.Tensor:
        w = self.proj.weight
        return F.linear(patches.to(w.dtype), w.reshape(w.shape[0], -1), self.proj.bias)


class PatchMerger(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.merged = cfg.hidden_size * cfg.merge_unit
        self.norm = nn.LayerNorm(cfg.hidden_size, eps=1e-6)
        self.linear_fc1 = nn.Linear(self.merged, self.merged)
        self.linear_fc2 = nn.Linear(self.merged, cfg.out_hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(x).view(-1, self.merged)
        return self.linear_fc2(F.gelu(self.linear_fc1(x)))


class VisionTower(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        self.cfg = cfg
        self.patch_embed = PatchEmbed(cfg)
        self.pos_embed = embedding(cfg.num_position_embeddings, cfg.hidden_size)
        self.blocks = nn.ModuleList(VisionBlock(cfg) for _ in range(cfg.depth))
        self.merger = PatchMerger(cfg)
        self.register_buffer("inv_freq", self.frequencies("cpu"), persistent=False)

    def frequencies(self, device) -> torch.Tensor:
        """Inverse frequencies of the 2-D rotary: head_dim/4 of them, shared by rows and columns."""
        quarter = self.cfg.head_dim // 2
        steps = torch.arange(0, quarter, 2, dtype=torch.float32, device=device)
        return 1.0 / (self.cfg.rope_theta ** (steps / quarter))

    def learned_positions(self, grid: ImageGrid, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """[N, D]: the position table resampled bilinearly (align_corners) to the image's grid."""
        side = self.cfg.grid_per_side
        (h0, h1), (wh0, wh1) = _taps(rows, grid.grid_h, side)
        (w0, w1), (ww0, ww1) = _taps(cols, grid.grid_w, side)
        table = self.pos_embed.weight
        out = None
        for hi, hw in ((h0, wh0), (h1, wh1)):
            for wi, ww in ((w0, ww0), (w1, ww1)):
                term = table[hi * side + wi] * (hw * ww)[:, None]
                out = term if out is None else out + term
        return out

    def rotary(self, rows: torch.Tensor, cols: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin [N, head_dim] fp32: [rows*f | cols*f] twice."""
        f = self.inv_freq.to(rows.device)
        emb = torch.cat([rows.float()[:, None] * f, cols.float()[:, None] * f], dim=-1)
        emb = torch.cat([emb, emb], dim=-1)
        return emb.cos(), emb.sin()

    @torch.inference_mode()
    def forward(self, patches: list[torch.Tensor], grids: list[ImageGrid]) -> list[torch.Tensor]:
        """Embeddings [grid tokens, out_hidden] of each image (``patches[i]``: [N_i, patch_dim])."""
        dtype = self.patch_embed.proj.weight.dtype
        device = self.patch_embed.proj.weight.device
        x_all = self.patch_embed(torch.cat(patches).to(device))
        outs, start = [], 0
        for grid in grids:
            n = grid.patches
            rows, cols = block_order_rows_cols(grid, device)
            x = x_all[start:start + n] + self.learned_positions(grid, rows, cols).to(dtype)
            start += n
            cos, sin = self.rotary(rows, cols)
            for block in self.blocks:
                x = block(x, cos, sin)
            outs.append(self.merger(x))
        return outs


def _taps(index: torch.Tensor, size: int, side: int):
    """Bilinear taps (floor, floor+1, clamped) and weights of ``index`` on an axis of ``size``
    into a table side of ``side``, corners aligned."""
    src = index.float() * (side - 1) / max(size - 1, 1)
    floor = torch.floor(src)
    lo = floor.long().clamp(0, side - 1)
    hi = (floor.long() + 1).clamp(0, side - 1)
    w_lo = (1 - (src - floor).abs()).clamp(min=0)
    w_hi = (1 - (src - floor - 1).abs()).clamp(min=0)
    return (lo, hi), (w_lo, w_hi)

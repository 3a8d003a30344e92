"""YaRN rope scaling: the frequencies and the cos/sin factor of a context stretched past training.

Qwen's model cards extend Qwen3.5 (262,144 tokens native) and Qwen3-Next
past their trained context with ``"rope_type": "yarn"`` in ``rope_parameters``
(``factor``, ``original_max_position_embeddings``). Per rotary frequency,
YaRN blends the trained frequency (fast-turning dimensions, which complete
many turns inside the trained length, keep it) with the frequency divided by
``factor`` (slow ones, interpolated), along a linear ramp between the
dimensions that turn ``beta_fast`` and ``beta_slow`` times over the trained
length; the cos/sin tables are then multiplied by an attention factor
(``0.1 * ln(factor) + 1`` unless the config gives it, or DeepSeek's
``mscale`` / ``mscale_all_dim`` ratio), which scales the rotated channels'
logits back up. The same arithmetic as transformers' ``yarn`` rope type,
which the tests hold it to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ignis.engine.models.checkpoint_error import CheckpointError


@dataclass(frozen=True)
class Yarn:
    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    attention_factor: float = 1.0
    truncate: bool = True

    def inv_freq(self, rotary_dim: int, theta: float, device="cpu"):
        """The blended inverse frequencies, [rotary_dim / 2] fp32."""
        import torch

        base = theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim)
        trained, stretched = 1.0 / base, 1.0 / (self.factor * base)
        low, high = self._ramp_ends(rotary_dim, theta)
        if low == high:
            high += 0.001  # a ramp of no width: a step
        ramp = ((torch.arange(rotary_dim // 2, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)
        keep = 1.0 - ramp  # 1: the trained frequency (fast dimensions), 0: the stretched one
        return stretched * (1.0 - keep) + trained * keep

    def _ramp_ends(self, rotary_dim: int, theta: float) -> tuple[float, float]:
        def dim_turning(turns: float) -> float:
            return rotary_dim * math.log(self.original_max_position_embeddings / (turns * 2 * math.pi)) / (
                2 * math.log(theta))

        low, high = dim_turning(self.beta_fast), dim_turning(self.beta_slow)
        if self.truncate:
            low, high = math.floor(low), math.ceil(high)
        return max(low, 0), min(high, rotary_dim - 1)


def _mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def parse_yarn(rope: dict, max_position_embeddings: int) -> Yarn:
    """The ``Yarn`` of a ``rope_parameters`` (or older ``rope_scaling``) dict whose type is yarn."""
    try:
        original = rope.get("original_max_position_embeddings")
        if original is None:
            raise CheckpointError("config.json: yarn rope scaling needs original_max_position_embeddings")
        original = int(original)
        factor = rope.get("factor")
        factor = float(factor) if factor is not None else max_position_embeddings / original
        if not factor > 0 or original < 1:
            raise CheckpointError(f"config.json: yarn rope scaling needs factor > 0 and "
                                  f"original_max_position_embeddings >= 1, got {factor}, {original}")
        attention = rope.get("attention_factor")
        if attention is None:
            mscale, all_dim = rope.get("mscale"), rope.get("mscale_all_dim")
            attention = (_mscale(factor, float(mscale)) / _mscale(factor, float(all_dim)) if mscale and all_dim
                         else _mscale(factor))
        return Yarn(factor=factor, original_max_position_embeddings=original,
                    beta_fast=float(rope.get("beta_fast") or 32.0), beta_slow=float(rope.get("beta_slow") or 1.0),
                    attention_factor=float(attention), truncate=bool(rope.get("truncate", True)))
    except CheckpointError:
        raise
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"config.json: malformed yarn rope scaling: {e}") from None

"""gpu_check's shapes: Qwen3.5-27B's for the GPU run (``FULL``), tiny ones for the dry run (``DRY``).

Each ``Shapes`` also carries the small random model the model section builds.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAGE = 64


@dataclass(frozen=True)
class Shapes:
    hq: int
    hkv: int
    d: int
    hk: int
    hv: int
    dk: int
    dv: int
    taps: int
    decode: tuple  # (batch, context)
    prefill: tuple  # (chunk, context after the chunk)
    gdn_tokens: tuple
    batches: tuple  # recurrent and conv-update batch sizes
    conv_tokens: tuple
    write_tokens: tuple
    model: dict = field(default_factory=dict)
    model_tokens: tuple = (37, 33, 6)  # two prefill chunks, then decode steps
    e2e: dict = field(default_factory=dict)  # the end-to-end model and what is timed on it

    @property
    def conv_dim(self) -> int:
        return 2 * self.hk * self.dk + self.hv * self.dv


def _model_cfg(hidden, layers, heads, kv, hd, lk, lv, ld, inter, vocab, max_len=4096) -> dict:
    period = min(4, layers)  # every 4th layer full attention, as in the checkpoints; at least one
    types = ["full_attention" if (i + 1) % period == 0 else "linear_attention" for i in range(layers)]
    return {"architectures": ["Qwen3_5ForCausalLM"], "vocab_size": vocab, "hidden_size": hidden,
            "intermediate_size": inter, "num_hidden_layers": layers, "layer_types": types,
            "num_attention_heads": heads, "num_key_value_heads": kv, "head_dim": hd,
            "linear_num_key_heads": lk, "linear_num_value_heads": lv, "linear_key_head_dim": ld,
            "linear_value_head_dim": ld, "linear_conv_kernel_dim": 4, "max_position_embeddings": max_len,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False}


K1, K4, K8, K16, K64 = 1024, 4096, 8192, 16384, 65536
FULL = Shapes(
    hq=24, hkv=4, d=256, hk=16, hv=48, dk=128, dv=128, taps=4,
    decode=((1, K4), (32, K4), (1, K64), (64, K16)),
    prefill=((2048, K16), (K8, K8), (K8, K64)),
    gdn_tokens=(K8, K64), batches=(1, 32), conv_tokens=(K8, K64), write_tokens=(64, K8),
    model=_model_cfg(256, 4, 6, 1, 64, 2, 4, 64, 512, 512), model_tokens=(150, 90, 8),
    # Qwen3.5-27B's shape: 64 layers (every 4th full attention), hidden 5120, 24 q / 4 kv heads of 256,
    # GDN 16 key / 48 value heads of 128, MLP 17408, the real vocabulary
    e2e={"model": _model_cfg(5120, 64, 24, 4, 256, 16, 48, 128, 17408, 248320, max_len=262144),
         "prefill": (K8, 4 * K8), "chunk": K8, "decode_lanes": (1, 32), "decode_context": K4, "steps": 20,
         "graph_max_len": 262144},
)
DRY = Shapes(
    hq=6, hkv=2, d=32, hk=2, hv=4, dk=16, dv=16, taps=4,
    decode=((2, 80),), prefill=((16, 80),), gdn_tokens=(70,), batches=(2,),
    conv_tokens=(70,), write_tokens=(16,),
    model=_model_cfg(32, 2, 4, 2, 16, 2, 4, 16, 48, 96), model_tokens=(37, 33, 3),
    e2e={"model": _model_cfg(32, 4, 4, 2, 16, 2, 4, 16, 48, 96),
         "prefill": (K1 // 8, K1 // 2), "chunk": K1 // 8, "decode_lanes": (1, 3), "decode_context": 100, "steps": 2,
         "graph_max_len": 4096},
)

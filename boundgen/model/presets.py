"""The demo checkpoints' shapes by preset name (`boundgen demo-model --preset`), apart from the
writer (demo.py) so that the command line lists them without importing torch."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Preset:
    family: str  # "qwen2" | "qwen3"
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    dtype: str  # storage dtype, also written as config "dtype"
    head_dim: int | None = None  # written only for qwen3 (qwen2 derives hidden // heads)
    tie_word_embeddings: bool = True
    rope_theta: float = 1_000_000.0
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768


PRESETS: dict[str, Preset] = {
    "tiny-qwen3": Preset("qwen3", 64, 2, 4, 2, 128, "float32", head_dim=16, max_position_embeddings=40960),
    "tiny-qwen2": Preset("qwen2", 64, 2, 4, 2, 160, "float32"),
    "qwen3-0.6b": Preset("qwen3", 1024, 28, 16, 8, 3072, "bfloat16", head_dim=128, max_position_embeddings=40960),
    "qwen2.5-0.5b": Preset("qwen2", 896, 24, 14, 2, 4864, "bfloat16"),
}

"""Model configuration read from an HF `config.json` (Qwen2 / Qwen3 families).

`ModelConfig` checks its invariants at construction. `ModelConfig.from_hf_dict` accepts exactly
the keys HF transformers writes for these families; a key we do not know, or a known key with a
value that changes the computation in a way we do not implement (rope scaling, sliding window,
another activation), is an error that names it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from boundgen.errors import ConfigError

ARCHITECTURES = {"Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}

# Keys that do not change inference in our packed layout (training knobs, bookkeeping, token ids
# that the programs take from generation_config.json instead).
_INERT_KEYS = {
    "_name_or_path", "architectures", "attention_dropout", "bos_token_id", "eos_token_id",
    "pad_token_id", "chunk_size_feed_forward", "dtype", "torch_dtype", "id2label", "label2id",
    "initializer_range", "is_encoder_decoder", "model_type", "output_attentions",
    "output_hidden_states", "problem_type", "return_dict", "transformers_version", "use_cache",
    "max_window_layers", "sliding_window", "tokenizer_class", "use_mrope",
}
_SHAPE_KEYS = {
    "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
    "num_key_value_heads", "head_dim", "rms_norm_eps", "max_position_embeddings",
    "tie_word_embeddings", "attention_bias",
}
_CHECKED_KEYS = {"hidden_act", "use_sliding_window", "layer_types", "rope_theta", "rope_scaling", "rope_parameters"}
KNOWN_KEYS = _INERT_KEYS | _SHAPE_KEYS | _CHECKED_KEYS


@dataclass(frozen=True)
class ModelConfig:
    family: str  # "qwen2" | "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool  # bias on q/k/v projections (always for Qwen2; attention_bias for Qwen3)
    o_bias: bool  # bias on the output projection (Qwen3 attention_bias only)
    qk_norm: bool  # per-head RMSNorm on q and k before RoPE (Qwen3)

    def __post_init__(self):
        if self.family not in ("qwen2", "qwen3"):
            raise ConfigError(f"unsupported model family {self.family!r}; expected qwen2 or qwen3")
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:  # JSON's true is no count
                raise ConfigError(f"config {name} must be a positive integer, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_heads}) must be a multiple of num_key_value_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ConfigError(f"head_dim must be even for rotary embeddings, got {self.head_dim}")
        if not (math.isfinite(self.rms_norm_eps) and self.rms_norm_eps > 0):
            raise ConfigError(f"rms_norm_eps must be a positive number, got {self.rms_norm_eps}")
        if not self.rope_theta > 0:
            raise ConfigError(f"rope_theta must be positive, got {self.rope_theta}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf_dict(cls, raw: dict) -> "ModelConfig":
        unknown = sorted(set(raw) - KNOWN_KEYS)
        if unknown:
            raise ConfigError(f"config.json has keys boundgen does not understand: {', '.join(unknown)}")
        family = _family(raw)
        act = raw.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"config hidden_act={act!r} is not supported; expected 'silu'")
        if raw.get("use_sliding_window", False):
            raise ConfigError("config use_sliding_window=true is not supported (full attention only)")
        layer_types = raw.get("layer_types")
        if layer_types is not None and any(t != "full_attention" for t in layer_types):
            raise ConfigError(f"config layer_types must all be 'full_attention', got {sorted(set(layer_types))}")
        required = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"]
        missing = [k for k in required if k not in raw]
        if missing:
            raise ConfigError(f"config.json is missing required keys: {', '.join(missing)}")
        try:
            return cls._from_checked(raw, family)
        except (TypeError, ValueError, ZeroDivisionError) as exc:  # e.g. "rms_norm_eps": "x", a head count of 0
            raise ConfigError(f"config.json has a value boundgen cannot use: {exc}") from None

    @classmethod
    def _from_checked(cls, raw: dict, family: str) -> "ModelConfig":
        num_heads = raw["num_attention_heads"]
        attention_bias = bool(raw.get("attention_bias", False))
        return cls(
            family=family,
            vocab_size=raw["vocab_size"],
            hidden_size=raw["hidden_size"],
            intermediate_size=raw["intermediate_size"],
            num_layers=raw["num_hidden_layers"],
            num_heads=num_heads,
            num_kv_heads=raw.get("num_key_value_heads") or num_heads,
            head_dim=raw.get("head_dim") or raw["hidden_size"] // num_heads,
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=_rope_theta(raw),
            max_position_embeddings=raw.get("max_position_embeddings", 32768),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", family == "qwen3")),
            qkv_bias=family == "qwen2" or attention_bias,
            o_bias=family == "qwen3" and attention_bias,
            qk_norm=family == "qwen3",
        )


def _family(raw: dict) -> str:
    arch = raw.get("architectures") or []
    model_type = raw.get("model_type")
    if arch:
        if len(arch) != 1 or arch[0] not in ARCHITECTURES:
            raise ConfigError(
                f"unsupported architecture {arch}; boundgen serves {', '.join(sorted(ARCHITECTURES))}")
        family = ARCHITECTURES[arch[0]]
        if model_type is not None and model_type != family:
            raise ConfigError(f"config model_type {model_type!r} does not match architecture {arch[0]}")
        return family
    if model_type in ("qwen2", "qwen3"):
        return model_type
    raise ConfigError(f"unsupported model_type {model_type!r}; boundgen serves qwen2 and qwen3")


def _rope_theta(raw: dict) -> float:
    """rope_theta from the top-level key (HF 4.x) or `rope_parameters` (HF 5.x); only default RoPE."""
    scaling = raw.get("rope_scaling")
    if scaling:
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind not in (None, "default"):
            raise ConfigError(f"config rope_scaling type {kind!r} is not supported; only default RoPE")
    params = raw.get("rope_parameters") or {}
    kind = params.get("rope_type", "default")
    if kind != "default":
        raise ConfigError(f"config rope_parameters.rope_type {kind!r} is not supported; only default RoPE")
    unknown = sorted(set(params) - {"rope_type", "rope_theta", "partial_rotary_factor"})
    if unknown or params.get("partial_rotary_factor", 1.0) != 1.0:
        raise ConfigError(f"config rope_parameters has keys boundgen does not understand: {unknown or ['partial_rotary_factor']}")
    theta = params.get("rope_theta", raw.get("rope_theta", 10000.0))
    return float(theta)

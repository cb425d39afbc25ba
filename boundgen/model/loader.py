"""Load an HF checkpoint directory into `QwenModel`: config.json + safetensors, never pickle.

HF tensor names map one to one onto ours, except q/k/v and gate/up, which are concatenated
into the fused `qkv_proj` / `gate_up_proj`. Every expected tensor must be present with its
expected shape; an unexpected tensor is an error (it would mean a model we do not implement).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open

from boundgen.errors import ConfigError, repeated_keys
from boundgen.model.config import ModelConfig
from boundgen.model.qwen import QwenModel
from boundgen.ops import rope as rope_op
from boundgen.ops.lowering import Ops

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def parse_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ConfigError(f"unsupported dtype {name!r}; expected one of {', '.join(DTYPES)}")
    return DTYPES[name]


def read_json_object(path: Path, what: str = "", unique_keys: bool = False) -> dict:
    """A JSON file (config.json, generation_config.json, the shards' index, a deploy file) as one
    object, else a ConfigError naming the file (after `what` it is, e.g. "deploy file") and what is wrong.
    unique_keys: a key given twice in an object is an error (json.loads keeps the last silently; HF's
    files are read as HF reads them, our own deploy file strictly)."""
    named = f"{what} {path}" if what else str(path)
    hook = functools.partial(_unique_keys, named) if unique_keys else None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"), object_pairs_hook=hook)
    except UnicodeDecodeError:
        raise ConfigError(f"{named} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise ConfigError(f"{named} is not valid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{named} must hold one JSON object, got {type(raw).__name__}")
    return raw


def _unique_keys(named: str, pairs: list) -> dict:
    twice = repeated_keys(pairs)
    if twice:
        raise ConfigError(f"{named} gives {', '.join(map(repr, twice))} twice; give each key once")
    return dict(pairs)


def default_stop_tokens(model_dir: str | Path) -> tuple[int, ...]:
    """Stop tokens as HF generate takes them: generation_config.json's eos_token_id, else config.json's."""
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            eos = read_json_object(path).get("eos_token_id")
            if eos is not None:
                ids = eos if isinstance(eos, list) else [eos]
                if not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
                    raise ConfigError(f"{path}: eos_token_id must be a token id or a list of them, got {eos!r}")
                return tuple(ids)
    return ()


def check_stop_tokens(model_dir: str | Path, stop_token_ids) -> None:
    """Stop tokens inside the checkpoint's vocabulary, else a ConfigError naming those outside."""
    vocab = read_config(model_dir).vocab_size
    outside = [t for t in stop_token_ids if t >= vocab]
    if outside:
        raise ConfigError(f"stop token ids {outside} are outside the model's vocabulary of {vocab} tokens")


def read_config(model_dir: str | Path) -> ModelConfig:
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError(f"{model_dir} is not a model directory: config.json not found")
    return ModelConfig.from_hf_dict(read_json_object(path))


def read_tensors(model_dir: str | Path) -> dict[str, torch.Tensor]:
    """All tensors of model.safetensors, or of the shards a model.safetensors.index.json lists."""
    model_dir = Path(model_dir)
    single = model_dir / "model.safetensors"
    index = model_dir / "model.safetensors.index.json"
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = read_json_object(index).get("weight_map", {})
        files = [model_dir / name for name in sorted(set(weight_map.values()))]
    else:
        raise ConfigError(f"{model_dir} has no model.safetensors or model.safetensors.index.json "
                          "(pickled .bin checkpoints are not loaded, by design)")
    tensors = {}
    for file in files:
        if not file.is_file():
            raise ConfigError(f"weight shard {file.name} listed in the index is missing")
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    tensors[name] = f.get_tensor(name)
        except SafetensorError as exc:
            raise ConfigError(f"{file} is not a valid safetensors file: {exc}") from None
    return tensors


def hf_to_boundgen(cfg: ModelConfig, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Rename (and fuse) HF tensors into QwenModel's state dict, checking names and shapes."""
    remaining = dict(tensors)

    def take(name: str, shape: tuple) -> torch.Tensor:
        if name not in remaining:
            raise ConfigError(f"checkpoint is missing tensor {name} (expected shape {list(shape)})")
        t = remaining.pop(name)
        if tuple(t.shape) != tuple(shape):
            raise ConfigError(f"checkpoint tensor {name} has shape {list(t.shape)}, expected {list(shape)}")
        return t

    H, D, V, I = cfg.hidden_size, cfg.head_dim, cfg.vocab_size, cfg.intermediate_size
    out = {"embed_tokens": take("model.embed_tokens.weight", (V, H)), "norm": take("model.norm.weight", (H,))}
    for i in range(cfg.num_layers):
        p, q = f"model.layers.{i}.", f"layers.{i}."
        out[q + "input_layernorm"] = take(p + "input_layernorm.weight", (H,))
        out[q + "post_attention_layernorm"] = take(p + "post_attention_layernorm.weight", (H,))
        sizes = {"q_proj": cfg.q_size, "k_proj": cfg.kv_size, "v_proj": cfg.kv_size}
        out[q + "self_attn.qkv_proj.weight"] = torch.cat(
            [take(f"{p}self_attn.{n}.weight", (s, H)) for n, s in sizes.items()])
        if cfg.qkv_bias:
            out[q + "self_attn.qkv_proj.bias"] = torch.cat(
                [take(f"{p}self_attn.{n}.bias", (s,)) for n, s in sizes.items()])
        out[q + "self_attn.o_proj.weight"] = take(p + "self_attn.o_proj.weight", (H, cfg.q_size))
        if cfg.o_bias:
            out[q + "self_attn.o_proj.bias"] = take(p + "self_attn.o_proj.bias", (H,))
        if cfg.qk_norm:
            out[q + "self_attn.q_norm"] = take(p + "self_attn.q_norm.weight", (D,))
            out[q + "self_attn.k_norm"] = take(p + "self_attn.k_norm.weight", (D,))
        out[q + "mlp.gate_up_proj.weight"] = torch.cat(
            [take(p + "mlp.gate_proj.weight", (I, H)), take(p + "mlp.up_proj.weight", (I, H))])
        out[q + "mlp.down_proj.weight"] = take(p + "mlp.down_proj.weight", (H, I))
    if cfg.tie_word_embeddings:
        remaining.pop("lm_head.weight", None)  # some tied checkpoints store the copy anyway
    else:
        out["lm_head"] = take("lm_head.weight", (V, H))
    # Rotary caches some exporters write are derived data, not parameters.
    for name in [n for n in remaining if n.endswith("rotary_emb.inv_freq")]:
        remaining.pop(name)
    if remaining:
        names = sorted(remaining)
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        raise ConfigError(f"checkpoint has tensors this {cfg.family} model does not use: {shown}")
    return out


def load_model(model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu",
               ops: Ops | None = None) -> QwenModel:
    cfg = read_config(model_dir)
    state = hf_to_boundgen(cfg, read_tensors(model_dir))
    with torch.device("meta"):
        model = QwenModel(cfg, ops)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    model.load_state_dict(state, strict=True, assign=True)
    model.inv_freq = rope_op.inv_freq(cfg.head_dim, cfg.rope_theta).to(device)
    model.requires_grad_(False)
    return model.eval()

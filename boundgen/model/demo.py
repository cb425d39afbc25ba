"""Seeded random-weight checkpoints in HF format, with the real Qwen vocabulary.

`write_demo_checkpoint(out_dir, preset)` writes what an HF Qwen2/Qwen3 checkpoint holds:
config.json (as transformers 5 writes it), model.safetensors (HF tensor names, stored in the
config's dtype), generation_config.json, tokenizer.json and tokenizer_config.json.

Weights are initialised like HF's `_init_weights` (normal, std 0.02), except that norm weights
are 1 + 0.1 N(0, 1) and biases 0.1 N(0, 1), so that a kernel ignoring a norm weight or a bias
shows. Each tensor has its own generator seeded from (seed, tensor name): changing one tensor's
presence (e.g. an untied lm_head) leaves the others as they were.

Tensors are generated in 16 MB chunks and streamed into the safetensors file, never building a
model: the 0.6B preset takes ~9 s on 2 cores and little memory beyond the tokenizer conversion.
"""

from __future__ import annotations

import json
import os
import struct
import zlib
from importlib import metadata
from pathlib import Path
from typing import Callable

import torch
from safetensors import safe_open

from boundgen.errors import ConfigError
from boundgen.model.config import ModelConfig
from boundgen.model.presets import PRESETS, Preset  # noqa: F401  (also this module's names)
from boundgen.text import vocab


DEMO_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
MARKER = "boundgen_demo"  # safetensors metadata key naming the preset and seed
INIT_STD = 0.02
NORM_NOISE = 0.1
BIAS_STD = 0.1
CHUNK_ELEMENTS = 1 << 22
PROGRESS_MIN_BYTES = 64 << 20  # smaller checkpoints are written without progress lines
# config dtype -> (torch dtype, safetensors dtype tag)
_ST_DTYPES = {"float32": (torch.float32, "F32"), "bfloat16": (torch.bfloat16, "BF16"),
              "float16": (torch.float16, "F16")}


def hf_config(preset: str | Preset, overrides: dict | None = None, tie_word_embeddings: bool | None = None) -> dict:
    """config.json contents: the preset's fields, then `overrides` (HF key names), then derived keys."""
    p = PRESETS[preset] if isinstance(preset, str) else preset
    qwen3 = p.family == "qwen3"
    cfg = {
        "architectures": ["Qwen3ForCausalLM" if qwen3 else "Qwen2ForCausalLM"],
        "attention_dropout": 0.0,
        "bos_token_id": vocab.ENDOFTEXT_ID,
        "dtype": p.dtype,
        "eos_token_id": vocab.IM_END_ID if qwen3 else vocab.ENDOFTEXT_ID,
        "hidden_act": "silu",
        "hidden_size": p.hidden_size,
        "initializer_range": INIT_STD,
        "intermediate_size": p.intermediate_size,
        "max_position_embeddings": p.max_position_embeddings,
        "model_type": p.family,
        "num_attention_heads": p.num_attention_heads,
        "num_hidden_layers": p.num_hidden_layers,
        "num_key_value_heads": p.num_key_value_heads,
        "pad_token_id": vocab.ENDOFTEXT_ID,
        "rms_norm_eps": p.rms_norm_eps,
        "rope_parameters": {"rope_theta": p.rope_theta, "rope_type": "default"},
        "sliding_window": None,
        "tie_word_embeddings": p.tie_word_embeddings,
        "transformers_version": _transformers_version(),
        "use_cache": True,
        "use_sliding_window": False,
        "vocab_size": vocab.MODEL_VOCAB_SIZE,
    }
    if qwen3:
        cfg.update(attention_bias=False, head_dim=p.head_dim)
    cfg.update(overrides or {})
    if tie_word_embeddings is not None:
        cfg["tie_word_embeddings"] = tie_word_embeddings
    cfg.setdefault("layer_types", ["full_attention"] * cfg["num_hidden_layers"])
    cfg.setdefault("max_window_layers", cfg["num_hidden_layers"])
    return dict(sorted(cfg.items()))


def generation_config(family: str) -> dict:
    """generation_config.json: token ids only (greedy/beam settings come from the caller)."""
    eos = [vocab.IM_END_ID, vocab.ENDOFTEXT_ID] if family == "qwen3" else vocab.ENDOFTEXT_ID
    return {"bos_token_id": vocab.ENDOFTEXT_ID, "eos_token_id": eos, "pad_token_id": vocab.ENDOFTEXT_ID,
            "transformers_version": _transformers_version()}


def tensor_plan(cfg: ModelConfig) -> dict[str, tuple[tuple[int, ...], str]]:
    """HF tensor name -> (shape, init) with init in {"normal", "norm", "bias"}, sorted by name."""
    H, D, V, I = cfg.hidden_size, cfg.head_dim, cfg.vocab_size, cfg.intermediate_size
    plan = {"model.embed_tokens.weight": ((V, H), "normal"), "model.norm.weight": ((H,), "norm")}
    if not cfg.tie_word_embeddings:
        plan["lm_head.weight"] = ((V, H), "normal")
    for i in range(cfg.num_layers):
        p = f"model.layers.{i}."
        plan[p + "input_layernorm.weight"] = ((H,), "norm")
        plan[p + "post_attention_layernorm.weight"] = ((H,), "norm")
        for name, rows in (("q_proj", cfg.q_size), ("k_proj", cfg.kv_size), ("v_proj", cfg.kv_size)):
            plan[f"{p}self_attn.{name}.weight"] = ((rows, H), "normal")
            if cfg.qkv_bias:
                plan[f"{p}self_attn.{name}.bias"] = ((rows,), "bias")
        plan[p + "self_attn.o_proj.weight"] = ((H, cfg.q_size), "normal")
        if cfg.o_bias:
            plan[p + "self_attn.o_proj.bias"] = ((H,), "bias")
        if cfg.qk_norm:
            plan[p + "self_attn.q_norm.weight"] = ((D,), "norm")
            plan[p + "self_attn.k_norm.weight"] = ((D,), "norm")
        plan[p + "mlp.gate_proj.weight"] = ((I, H), "normal")
        plan[p + "mlp.up_proj.weight"] = ((I, H), "normal")
        plan[p + "mlp.down_proj.weight"] = ((H, I), "normal")
    return dict(sorted(plan.items()))


def write_demo_checkpoint(out_dir: str | Path, preset: str, seed: int = 0, overrides: dict | None = None,
                          tie_word_embeddings: bool | None = None, boost_token: int | None = None,
                          boost_scale: float = 50.0, progress: Callable[[str], None] | None = None) -> Path:
    """Write a seeded random checkpoint of `preset` into out_dir; returns out_dir.

    overrides: HF config keys replacing the preset's (e.g. {"num_key_value_heads": 1, "head_dim": 32}).
    boost_token: multiply that token's lm_head row by boost_scale, so that its logit is far from the
    others (large positive in about half of the contexts): beam search then emits it, which stop-token
    tests need. Needs tie_word_embeddings=False.
    progress: called with a line every ~10% of the weights, for checkpoints of 64 MiB or more.
    """
    if preset not in PRESETS:
        raise ConfigError(f"unknown demo preset {preset!r}; expected one of {', '.join(PRESETS)}")
    out_dir = Path(out_dir)
    _check_target(out_dir)
    raw = hf_config(preset, overrides, tie_word_embeddings)
    cfg = ModelConfig.from_hf_dict(raw)
    if raw["dtype"] not in _ST_DTYPES:
        raise ConfigError(f"demo dtype {raw['dtype']!r} is not one of {', '.join(_ST_DTYPES)}")
    if boost_token is not None:
        if cfg.tie_word_embeddings:
            raise ConfigError("boost_token needs an untied lm_head: pass tie_word_embeddings=False")
        if not 0 <= boost_token < cfg.vocab_size:
            raise ConfigError(f"boost_token {boost_token} is outside the vocabulary [0, {cfg.vocab_size})")

    out_dir.mkdir(parents=True, exist_ok=True)
    marker = {"preset": preset, "seed": seed, "overrides": overrides or {}, "boost_token": boost_token}
    _write_weights(out_dir / "model.safetensors", tensor_plan(cfg), raw["dtype"], seed, marker,
                   boost=(boost_token, boost_scale), progress=progress)
    _write_json(out_dir / "config.json", raw)
    _write_json(out_dir / "generation_config.json", generation_config(cfg.family))
    vocab.write_qwen_tokenizer(out_dir, eos_token="<|im_end|>" if cfg.family == "qwen3" else "<|endoftext|>")
    return out_dir


def is_demo_checkpoint(path: str | Path) -> bool:
    """True if path holds only demo files and its model.safetensors carries the demo marker."""
    path = Path(path)
    weights = path / "model.safetensors"
    if not path.is_dir() or not weights.is_file() or any(p.name not in DEMO_FILES for p in path.iterdir()):
        return False
    try:
        with safe_open(str(weights), framework="pt") as f:
            return MARKER in (f.metadata() or {})
    except Exception:
        return False


def _check_target(out_dir: Path) -> None:
    if out_dir.exists() and not out_dir.is_dir():
        raise ConfigError(f"{out_dir} exists and is not a directory")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not is_demo_checkpoint(out_dir):
        raise ConfigError(f"{out_dir} is not empty and is not a boundgen demo checkpoint; refusing to overwrite "
                          "it (give a new or empty directory)")


def _write_weights(path: Path, plan: dict, dtype_name: str, seed: int, marker: dict,
                   boost: tuple[int | None, float], progress) -> None:
    """Stream the tensors of `plan` into a safetensors file, generating them chunk by chunk."""
    dtype, st_dtype = _ST_DTYPES[dtype_name]
    itemsize = torch.tensor([], dtype=dtype).element_size()
    header, offset = {"__metadata__": {"format": "pt", MARKER: json.dumps(marker, sort_keys=True)}}, 0
    for name, (shape, _) in plan.items():
        nbytes = itemsize * _numel(shape)
        header[name] = {"dtype": st_dtype, "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    total, done, reported = offset, 0, 0
    report = progress if progress and total >= PROGRESS_MIN_BYTES else None
    if report:
        report(f"model.safetensors: generating {total >> 20} MiB of {dtype_name} weights ({len(plan)} tensors)")
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for name, (shape, init) in plan.items():
            for chunk in _generate(name, shape, init, seed, boost if name == "lm_head.weight" else (None, 1.0)):
                f.write(chunk.to(dtype).contiguous().view(torch.uint8).numpy().data)
            done += itemsize * _numel(shape)
            if report and done * 10 // total > reported:
                reported = done * 10 // total
                report(f"model.safetensors: {done >> 20}/{total >> 20} MiB")
    os.replace(tmp, path)


def _generate(name: str, shape: tuple, init: str, seed: int, boost: tuple[int | None, float]):
    """Yield float32 chunks (row blocks) of one tensor, from its own seeded generator."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (1 << 63))
    rows, cols = (shape[0], shape[1]) if len(shape) == 2 else (1, shape[0])
    step = max(1, CHUNK_ELEMENTS // cols)
    boost_token, boost_scale = boost
    for start in range(0, rows, step):
        n = min(step, rows - start)
        x = torch.empty(n, cols).normal_(0.0, 1.0, generator=gen)
        if init == "normal":
            x.mul_(INIT_STD)
        elif init == "norm":
            x.mul_(NORM_NOISE).add_(1.0)
        else:
            x.mul_(BIAS_STD)
        if boost_token is not None and start <= boost_token < start + n:
            x[boost_token - start].mul_(boost_scale)
        yield x


def _numel(shape) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def _transformers_version() -> str:
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return "5.24.0"


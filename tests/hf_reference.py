"""Helpers that make tiny random HF checkpoints with transformers itself (the reference nobody here wrote)."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config


def make_hf_model(family: str, seed: int = 0, vocab_size: int = 512, hidden_size: int = 64, layers: int = 2,
                  heads: int = 4, kv_heads: int = 2, head_dim: int | None = None, intermediate: int = 96,
                  tied: bool = True, eos_token_id=None, boost: dict | None = None, scale: float = 0.2,
                  rope_theta: float = 10000.0):
    """A float32 HF Qwen2/Qwen3 model with weights large enough that logits are far from uniform."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=intermediate,
                  num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  tie_word_embeddings=tied, eos_token_id=eos_token_id, max_position_embeddings=1024,
                  rope_parameters={"rope_type": "default", "rope_theta": rope_theta})
    if family == "qwen3":
        cfg = Qwen3Config(head_dim=head_dim or hidden_size // heads, **common)
    else:
        if head_dim is not None:
            common["head_dim"] = head_dim
        cfg = Qwen2Config(**common)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").float().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif "bias" in name:
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(scale * torch.randn_like(p))
        for token, factor in (boost or {}).items():
            model.get_output_embeddings().weight[token] *= factor
    return model


def save(model, path) -> str:
    model.save_pretrained(str(path))
    return str(path)

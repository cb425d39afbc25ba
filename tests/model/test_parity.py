"""The packed model against HF transformers in FP32: each sequence of a packed batch vs HF alone."""

import pytest
import torch

from boundgen.model.loader import load_model
from tests.hf_reference import make_hf_model, save

CONFIGS = [
    ("qwen3", dict(heads=4, kv_heads=2, head_dim=16)),
    ("qwen3", dict(heads=4, kv_heads=1, head_dim=32, tied=False)),
    ("qwen3", dict(heads=6, kv_heads=3, head_dim=16, hidden_size=48, rope_theta=1e6)),
    ("qwen3", dict(heads=5, kv_heads=5, head_dim=16, hidden_size=80, tied=False)),
    ("qwen2", dict(heads=4, kv_heads=2)),  # head_dim 16 from hidden / heads
    ("qwen2", dict(heads=2, kv_heads=1, hidden_size=64, tied=False)),  # head_dim 32
    ("qwen2", dict(heads=8, kv_heads=4, hidden_size=128, layers=3)),
]


def packed(seqs):
    tokens = torch.cat(seqs)
    positions = torch.cat([torch.arange(len(s)) for s in seqs])
    cu = torch.zeros(len(seqs) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor([len(s) for s in seqs]).cumsum(0)
    return tokens, positions, cu


@pytest.mark.parametrize("family,kw", CONFIGS, ids=[f"{f}-{i}" for i, (f, _) in enumerate(CONFIGS)])
def test_packed_logits_match_hf(tmp_path, family, kw):
    hf = make_hf_model(family, seed=len(kw), **kw)
    model = load_model(save(hf, tmp_path))
    gen = torch.Generator().manual_seed(1)
    seqs = [torch.randint(0, 512, (n,), generator=gen) for n in (1, 7, 37, 64)]
    with torch.no_grad():
        hidden, _ = model.prefill(*packed(seqs))
        ours = model.logits(hidden)
        ref = torch.cat([hf(s[None]).logits[0] for s in seqs])
    rel = (ours - ref).abs().max() / ref.abs().max()
    assert rel <= 1e-4, f"max relative error {rel:.2e}"


def test_single_sequence_and_prefill_kv(tmp_path):
    hf = make_hf_model("qwen3", seed=3, tied=False)
    model = load_model(save(hf, tmp_path))
    seq = torch.randint(0, 512, (23,))
    with torch.no_grad():
        hidden, (k, v) = model.prefill(*packed([seq]), keep_kv=True)
        ref = hf(seq[None], use_cache=True)
    assert k.shape == (2, 23, 2, 16) and v.shape == (2, 23, 2, 16)
    torch.testing.assert_close(model.logits(hidden), ref.logits[0], rtol=1e-4, atol=1e-4)
    # Our K/V of layer 0 equals HF's cache (HF stores [B, Nkv, L, D], RoPE applied).
    torch.testing.assert_close(k[0], ref.past_key_values.layers[0].keys[0].transpose(0, 1), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_close_to_hf(tmp_path, dtype):
    hf = make_hf_model("qwen2", seed=5, scale=0.05)
    model = load_model(save(hf, tmp_path), dtype=dtype)
    seqs = [torch.randint(0, 512, (n,)) for n in (5, 19)]
    hf = hf.to(dtype)
    with torch.no_grad():
        hidden, _ = model.prefill(*packed(seqs))
        ours = model.logits(hidden).float()
        ref = torch.cat([hf(s[None]).logits[0] for s in seqs]).float()
    assert ours.dtype == torch.float32 and model.dtype == dtype
    assert (ours - ref).abs().max() / ref.abs().max() < 3e-2

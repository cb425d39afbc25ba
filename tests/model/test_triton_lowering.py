"""The model with the Triton RMSNorm, RoPE and SwiGLU lowerings against the torch lowering, FP32.

`OpLowering(...).resolve()` gives the registered ops. On CPU those run their reference (the op's
CPU kernel), so the kernels themselves are swapped in through their launchers and run in the
interpreter; on CUDA the registered ops run the compiled kernels.
"""

import dataclasses
import os

import pytest
import torch

from boundgen.model.loader import load_model
from boundgen.ops import rmsnorm, rope, silu_mul
from boundgen.ops.lowering import OpLowering

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
KERNEL_DEVICE = "cpu" if INTERPRETED else ("cuda" if torch.cuda.is_available() else None)
LOWERING = OpLowering(rmsnorm="triton", rope="triton", silu_mul="triton")


def kernel_ops():
    ops = LOWERING.resolve()
    assert (ops.rmsnorm, ops.rope, ops.silu_mul) == (rmsnorm.rmsnorm, rope.rope, silu_mul.silu_mul)
    if KERNEL_DEVICE == "cpu":
        ops = dataclasses.replace(ops, rmsnorm=rmsnorm.launch, rope=rope.launch,
                                  silu_mul=silu_mul.launch)
    return ops


def run(model, device):
    """Logits of a packed prefill of three sequences, then hidden states of one beam step of
    3 beams over the first sequence's K/V."""
    lengths = [7, 1, 12]
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, 5000, (sum(lengths),), generator=gen).to(device)
    positions = torch.cat([torch.arange(n) for n in lengths]).to(device)
    cu_seqlens = torch.tensor([0, 7, 8, 20], dtype=torch.int32, device=device)
    with torch.no_grad():
        hidden, (k, v) = model.prefill(tokens, positions, cu_seqlens, keep_kv=True)
        logits = model.logits(hidden)
        suffix_k = torch.zeros(k.shape[0], 3, 2, *k.shape[2:], device=device)
        suffix_v = torch.zeros_like(suffix_k)
        step = model.decode(tokens[:3], torch.full((3,), 7, device=device), k[:, :7], v[:, :7],
                            suffix_k, suffix_v, torch.zeros(1, dtype=torch.int64, device=device))
    return logits, step


@pytest.mark.skipif(KERNEL_DEVICE is None, reason="needs TRITON_INTERPRET=1 or a CUDA device")
@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_triton_lowering_matches_torch_lowering(family, request):
    model_dir = request.getfixturevalue(f"tiny_{family}_dir")
    logits, step = run(load_model(model_dir, device=KERNEL_DEVICE), KERNEL_DEVICE)
    fused_logits, fused_step = run(load_model(model_dir, device=KERNEL_DEVICE, ops=kernel_ops()),
                                   KERNEL_DEVICE)
    torch.testing.assert_close(fused_logits, logits, atol=1e-5, rtol=0)
    torch.testing.assert_close(fused_step, step, atol=1e-5, rtol=0)
    if KERNEL_DEVICE == "cpu":  # the registered ops, as a build on CPU runs them: the references
        registered_logits, _ = run(load_model(model_dir, ops=LOWERING.resolve()), "cpu")
        torch.testing.assert_close(registered_logits, logits, atol=0, rtol=0)

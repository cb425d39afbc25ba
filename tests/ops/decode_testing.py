"""A lowering left in the model changes nothing it computes: what the op tests of the lowerings
that a decode step runs, or that an FP8 model runs, share."""

import dataclasses

import torch

from boundgen.model import fp8
from boundgen.model.loader import load_model
from boundgen.ops.lowering import REFERENCE, OpLowering
from tests.ops.kernel_testing import KERNEL_DEVICE


def decode(model, steps=2):
    """Prefill a 7-token prompt, then `steps` decode steps of 3 beams: hidden states and the suffix K/V
    (in the model's dtype)."""
    cfg = model.cfg
    tokens = torch.randint(0, 500, (7,), generator=torch.Generator().manual_seed(4))
    cu = torch.tensor([0, 7], dtype=torch.int32)
    _, (prefix_k, prefix_v) = model.prefill(tokens, torch.arange(7), cu, keep_kv=True)
    shape = (cfg.num_layers, 3, steps, cfg.num_kv_heads, cfg.head_dim)
    suffix_k, suffix_v = torch.zeros(shape, dtype=model.dtype), torch.zeros(shape, dtype=model.dtype)
    hidden = []
    for s in range(steps):
        beams = torch.tensor([5 + s, 9, 300 + s])
        hidden.append(model.decode(beams, torch.full((3,), 7 + s), prefix_k, prefix_v, suffix_k, suffix_v,
                                   torch.tensor([s]), cu, 3))
    return torch.stack(hidden), suffix_k, suffix_v


def assert_decode_unchanged(path, op: str, kernel, exact: bool = True) -> None:
    """In FP32 the model with `op` lowered to "triton" (the registered op: its CPU kernel is the
    reference) decodes identically to the model without (not `exact`: within FP32 rounding, for an
    op whose reference sums in another order); with `kernel` itself in its place (the
    interpreter, or the GPU) within FP32 rounding."""
    expected = decode(load_model(path))
    lowered = decode(load_model(path, ops=OpLowering(**{op: "triton"}).resolve()))
    for a, b in zip(lowered, expected):
        assert torch.equal(a, b) if exact else torch.allclose(a, b, atol=1e-5, rtol=1e-5)
    if KERNEL_DEVICE is not None:
        ops = dataclasses.replace(REFERENCE.resolve(), **{op: kernel})
        for a, b in zip(decode(load_model(path, device=KERNEL_DEVICE, ops=ops)), expected):
            torch.testing.assert_close(a.cpu(), b, atol=1e-5, rtol=1e-5)


def assert_fp8_prefill_unchanged(path, kernels: dict, mode: str = "mlp") -> None:
    """An FP8 model (bf16, model/fp8.py, `--fp8 mode`) with the ops of `kernels` lowered to "triton"
    computes the logits it computes without: identical with the registered ops (their CPU kernels
    are the references), within an E4M3 ulp here and there with the kernels themselves (the
    interpreter)."""
    tokens = torch.randint(0, 500, (19,), generator=torch.Generator().manual_seed(6))
    positions, cu = torch.arange(19), torch.tensor([0, 19], dtype=torch.int32)

    def logits(ops=None):
        model = fp8.quantize(load_model(path, torch.bfloat16, ops=ops), mode)
        return model.logits(model.prefill(tokens, positions, cu)[0]).float()
    expected = logits()
    assert torch.equal(logits(OpLowering(**{op: "triton" for op in kernels}).resolve()), expected)
    if KERNEL_DEVICE == "cpu":
        ops = dataclasses.replace(REFERENCE.resolve(), **kernels)
        torch.testing.assert_close(logits(ops), expected, atol=0.1, rtol=0.05)

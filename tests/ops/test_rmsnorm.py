"""RMSNorm: the Triton kernel against the torch reference, the registered op.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane;
tests/conftest.py sets the variable), else compiled on CUDA. The kernel has no dots, so bf16 runs
in the interpreter too (casts go through `round_to`).
"""

import pytest
import torch

from boundgen.ops import rmsnorm as op
from tests.ops.kernel_testing import (KERNEL_DEVICE, assert_script_prints_ok, call_targets, needs_compiled_kernel,
                                     needs_kernel, one_kernel_trace_script)
from tests.ops.ulp import ulp_distance

EPS = 1e-6


def make_inputs(num_tokens, layout, dtype, device="cpu", heads=(4, 2), head_dim=16, hidden=48,
                seed=0):
    """(x, weight) as the model passes them: "hidden" x [T, H] contiguous; "q"/"k" x [T, N, D], a
    view of one fused qkv output (not contiguous)."""
    gen = torch.Generator().manual_seed(seed)
    if layout == "hidden":
        x = torch.randn(num_tokens, hidden, generator=gen) * 3
        weight = 1 + 0.1 * torch.randn(hidden, generator=gen)
    else:
        num_q, num_kv = heads
        qkv = torch.randn(num_tokens, (num_q + 2 * num_kv) * head_dim, generator=gen) * 3
        q, k, _ = qkv.split([num_q * head_dim, num_kv * head_dim, num_kv * head_dim], dim=-1)
        x = q.reshape(num_tokens, num_q, head_dim) if layout == "q" else k.reshape(
            num_tokens, num_kv, head_dim)
        weight = 1 + 0.1 * torch.randn(head_dim, generator=gen)
    return x.to(device=device, dtype=dtype), weight.to(device=device, dtype=dtype)


def assert_matches_reference(out, x, weight):
    expected = op.reference(x, weight, EPS)
    assert out.dtype == x.dtype and out.shape == x.shape and out.is_contiguous()
    if x.dtype == torch.float32:
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    else:  # same rounding steps; only the FP32 sum order differs (on the H200: up to 2 ulp, rarely)
        ulps = ulp_distance(out, expected)
        assert ulps.max() <= (2 if x.is_cuda else 1) and (ulps > 0).float().mean() < 0.01, ulps.max()


@needs_kernel
@pytest.mark.parametrize("num_tokens", [1, 37, 123])
@pytest.mark.parametrize("layout", ["hidden", "q", "k"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
def test_kernel_matches_reference(num_tokens, layout, dtype):
    x, weight = make_inputs(num_tokens, layout, dtype, KERNEL_DEVICE)
    assert_matches_reference(op.launch(x, weight, EPS), x, weight)


@needs_kernel
@pytest.mark.parametrize("block_rows", [1, 4, 16])
def test_kernel_block_shapes(block_rows):
    """Many programs, a partial last block, a non-power-of-two row (H 48 in a block of 64)."""
    x, weight = make_inputs(37, "q", torch.float32, KERNEL_DEVICE, heads=(7, 1))
    assert_matches_reference(op.launch(x, weight, EPS, block_rows=block_rows), x, weight)
    x, weight = make_inputs(13, "hidden", torch.bfloat16, KERNEL_DEVICE)
    assert_matches_reference(op.launch(x, weight, EPS, block_rows=block_rows), x, weight)


@needs_kernel
def test_kernel_is_exact_where_rounding_is_decided():
    """bf16 rows whose FP32 sum has one order only (a single nonzero element per row): the kernel
    must equal the reference bit for bit, which a cast that truncates would not."""
    x = torch.zeros(16, 64)
    x[torch.arange(16), torch.arange(16) * 3] = torch.linspace(-7, 9, 16)
    weight = 1 + 0.1 * torch.randn(64, generator=torch.Generator().manual_seed(2))
    x, weight = x.to(KERNEL_DEVICE, torch.bfloat16), weight.to(KERNEL_DEVICE, torch.bfloat16)
    assert torch.equal(op.launch(x, weight, EPS), op.reference(x, weight, EPS))


def test_launcher_rejects_bad_inputs():
    x, weight = make_inputs(5, "q", torch.float32)
    with pytest.raises(ValueError, match=r"weight must be \[16\]"):
        op.launch(x, weight[:8], EPS)
    with pytest.raises(ValueError, match="share one dtype"):
        op.launch(x, weight.half(), EPS)
    with pytest.raises(ValueError, match="share one dtype"):
        op.launch(x.double(), weight.double(), EPS)
    with pytest.raises(ValueError, match="must be contiguous"):
        op.launch(x.transpose(1, 2).contiguous().transpose(1, 2), weight, EPS)
    with pytest.raises(ValueError, match=r"expected x \[T, H\] or \[T, N, D\]"):
        op.launch(x[0, 0], weight, EPS)


def test_registered_op_runs_reference_on_cpu():
    x, weight = make_inputs(7, "q", torch.float32)
    out = torch.ops.boundgen.rmsnorm(x, weight, EPS)
    torch.testing.assert_close(out, op.reference(x, weight, EPS), atol=0, rtol=0)
    assert op.IMPLEMENTATIONS["triton"] is op.rmsnorm


class _Norm(torch.nn.Module):
    def forward(self, qkv, weight):
        return op.IMPLEMENTATIONS["triton"](qkv[:, :64].reshape(-1, 4, 16), weight, EPS)


def test_op_survives_export_as_one_node_with_dynamic_tokens():
    qkv, weight = torch.randn(9, 128), torch.randn(16)
    tokens = torch.export.Dim("T", min=2, max=4096)
    exported = torch.export.export(_Norm(), (qkv, weight), dynamic_shapes=({0: tokens}, None))
    calls = call_targets(exported)
    assert calls.count(torch.ops.boundgen.rmsnorm.default) == 1
    assert all(target in (torch.ops.aten.slice.Tensor, torch.ops.aten.view.default,
                          torch.ops.aten.reshape.default, torch.ops.boundgen.rmsnorm.default)
               for target in calls), calls
    qkv2 = torch.randn(37, 128)
    torch.testing.assert_close(exported.module()(qkv2, weight),
                               op.reference(qkv2[:, :64].reshape(37, 4, 16), weight, EPS))


_TRACE_SCRIPT = one_kernel_trace_script("""
    from boundgen.ops import rmsnorm as op
    qkv, weight = torch.randn(10, 128), torch.randn(16)
    graph = make_fx(lambda qkv, w: op.launch(qkv[:, :64].reshape(-1, 4, 16), w, 1e-6),
                    tracing_mode="symbolic")(qkv, weight).graph
""")


def test_launcher_traces_with_symbolic_tokens():
    """The launcher on a q view of qkv, traced as Inductor does on the GPU: one kernel call, its
    grid an expression of T (one_kernel_trace_script says why and how)."""
    assert_script_prints_ok(_TRACE_SCRIPT)


# ---------------------------------------------------------------------------------------------
# GPU: Qwen shapes in bf16 (W1: Qwen3-0.6B, T 2400, H 1024, q/k heads 16/8 of D 128;
# W2: Qwen2.5-0.5B, T 100, H 896).

@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("num_tokens,layout,heads,head_dim,hidden", [
    (2400, "hidden", (16, 8), 128, 1024), (2400, "q", (16, 8), 128, 1024),
    (2400, "k", (16, 8), 128, 1024), (100, "hidden", (14, 2), 64, 896)],
    ids=["w1-hidden", "w1-q", "w1-k", "w2-hidden"])
def test_gpu_bf16_qwen_shapes(num_tokens, layout, heads, head_dim, hidden):
    x, weight = make_inputs(num_tokens, layout, torch.bfloat16, "cuda", heads, head_dim, hidden)
    assert_matches_reference(torch.ops.boundgen.rmsnorm(x, weight, EPS), x, weight)

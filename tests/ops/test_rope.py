"""RoPE: the Triton kernel against the torch reference, the registered op.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane;
tests/conftest.py sets the variable), else compiled on CUDA. The kernel has no dots, so bf16 runs
in the interpreter too (casts go through `round_to`). It rounds as the reference does, step by
step, so results are compared for equality (FP32 on the GPU may fuse a product into the sum: 1 ulp).
"""

import pytest
import torch

from boundgen.ops import rope as op
from tests.ops.kernel_testing import (KERNEL_DEVICE, assert_script_prints_ok, call_targets, needs_compiled_kernel,
                                     needs_kernel, one_kernel_trace_script)
from tests.ops.ulp import ulp_distance



def make_cos_sin(num_tokens, head_dim, dtype, device="cpu", seed=0):
    """cos/sin [T, D] as the model makes them, from random positions."""
    gen = torch.Generator().manual_seed(seed)
    positions = torch.randint(0, 40000, (num_tokens,), generator=gen).to(device)
    return op.cos_sin(positions, op.inv_freq(head_dim, 1e6).to(device), dtype)


def make_inputs(num_tokens, heads, head_dim, dtype, device="cpu", seed=0):
    """q [T, N_q, D], k [T, N_kv, D] as views of one fused qkv output (not contiguous), cos, sin."""
    gen = torch.Generator().manual_seed(seed)
    num_q, num_kv = heads
    qkv = torch.randn(num_tokens, (num_q + 2 * num_kv) * head_dim, generator=gen) * 3
    q, k, _ = qkv.to(device=device, dtype=dtype).split(
        [num_q * head_dim, num_kv * head_dim, num_kv * head_dim], dim=-1)
    return (q.reshape(num_tokens, num_q, head_dim), k.reshape(num_tokens, num_kv, head_dim),
            *make_cos_sin(num_tokens, head_dim, dtype, device, seed))


def assert_matches_reference(out, x, cos, sin):
    expected = op.reference(x, cos, sin)
    assert out.dtype == x.dtype and out.shape == x.shape and out.is_contiguous()
    if x.is_cuda and x.dtype == torch.float32:
        torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-6)
    elif x.is_cuda and x.dtype == torch.bfloat16:  # rounded on the bits (ops/rope.py): bit for bit
        ulps = ulp_distance(out, expected)
        assert ulps.max() == 0, (ulps.max(), (ulps > 0).float().mean())
    elif x.is_cuda:  # fp16: plain casts, which the GPU compiler may fold (one rounding fewer)
        ulps = ulp_distance(out, expected)
        assert ulps.max() <= 1 and (ulps > 0).float().mean() < 0.05, ulps.max()
    else:
        assert torch.equal(out, expected), (out.float() - expected.float()).abs().max()


@needs_kernel
@pytest.mark.parametrize("num_tokens", [1, 7, 37])
@pytest.mark.parametrize("heads", [(4, 2), (7, 1)], ids=["4-2", "7-1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
def test_kernel_matches_reference(num_tokens, heads, dtype):
    q, k, cos, sin = make_inputs(num_tokens, heads, 16, dtype, KERNEL_DEVICE)
    for x in (q, k):
        assert_matches_reference(op.launch(x, cos, sin), x, cos, sin)


@needs_kernel
@pytest.mark.parametrize("blocks", [(4, 2), (16, 4), (1, 8)], ids=["t4n2", "t16n4", "t1n8"])
def test_kernel_block_shapes(blocks):
    """Several token and head blocks, partial last blocks of both (37 tokens, 7 heads); D 24 has
    a half row (12) shorter than its block (16)."""
    q, _, cos, sin = make_inputs(37, (7, 1), 24, torch.bfloat16, KERNEL_DEVICE)
    assert_matches_reference(op.launch(q, cos, sin, *blocks), q, cos, sin)


def test_launcher_rejects_bad_inputs():
    q, k, cos, sin = make_inputs(5, (4, 2), 16, torch.float32)
    with pytest.raises(ValueError, match=r"cos and sin must be \[T, D\] = \[5, 16\]"):
        op.launch(q, cos[:4], sin[:4])
    with pytest.raises(ValueError, match="share one dtype"):
        op.launch(q, cos.half(), sin.half())
    with pytest.raises(ValueError, match="must be contiguous"):
        op.launch(q.transpose(1, 2).contiguous().transpose(1, 2), cos, sin)
    with pytest.raises(ValueError, match="even head dim"):
        op.launch(q[..., :15], cos[:, :15], sin[:, :15])
    with pytest.raises(ValueError, match=r"expected x \[T, N, D\]"):
        op.launch(q[:, 0], cos, sin)


def test_registered_op_runs_reference_on_cpu():
    q, _, cos, sin = make_inputs(7, (4, 2), 16, torch.float32)
    out = torch.ops.boundgen.rope(q, cos, sin)
    torch.testing.assert_close(out, op.reference(q, cos, sin), atol=0, rtol=0)
    assert op.IMPLEMENTATIONS["triton"] is op.rope


class _Rotate(torch.nn.Module):
    def forward(self, qkv, cos, sin):
        return op.IMPLEMENTATIONS["triton"](qkv[:, :64].reshape(-1, 4, 16), cos, sin)


def test_op_survives_export_as_one_node_with_dynamic_tokens():
    qkv, (cos, sin) = torch.randn(9, 128), make_cos_sin(9, 16, torch.float32)
    tokens = torch.export.Dim("T", min=2, max=4096)
    exported = torch.export.export(_Rotate(), (qkv, cos, sin),
                                   dynamic_shapes=({0: tokens}, {0: tokens}, {0: tokens}))
    calls = call_targets(exported)
    assert calls.count(torch.ops.boundgen.rope.default) == 1
    assert all(target in (torch.ops.aten.slice.Tensor, torch.ops.aten.view.default,
                          torch.ops.aten.reshape.default, torch.ops.boundgen.rope.default)
               for target in calls), calls
    qkv2, (cos2, sin2) = torch.randn(37, 128), make_cos_sin(37, 16, torch.float32, seed=3)
    torch.testing.assert_close(exported.module()(qkv2, cos2, sin2),
                               op.reference(qkv2[:, :64].reshape(37, 4, 16), cos2, sin2),
                               atol=0, rtol=0)


_TRACE_SCRIPT = one_kernel_trace_script("""
    from boundgen.ops import rope as op
    qkv, cos, sin = torch.randn(10, 128), torch.randn(10, 16), torch.randn(10, 16)
    graph = make_fx(lambda qkv, c, s: op.launch(qkv[:, :64].reshape(-1, 4, 16), c, s),
                    tracing_mode="symbolic")(qkv, cos, sin).graph
""")


def test_launcher_traces_with_symbolic_tokens():
    """The launcher with cos/sin on a q view of qkv, traced as Inductor does on the GPU: one
    kernel call, its grid an expression of T (one_kernel_trace_script says why and how)."""
    assert_script_prints_ok(_TRACE_SCRIPT)


# ---------------------------------------------------------------------------------------------
# GPU: Qwen shapes in bf16 (W1: Qwen3-0.6B, T 2400, heads 16/8 of D 128; W2: Qwen2.5-0.5B,
# T 100, heads 14/2 of D 64), q and k as strided views of qkv.

@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("num_tokens,heads,head_dim", [(2400, (16, 8), 128), (100, (14, 2), 64)],
                         ids=["w1", "w2"])
def test_gpu_bf16_qwen_shapes(num_tokens, heads, head_dim):
    q, k, cos, sin = make_inputs(num_tokens, heads, head_dim, torch.bfloat16, "cuda")
    for x in (q, k):
        assert_matches_reference(torch.ops.boundgen.rope(x, cos, sin), x, cos, sin)

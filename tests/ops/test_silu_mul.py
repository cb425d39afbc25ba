"""silu_mul: the Triton kernel against the torch reference, the registered op.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane;
tests/conftest.py sets the variable), else compiled on CUDA. The kernel has no dots, so bf16 runs
in the interpreter too (casts go through `round_to`). exp differs from torch's in the last FP32
bit at times: FP32 within a few ulp; in bf16/fp16 silu(gate) may then round one ulp away, which
the product with up can stretch to two ulp of the result (rare: a few per million in bf16).
"""

import pytest
import torch

from boundgen.ops import silu_mul as op
from tests.ops.kernel_testing import (KERNEL_DEVICE, assert_script_prints_ok, call_targets, needs_compiled_kernel,
                                     needs_kernel, one_kernel_trace_script)
from tests.ops.ulp import ulp_distance



def make_input(num_tokens, inter, dtype, device="cpu", seed=0, strided=False):
    """x [T, 2I] (gate then up), as gate_up_proj writes it; `strided` makes it a column slice of
    a wider tensor (row stride > 2I)."""
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randn(num_tokens, 2 * inter + (24 if strided else 0), generator=gen) * 3
    return wide.to(device=device, dtype=dtype)[:, 8: 8 + 2 * inter] if strided else wide.to(
        device=device, dtype=dtype)


def assert_matches_reference(out, x):
    expected = op.reference(x)
    assert out.dtype == x.dtype and out.shape == expected.shape and out.is_contiguous()
    if x.dtype == torch.float32:
        torch.testing.assert_close(out, expected, atol=1e-6, rtol=1e-6)
    else:
        ulps = ulp_distance(out, expected)
        assert ulps.max() <= 2 and (ulps > 0).float().mean() < 0.01, ulps.max()


@needs_kernel
@pytest.mark.parametrize("num_tokens", [1, 7, 37])
@pytest.mark.parametrize("inter,strided", [(128, False), (160, True)], ids=["i128", "i160-strided"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16],
                         ids=["fp32", "fp16", "bf16"])
def test_kernel_matches_reference(num_tokens, inter, strided, dtype):
    x = make_input(num_tokens, inter, dtype, KERNEL_DEVICE, strided=strided)
    assert_matches_reference(op.launch(x), x)


@needs_kernel
@pytest.mark.parametrize("blocks", [(4, 64), (16, 32), (1, 256)], ids=["t4i64", "t16i32", "t1i256"])
def test_kernel_block_shapes(blocks):
    """Several token and column blocks with partial last blocks (37 tokens, I 80)."""
    x = make_input(37, 80, torch.bfloat16, KERNEL_DEVICE, strided=True)
    assert_matches_reference(op.launch(x, *blocks), x)


def test_launcher_rejects_bad_inputs():
    x = make_input(5, 16, torch.float32)
    with pytest.raises(ValueError, match=r"expected x \[T, 2I\]"):
        op.launch(x[:, :31])
    with pytest.raises(ValueError, match=r"expected x \[T, 2I\]"):
        op.launch(x[None])
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        op.launch(x.double())
    with pytest.raises(ValueError, match="must be contiguous"):
        op.launch(x.t().contiguous().t())


def test_registered_op_runs_reference_on_cpu():
    x = make_input(7, 128, torch.float32, strided=True)
    torch.testing.assert_close(torch.ops.boundgen.silu_mul(x), op.reference(x), atol=0, rtol=0)
    assert op.IMPLEMENTATIONS["triton"] is op.silu_mul


class _Activate(torch.nn.Module):
    def forward(self, x):
        return op.IMPLEMENTATIONS["triton"](x)


def test_op_survives_export_as_one_node_with_dynamic_tokens():
    tokens = torch.export.Dim("T", min=2, max=4096)
    exported = torch.export.export(_Activate(), (make_input(9, 128, torch.float32),),
                                   dynamic_shapes=({0: tokens},))
    calls = call_targets(exported)
    assert calls == [torch.ops.boundgen.silu_mul.default]
    x2 = make_input(37, 128, torch.float32, seed=3)
    torch.testing.assert_close(exported.module()(x2), op.reference(x2), atol=0, rtol=0)


_TRACE_SCRIPT = one_kernel_trace_script("""
    from boundgen.ops import silu_mul as op
    graph = make_fx(lambda x: op.launch(x), tracing_mode="symbolic")(torch.randn(10, 256)).graph
""")


def test_launcher_traces_with_symbolic_tokens():
    """The launcher on x [T, 2I], traced as Inductor does on the GPU: one kernel call, its grid
    an expression of T (one_kernel_trace_script says why and how)."""
    assert_script_prints_ok(_TRACE_SCRIPT)


# ---------------------------------------------------------------------------------------------
# GPU: Qwen shapes in bf16 (W1: Qwen3-0.6B, T 2400, I 3072; W2: Qwen2.5-0.5B, T 100, I 4864).

@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("num_tokens,inter", [(2400, 3072), (100, 4864)], ids=["w1", "w2"])
def test_gpu_bf16_qwen_shapes(num_tokens, inter):
    x = make_input(num_tokens, inter, torch.bfloat16, "cuda")
    assert_matches_reference(torch.ops.boundgen.silu_mul(x), x)

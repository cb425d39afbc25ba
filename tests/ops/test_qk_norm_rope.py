"""qk_norm_rope: the fused Triton kernel against the composition of the rmsnorm and rope
references, the registered op, the model's fused path.

The kernel runs under TRITON_INTERPRET=1 on CPU tensors (tests/conftest.py), else compiled on
CUDA. bf16 / fp16: the same rounding steps as the references, only the FP32 sum of squares in
another order, so a normed value is rarely one ulp off, and a rotated one then at most one ulp of
the largest values off (as with the separate Triton ops); FP32 within 1e-5."""

import pytest
import torch

from boundgen.model.qwen import QwenModel
from boundgen.ops import qk_norm_rope as op
from boundgen.ops import rope
from boundgen.ops.lowering import OpLowering
from tests.ops.kernel_testing import KERNEL_DEVICE, call_targets, needs_compiled_kernel, needs_kernel
from tests.ops.ulp import ulp_distance

EPS = 1e-6


def make_inputs(num_tokens, heads, head_dim, dtype, device="cpu", seed=0):
    gen = torch.Generator().manual_seed(seed)
    num_q, num_kv = heads
    qkv = torch.randn(num_tokens, (num_q + 2 * num_kv) * head_dim, generator=gen) * 3
    wq = 1 + 0.1 * torch.randn(head_dim, generator=gen)
    wk = 1 + 0.1 * torch.randn(head_dim, generator=gen)
    positions = torch.randint(0, 4096, (num_tokens,), generator=gen)
    cos, sin = rope.cos_sin(positions, rope.inv_freq(head_dim, 1e6), dtype)
    return [t.to(device=device, dtype=dtype) for t in (qkv, wq, wk)] + [cos.to(device), sin.to(device)]


def assert_matches(got, inputs, heads):
    want = op.reference(*inputs, EPS, *heads)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape and g.is_contiguous()
        if g.dtype == torch.float32:
            torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-5)
        else:  # one ulp of the largest values at most; a normed value one ulp off moves a RoPE sum
            # whose terms nearly cancel by many ulps of its own (16 seen on the H200), not more in value
            ulps = ulp_distance(g, w)
            worst = (g.float() - w.float()).abs().max()
            assert worst <= torch.finfo(g.dtype).eps * w.float().abs().max(), worst
            assert (ulps > 0).float().mean() < 0.01, (ulps > 0).float().mean()


@needs_kernel
@pytest.mark.parametrize("num_tokens", [1, 37, 123])
@pytest.mark.parametrize("heads,head_dim", [((4, 2), 16), ((16, 8), 128), ((14, 2), 64)],
                         ids=["tiny", "qwen3-0.6b", "24-heads-of-64"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_kernel_matches_the_composed_references(num_tokens, heads, head_dim, dtype):
    inputs = make_inputs(num_tokens, heads, head_dim, dtype, KERNEL_DEVICE)
    assert_matches(op.launch(*inputs, EPS, *heads), inputs, heads)


@needs_kernel
@pytest.mark.parametrize("block_t", [1, 2, 8])
def test_kernel_block_shapes(block_t):
    """Many programs, a partial last block of tokens; heads padded (6 of 8)."""
    inputs = make_inputs(13, (4, 2), 16, torch.bfloat16, KERNEL_DEVICE, seed=3)
    assert_matches(op.launch(*inputs, EPS, 4, 2, block_t=block_t), inputs, (4, 2))


def test_launcher_rejects_bad_inputs():
    qkv, wq, wk, cos, sin = make_inputs(3, (4, 2), 16, torch.float32)
    with pytest.raises(ValueError, match="qkv"):
        op.launch(qkv[:, :-16], wq, wk, cos, sin, EPS, 4, 2)
    with pytest.raises(ValueError, match="power of two"):
        op.launch(qkv[:, :96], wq[:12], wk[:12], cos[:, :12], sin[:, :12], EPS, 4, 2)
    with pytest.raises(ValueError, match="cos / sin"):
        op.launch(qkv, wq, wk, cos[:2], sin, EPS, 4, 2)
    with pytest.raises(ValueError, match="one dtype"):
        op.launch(qkv, wq.half(), wk, cos, sin, EPS, 4, 2)


def test_registered_op_runs_the_reference_on_cpu_and_exports_as_one_node():
    inputs = make_inputs(5, (4, 2), 16, torch.float32)
    got = torch.ops.boundgen.qk_norm_rope(*inputs, EPS, 4, 2)
    want = op.reference(*inputs, EPS, 4, 2)
    assert all(torch.equal(g, w) for g, w in zip(got, want))

    class Fused(torch.nn.Module):
        def forward(self, qkv, wq, wk, cos, sin):
            return op.IMPLEMENTATIONS["triton"](qkv, wq, wk, cos, sin, EPS, 4, 2)

    tokens = torch.export.Dim("T", min=2, max=4096)
    exported = torch.export.export(Fused(), tuple(inputs),
                                   dynamic_shapes=({0: tokens}, None, None, {0: tokens}, {0: tokens}))
    calls = call_targets(exported)
    assert calls.count(torch.ops.boundgen.qk_norm_rope.default) == 1
    assert op.IMPLEMENTATIONS["separate"] is None


def test_model_with_the_fused_op_equals_the_separate_ops(tiny_qwen3_dir):
    """Qwen3 (q/k norm): the fused lowering gives the separate ops' hidden states (on CPU the
    registered op runs the reference); Qwen2 has no q/k norm and ignores the lowering."""
    from boundgen.model.loader import load_model
    model = load_model(tiny_qwen3_dir)
    tokens = torch.randint(0, 500, (11,), generator=torch.Generator().manual_seed(0))
    positions, cu = torch.arange(11), torch.tensor([0, 5, 11], dtype=torch.int32)
    with torch.no_grad():
        separate, _ = model.prefill(tokens, positions, cu)
        model.ops = OpLowering(qk_norm_rope="triton").resolve()
        fused, _ = model.prefill(tokens, positions, cu)
    assert isinstance(model, QwenModel) and model.cfg.qk_norm
    assert torch.equal(fused, separate)


@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("num_tokens", [100, 2250])
def test_gpu_qwen3_shapes(num_tokens):
    inputs = make_inputs(num_tokens, (16, 8), 128, torch.bfloat16, "cuda")
    assert_matches(op.launch(*inputs, EPS, 16, 8), inputs, (16, 8))

"""A decode step's RoPE + K/V write: the Triton kernel against the torch reference, the registered
op (its writes survive export), and the model's decode step with the op lowered.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane), else
compiled on CUDA. No dots, so bf16 runs in the interpreter too (casts go through `round_to`)."""

import pytest
import torch

from boundgen.ops import rope_kv_write as op
from tests.ops.decode_testing import assert_decode_unchanged
from tests.ops.kernel_testing import KERNEL_DEVICE, call_targets, needs_compiled_kernel, needs_kernel


def make_inputs(rows, heads, head_dim, slots, dtype, device="cpu", seed=0, layers=3):
    """(qkv, cos, sin, suffix_k, suffix_v): every layer's suffix buffers full of other values, as
    earlier steps left them."""
    num_q, num_kv = heads
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(rows, (num_q + 2 * num_kv) * head_dim, generator=gen) * 2
    angles = torch.rand(rows, head_dim // 2, generator=gen) * 50
    emb = torch.cat((angles, angles), dim=-1)
    suffix_k, suffix_v = (torch.randn(layers, rows, slots, num_kv, head_dim, generator=gen) for _ in range(2))
    return tuple(t.to(device=device, dtype=dtype) for t in (qkv, emb.cos(), emb.sin(), suffix_k, suffix_v))


def run_both(rows, heads, head_dim, slots, step, dtype, device, layer=1, **launch):
    """(q, suffix_k, suffix_v) from the kernel and from the reference, each on its own buffers."""
    qkv, cos, sin, suffix_k, suffix_v = make_inputs(rows, heads, head_dim, slots, dtype, device)
    step = torch.tensor([step], device=device)
    ours = (suffix_k.clone(), suffix_v.clone())
    q = op.launch(qkv, cos, sin, *ours, step, layer, *heads, **launch)
    theirs = (suffix_k.clone(), suffix_v.clone())
    expected = op.reference(qkv, cos, sin, *theirs, step, layer, *heads)
    assert not torch.equal(theirs[0][layer], suffix_k[layer]) and torch.equal(theirs[0][layer - 1], suffix_k[layer - 1])
    return (q, *ours), (expected, *theirs)


@needs_kernel
@pytest.mark.parametrize("rows", [1, 5, 23])
@pytest.mark.parametrize("heads", [(4, 2), (7, 1), (14, 2)], ids=["g2", "g7", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["fp32", "fp16", "bf16"])
def test_kernel_matches_reference_bit_for_bit(rows, heads, dtype):
    """q, the slot written and every other slot and layer: equal, not close (RoPE rounds as the reference)."""
    got, expected = run_both(rows, heads, 16, 3, 1, dtype, KERNEL_DEVICE)
    for name, a, b in zip(("q", "suffix_k", "suffix_v"), got, expected):
        assert torch.equal(a, b), f"{name}: max abs difference {(a.float() - b.float()).abs().max()}"


@needs_kernel
@pytest.mark.parametrize("block_t", [1, 2, 8])
@pytest.mark.parametrize("step,layer", [(0, 2), (2, 1)])
def test_kernel_block_shapes_slots_and_layers(block_t, step, layer):
    got, expected = run_both(11, (4, 2), 32, 3, step, torch.bfloat16, KERNEL_DEVICE, layer=layer, block_t=block_t)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))


def test_launcher_rejects_bad_inputs():
    qkv, cos, sin, suffix_k, suffix_v = make_inputs(5, (4, 2), 16, 3, torch.float32)
    step = torch.tensor([1])
    with pytest.raises(ValueError, match=r"expected qkv \[B, \(Nq \+ 2 Nkv\) D\]"):
        op.launch(qkv[:, :-16], cos, sin, suffix_k, suffix_v, step, 0, 4, 2)
    with pytest.raises(ValueError, match=r"expected qkv .* suffix_k \[L, B, S, Nkv, D\]"):
        op.launch(qkv, cos, sin, suffix_k[0], suffix_v[0], step, 0, 4, 2)
    with pytest.raises(ValueError, match="must both be"):
        op.launch(qkv, cos, sin, suffix_k, suffix_v[:, :4], step, 0, 4, 2)
    with pytest.raises(ValueError, match="layer 3 is not one of"):
        op.launch(qkv, cos, sin, suffix_k, suffix_v, step, 3, 4, 2)
    with pytest.raises(ValueError, match="cos / sin must be"):
        op.launch(qkv, cos[:4], sin, suffix_k, suffix_v, step, 0, 4, 2)
    with pytest.raises(ValueError, match=r"step must be a \[1\] int64"):
        op.launch(qkv, cos, sin, suffix_k, suffix_v, step.int(), 0, 4, 2)
    with pytest.raises(ValueError, match="share one dtype"):
        op.launch(qkv, cos.half(), sin, suffix_k, suffix_v, step, 0, 4, 2)
    with pytest.raises(ValueError, match="slot's"):
        op.launch(qkv, cos, sin, suffix_k.transpose(3, 4).contiguous().transpose(3, 4), suffix_v, step, 0, 4, 2)


def test_registered_op_runs_reference_on_cpu():
    qkv, cos, sin, suffix_k, suffix_v = make_inputs(5, (4, 2), 16, 3, torch.float32)
    step = torch.tensor([2])
    k2, v2 = suffix_k.clone(), suffix_v.clone()
    q = torch.ops.boundgen.rope_kv_write(qkv, cos, sin, suffix_k, suffix_v, step, 1, 4, 2)
    assert torch.equal(q, op.reference(qkv, cos, sin, k2, v2, step, 1, 4, 2))
    assert torch.equal(suffix_k, k2) and torch.equal(suffix_v, v2)
    assert op.IMPLEMENTATIONS["triton"] is op.rope_kv_write and op.IMPLEMENTATIONS["separate"] is None


class _Write(torch.nn.Module):
    """As the decode step uses the op: on graph-internal buffers (as after the reorder by parent)."""

    def forward(self, qkv, cos, sin, suffix_k, suffix_v, step):
        k, v = suffix_k.clone(), suffix_v.clone()
        q = op.IMPLEMENTATIONS["triton"](qkv, cos, sin, k, v, step, 1, 4, 2)
        return q, k, v


def test_the_writes_survive_export_and_an_aoti_package(tmp_path):
    """Exported with a dynamic beam count and compiled by AOTInductor on CPU (the op opaque, its
    reference run by the package): layer 1's slot is written, in the package's own buffers."""
    qkv, cos, sin, suffix_k, suffix_v = make_inputs(5, (4, 2), 16, 3, torch.float32)
    step = torch.tensor([1])
    rows = torch.export.Dim("B", min=2, max=4096)
    shapes = ({0: rows}, {0: rows}, {0: rows}, {1: rows}, {1: rows}, None)
    exported = torch.export.export(_Write(), (qkv, cos, sin, suffix_k, suffix_v, step), dynamic_shapes=shapes)
    calls = call_targets(exported)
    assert any("rope_kv_write" in str(t) for t in calls), calls
    with torch._functorch.config.patch(decompose_custom_triton_ops=False):
        package = torch._inductor.aoti_load_package(torch._inductor.aoti_compile_and_package(
            exported, package_path=str(tmp_path / "write.pt2")))
    k_ref, v_ref = suffix_k.clone(), suffix_v.clone()
    q_ref = op.reference(qkv, cos, sin, k_ref, v_ref, step, 1, 4, 2)
    for run in (exported.module(), package):
        q, k, v = run(qkv, cos, sin, suffix_k, suffix_v, step)
        assert torch.equal(q, q_ref) and torch.equal(k, k_ref) and torch.equal(v, v_ref)


@pytest.mark.parametrize("checkpoint", ["tiny_qwen2_dir", "tiny_qwen3_dir"])
def test_decode_with_the_fused_op_equals_the_decode_without(checkpoint, request):
    """In FP32 the lowered decode (the registered op: its CPU kernel is the reference) is identical
    to the separate ops; with the kernel itself (the interpreter) within FP32 rounding. Qwen3 (q/k
    norm) keeps the separate form whatever the lowering."""
    assert_decode_unchanged(request.getfixturevalue(checkpoint), "rope_kv_write", op.launch)


@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("rows", [100, 800])
def test_gpu_qwen2_shapes(rows):
    """W2's decode rows: Qwen2.5-0.5B heads 14/2 of 64, 4 suffix slots, bf16."""
    got, expected = run_both(rows, (14, 2), 64, 4, 3, torch.bfloat16, "cuda", layer=2)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))

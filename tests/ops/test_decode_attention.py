"""A decode layer's RoPE, K/V write and prefix attention in one kernel: against the torch reference
(the two ops one after the other), against the two kernels it fuses (bit for bit under the
interpreter; compiled, its writes bit for bit and its output within a bf16 ulp), the registered op
(its writes survive export), and the model's decode step with the op lowered.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane), else
compiled on CUDA. bf16 is GPU-only: the interpreter's bf16 tl.dot is wrong (triton-lang/triton#11584)."""

import pytest
import torch

from boundgen.ops import decode_attention as op
from tests.ops.decode_testing import assert_decode_unchanged
from tests.ops.kernel_testing import KERNEL_DEVICE, call_targets, needs_compiled_kernel, needs_kernel
from tests.ops.test_prefix_attention import TOLERANCE


def make_inputs(lengths, width, heads, head_dim, slots, step, dtype, device="cpu", seed=0, layers=3):
    """(qkv, cos, sin, k_prefix, v_prefix, suffix_k, suffix_v, step, cu_seqlens) for R = len(lengths)
    prompts of W beams each; every layer's suffix buffers full of other values, as earlier steps left
    them; the prompts' K/V one layer of a [layers, T, Nkv, D] buffer (a view, as the model passes)."""
    num_q, num_kv = heads
    beams = len(lengths) * width
    gen = torch.Generator().manual_seed(seed)
    qkv = torch.randn(beams, (num_q + 2 * num_kv) * head_dim, generator=gen) * 2
    angles = torch.rand(beams, head_dim // 2, generator=gen) * 50
    emb = torch.cat((angles, angles), dim=-1)
    prefix_k, prefix_v = (torch.randn(layers, sum(lengths), num_kv, head_dim, generator=gen) for _ in range(2))
    suffix_k, suffix_v = (torch.randn(layers, beams, slots, num_kv, head_dim, generator=gen) for _ in range(2))
    tensors = (t.to(device=device, dtype=dtype) for t in (qkv, emb.cos(), emb.sin(), prefix_k, prefix_v, suffix_k,
                                                           suffix_v))
    qkv, cos, sin, prefix_k, prefix_v, suffix_k, suffix_v = tensors
    cu_seqlens = torch.tensor([0, *lengths]).cumsum(0).to(dtype=torch.int32, device=device)
    return (qkv, cos, sin, prefix_k[1], prefix_v[1], suffix_k, suffix_v, torch.tensor([step], device=device),
            cu_seqlens)


def run(fn, inputs, layer, width, heads, **launch):
    """fn's output and the suffix buffers it wrote (on copies of the inputs' buffers)."""
    qkv, cos, sin, k_prefix, v_prefix, suffix_k, suffix_v, step, cu = inputs
    suffix_k, suffix_v = suffix_k.clone(), suffix_v.clone()
    out = fn(qkv, cos, sin, k_prefix, v_prefix, suffix_k, suffix_v, step, cu, layer, width,
             k_prefix.shape[-1] ** -0.5, *heads, **launch)
    return out, suffix_k, suffix_v


# (prompt lengths, W, suffix slots, step): one request, prompts of one token, W = 1, odd W (a block of
# beams spans requests), the first and the last slot.
CASES = [((37,), 5, 4, 3), ((1,), 1, 2, 0), ((7,), 9, 3, 1), ((1, 37), 3, 4, 2), ((9, 1, 23), 7, 4, 0),
         ((20, 1, 3), 1, 1, 0)]


@needs_kernel
@pytest.mark.parametrize("lengths,width,slots,step", CASES, ids=lambda x: str(x))
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (14, 2)], ids=["g1", "g2", "qwen2"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_kernel_matches_the_reference_and_the_separate_kernels(lengths, width, slots, step, heads, dtype):
    """Within the attention's tolerance of the reference, its writes equal; and bit for bit what the
    two kernels it fuses compute and write."""
    inputs = make_inputs(lengths, width, heads, 16, slots, step, dtype, KERNEL_DEVICE)
    got = run(op.launch, inputs, 1, width, heads)
    expected = run(op.reference, inputs, 1, width, heads)
    assert got[0].dtype == dtype and got[0].shape == (len(lengths) * width, heads[0], 16)
    torch.testing.assert_close(got[0].float(), expected[0].float(), atol=TOLERANCE[dtype], rtol=0)
    assert torch.equal(got[1], expected[1]) and torch.equal(got[2], expected[2])
    assert not torch.equal(got[1][1], inputs[5][1]) and torch.equal(got[1][0], inputs[5][0])  # layer 1 written alone
    pair = run(op.launch_pair, inputs, 1, width, heads)
    for name, a, b in zip(("out", "suffix_k", "suffix_v"), got, pair):
        assert torch.equal(a, b), f"{name}: max abs difference {(a.float() - b.float()).abs().max()}"


@needs_kernel
@pytest.mark.parametrize("beams", [1, 2, 8], ids=lambda b: f"beams{b}")
@pytest.mark.parametrize("layer", [0, 2])
def test_kernel_beams_per_program_and_layers(beams, layer):
    """One program a beam (padded rows), blocks that span requests (W = 7), the first and last layer."""
    inputs = make_inputs((9, 1, 23), 7, (14, 2), 32, 4, 2, torch.float32, KERNEL_DEVICE)
    got = run(op.launch, inputs, layer, 7, (14, 2), beams_per_program=beams, block_n=16)
    expected = run(op.reference, inputs, layer, 7, (14, 2))
    torch.testing.assert_close(got[0], expected[0], atol=TOLERANCE[torch.float32], rtol=0)
    assert torch.equal(got[1], expected[1]) and torch.equal(got[2], expected[2])


@needs_kernel
def test_kernel_ignores_slots_past_the_step():
    """Slots after `step` never reach the output, whatever they hold (NaN and inf included)."""
    inputs = list(make_inputs((12,), 4, (4, 2), 16, 4, 1, torch.float32, KERNEL_DEVICE))
    clean = run(op.launch, inputs, 1, 4, (4, 2))[0]
    for buffer in (5, 6):
        inputs[buffer] = inputs[buffer].clone()
        inputs[buffer][:, :, 2:] = float("nan")
        inputs[buffer][:, :, 3:] = float("inf")
    assert torch.equal(run(op.launch, inputs, 1, 4, (4, 2))[0], clean)


def test_launcher_rejects_bad_inputs():
    qkv, cos, sin, k_prefix, v_prefix, suffix_k, suffix_v, step, cu = make_inputs((6,), 4, (4, 2), 16, 3, 1,
                                                                                   torch.float32)
    args = dict(k_prefix=k_prefix, v_prefix=v_prefix, suffix_k=suffix_k, suffix_v=suffix_v, step=step,
                cu_seqlens=cu, layer=1, width=4, scale=0.25, num_q_heads=4, num_kv_heads=2)
    with pytest.raises(ValueError, match=r"^decode_attention: rope_kv_write: expected qkv"):
        op.launch(qkv[:, :-16], cos, sin, **args)
    with pytest.raises(ValueError, match=r"^decode_attention: rope_kv_write: layer 3 is not one of"):
        op.launch(qkv, cos, sin, **dict(args, layer=3))
    with pytest.raises(ValueError, match=r"^decode_attention: prefix_attention: expected cu_seqlens"):
        op.launch(qkv, cos, sin, **dict(args, width=3))
    with pytest.raises(ValueError, match=r"^decode_attention: prefix_attention: k_prefix and v_prefix"):
        op.launch(qkv, cos, sin, **dict(args, v_prefix=v_prefix[:, :1]))
    with pytest.raises(ValueError, match=r"^decode_attention: rope_kv_write: step must be"):
        op.launch(qkv, cos, sin, **dict(args, step=step.int()))


def test_registered_op_runs_the_reference_on_cpu():
    inputs = make_inputs((6, 3), 4, (4, 2), 16, 3, 2, torch.float32)
    got = run(torch.ops.boundgen.decode_attention, inputs, 1, 4, (4, 2))
    expected = run(op.reference, inputs, 1, 4, (4, 2))
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert op.IMPLEMENTATIONS["triton"] is op.decode_attention and op.IMPLEMENTATIONS["separate"] is None


class _Layer(torch.nn.Module):
    """As the decode step uses the op: on graph-internal buffers (as after the reorder by parent)."""

    def forward(self, qkv, cos, sin, k_prefix, v_prefix, suffix_k, suffix_v, step, cu):
        k, v = suffix_k.clone(), suffix_v.clone()
        out = op.IMPLEMENTATIONS["triton"](qkv, cos, sin, k_prefix, v_prefix, k, v, step, cu, 1, 4, 0.25, 4, 2)
        return out, k, v


def test_the_writes_survive_export_and_an_aoti_package(tmp_path):
    """Exported with a dynamic beam count and compiled by AOTInductor on CPU (the op opaque, its
    reference run by the package): layer 1's slot is written, in the package's own buffers."""
    inputs = make_inputs((6,), 4, (4, 2), 16, 3, 1, torch.float32)
    beams = torch.export.Dim("B", min=2, max=4096)
    shapes = ({0: beams}, {0: beams}, {0: beams}, None, None, {1: beams}, {1: beams}, None, None)
    exported = torch.export.export(_Layer(), inputs, dynamic_shapes=shapes)
    calls = call_targets(exported)
    assert any("decode_attention" in str(t) for t in calls), calls
    with torch._functorch.config.patch(decompose_custom_triton_ops=False):
        package = torch._inductor.aoti_load_package(torch._inductor.aoti_compile_and_package(
            exported, package_path=str(tmp_path / "layer.pt2")))
    expected = run(op.reference, inputs, 1, 4, (4, 2))
    for module in (exported.module(), package):
        got = module(*inputs)
        assert all(torch.equal(a, b) for a, b in zip(got, expected))


@pytest.mark.parametrize("checkpoint", ["tiny_qwen2_dir", "tiny_qwen3_dir"])
def test_decode_with_the_fused_op_equals_the_decode_without(checkpoint, request):
    """In FP32 the lowered decode (the registered op: its CPU kernel is the reference) is identical
    to the separate ops; with the kernel itself (the interpreter) within FP32 rounding. Qwen3 (q/k
    norm) keeps the separate form whatever the lowering."""
    assert_decode_unchanged(request.getfixturevalue(checkpoint), "decode_attention", op.launch)


@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("lengths,width,step", [((64,), 100, 3), ((64,) * 8, 100, 0), ((400, 400), 100, 2)],
                         ids=["W2", "W2x8", "W3x2"])
def test_gpu_qwen2_shapes_match_the_separate_kernels(lengths, width, step):
    """W2 / W3 decode steps: Qwen2.5-0.5B heads 14/2 of 64, 4 suffix slots, bf16: the slot written bit
    for bit as the two kernels it fuses write it; the output within a bf16 rounding of theirs (compiled,
    the two kernels' sums need not come out in one order: on an H100 on 2026-12-07 up to one ulp apart
    here and there), and within bf16 tolerance of the reference."""
    inputs = make_inputs(lengths, width, (14, 2), 64, 4, step, torch.bfloat16, "cuda")
    got = run(op.launch, inputs, 2, width, (14, 2))
    pair = run(op.launch_pair, inputs, 2, width, (14, 2))
    assert torch.equal(got[1], pair[1]) and torch.equal(got[2], pair[2])
    torch.testing.assert_close(got[0].float(), pair[0].float(), rtol=2 ** -7, atol=2 ** -12)
    torch.testing.assert_close(got[0].float(), run(op.reference, inputs, 2, width, (14, 2))[0].float(),
                               atol=TOLERANCE[torch.bfloat16], rtol=0)

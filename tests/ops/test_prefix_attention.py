"""Shared-prefix beam attention: the Triton kernel against the torch reference, the registered op.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane;
tests/conftest.py sets the variable), else compiled on CUDA. bf16 is GPU-only: the interpreter's
bf16 tl.dot is wrong (triton-lang/triton#11584).
"""

import textwrap

import pytest
import torch

from boundgen.ops import prefix_attention as op
from tests.ops.kernel_testing import (KERNEL_DEVICE, assert_script_prints_ok, call_targets, needs_compiled_kernel,
                                     needs_kernel)

TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def make_inputs(lengths, width, suffix_len, num_q_heads, num_kv_heads, head_dim, dtype,
                device="cpu", seed=0):
    """Inputs for R = len(lengths) requests of W beams: the prefix is one layer of a
    [n_layers, T, N_kv, D] buffer, the suffix the slice [:, :L_s] of a [R*W, S, N_kv, D] buffer
    (not contiguous), all L_s positions valid. Returns (q, k_prefix, v_prefix, k_suffix, v_suffix,
    step, cu_seqlens)."""
    gen = torch.Generator().manual_seed(seed)

    def randn(*shape):
        return torch.randn(*shape, generator=gen).to(dtype=dtype, device=device)

    beams, slots = len(lengths) * width, suffix_len + 2
    q = randn(beams, num_q_heads, head_dim)
    k_prefix, v_prefix = randn(2, sum(lengths), num_kv_heads, head_dim).unbind(0)
    k_suffix = randn(beams, slots, num_kv_heads, head_dim)[:, :suffix_len]
    v_suffix = randn(beams, slots, num_kv_heads, head_dim)[:, :suffix_len]
    cu_seqlens = torch.tensor([0, *lengths], dtype=torch.int32).cumsum(0).to(torch.int32)
    return (q, k_prefix, v_prefix, k_suffix, v_suffix, step_of(suffix_len, device),
            cu_seqlens.to(device))


def step_of(n, device="cpu"):
    """The step as the op takes it for n valid suffix positions: its last slot n - 1, [1] int64 on
    the inputs' device (-1: none)."""
    return torch.tensor([n - 1], dtype=torch.int64, device=device)


def check_kernel(lengths, width, suffix_len, heads, head_dim, dtype, beams=None, block_n=16):
    *inputs, cu = make_inputs(lengths, width, suffix_len, *heads, head_dim, dtype, KERNEL_DEVICE)
    scale = head_dim ** -0.5
    out = op.launch(*inputs, cu, width, scale, beams, block_n)
    expected = op.reference(*inputs, cu, width, scale)
    assert out.dtype == dtype and out.shape == inputs[0].shape
    torch.testing.assert_close(out.float(), expected.float(), atol=TOLERANCE[dtype], rtol=0)


# (prompt lengths, W, L_s): one request (as before), then R = 2, 3 with prompts of length 1,
# odd W (a block of beams spans requests), W = 1.
CASES = [((37,), 1, 0), ((1,), 1, 1), ((7,), 5, 0), ((37,), 5, 4), ((1,), 9, 3),
         ((1, 37), 3, 2), ((5, 12), 1, 0), ((9, 1, 23), 7, 3), ((20, 1, 3), 1, 1)]


@needs_kernel
@pytest.mark.parametrize("lengths,width,suffix_len", CASES, ids=lambda x: str(x))
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (7, 1)], ids=["g1", "g2", "g7"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_kernel_matches_reference(lengths, width, suffix_len, heads, dtype):
    check_kernel(lengths, width, suffix_len, heads, 16, dtype)


@needs_kernel
@pytest.mark.parametrize("beams", [1, 2, 4, 16], ids=lambda b: f"beams{b}")
@pytest.mark.parametrize("lengths,width", [((37,), 7), ((9, 1, 23), 7), ((4, 30), 4)],
                         ids=lambda x: str(x))
def test_kernel_beams_per_program(beams, lengths, width):
    """1 is one program per (beam, kv head) with padded rows; 16 leaves most of the last
    program's beams past R*W; with W = 7 blocks of 2, 4 and 16 beams span requests."""
    check_kernel(lengths, width, 2, (14, 2), 32, torch.float32, beams)


@needs_kernel
def test_kernel_head_dim_64_default_tiles():
    check_kernel((70,), 3, 1, (2, 1), 64, torch.float32, block_n=64)
    check_kernel((70, 65, 1), 3, 1, (2, 1), 64, torch.float32, block_n=64)


@pytest.mark.parametrize("lengths,width", [((1, 9, 23), 3), ((5, 1), 1), ((2, 3, 4), 7)],
                         ids=lambda x: str(x))
def test_reference_packed_equals_each_request_alone(lengths, width):
    """The semantics: R packed requests give each request's rows as if it ran alone (R = 1)."""
    q, kp, vp, ks, vs, n, cu = make_inputs(lengths, width, 3, 4, 2, 16, torch.float32)
    packed = op.reference(q, kp, vp, ks, vs, n, cu, width, 0.25)
    for r in range(len(lengths)):
        rows, toks = slice(r * width, (r + 1) * width), slice(int(cu[r]), int(cu[r + 1]))
        alone = op.reference(q[rows], kp[toks], vp[toks], ks[rows], vs[rows], n,
                             torch.tensor([0, lengths[r]], dtype=torch.int32), width, 0.25)
        torch.testing.assert_close(packed[rows], alone, atol=1e-6, rtol=0)


def test_launcher_rejects_bad_inputs():
    q, kp, vp, ks, vs, n, cu = make_inputs((3, 2), 3, 2, 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="k_suffix and v_suffix must both be"):
        op.launch(q, kp, vp, ks[:2], vs[:2], n, cu, 3, 0.25)
    with pytest.raises(ValueError, match="share one dtype"):
        op.launch(q, kp, vp, ks.half(), vs, n, cu, 3, 0.25)
    with pytest.raises(ValueError, match="head dim of q and all K/V must be contiguous"):
        op.launch(q, kp, vp, ks, vs.transpose(2, 3).contiguous().transpose(2, 3), n, cu, 3, 0.25)
    with pytest.raises(ValueError, match="k_prefix and v_prefix must both be"):
        op.launch(q, kp, vp[:4], ks, vs, n, cu, 3, 0.25)
    with pytest.raises(ValueError, match="beams_per_program must be a power of two"):
        op.launch(q, kp, vp, ks, vs, n, cu, 3, 0.25, beams_per_program=3)
    with pytest.raises(ValueError, match="cu_seqlens"):
        op.launch(q, kp, vp, ks, vs, n, cu, 2, 0.25)  # 6 beams are not 2 requests of 2
    with pytest.raises(ValueError, match="cu_seqlens"):
        op.launch(q, kp, vp, ks, vs, n, cu.long(), 3, 0.25)


@pytest.mark.parametrize("bad", [torch.tensor([1], dtype=torch.int32), torch.tensor(1),
                                 torch.tensor([1, 1]), torch.tensor([[1]]), 1],
                         ids=["int32", "0-d", "shape2", "shape1x1", "python-int"])
def test_launcher_rejects_bad_step(bad):
    q, kp, vp, ks, vs, _, cu = make_inputs((3, 2), 3, 2, 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="expected step an int64 tensor of shape \\[1\\]"):
        op.launch(q, kp, vp, ks, vs, bad, cu, 3, 0.25)


def test_launcher_rejects_step_on_another_device():
    q, kp, vp, ks, vs, _, cu = make_inputs((3, 2), 3, 2, 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="all inputs must be on one device"):
        op.launch(q, kp, vp, ks, vs, step_of(2, "meta"), cu, 3, 0.25)


def _poisoned_buffer(lengths, width, capacity, n, heads, dtype, device):
    """make_inputs with a suffix buffer of `capacity` positions whose positions >= n hold NaN
    (keys) and inf (values); also returns the valid slices [:, :n] of the clean buffers."""
    q, kp, vp, ks, vs, _, cu = make_inputs(lengths, width, capacity, *heads, 16, dtype, device)
    clean = ks[:, :n], vs[:, :n]
    ks, vs = ks.clone(), vs.clone()
    ks[:, n:], vs[:, n:] = float("nan"), float("inf")
    return (q, kp, vp, ks, vs, step_of(n, device), cu), clean


@pytest.mark.parametrize("n", [0, 1, 3, 4])
def test_reference_ignores_suffix_positions_past_suffix_len(n):
    """The full buffer with n valid positions equals the buffer sliced to those n positions."""
    (q, kp, vp, ks, vs, sl, cu), (ks_n, vs_n) = _poisoned_buffer((9, 1, 23), 3, 4, n, (4, 2),
                                                                  torch.float32, "cpu")
    out = op.reference(q, kp, vp, ks, vs, sl, cu, 3, 0.25)
    assert out.isfinite().all()
    sliced = op.reference(q, kp, vp, ks_n, vs_n, sl, cu, 3, 0.25)
    torch.testing.assert_close(out, sliced, atol=0, rtol=0)


@needs_kernel
@pytest.mark.parametrize("n", [0, 1, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_kernel_ignores_suffix_positions_past_suffix_len(n, dtype):
    (q, kp, vp, ks, vs, sl, cu), (ks_n, vs_n) = _poisoned_buffer(
        (9, 1, 23), 3, 4, n, (4, 2), dtype, KERNEL_DEVICE)
    out = op.launch(q, kp, vp, ks, vs, sl, cu, 3, 0.25, block_n=16)
    expected = op.reference(q, kp, vp, ks_n, vs_n, sl, cu, 3, 0.25)
    torch.testing.assert_close(out.float(), expected.float(), atol=TOLERANCE[dtype], rtol=0)


def _poisoned_prompt_tail(dtype, device, tail=5):
    """Inputs whose prompt buffer has `tail` rows after the last prompt (a beam call padded for
    CUDA graphs) holding NaN and inf, as unwritten memory may; and the same inputs without them."""
    *inputs, cu = make_inputs((9, 1, 23), 3, 2, 4, 2, 16, dtype, device)
    q, kp, vp, ks, vs, sl = inputs
    junk = torch.tensor([float("nan"), float("inf")], dtype=dtype, device=device).repeat(tail * 16)
    kp_t, vp_t = (torch.cat((x, junk.reshape(tail, 2, 16))) for x in (kp, vp))
    return (q, kp_t, vp_t, ks, vs, sl, cu), (q, kp, vp, ks, vs, sl, cu)


def test_reference_ignores_prompt_rows_after_the_last_prompt():
    """Rows of no request take no part, whatever they hold (0 * NaN is NaN: they must be zeroed)."""
    padded, clean = _poisoned_prompt_tail(torch.float32, "cpu")
    out = op.reference(*padded, 3, 0.25)
    assert out.isfinite().all()
    torch.testing.assert_close(out, op.reference(*clean, 3, 0.25), atol=1e-6, rtol=0)  # summation order


@needs_kernel
def test_kernel_ignores_prompt_rows_after_the_last_prompt():
    padded, clean = _poisoned_prompt_tail(torch.float32, KERNEL_DEVICE)
    out = op.launch(*padded, 3, 0.25, block_n=16)
    torch.testing.assert_close(out, op.reference(*clean, 3, 0.25), atol=TOLERANCE[torch.float32], rtol=0)


def test_registered_op_runs_reference_on_cpu():
    *inputs, cu = make_inputs((37, 1, 4), 5, 3, 4, 2, 16, torch.float32)
    out = torch.ops.boundgen.prefix_attention(*inputs, cu, 5, 0.25)
    torch.testing.assert_close(out, op.reference(*inputs, cu, 5, 0.25), atol=0, rtol=0)
    assert op.IMPLEMENTATIONS["triton"] is op.prefix_attention


class _Step(torch.nn.Module):
    """One decode step's attention as the model runs it: the whole suffix buffer, the step (its
    last valid slot) an input."""

    def __init__(self, lowering: str):
        super().__init__()
        self.attention = op.IMPLEMENTATIONS[lowering]

    def forward(self, q, k_prefix, v_prefix, k_buffer, v_buffer, step, cu_seqlens):
        return self.attention(q, k_prefix, v_prefix, k_buffer, v_buffer, step, cu_seqlens,
                              5, 0.25)


@pytest.mark.parametrize("lowering", ["triton", "torch"])
def test_op_exports_once_for_every_suffix_len(lowering):
    """Dynamic prompt tokens T and requests R (R * W beams, W = 5 fixed at build time); one
    exported step serves every n in [0, L_s]. The registered op stays one node."""
    *inputs, cu = make_inputs((4, 5), 5, 4, 4, 2, 16, torch.float32)
    tokens, requests = torch.export.Dim("T", min=1, max=1024), torch.export.Dim("R", min=1, max=64)
    beams = 5 * requests
    shapes = ({0: beams}, {0: tokens}, {0: tokens}, {0: beams}, {0: beams}, None,
              {0: requests + 1})
    q, kp, vp, kb, vb, n = inputs
    exported = torch.export.export(_Step(lowering),
                                   (q, kp, vp, kb.contiguous(), vb.contiguous(), n, cu),
                                   dynamic_shapes=shapes)
    calls = call_targets(exported)
    assert torch.ops.aten._local_scalar_dense.default not in calls  # no .item(): n stays a tensor
    if lowering == "triton":
        assert calls == [torch.ops.boundgen.prefix_attention.default]
    for lengths, n in [((37,), 0), ((1, 9, 23), 1), ((1, 9, 23), 3), ((2, 6), 4)]:
        q2, kp2, vp2, kb2, vb2, _, cu2 = make_inputs(lengths, 5, 4, 4, 2, 16, torch.float32,
                                                     seed=2)
        kb2, vb2 = kb2.contiguous(), vb2.contiguous()
        kb2[:, n:], vb2[:, n:] = float("nan"), float("nan")
        torch.testing.assert_close(
            exported.module()(q2, kp2, vp2, kb2, vb2, step_of(n), cu2),
            op.reference(q2, kp2, vp2, kb2[:, :n], vb2[:, :n], step_of(n), cu2, 5, 0.25),
            atol=0, rtol=0)


_TRACE_SCRIPT = textwrap.dedent("""
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx
    from boundgen.ops import prefix_attention as op
    q, kp, vp = torch.randn(6, 4, 16), torch.randn(9, 2, 16), torch.randn(9, 2, 16)
    kb, vb = torch.randn(6, 4, 2, 16), torch.randn(6, 4, 2, 16)
    cu, n = torch.tensor([0, 4, 9], dtype=torch.int32), torch.tensor([1], dtype=torch.int64)
    graph = make_fx(lambda q, kp, vp, kb, vb, n, cu: op.launch(q, kp, vp, kb[:, :3], vb[:, :3], n,
                                                               cu, 3, 0.25),
                    tracing_mode="symbolic")(q, kp, vp, kb, vb, n, cu).graph
    hops = [n for n in graph.nodes if "triton_kernel_wrapper" in str(n.target)]
    assert len(hops) == 1, graph
    assert not [n for n in graph.nodes if "clone" in str(n.target) or "copy" in str(n.target)]
    assert not [n for n in graph.nodes if "local_scalar_dense" in str(n.target)], graph
    print("ok")
""")


def test_launcher_traces_with_symbolic_shapes_without_copies():
    """What Inductor does to the op on the GPU: one kernel call, the suffix slice passed by
    strides (no copy), the step passed as a pointer (no host read). Fresh process without the
    interpreter, where wrap_triton can trace."""
    assert_script_prints_ok(_TRACE_SCRIPT)


# ---------------------------------------------------------------------------------------------
# GPU: W2/W3 shapes in bf16 against the reference, SDPA and FlexAttention over the
# concatenated K/V (what a lowering without this kernel has to build).

def _concatenated(k_prefix, k_suffix):
    width = k_suffix.shape[0]
    full = torch.cat((k_prefix.expand(width, *k_prefix.shape), k_suffix), dim=1)  # [W, L, Nkv, D]
    return full.transpose(1, 2)  # [W, Nkv, L, D]


def _sdpa(q, k_prefix, v_prefix, k_suffix, v_suffix, step, cu_seqlens, width, scale):
    import torch.nn.functional as F
    n = int(step) + 1
    out = F.scaled_dot_product_attention(q[:, :, None], _concatenated(k_prefix, k_suffix[:, :n]),
                                         _concatenated(v_prefix, v_suffix[:, :n]), scale=scale,
                                         enable_gqa=True)
    return out[:, :, 0]


def _flex(q, k_prefix, v_prefix, k_suffix, v_suffix, step, cu_seqlens, width, scale):
    from torch.nn.attention.flex_attention import flex_attention
    n = int(step) + 1
    out = flex_attention(q[:, :, None], _concatenated(k_prefix, k_suffix[:, :n]),
                         _concatenated(v_prefix, v_suffix[:, :n]), scale=scale, enable_gqa=True)
    return out[:, :, 0]


@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("lengths", [(64,), (400,), (64, 1, 400, 33)], ids=lambda x: str(x))
@pytest.mark.parametrize("suffix_len", [0, 1, 4])
@pytest.mark.parametrize("heads,head_dim", [((14, 2), 64), ((16, 8), 128)], ids=["qwen2", "qwen3"])
def test_gpu_matches_reference_sdpa_flex(lengths, suffix_len, heads, head_dim):
    """W = 100; SDPA and Flex over the concatenated K/V for one request, the reference for all."""
    inputs = make_inputs(lengths, 100, suffix_len, *heads, head_dim, torch.bfloat16, "cuda")
    scale = head_dim ** -0.5
    out = torch.ops.boundgen.prefix_attention(*inputs, 100, scale).float()
    one_beam_per_program = op.launch(*inputs, 100, scale, beams_per_program=1).float()
    others = [("reference", op.reference)]
    if len(lengths) == 1:
        others += [("sdpa", _sdpa), ("flex", _flex)]
    for name, other in others:
        expected = other(*inputs, 100, scale).float()
        for layout, got in [("default", out), ("beams1", one_beam_per_program)]:
            err = (got - expected).abs().max().item()
            assert err < 2e-2, f"{layout}: max abs error {err} against {name}"

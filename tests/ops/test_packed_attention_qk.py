"""packed_attention_qk: the fused q/k norm + RoPE + packed attention kernel against the composition of
the qk_norm_rope and packed_attention references, the registered op, the model's fused path.

The kernel runs under TRITON_INTERPRET=1 on CPU tensors (tests/conftest.py), else compiled on CUDA.
The q and k it attends with are qk_norm_rope's kernel's bit for bit (its helper, checked alone by a
kernel that stores them); bf16 / fp16 outputs are compared with attention over those same rounded q
and k, at packed attention's tolerances; FP32 with the reference composition.
"""

import dataclasses

import pytest
import torch
import triton
import triton.language as tl

from boundgen.model.qwen import QwenModel
from boundgen.ops import packed_attention, qk_norm_rope, rope
from boundgen.ops import packed_attention_qk as op
from boundgen.ops.lowering import OpLowering
from boundgen.ops.packed_attention_qk import _normed_rotated
from tests.ops.kernel_testing import (KERNEL_DEVICE, assert_script_prints_ok, call_targets, needs_compiled_kernel,
                                     needs_kernel, one_kernel_trace_script)

EPS = 1e-6
TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}  # tests/ops/test_packed_attention.py


def make_inputs(lengths, heads, head_dim, dtype, device="cpu", seed=0):
    """(qkv, q_weight, k_weight, cos, sin), cu_seqlens: positions restart at each sequence."""
    gen = torch.Generator().manual_seed(seed)
    num_q, num_kv = heads
    qkv = torch.randn(sum(lengths), (num_q + 2 * num_kv) * head_dim, generator=gen)
    wq = 1 + 0.1 * torch.randn(head_dim, generator=gen)
    wk = 1 + 0.1 * torch.randn(head_dim, generator=gen)
    positions = torch.cat([torch.arange(n) for n in lengths])
    cos, sin = rope.cos_sin(positions, rope.inv_freq(head_dim, 1e6), dtype)
    cu_seqlens = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    inputs = [t.to(device=device, dtype=dtype) for t in (qkv, wq, wk)] + [cos.to(device), sin.to(device)]
    return inputs, cu_seqlens.to(device)


def check_kernel(lengths, heads, head_dim, dtype, blocks=(None, None), pack=None, max_seqlen=None):
    inputs, cu_seqlens = make_inputs(lengths, heads, head_dim, dtype, KERNEL_DEVICE)
    scale = head_dim ** -0.5
    out = op.launch(*inputs, EPS, cu_seqlens, scale, *heads, max_seqlen, *blocks, pack=pack)
    assert out.dtype == dtype and out.shape == (sum(lengths), heads[0], head_dim)
    if dtype == torch.float32:
        expected = op.reference(*inputs, EPS, cu_seqlens, scale, *heads)
    else:  # attention over qk_norm_rope's kernel's rounded q and k
        q, k = qk_norm_rope.launch(*inputs, EPS, *heads)
        v = qk_norm_rope.split_heads(inputs[0], *heads, head_dim)[2]
        expected = packed_attention.reference(q, k, v, cu_seqlens, scale)
    torch.testing.assert_close(out.float(), expected.float(), atol=TOLERANCE[dtype], rtol=0)
    return out


LENGTHS = [[1], [7], [37], [1, 7, 37], [37, 1, 7, 0, 2]]


@needs_kernel
@pytest.mark.parametrize("lengths", LENGTHS, ids=lambda x: "-".join(map(str, x)))
@pytest.mark.parametrize("heads", [(4, 2), (2, 2)], ids=["g2", "g1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_matches_reference(lengths, heads, dtype):
    """One sequence (B = 1) of one token, of lengths that are not multiples of the block, several
    with empty ones among them; GQA ratios 2 and 1."""
    check_kernel(lengths, heads, 32, dtype, blocks=(16, 16))


@needs_kernel
@pytest.mark.parametrize("heads,pack", [((4, 2), 1), ((8, 2), 2), ((8, 2), 4), ((4, 1), 4)],
                         ids=["g2p1", "g4p2", "g4p4", "g4p4-one-kv"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_kernel_packs_query_heads(heads, pack, dtype):
    check_kernel([1, 37, 23, 16, 17, 0, 2], heads, 32, dtype, (16, 16), pack)


@needs_kernel
@pytest.mark.parametrize("blocks", [(16, 32), (32, 16), (None, None)], ids=["m16n32", "m32n16", "default"])
def test_kernel_block_shapes(blocks):
    """BLOCK_N > BLOCK_M, BLOCK_N < BLOCK_M (rows with no key in a masked tile), the default."""
    check_kernel([1, 37, 23, 16, 17], (4, 2), 32, torch.float32, blocks)


@needs_kernel
def test_kernel_ignores_a_max_seqlen_bound_and_spans_seq_chunks():
    """More sequences than one SEQ_CHUNK (64) of cu_seqlens; the bound changes nothing."""
    lengths = torch.randint(0, 6, (70,), generator=torch.Generator().manual_seed(1)).tolist()
    lengths[0] = 9
    out = check_kernel(lengths, (2, 1), 32, torch.float16, (16, 16), max_seqlen=9)
    assert torch.equal(out, check_kernel(lengths, (2, 1), 32, torch.float16, (16, 16)))


@triton.jit
def _store_normed_rotated(qkv_ptr, wq_ptr, wk_ptr, cos_ptr, sin_ptr, q_ptr, k_ptr, eps, num_tokens, stride_qkv,
                          NUM_Q: tl.constexpr, NUM_KV: tl.constexpr, HALF: tl.constexpr, SOFT_BF16: tl.constexpr):
    # The attention kernel's q / k load for every (token, head) row of one head, written out.
    head = tl.program_id(0)
    tokens = tl.arange(0, 64)
    ok = tokens < num_tokens
    offs = tl.arange(0, HALF)[None, :]
    if head < NUM_Q:
        y1, y2 = _normed_rotated(qkv_ptr, wq_ptr, cos_ptr, sin_ptr, tokens, tokens * 0 + head, ok, eps, stride_qkv,
                                 2 * HALF, 2 * HALF, HALF, SOFT_BF16)
        out_at = q_ptr + (tokens[:, None] * NUM_Q + head) * (2 * HALF) + offs
    else:
        y1, y2 = _normed_rotated(qkv_ptr, wk_ptr, cos_ptr, sin_ptr, tokens, tokens * 0 + head, ok, eps, stride_qkv,
                                 2 * HALF, 2 * HALF, HALF, SOFT_BF16)
        out_at = k_ptr + (tokens[:, None] * NUM_KV + head - NUM_Q) * (2 * HALF) + offs
    tl.store(out_at, y1, mask=ok[:, None])
    tl.store(out_at + HALF, y2, mask=ok[:, None])


@needs_kernel
@pytest.mark.parametrize("heads,head_dim", [((4, 2), 32), ((16, 8), 128)], ids=["tiny", "qwen3-0.6b"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_q_and_k_are_qk_norm_rope_bit_for_bit(heads, head_dim, dtype):
    """The q and k rows the kernel attends with equal what qk_norm_rope's kernel stores."""
    inputs, _ = make_inputs([37], heads, head_dim, dtype, KERNEL_DEVICE, seed=4)
    inputs[0] = inputs[0] * 3  # values well off 1: the norm's rounding matters
    q, k = qk_norm_rope.launch(*inputs, EPS, *heads)
    got_q, got_k = torch.full_like(q, float("nan")), torch.full_like(k, float("nan"))
    qkv, wq, wk, cos, sin = inputs
    _store_normed_rotated[(sum(heads),)](qkv, wq, wk, cos, sin, got_q, got_k, EPS, qkv.shape[0], qkv.stride(0),
                                         NUM_Q=heads[0], NUM_KV=heads[1], HALF=head_dim // 2,
                                         SOFT_BF16=qkv.device.type == "cpu")
    assert torch.equal(got_q, q) and torch.equal(got_k, k)


def test_launcher_rejects_bad_inputs():
    (qkv, wq, wk, cos, sin), cu = make_inputs([3, 4], (4, 2), 32, torch.float32)
    args = (EPS, cu, 0.25)
    with pytest.raises(ValueError, match=r"qkv \[T, \(Nq \+ 2 Nkv\) D\]"):
        op.launch(qkv[:, :-32], wq, wk, cos, sin, *args, 4, 2)
    with pytest.raises(ValueError, match="power of two >= 32"):
        op.launch(qkv[:, :128], wq[:16], wk[:16], cos[:, :16], sin[:, :16], *args, 4, 2)
    with pytest.raises(ValueError, match="multiple of N_kv=3"):
        op.launch(qkv, wq, wk, cos, sin, *args, 4, 3)
    with pytest.raises(ValueError, match="cos / sin"):
        op.launch(qkv, wq, wk, cos[:2], sin, *args, 4, 2)
    with pytest.raises(ValueError, match="share one dtype"):
        op.launch(qkv, wq.half(), wk, cos, sin, *args, 4, 2)
    with pytest.raises(ValueError, match="share one dtype"):
        op.launch(qkv.double(), wq.double(), wk.double(), cos.double(), sin.double(), *args, 4, 2)
    with pytest.raises(ValueError, match="must be contiguous"):
        op.launch(qkv, wq, wk, cos.t().contiguous().t(), sin, *args, 4, 2)
    with pytest.raises(ValueError, match="cu_seqlens must be a contiguous 1-D int32"):
        op.launch(qkv, wq, wk, cos, sin, EPS, cu.long(), 0.25, 4, 2)
    with pytest.raises(ValueError, match="pack must be a power of two dividing the group of 2"):
        op.launch(qkv, wq, wk, cos, sin, *args, 4, 2, pack=4)


def test_registered_op_runs_the_reference_on_cpu_and_exports_as_one_node():
    inputs, cu = make_inputs([1, 7, 9], (4, 2), 16, torch.float32)
    got = torch.ops.boundgen.packed_attention_qk(*inputs, EPS, cu, 0.25, 4, 2)
    q, k = qk_norm_rope.reference(*inputs, EPS, 4, 2)
    v = qk_norm_rope.split_heads(inputs[0], 4, 2, 16)[2]
    assert torch.equal(got, packed_attention.reference(q, k, v, cu, 0.25))
    assert op.IMPLEMENTATIONS["separate"] is None

    class Fused(torch.nn.Module):
        def forward(self, qkv, wq, wk, cos, sin, cu_seqlens):
            return op.IMPLEMENTATIONS["triton"](qkv, wq, wk, cos, sin, EPS, cu_seqlens, 0.25, 4, 2, max_seqlen=9)

    tokens = torch.export.Dim("T", min=2, max=4096)
    bounds = torch.export.Dim("B_plus_1", min=2, max=65)
    exported = torch.export.export(Fused(), (*inputs, cu),
                                   dynamic_shapes=({0: tokens}, None, None, {0: tokens}, {0: tokens}, {0: bounds}))
    assert call_targets(exported) == [torch.ops.boundgen.packed_attention_qk.default]
    inputs2, cu2 = make_inputs([5, 1, 30], (4, 2), 16, torch.float32, seed=3)
    assert torch.equal(exported.module()(*inputs2, cu2), op.reference(*inputs2, EPS, cu2, 0.25, 4, 2))


def test_launcher_traces_with_symbolic_tokens():
    """Traced as Inductor does on the GPU: one kernel call whose grid stays an expression of T."""
    assert_script_prints_ok(one_kernel_trace_script("""
    from boundgen.ops import packed_attention_qk as op
    qkv, w, cs = torch.randn(10, 8 * 32), torch.randn(32), torch.randn(10, 32)
    cu_seqlens = torch.tensor([0, 3, 10], dtype=torch.int32)
    graph = make_fx(lambda qkv, w, cs, cu: op.launch(qkv, w, w, cs, cs, 1e-6, cu, 0.25, 4, 2),
                    tracing_mode="symbolic")(qkv, w, cs, cu_seqlens).graph
"""))


def _prefill(model, keep_kv=False):
    tokens = torch.randint(0, 500, (20,), generator=torch.Generator().manual_seed(0))
    positions = torch.cat([torch.arange(n) for n in (7, 1, 12)])
    cu = torch.tensor([0, 7, 8, 20], dtype=torch.int32)
    with torch.no_grad():
        hidden, kv = model.prefill(tokens, positions, cu, keep_kv=keep_kv, max_seqlen=12)
        return model.logits(hidden), kv


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_model_with_the_fused_op_equals_the_separate_ops(family, make_checkpoint):
    """Qwen3 (q/k norm; heads of 32, the kernel's least): the fused lowering gives the separate ops'
    logits, the registered op (its CPU kernel: the reference) exactly, and the kernel itself (in the
    interpreter) within FP32 rounding; a prefill that keeps its K/V, and Qwen2 (no q/k norm), ignore
    the lowering."""
    from boundgen.model.loader import load_model
    model = load_model(make_checkpoint(f"tiny-{family}", overrides={"head_dim": 32}))
    assert isinstance(model, QwenModel) and model.cfg.qk_norm == (family == "qwen3")
    separate, _ = _prefill(model)
    _, separate_kv = _prefill(model, keep_kv=True)
    model.ops = OpLowering(packed_attention_qk="triton").resolve()
    fused, _ = _prefill(model)
    assert torch.equal(fused, separate)
    _, fused_kv = _prefill(model, keep_kv=True)
    assert all(torch.equal(a, b) for a, b in zip(fused_kv, separate_kv))
    if KERNEL_DEVICE == "cpu":  # the kernel in its place, each call counted
        calls = []

        def kernel(qkv, *args, **kwargs):
            calls.append(qkv.shape)
            return op.launch(qkv, *args, **kwargs)
        model.ops = dataclasses.replace(model.ops, packed_attention_qk=kernel)
        logits, _ = _prefill(model)
        torch.testing.assert_close(logits, separate, atol=1e-5, rtol=0)
        assert len(calls) == (model.cfg.num_layers if model.cfg.qk_norm else 0)


# ---------------------------------------------------------------------------------------------
# GPU: W1's shapes in bf16 against the triton_gqa lowering over qk_norm_rope's q and k.

@pytest.mark.gpu
@needs_compiled_kernel
def test_gpu_w1_shapes_match_the_separate_kernels():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(48, 257, (15,), generator=gen).tolist() + [1]
    inputs, cu_seqlens = make_inputs(lengths, (16, 8), 128, torch.bfloat16, "cuda")
    scale = 128 ** -0.5
    fused = torch.ops.boundgen.packed_attention_qk(*inputs, EPS, cu_seqlens, scale, 16, 8).float()
    q, k = qk_norm_rope.launch(*inputs, EPS, 16, 8)
    v = qk_norm_rope.split_heads(inputs[0], 16, 8, 128)[2]
    separate = packed_attention.triton_gqa_attention(q, k, v, cu_seqlens, scale).float()
    reference = op.reference(*inputs, EPS, cu_seqlens, scale, 16, 8).float()
    # a bf16 ulp or two of the output (|out| up to ~4: rows of a sequence's first tokens)
    torch.testing.assert_close(fused, separate, atol=2e-2, rtol=2 ** -7)
    torch.testing.assert_close(fused, reference, atol=2e-2, rtol=2 ** -7)

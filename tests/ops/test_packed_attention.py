"""Packed prefill attention: the Triton kernel against the torch reference, the registered op.

The kernel tests run the real kernel: under TRITON_INTERPRET=1 on CPU tensors (the CPU lane;
tests/conftest.py sets the variable), else compiled on CUDA. bf16 is GPU-only: the interpreter's
bf16 tl.dot is wrong (triton-lang/triton#11584).
"""

import pytest
import torch

from boundgen.ops import packed_attention as op
from tests.ops.kernel_testing import (KERNEL_DEVICE, assert_script_prints_ok, needs_compiled_kernel,
                                     needs_kernel, one_kernel_trace_script)

TOLERANCE = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


def make_inputs(lengths, num_q_heads, num_kv_heads, head_dim, dtype, device="cpu", seed=0):
    """q, k, v as the model makes them (views of one fused qkv output: v is not contiguous)."""
    gen = torch.Generator().manual_seed(seed)
    cu_seqlens = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    cu_seqlens[1:] = torch.tensor(lengths).cumsum(0)
    num_tokens = int(cu_seqlens[-1])
    width = (num_q_heads + 2 * num_kv_heads) * head_dim
    qkv = torch.randn(num_tokens, width, generator=gen).to(dtype=dtype, device=device)
    q, k, v = qkv.split([num_q_heads * head_dim, num_kv_heads * head_dim,
                         num_kv_heads * head_dim], dim=-1)
    return (q.reshape(num_tokens, num_q_heads, head_dim),
            k.reshape(num_tokens, num_kv_heads, head_dim),
            v.reshape(num_tokens, num_kv_heads, head_dim), cu_seqlens.to(device))


def check_kernel(lengths, heads, head_dim, dtype, blocks=(None, None), pack=1, launch=op.launch):
    q, k, v, cu_seqlens = make_inputs(lengths, *heads, head_dim, dtype, KERNEL_DEVICE)
    scale = head_dim ** -0.5
    out = launch(q, k, v, cu_seqlens, scale, *blocks, pack=pack)
    expected = op.reference(q, k, v, cu_seqlens, scale)
    assert out.dtype == dtype and out.shape == q.shape
    torch.testing.assert_close(out.float(), expected.float(), atol=TOLERANCE[dtype], rtol=0)


@needs_kernel
@pytest.mark.parametrize("lengths", [[1], [7], [37], [1, 7, 37], [37, 1, 7, 0, 2]],
                         ids=lambda x: "-".join(map(str, x)))
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (7, 1)], ids=["g1", "g2", "g7"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["fp32", "fp16"])
def test_kernel_matches_reference(lengths, heads, dtype):
    check_kernel(lengths, heads, 16, dtype, blocks=(16, 16))


@needs_kernel
@pytest.mark.parametrize("heads,pack", [((4, 2), 2), ((8, 2), 2), ((8, 2), 4), ((4, 1), 4)],
                         ids=["g2p2", "g4p2", "g4p4", "g4p4-one-kv"])
@pytest.mark.parametrize("blocks", [(16, 16), (16, 32), (32, 16)], ids=["m16n16", "m16n32", "m32n16"])
def test_kernel_packs_query_heads(heads, pack, blocks):
    """Several query heads of one K/V head in one program: rows interleave tokens and heads, the
    causal mask and the sequence bounds follow each row's token."""
    check_kernel([1, 37, 23, 16, 17, 0, 2], heads, 16, torch.float32, blocks, pack)


@pytest.mark.parametrize("pack", [0, 3, 4])
def test_pack_must_divide_the_group(pack):
    q, k, v, cu_seqlens = make_inputs([5], 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="pack must be a power of two dividing the group of 2"):
        op.launch(q, k, v, cu_seqlens, 0.25, pack=pack)


def test_gqa_pack_takes_power_of_two_groups():
    assert [op.gqa_pack(q, kv) for q, kv in [(16, 8), (14, 2), (8, 1), (32, 2), (4, 4)]] == [2, 1, 8, 1, 1]


@needs_kernel
@pytest.mark.parametrize("blocks", [(16, 16), (32, 16), (16, 32), (None, None)],
                         ids=["m16n16", "m32n16", "m16n32", "default"])
def test_kernel_block_shapes(blocks):
    """BLOCK_N < BLOCK_M leaves rows with no key in a masked tile; BLOCK_N > BLOCK_M has key
    tiles longer than the query block; the defaults are what the op runs."""
    check_kernel([1, 37, 23, 16, 17], (4, 2), 32, torch.float32, blocks)


@needs_kernel
def test_kernel_many_sequences():
    lengths = torch.randint(1, 13, (24,), generator=torch.Generator().manual_seed(1)).tolist()
    check_kernel(lengths, (2, 1), 16, torch.float16, blocks=(16, 16))


@needs_kernel
def test_kernel_head_dim_64():
    check_kernel([5, 37], (2, 1), 64, torch.float32)


@needs_kernel
@pytest.mark.parametrize("lengths", [[1], [7], [37], [1, 7, 37], [37, 1, 7, 0, 2]],
                         ids=lambda x: "-".join(map(str, x)))
@pytest.mark.parametrize("heads,pack", [((4, 2), 2), ((8, 2), 4), ((7, 1), 1), ((4, 2), 1)],
                         ids=["g2p2", "g4p4", "g7p1", "g2p1"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_stacked_kernel_matches_reference(lengths, heads, pack, dtype):
    """The `triton_stacked` form: a pack's query heads stacked as row slabs, sequences of one token
    and lengths that are not multiples of the tile; bf16 runs with FP32 dots under the interpreter."""
    check_kernel(lengths, heads, 16, dtype, blocks=(16, 16), pack=pack, launch=op.launch_stacked)


@needs_kernel
@pytest.mark.parametrize("blocks", [(32, 16), (32, 32), (64, 16), (None, None)],
                         ids=["m32n16", "m32n32", "m64n16", "default"])
def test_stacked_kernel_block_shapes(blocks):
    """Several key tiles on the diagonal (BLOCK_N < BLOCK_M) and off it, blocks that end past their
    sequence, heaviest-first order over sequences of 1 to 4 blocks; the default is what the op runs."""
    check_kernel([1, 37, 23, 16, 17, 70, 0, 2], (4, 2), 32, torch.float32, blocks, pack=None,
                 launch=op.launch_stacked)


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_stacked_kernel_with_tensor_descriptors(dtype):
    """K/V off the diagonal through TMA descriptors (the benchmark's `tma` configs): the same result,
    a sequence of 70 tokens has whole tiles before its second and third blocks."""
    q, k, v, cu_seqlens = make_inputs([1, 37, 70, 0, 2], 4, 2, 16, dtype, KERNEL_DEVICE)
    out = op.launch_stacked(q, k, v, cu_seqlens, 0.25, 32, 16, pack=2, tma=True)
    torch.testing.assert_close(out.float(), op.reference(q, k, v, cu_seqlens, 0.25).float(), atol=TOLERANCE[dtype],
                               rtol=0)


@needs_kernel
def test_stacked_kernel_many_sequences():
    """More sequences than one SEQ_CHUNK vector (64) of cu_seqlens."""
    lengths = torch.randint(0, 20, (70,), generator=torch.Generator().manual_seed(2)).tolist()
    check_kernel(lengths, (2, 1), 16, torch.float16, blocks=(16, 16), pack=2, launch=op.launch_stacked)


@pytest.mark.parametrize("blocks", [(32, 64), (16, 8), (48, 16)])
def test_stacked_launcher_rejects_tiles_that_do_not_nest(blocks):
    q, k, v, cu_seqlens = make_inputs([5], 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="BLOCK_N must be a power of two >= 16 dividing BLOCK_M"):
        op.launch_stacked(q, k, v, cu_seqlens, 0.25, *blocks)


def test_stacked_config_keeps_128_rows():
    assert op.stacked_config(128, 2) == (64, 32, 8, 2) and op.stacked_config(64, 1) == (128, 64, 8, 2)
    assert [op.stacked_config(128, p)[0] * p for p in (1, 2, 4, 8)] == [128] * 4


def test_launcher_rejects_bad_inputs():
    q, k, v, cu_seqlens = make_inputs([3, 4], 4, 2, 16, torch.float32)
    scale = 0.25
    with pytest.raises(ValueError, match="cu_seqlens must be a contiguous 1-D int32"):
        op.launch(q, k, v, cu_seqlens.long(), scale)
    with pytest.raises(ValueError, match="share one dtype"):
        op.launch(q, k.half(), v, cu_seqlens, scale)
    with pytest.raises(ValueError, match="head dim of q, k and v must be contiguous"):
        op.launch(q, k.transpose(1, 2).contiguous().transpose(1, 2), v, cu_seqlens, scale)
    with pytest.raises(ValueError, match="not a multiple of N_kv"):
        op.launch(q[:, :3], k, v, cu_seqlens, scale)
    with pytest.raises(ValueError, match="k and v must both be"):
        op.launch(q, k[:5], v[:5], cu_seqlens, scale)
    with pytest.raises(ValueError, match="power of two >= 16"):
        op.launch(q[..., :12], k[..., :12], v[..., :12], cu_seqlens, scale)


def test_registered_op_runs_reference_on_cpu():
    q, k, v, cu_seqlens = make_inputs([1, 7, 37], 4, 2, 16, torch.float32)
    out = torch.ops.boundgen.packed_attention(q, k, v, cu_seqlens, 0.25)
    torch.testing.assert_close(out, op.reference(q, k, v, cu_seqlens, 0.25), atol=0, rtol=0)
    assert op.IMPLEMENTATIONS["triton"] is op.triton_attention
    stacked = torch.ops.boundgen.packed_attention_stacked(q, k, v, cu_seqlens, 0.25)
    torch.testing.assert_close(stacked, op.reference(q, k, v, cu_seqlens, 0.25), atol=0, rtol=0)
    assert op.IMPLEMENTATIONS["triton_stacked"] is op.triton_stacked_attention


class _Attend(torch.nn.Module):
    def __init__(self, lowering="triton"):
        super().__init__()
        self.attend = op.IMPLEMENTATIONS[lowering]

    def forward(self, q, k, v, cu_seqlens):
        return self.attend(q, k, v, cu_seqlens, 0.25)


@pytest.mark.parametrize("lowering,target", [("triton", "packed_attention"),
                                             ("triton_stacked", "packed_attention_stacked")])
def test_op_survives_export_as_one_node_with_dynamic_shapes(lowering, target):
    q, k, v, cu_seqlens = make_inputs([3, 9], 4, 2, 16, torch.float32)
    tokens = torch.export.Dim("T", min=2, max=4096)
    bounds = torch.export.Dim("B_plus_1", min=2, max=65)
    exported = torch.export.export(_Attend(lowering), (q, k, v, cu_seqlens),
                                   dynamic_shapes=({0: tokens}, {0: tokens}, {0: tokens},
                                                   {0: bounds}))
    calls = [n for n in exported.graph.nodes if n.op == "call_function"]
    assert [n.target for n in calls] == [getattr(torch.ops.boundgen, target).default]
    q2, k2, v2, cu2 = make_inputs([1, 7, 37], 4, 2, 16, torch.float32, seed=3)
    torch.testing.assert_close(exported.module()(q2, k2, v2, cu2),
                               op.reference(q2, k2, v2, cu2, 0.25), atol=0, rtol=0)


def _trace_script(launcher: str, token_axis: int) -> str:
    return one_kernel_trace_script(f"""
    from boundgen.ops import packed_attention as op
    q, k, v = torch.randn(10, 4, 16), torch.randn(10, 2, 16), torch.randn(10, 2, 16)
    cu_seqlens = torch.tensor([0, 3, 10], dtype=torch.int32)
    graph = make_fx(lambda q, k, v, cu: op.{launcher}(q, k, v, cu, 0.25), tracing_mode="symbolic")(
        q, k, v, cu_seqlens).graph
""", grid_checks=f"""
    assert all(isinstance(g, (int, torch.fx.Node)) for g in grid), grid
    grid = grid[{token_axis}:] + grid[:{token_axis}]  # the token axis first, as the checks expect
""")


@pytest.mark.parametrize("launcher,token_axis", [("launch", 0), ("launch_stacked", 1)])
def test_launcher_traces_with_symbolic_tokens(launcher, token_axis):
    """The launcher over two packed sequences, traced as Inductor does on the GPU: one kernel
    call, its grid ints and nodes, the token axis an expression of T (one_kernel_trace_script says
    why and how)."""
    assert_script_prints_ok(_trace_script(launcher, token_axis))


# ---------------------------------------------------------------------------------------------
# GPU: realistic shapes in bf16 against the reference, SDPA and FlexAttention.

def _sdpa_per_sequence(q, k, v, cu_seqlens, scale):
    import torch.nn.functional as F
    out = torch.empty_like(q)
    bounds = cu_seqlens.tolist()
    for start, end in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (t[start:end].transpose(0, 1)[None] for t in (q, k, v))  # [1, N, L, D]
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True, scale=scale, enable_gqa=True)
        out[start:end] = o[0].transpose(0, 1)
    return out


def _flex_document_causal(q, k, v, cu_seqlens, scale):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    seq = op.sequence_ids(cu_seqlens, q.shape[0])

    def mask_mod(b, h, q_idx, kv_idx):
        return (seq[q_idx] == seq[kv_idx]) & (kv_idx <= q_idx)

    num_tokens = q.shape[0]
    block_mask = create_block_mask(mask_mod, None, None, num_tokens, num_tokens, device=q.device)
    out = flex_attention(*(t.transpose(0, 1)[None] for t in (q, k, v)), block_mask=block_mask,
                         scale=scale, enable_gqa=True)
    return out[0].transpose(0, 1)


@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("heads,head_dim", [((16, 8), 128), ((14, 2), 64)], ids=["qwen3", "qwen2"])
def test_gpu_matches_reference_sdpa_flex(heads, head_dim):
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(48, 257, (15,), generator=gen).tolist() + [1, 500]
    q, k, v, cu_seqlens = make_inputs(lengths, *heads, head_dim, torch.bfloat16, "cuda")
    scale = head_dim ** -0.5
    forms = {f"pack {pack}": torch.ops.boundgen.packed_attention(q, k, v, cu_seqlens, scale, pack)
             for pack in (1, op.gqa_pack(*heads))}
    forms["stacked"] = torch.ops.boundgen.packed_attention_stacked(q, k, v, cu_seqlens, scale)
    for form, out in forms.items():
        for name, other in [("reference", op.reference), ("sdpa", _sdpa_per_sequence),
                            ("flex", _flex_document_causal)]:
            expected = other(q, k, v, cu_seqlens, scale).float()
            err = (out.float() - expected).abs().max().item()
            assert err < 2e-2, f"{form}: max abs error {err} against {name}"


def test_flash_runs_the_reference_on_cpu_and_in_fp32():
    """FlashAttention is CUDA-only and has no FP32 kernel: the lowering falls back, exactly."""
    q, k, v, cu_seqlens = make_inputs([1, 7, 37], 4, 2, 16, torch.float32)
    torch.testing.assert_close(op.flash(q, k, v, cu_seqlens, 0.25, 37), op.reference(q, k, v, cu_seqlens, 0.25),
                               atol=0, rtol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("heads,head_dim", [((16, 8), 128), ((14, 2), 64)], ids=["qwen3", "qwen2"])
def test_gpu_flash_matches_reference(heads, head_dim):
    """W1-like samples of <= 256 tokens, empty sequences, then padding as the engine adds it: a
    filler sequence longer than the bound (its rows past 256 are not written) and a tail of no
    sequence. Every row of a real sequence matches the reference; with no bound, every row."""
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(48, 257, (15,), generator=gen).tolist() + [1, 0, 256, 400]
    q, k, v, cu_seqlens = make_inputs(lengths + [0], *heads, head_dim, torch.bfloat16, "cuda")
    tail = 7
    q, k, v = (torch.cat((t, torch.randn_like(t[:tail]))) for t in (q, k, v))
    scale = head_dim ** -0.5
    expected = op.reference(q, k, v, cu_seqlens, scale).float()
    real = int(cu_seqlens[-3])  # rows before the filler sequence
    bounded = op.flash(q, k, v, cu_seqlens, scale, 256).float()
    assert (bounded[:real] - expected[:real]).abs().max().item() < 2e-2
    unbounded = op.flash(q, k, v, cu_seqlens, scale).float()
    end = int(cu_seqlens[-1])
    assert (unbounded[:end] - expected[:end]).abs().max().item() < 2e-2


@pytest.mark.parametrize("lengths", [[1], [37], [5, 1, 123, 2], [16] * 9])
@pytest.mark.parametrize("heads", [(4, 4), (14, 2)])
def test_reference_per_sequence_and_traced_match_dense(lengths, heads):
    """The eager reference (one sequence at a time) and its traced form (SDPA under a [T, T] mask)
    equal the semantics written over the whole packed batch."""
    torch.manual_seed(0)
    num_q, num_kv, d = heads[0], heads[1], 32
    t = sum(lengths)
    q, k, v = (torch.randn(t, n, d) for n in (num_q, num_kv, num_kv))
    cu = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
    dense = op.reference_dense(q, k, v, cu, 0.17)
    torch.testing.assert_close(op.reference(q, k, v, cu, 0.17), dense, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(op._reference_traced(q, k, v, cu, 0.17), dense, atol=1e-5, rtol=1e-5)


def test_reference_gives_zeros_after_the_last_sequence():
    """Tokens after the last sequence (a beam call padded for CUDA graphs) belong to none: the
    eager reference writes zeros there, never uninitialised memory, so runs are reproducible."""
    q, k, v, cu = make_inputs([5, 3], 4, 2, 16, torch.float32)
    cu_short = torch.tensor([0, 5], dtype=torch.int32)  # the last 3 tokens: padding
    out = op.reference(q, k, v, cu_short, 0.25)
    assert (out[5:] == 0).all()
    torch.testing.assert_close(out[:5], op.reference(q[:5], k[:5], v[:5], cu_short, 0.25), atol=0, rtol=0)

"""vocab_topk: the Triton kernel against the torch reference, the registered op.

The kernel runs under TRITON_INTERPRET=1 on CPU tensors (the CPU lane; slow there, so the
vocabularies are small and `block` is lowered to make rows span several blocks, `cap` to force the
refinement passes), else compiled on CUDA. The kernel ranks equal values by lower column first;
torch.topk leaves their order open, so the ids are compared with a stable sort of the same values
(`stable_reference`), and with the reference's ids only where the input has no ties. logp: FP32
within a few ulp (another summation order for the log-sum-exp).
"""

import pytest
import torch

from boundgen.bench import selection
from boundgen.ops import vocab_topk as op
from tests.ops.kernel_testing import (KERNEL_DEVICE, assert_script_prints_ok, call_targets, needs_compiled_kernel,
                                     needs_kernel)


def stable_reference(logits, bias, k):
    """The reference with ties ranked by lower column first (the kernel's order)."""
    biased = logits if bias is None else logits + bias.to(logits.dtype)
    ids = torch.sort(biased, dim=-1, descending=True, stable=True).indices[:, :k]
    logp = torch.log_softmax(logits.to(torch.float32), dim=-1)
    return (logp if bias is None else logp + bias).gather(-1, ids), ids


def make_input(rows, vocab, dtype, device="cpu", seed=0, barred=(), ties=False):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randint(-4, 5, (rows, vocab), generator=gen).float() if ties else \
        torch.randn(rows, vocab, generator=gen) * 4
    bias = torch.zeros(vocab)
    bias[list(barred)] = float("-inf")
    return logits.to(device=device, dtype=dtype), bias.to(device)


def assert_matches(logits, bias, k, **launch_args):
    logp, ids = op.launch(logits, bias, k, **launch_args)
    want_logp, want_ids = stable_reference(logits, bias, k)
    assert ids.dtype == torch.int64 and logp.dtype == torch.float32 and ids.shape == (logits.shape[0], k)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=2e-5)
    return logp, ids


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows,vocab,k,block,cap", [
    (3, 1237, 10, 256, None),  # odd V over several blocks
    (7, 1000, 200, 256, None),  # K near the block size, 7 rows
    (1, 40, 40, None, None),  # K = V: barred tokens last with -inf
    (3, 100, 1, None, None),  # K = 1
    (1, 1000, 300, 128, None),  # K > block: no lane bound, every key survives
    (3, 1237, 32, 256, 32),  # cap = K: more keys than cap above the lane bound: radix select, refined
], ids=["odd-v", "k200-7rows", "k-is-v", "k1", "k-over-block", "refine"])
def test_kernel_matches_reference(dtype, rows, vocab, k, block, cap):
    logits, bias = make_input(rows, vocab, dtype, KERNEL_DEVICE, barred=(0, vocab // 2, vocab - 1))
    assert_matches(logits, bias, k, block=block, cap=cap)


@needs_kernel
def test_kernel_without_bias():
    """No bias (nothing barred): the plain top K of the logits and their log-probs."""
    logits, _ = make_input(3, 300, torch.bfloat16, KERNEL_DEVICE)
    assert_matches(logits, None, 10, block=64)


@needs_kernel
@pytest.mark.parametrize("cap", [None, 64], ids=["fits", "tie-overflows-cap"])
def test_ties_rank_the_lower_column_first(cap):
    """Logits of nine distinct values: every rank is a tie; the order is the stable sort's. With
    cap 64 the keys above the lane bound overflow, and in the radix select the threshold value (~33
    copies) does not fit beside the ~33 above it: refined down to that one value, its lowest columns."""
    logits, bias = make_input(2, 300, torch.bfloat16, KERNEL_DEVICE, ties=True)
    logp, ids = assert_matches(logits, bias, 50, block=64, cap=cap)
    _, ref_ids = op.reference(logits, bias, 50)
    assert torch.equal(logits.gather(1, ids), logits.gather(1, ref_ids))  # the same values as torch.topk's


@needs_kernel
def test_negative_and_signed_zero_logits():
    """All logits <= 0 (cap 64 forces the radix select, whose first bin then holds the whole row:
    refined from the full negative key range), with -0.0 and +0.0 ranking as equal values."""
    logits = -(torch.randn(2, 517, generator=torch.Generator().manual_seed(5)).abs() * 3)
    logits[:, 100:140] = 0.0
    logits[:, 120:130] = -0.0
    assert_matches(logits.to(KERNEL_DEVICE), None, 60, block=128, cap=64)


@needs_kernel
def test_a_row_of_one_value_and_a_row_with_its_top_in_one_lane():
    """Row 0 constant (as a padding row may be): every key passes the lane bound, the range is one
    value, its lowest columns win, without refinement. Row 1: the 40 largest values all in lane 0
    (columns = 0 mod 64): the lane bound lets 114 keys through, more than cap, so the radix select
    narrows [t0, max] before collecting."""
    logits = torch.randn(2, 2560, generator=torch.Generator().manual_seed(7))
    logits[0] = 0.5
    logits[1, ::64] = 10 + torch.arange(40.0)
    assert_matches(logits.to(KERNEL_DEVICE, torch.bfloat16), None, 40, block=64, cap=64)


@needs_kernel
def test_barred_tokens_come_last_with_minus_inf():
    """A bias of -inf (min_new_tokens) bars a token from the top K unless fewer than K others exist."""
    logits, bias = make_input(1, 64, torch.float32, KERNEL_DEVICE, barred=range(0, 64, 2))
    logp, ids = assert_matches(logits, bias, 40)
    assert bool((ids[0, :32] % 2 == 1).all()) and bool(torch.isinf(logp[0, 32:]).all())


def test_reference_is_topk_then_log_softmax():
    """No ties: the reference's ids are torch.topk's, its values the full log-softmax's."""
    logits, bias = make_input(3, 1000, torch.float32, barred=(7,))
    logp, ids = op.reference(logits, bias, 25)
    assert torch.equal(ids, torch.topk(logits + bias, 25).indices)
    torch.testing.assert_close(logp, torch.log_softmax(logits, -1).gather(1, ids), rtol=0, atol=0)
    plain_logp, plain_ids = op.reference(logits, None, 25)  # no bias: token 7 may rank
    assert torch.equal(plain_ids, torch.topk(logits, 25).indices)
    torch.testing.assert_close(plain_logp, torch.log_softmax(logits, -1).gather(1, plain_ids), rtol=0, atol=0)


def test_launcher_rejects_bad_inputs():
    logits, bias = make_input(2, 50, torch.float32)
    with pytest.raises(ValueError, match=r"expected logits \[M, V\]"):
        op.launch(logits[0], bias, 3)
    with pytest.raises(ValueError, match="bfloat16, float16 or float32"):
        op.launch(logits.double(), bias, 3)
    with pytest.raises(ValueError, match="bias must be contiguous FP32"):
        op.launch(logits, bias[:10], 3)
    with pytest.raises(ValueError, match="bias must be contiguous FP32"):
        op.launch(logits, bias.half(), 3)
    with pytest.raises(ValueError, match=r"k must be in 1..V=50"):
        op.launch(logits, bias, 51)
    with pytest.raises(ValueError, match="cap must be powers of two, cap >= k=3"):
        op.launch(logits, bias, 3, cap=2)
    with pytest.raises(ValueError, match="block and cap must be powers of two"):
        op.launch(logits, bias, 3, block=100)


def test_default_cap_leaves_k_slots_for_the_threshold_bin():
    assert op.default_cap(200) == 512 and op.default_cap(300) == 1024 and op.default_cap(800) == 2048
    assert op.default_cap(1) == 16


def test_reference_lse_has_the_reference_ids_and_log_probs():
    """The cheap torch lowering: no [M, V] log-softmax, the same ids, logp within FP32 rounding."""
    for dtype in (torch.float32, torch.bfloat16):
        logits, bias = make_input(3, 1000, dtype, barred=(7, 500))
        for b in (bias, None):
            logp, ids = op.reference_lse(logits, b, 40)
            want_logp, want_ids = op.reference(logits, b, 40)
            assert torch.equal(ids, want_ids)
            torch.testing.assert_close(logp, want_logp, rtol=0, atol=2e-6)


def test_registered_op_runs_reference_on_cpu():
    logits, bias = make_input(4, 300, torch.float32, barred=(3,))
    for b in (bias, None):
        got = torch.ops.boundgen.vocab_topk(logits, b, 17)
        want = op.reference(logits, b, 17)
        assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])
    assert op.IMPLEMENTATIONS["triton"] is op.vocab_topk


class _Expand(torch.nn.Module):
    def forward(self, logits, bias):
        return op.IMPLEMENTATIONS["triton"](logits, bias, 5)


def test_op_survives_export_as_one_node_with_dynamic_rows():
    rows = torch.export.Dim("M", min=2, max=4096)
    logits, bias = make_input(9, 64, torch.float32)
    exported = torch.export.export(_Expand(), (logits, bias), dynamic_shapes=({0: rows}, None))
    calls = call_targets(exported)
    assert torch.ops.boundgen.vocab_topk.default in calls
    logits2, _ = make_input(37, 64, torch.float32, seed=3)
    got, want = exported.module()(logits2, bias), op.reference(logits2, bias, 5)
    assert torch.equal(got[1], want[1]) and torch.equal(got[0], want[0])


_COMPILE_SCRIPT = """
import torch
from boundgen.bench import kernels
from boundgen.ops import vocab_topk as op
torch.manual_seed(0)
logits = (torch.randn(300, 1000, device="cuda") * 4).to(torch.bfloat16)
bias = torch.zeros(1000, device="cuda")
fn = torch.compile(lambda x, b: torch.ops.boundgen.vocab_topk(x, b, 200), dynamic=True)
logp, ids = fn(logits, bias)
want = torch.sort(logits, dim=-1, descending=True, stable=True).indices[:, :200]
assert torch.equal(ids, want), "ids differ"
print("ok")
"""


@pytest.mark.gpu
@needs_compiled_kernel
def test_op_compiles_under_inductor():
    """Inductor lowers the op's kernel launch (as AOTInductor does in a build)."""
    assert_script_prints_ok(_COMPILE_SCRIPT)


# ---------------------------------------------------------------------------------------------
# GPU: Qwen's vocabulary in bf16, beam shapes (100 beams a request; 1, 8 and 16 requests a call).

def lm_head_logits(rows, vocab, device, seed=0):
    """bf16 logits shaped like an LM head's rather than N(0, 1) (bench/selection.py: uneven token
    norms, a Zipf-like prior, peaked rows). Ties are common at bf16's resolution (ulp 1/16 at 8-16)."""
    return selection.lm_head_logits(rows, vocab, device=device, seed=seed)[2]


QWEN_CASES = pytest.mark.parametrize("rows,k", [(r, k) for k in (200, 400, 800) for r in (100, 800, 1600)])


def qwen_beam_case(rows, k):
    """(logits, bias) of a beam step over Qwen's vocabulary on the GPU: LM-head-like bf16 logits
    [rows, 151,936], and the bias that bars the two stop tokens (None at K 400: the path without)."""
    logits = lm_head_logits(rows, 151936, "cuda", seed=rows + k)
    if k == 400:
        return logits, None
    bias = torch.zeros(151936, device="cuda")
    bias[[151643, 151645]] = float("-inf")
    return logits, bias


def assert_lowering_exports(lowering, ops):
    """vocab_topk lowered to `lowering` exports with dynamic rows as graph calls of the registered
    `ops`, and the exported program gives a stable sort's top 5 on other rows."""
    class Select(torch.nn.Module):
        def forward(self, logits, bias):
            return op.IMPLEMENTATIONS[lowering](logits, bias, 5)

    logits, bias = make_input(9, 640, torch.float32, barred=(3,))
    exported = torch.export.export(Select(), (logits, bias),
                                   dynamic_shapes=({0: torch.export.Dim("M", min=2, max=4096)}, None))
    calls = call_targets(exported)
    assert all(calls.count(o) == 1 for o in ops), calls
    logits2, _ = make_input(37, 640, torch.float32, seed=3)
    got, want = exported.module()(logits2, bias), stable_reference(logits2, bias, 5)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=2e-5)


@pytest.mark.gpu
@needs_compiled_kernel
@QWEN_CASES
def test_gpu_bf16_qwen_vocabulary(rows, k):
    assert_matches(*qwen_beam_case(rows, k), k)


@pytest.mark.gpu
@needs_compiled_kernel
def test_gpu_gaussian_and_fp32_logits():
    """N(0, 4) bf16 logits, and FP32 logits (all 32 key bits: refinement down to single values)."""
    logits, bias = make_input(300, 151936, torch.bfloat16, "cuda", barred=(151643, 151645))
    assert_matches(logits, bias, 200)
    assert_matches(lm_head_logits(64, 151936, "cuda").float() + torch.randn(64, 151936, device="cuda") * 1e-3,
                   None, 300)

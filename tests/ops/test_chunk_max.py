"""chunk_max (the Triton kernel under the interpreter on CPU, compiled on CUDA) against its torch
reference, and the "chunks" lowering of vocab_topk that ranks only the top K chunks' values.

The selected values must equal a stable sort's, best first, each id carrying its own value; where
the input has no ties (barred tokens, all -inf, aside) the ids must be the reference's too: with
equal values torch.topk may pick either. logp: within a few FP32 ulp of the reference's."""

import pytest
import torch

from boundgen.ops import chunk_max as op
from boundgen.ops import vocab_topk
from tests.ops.kernel_testing import KERNEL_DEVICE, needs_compiled_kernel, needs_kernel
from tests.ops.test_vocab_topk import (QWEN_CASES, assert_lowering_exports, lm_head_logits, make_input,
                                      qwen_beam_case, stable_reference)


def assert_maxima_match(logits, bias, chunk, **launch_args):
    maxima, lse = op.launch(logits, bias, chunk, **launch_args)
    want_maxima, want_lse = op.reference(logits, bias, chunk)
    assert maxima.dtype == logits.dtype and maxima.shape == want_maxima.shape
    assert torch.equal(maxima, want_maxima)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-5)


def assert_selection_matches(logits, bias, k, ties=False, maxima_and_lse=None):
    chunk = vocab_topk.chunk_size(logits.shape[1], k)
    if maxima_and_lse is None:
        logp, ids = vocab_topk.chunked(logits, bias, k)
    else:
        logp, ids = vocab_topk.select_from_chunks(logits, bias, k, *maxima_and_lse(chunk), chunk)
    want_logp, want_ids = stable_reference(logits, bias, k)
    assert ids.dtype == torch.int64 and logp.dtype == torch.float32 and ids.shape == (logits.shape[0], k)
    assert all(len(set(row)) == k for row in ids.tolist()), "an id twice in a row"
    ranked = op.biased(logits, bias)  # the same values best first, each id carrying its own value
    assert torch.equal(ranked.gather(1, ids), ranked.gather(1, want_ids))
    if not ties:  # and the same ids, barred tokens (all -inf: tied) aside
        finite = ranked.gather(1, want_ids).isfinite()
        assert torch.equal(ids[finite], want_ids[finite])
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=2e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows,vocab,chunk,tile,segment", [
    (3, 1248, 32, 128, 256),  # five segments, the last one partial
    (2, 1000, 8, 64, 64),  # one tile a segment
    (1, 40, 1, 64, 64),  # chunk 1: every value its own chunk
    (4, 320, 64, 64, 512),  # one segment longer than the row
], ids=["segments", "tile-is-segment", "chunk1", "one-segment"])
@needs_kernel
def test_kernel_matches_reference(dtype, rows, vocab, chunk, tile, segment):
    logits, bias = make_input(rows, vocab, dtype, KERNEL_DEVICE, barred=(0, vocab // 2, vocab - 1))
    for b in (bias, None):
        assert_maxima_match(logits, b, chunk, tile=tile, segment=segment)


@needs_kernel
def test_kernel_with_ties_and_signed_zeros():
    logits, bias = make_input(3, 768, torch.float32, KERNEL_DEVICE, ties=True)
    logits[0, ::3] = -0.0
    logits[1] = 0.0
    assert_maxima_match(logits, bias, 16, tile=64, segment=128)


@pytest.mark.parametrize("rows,vocab,k,ties", [
    (3, 1237, 10, False),  # odd V: chunk 1
    (7, 1024, 200, False), (1, 40, 40, False), (3, 96, 1, False),
    (4, 1248, 50, True),  # many equal values across chunks
    (2, 2048, 700, True),  # k past V / 32 chunks: the chunk narrows to keep k chunks
], ids=["odd-v", "k200", "k-is-v", "k1", "ties", "narrow-chunk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_chunks_lowering_matches_the_reference(rows, vocab, k, ties, dtype):
    """The registered op on CPU is the reference: this checks the selection built on it. (N(0, 4) in
    bf16 has ties too: 8 bits of mantissa.)"""
    logits, bias = make_input(rows, vocab, dtype, barred=(0, vocab // 2, vocab - 1), ties=ties)
    for b in (bias, None):
        assert_selection_matches(logits, b, k, ties=ties or dtype == torch.bfloat16)


@needs_kernel
@pytest.mark.parametrize("k", [1, 64, 300])
def test_chunks_lowering_on_the_kernel(k):
    logits, bias = make_input(5, 2560, torch.bfloat16, KERNEL_DEVICE, barred=(7, 2559), ties=k == 64)
    assert_selection_matches(logits, bias, k, ties=True,  # bf16
                             maxima_and_lse=lambda chunk: op.launch(logits, bias, chunk, tile=256, segment=512))


def test_a_row_whose_top_k_sits_in_one_chunk():
    logits = torch.zeros(2, 640)
    logits[0, 64:96] = torch.arange(32, 0, -1).float()  # the whole top 32 in chunk 2
    logits[1, 5] = 2.0
    logits[1, 600] = 1.0
    assert_selection_matches(logits, None, 32, ties=True)  # row 1: zeros after its two
    assert vocab_topk.chunked(logits, None, 2)[1][1].tolist() == [5, 600]


def test_chunk_size_divides_v_into_k_chunks():
    assert vocab_topk.chunk_size(151936, 200) == 32
    assert vocab_topk.chunk_size(151936, 800) == 32
    assert vocab_topk.chunk_size(1000, 100) == 8
    assert vocab_topk.chunk_size(40, 40) == 1
    assert vocab_topk.chunk_size(1237, 10) == 1  # odd V


def test_launcher_rejects_bad_inputs():
    logits = torch.zeros(2, 96)
    with pytest.raises(ValueError, match="power of two dividing V=96"):
        op.launch(logits, None, 24)
    with pytest.raises(ValueError, match="power of two dividing V=96"):
        op.launch(logits, None, 64)
    with pytest.raises(ValueError, match="contiguous rows"):
        op.launch(logits.T, None, 8)
    with pytest.raises(ValueError, match="bias must be contiguous FP32"):
        op.launch(logits, torch.zeros(95), 8)
    with pytest.raises(ValueError, match="multiple of it"):
        op.launch(logits, None, 8, tile=64, segment=96)


def test_lowering_exports_with_dynamic_rows_and_one_chunk_max_node():
    assert_lowering_exports("chunks", [torch.ops.boundgen.chunk_max.default])


# ---------------------------------------------------------------------------------------------
# GPU: Qwen's vocabulary in bf16, beam shapes (100 beams a request; 1, 8 and 16 requests a call).
# LM-head-like bf16 logits have ties (ulp 1/16 at 8-16): values are compared, not ids.

@pytest.mark.gpu
@needs_compiled_kernel
@QWEN_CASES
def test_gpu_bf16_qwen_vocabulary(rows, k):
    logits, bias = qwen_beam_case(rows, k)
    assert_maxima_match(logits, bias, 32)
    assert_selection_matches(logits, bias, k, ties=True)


@pytest.mark.gpu
@needs_compiled_kernel
def test_gpu_fp32_logits_without_ties():
    logits = lm_head_logits(64, 151936, "cuda").float() + torch.randn(64, 151936, device="cuda") * 1e-3
    assert_selection_matches(logits, None, 300)


_COMPILE_SCRIPT = """
import torch
from boundgen.ops import vocab_topk
torch.manual_seed(0)
logits = (torch.randn(300, 4096, device="cuda") * 4).to(torch.bfloat16)
bias = torch.zeros(4096, device="cuda")
fn = torch.compile(lambda x, b: vocab_topk.chunked(x, b, 200), dynamic=True, mode="max-autotune-no-cudagraphs")
logp, ids = fn(logits, bias)
want = torch.topk(logits, 200, dim=-1).values
assert torch.equal(logits.gather(1, ids), want), "values differ"
print("ok")
"""


@pytest.mark.gpu
@needs_compiled_kernel
def test_lowering_compiles_under_inductor():
    """Inductor compiles the lowering, autotuning its kernels on made-up data (where a gather's
    indices must still be in bounds: the first build on the H200 stopped on a device assert)."""
    from tests.ops.kernel_testing import assert_script_prints_ok
    assert_script_prints_ok(_COMPILE_SCRIPT)

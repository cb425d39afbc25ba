"""chunk_select (the Triton kernel under the interpreter on CPU, compiled on CUDA) and its torch
reference against a stable sort of the whole row: the same ids in the same order, ties included
(equal values: the lower column first); logp within a few FP32 ulp of the reference lowering's."""

import pytest
import torch

from boundgen.ops import chunk_max, chunk_select, vocab_topk
from tests.ops.kernel_testing import KERNEL_DEVICE, needs_compiled_kernel, needs_kernel
from tests.ops.test_vocab_topk import QWEN_CASES, assert_lowering_exports, make_input, qwen_beam_case, stable_reference


def assert_exact(logits, bias, k, select=chunk_select.launch):
    chunk = vocab_topk.select_chunk_size(logits.shape[1], k)
    maxima, lse = chunk_max.reference(logits, bias, chunk)
    logp, ids = select(logits, bias, maxima, lse, k, chunk)
    want_logp, want_ids = stable_reference(logits, bias, k)
    assert ids.dtype == torch.int64 and logp.dtype == torch.float32 and ids.shape == (logits.shape[0], k)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=2e-5)


CASES = [(3, 1248, 10, False), (7, 1024, 200, False), (1, 40, 40, False), (3, 96, 1, False),
         (4, 1248, 50, True),  # many equal values across chunks
         (2, 2048, 300, True)]  # k x chunk past a program's block: the chunk narrows
IDS = ["k10", "k200", "k-is-v", "k1", "ties", "narrow-chunk"]


@needs_kernel
@pytest.mark.parametrize("rows,vocab,k,ties", CASES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_kernel_is_a_stable_top_k(rows, vocab, k, ties, dtype):
    logits, bias = make_input(rows, vocab, dtype, KERNEL_DEVICE, barred=(0, vocab // 2, vocab - 1), ties=ties)
    for b in (bias, None):
        assert_exact(logits, b, k)


@pytest.mark.parametrize("rows,vocab,k,ties", CASES, ids=IDS)
def test_reference_is_a_stable_top_k(rows, vocab, k, ties):
    logits, bias = make_input(rows, vocab, torch.bfloat16, barred=(0, vocab - 1), ties=ties)
    assert_exact(logits, bias, k, select=chunk_select.reference)


def test_a_row_whose_top_k_sits_in_one_chunk_and_equal_maxima():
    logits = torch.zeros(2, 640)
    logits[0, 64:96] = torch.arange(32, 0, -1).float()
    logits[1, 600] = logits[1, 5] = 1.0  # equal maxima in chunks 18 and 0: column 5 first
    assert_exact(logits, None, 32, select=chunk_select.reference)
    assert vocab_topk.chunked_select(logits, None, 2)[1][1].tolist() == [5, 600]


def test_launcher_rejects_bad_inputs():
    logits, bias = make_input(2, 256, torch.float32)
    maxima, lse = chunk_max.reference(logits, bias, 8)
    with pytest.raises(ValueError, match="dividing"):
        chunk_select.launch(logits, bias, maxima, lse, 4, 24)
    with pytest.raises(ValueError, match="maxima must be"):
        chunk_select.launch(logits, bias, maxima[:, :-1], lse, 4, 8)
    with pytest.raises(ValueError, match="lse must be FP32"):
        chunk_select.launch(logits, bias, maxima, lse.double(), 4, 8)
    with pytest.raises(ValueError, match="k=33"):
        chunk_select.launch(logits, bias, maxima, lse, 33, 8)


def test_chunk_width_keeps_k_chunks_in_one_block():
    assert chunk_select.chunk_width(151936, 200, 32) == 32
    assert chunk_select.chunk_width(151936, 800, 32) == 16
    assert chunk_select.chunk_width(2048, 300, 4) == 4


def test_lowering_exports_with_dynamic_rows_as_two_ops():
    assert_lowering_exports("chunks-triton", [torch.ops.boundgen.chunk_max.default,
                                              torch.ops.boundgen.chunk_select.default])


# ---------------------------------------------------------------------------------------------
# GPU: Qwen's vocabulary in bf16 (ties common), beam shapes.

@pytest.mark.gpu
@needs_compiled_kernel
@QWEN_CASES
def test_gpu_bf16_qwen_vocabulary(rows, k):
    logits, bias = qwen_beam_case(rows, k)
    chunk = vocab_topk.select_chunk_size(151936, k)
    logp, ids = chunk_select.launch(logits, bias, *chunk_max.launch(logits, bias, chunk), k, chunk)
    want_logp, want_ids = stable_reference(logits, bias, k)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=2e-5)

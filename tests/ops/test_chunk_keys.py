"""chunk_keys (the Triton kernel under the interpreter on CPU, compiled on CUDA) against its torch
reference, and the "chunks" lowering of vocab_topk that ranks only the top K chunks' values.

The lowering's ids must equal a stable descending sort of logits + bias (equal values: the lower
column first), ties included; logp within a few FP32 ulp of the reference's log-softmax."""

import pytest
import torch

from boundgen.ops import chunk_keys as op
from boundgen.ops import vocab_topk
from tests.ops.kernel_testing import KERNEL_DEVICE, needs_compiled_kernel, needs_kernel
from tests.ops.test_vocab_topk import lm_head_logits, make_input, stable_reference


def assert_keys_match(logits, bias, chunk, **launch_args):
    keys, lse = op.launch(logits, bias, chunk, **launch_args)
    want_keys, want_lse = op.reference(logits, bias, chunk)
    assert keys.dtype == torch.int64 and keys.shape == want_keys.shape
    assert torch.equal(keys, want_keys)
    torch.testing.assert_close(lse, want_lse, rtol=0, atol=1e-5)


def assert_selection_matches(logits, bias, k, keys_and_lse=None):
    chunk = vocab_topk.chunk_size(logits.shape[1], k)
    if keys_and_lse is None:
        logp, ids = vocab_topk.chunked(logits, bias, k)
    else:
        logp, ids = vocab_topk.select_from_chunks(logits, bias, k, *keys_and_lse(chunk), chunk)
    want_logp, want_ids = stable_reference(logits, bias, k)
    assert ids.dtype == torch.int64 and logp.dtype == torch.float32 and ids.shape == (logits.shape[0], k)
    assert torch.equal(ids, want_ids)
    torch.testing.assert_close(logp, want_logp, rtol=0, atol=2e-5)


def test_sort_keys_order_values_then_columns():
    values = torch.tensor([1.5, -0.0, 0.0, -2.0, float("-inf"), 1.5, 3.0e38, -3.0e38])
    cols = torch.arange(values.numel())
    keys = op.sort_keys(values, cols)
    order = torch.argsort(keys, descending=True)
    assert order.tolist() == [6, 0, 5, 1, 2, 3, 7, 4]  # equal values (1.5; -0.0 and 0.0): lower column first
    assert torch.equal(op.key_columns(keys), cols)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows,vocab,chunk,tile,segment", [
    (3, 1237, 32, 128, 256),  # odd V: a partial last chunk, five segments
    (2, 1000, 8, 64, 64),  # one tile a segment
    (1, 40, 1, 64, 64),  # chunk 1: every value its own chunk
    (4, 300, 64, 64, 512),  # one segment longer than the row
], ids=["odd-v", "tile-is-segment", "chunk1", "one-segment"])
@needs_kernel
def test_kernel_matches_reference(dtype, rows, vocab, chunk, tile, segment):
    logits, bias = make_input(rows, vocab, dtype, KERNEL_DEVICE, barred=(0, vocab // 2, vocab - 1))
    for b in (bias, None):
        assert_keys_match(logits, b, chunk, tile=tile, segment=segment)


@needs_kernel
def test_kernel_with_ties_and_signed_zeros():
    logits, bias = make_input(3, 777, torch.float32, KERNEL_DEVICE, ties=True)
    logits[0, ::3] = -0.0
    logits[1] = 0.0
    assert_keys_match(logits, bias, 16, tile=64, segment=128)


@pytest.mark.parametrize("rows,vocab,k,ties", [
    (3, 1237, 10, False), (7, 1000, 200, False), (1, 40, 40, False), (3, 100, 1, False),
    (4, 1237, 50, True),  # many equal values across chunks: ids by lower column
    (2, 2000, 700, True),  # k past V / 32 chunks: the chunk narrows to keep k chunks
], ids=["odd-v", "k200", "k-is-v", "k1", "ties", "narrow-chunk"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_chunks_lowering_matches_stable_reference(rows, vocab, k, ties, dtype):
    """The registered op on CPU is the reference: this checks the selection built on it."""
    logits, bias = make_input(rows, vocab, dtype, barred=(0, vocab // 2, vocab - 1), ties=ties)
    for b in (bias, None):
        assert_selection_matches(logits, b, k)


@needs_kernel
@pytest.mark.parametrize("k", [1, 64, 300])
def test_chunks_lowering_on_the_kernel(k):
    logits, bias = make_input(5, 2500, torch.bfloat16, KERNEL_DEVICE, barred=(7, 2499), ties=k == 64)
    assert_selection_matches(logits, bias, k, lambda chunk: op.launch(logits, bias, chunk, tile=256, segment=512))


def test_a_row_whose_top_k_sits_in_one_chunk():
    """The top K all in one chunk, and K-th place decided by a tie across chunks."""
    logits = torch.zeros(2, 640)
    logits[0, 64:96] = torch.arange(32, 0, -1).float()  # the whole top 32 in chunk 2
    logits[1, 5] = logits[1, 600] = 1.0  # equal maxima in chunks 0 and 18: column 5 first
    assert_selection_matches(logits, None, 32)
    assert vocab_topk.chunked(logits, None, 2)[1][1].tolist() == [5, 600]


def test_chunk_size_keeps_k_chunks():
    assert vocab_topk.chunk_size(151936, 200) == 32
    assert vocab_topk.chunk_size(151936, 800) == 32
    assert vocab_topk.chunk_size(1000, 100) == 8
    assert vocab_topk.chunk_size(40, 40) == 1


def test_launcher_rejects_bad_inputs():
    logits = torch.zeros(2, 100)
    with pytest.raises(ValueError, match="power of two"):
        op.launch(logits, None, 24)
    with pytest.raises(ValueError, match="contiguous rows"):
        op.launch(logits.T, None, 8)
    with pytest.raises(ValueError, match="bias must be contiguous FP32"):
        op.launch(logits, torch.zeros(99), 8)
    with pytest.raises(ValueError, match="multiple of it"):
        op.launch(logits, None, 8, tile=64, segment=96)


class _Select(torch.nn.Module):
    def forward(self, logits, bias):
        return vocab_topk.IMPLEMENTATIONS["chunks"](logits, bias, 5)


def test_lowering_exports_with_dynamic_rows_and_one_chunk_keys_node():
    rows = torch.export.Dim("M", min=2, max=4096)
    logits, bias = make_input(9, 640, torch.float32, barred=(3,))
    exported = torch.export.export(_Select(), (logits, bias), dynamic_shapes=({0: rows}, None))
    calls = [n.target for n in exported.graph.nodes if n.op == "call_function"]
    assert calls.count(torch.ops.boundgen.chunk_keys.default) == 1
    logits2, _ = make_input(37, 640, torch.float32, seed=3)
    got, want = exported.module()(logits2, bias), stable_reference(logits2, bias, 5)
    assert torch.equal(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=2e-5)


# ---------------------------------------------------------------------------------------------
# GPU: Qwen's vocabulary in bf16, beam shapes (100 beams a request; 1, 8 and 16 requests a call).

@pytest.mark.gpu
@needs_compiled_kernel
@pytest.mark.parametrize("k", [200, 400, 800])
@pytest.mark.parametrize("rows", [100, 800, 1600])
def test_gpu_bf16_qwen_vocabulary(rows, k):
    logits = lm_head_logits(rows, 151936, "cuda", seed=rows + k)
    bias = torch.zeros(151936, device="cuda")
    bias[[151643, 151645]] = float("-inf")
    assert_keys_match(logits, bias, 32)
    assert_selection_matches(logits, bias if k != 400 else None, k)


@pytest.mark.gpu
@needs_compiled_kernel
def test_gpu_gaussian_and_fp32_logits():
    logits, bias = make_input(300, 151936, torch.bfloat16, "cuda", barred=(151643, 151645))
    assert_selection_matches(logits, bias, 200)
    assert_selection_matches(lm_head_logits(64, 151936, "cuda").float()
                             + torch.randn(64, 151936, device="cuda") * 1e-3, None, 300)

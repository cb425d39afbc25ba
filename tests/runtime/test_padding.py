"""Bucketed padding for CUDA graphs never changes real samples' scores or beams (checked on CPU)."""

import dataclasses

import numpy as np
import torch

from boundgen.model.loader import load_model
from boundgen.ops import packed_attention, prefix_attention
from boundgen.ops.lowering import REFERENCE
from boundgen.programs.beam import BeamProgram
from boundgen.programs.factory import make_program
from boundgen.programs.score import ScoreProgram
from boundgen.artifact.program import BeamSpec
from boundgen.programs.eager import EagerRunner
from boundgen.runtime.context import RequestContext
from boundgen.runtime.engine import EngineSpec
from boundgen.runtime.graphs import bucket_size, pad_batch
from boundgen.runtime.local_engine import LocalEngine
from boundgen.runtime.requests import BeamResultBuilder, RequestPacker
from boundgen.text.tokenizer import Tokenizer
from tests.hf_reference import make_hf_model, save
from tests.model.test_parity import packed
from tests.ops.kernel_testing import KERNEL_DEVICE, needs_kernel


def test_bucket_size():
    assert bucket_size(1, 256, 4096) == 256
    assert bucket_size(256, 256, 4096) == 256
    assert bucket_size(257, 256, 4096) == 512
    assert bucket_size(4000, 256, 4000) == 4000


def test_filler_sequence_leaves_scores_unchanged(tmp_path):
    model = load_model(save(make_hf_model("qwen3", seed=4), tmp_path))
    program = ScoreProgram(model, [3, 9])
    seqs = [torch.randint(0, 512, (n,)) for n in (5, 1, 30)]
    tokens, positions, cu = packed(seqs)
    with torch.no_grad():
        ref = program(tokens, positions, cu)  # probs, lse, label_logits
        for padded_tokens in (36, 40, 64):
            out = program(*pad_batch(tokens, positions, cu, padded_tokens, padded_samples=6))
            assert [tuple(o.shape) for o in out] == [(6, 2), (6,), (6, 2)]
            for got, want in zip(out, ref):
                torch.testing.assert_close(got[:3], want, rtol=1e-5, atol=1e-5)


def test_tail_tokens_leave_beams_unchanged(tiny_qwen2_dir):
    """A beam call padded with tokens after the last prompt, of no request (what CUDA-graph
    padding does): the requests' candidates equal the unpadded call's (scores to rounding: GEMMs
    of other heights). The tail adds no request, so no beams."""
    program = BeamProgram(load_model(tiny_qwen2_dir), 4, 3, stop_token_ids=[5])
    seqs = [torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)) for n in (7, 1)]
    tokens, positions, cu = packed(seqs)
    with torch.no_grad():
        ref = program(tokens, positions, cu)
        for padded_tokens in (9, 16, 32):
            out = program(*pad_batch(tokens, positions, cu, padded_tokens, padded_samples=2))
            assert out[0].shape == (8, 3)
            token_ids, scores, finished, beam_indices = out
            assert torch.equal(token_ids, ref[0]) and torch.equal(finished, ref[2])
            assert torch.equal(beam_indices, ref[3])
            torch.testing.assert_close(scores, ref[1], rtol=0, atol=1e-5)


def test_beam_packer_pads_to_bounded_shapes(tiny_qwen2_dir):
    """Every shape a padded beam call can take is among the warm-up batches (captured at load):
    tokens to the bucket, requests as they are, up to max_requests."""
    spec = BeamSpec(width=4, steps=3, max_prompt_tokens=20, max_requests=4)
    node = RequestPacker(Tokenizer.from_dir(tiny_qwen2_dir), spec, token_bucket=16)
    warm = {(int(t.shape[0]), int(cu.shape[0]) - 1) for t, _, cu in node.warm_batches()}
    assert warm == {(16, 1), (32, 1), (16, 2), (32, 2), (48, 2), (16, 3), (32, 3), (48, 3), (64, 3),
                    (16, 4), (32, 4), (48, 4), (64, 4), (80, 4)}
    for t, p, cu in node.warm_batches():  # valid packed batches: one-token prompts, then the tail
        assert int(cu[-1]) <= t.shape[0] and bool((cu[1:] > cu[:-1]).all())
    for real_tokens, real_requests in ((1, 1), (20, 1), (3, 2), (41, 3), (60, 3), (10, 4), (80, 4)):
        shape = node.padded_shape(real_tokens, real_requests)
        assert shape in warm and shape[0] >= real_tokens and shape[1] == real_requests


def test_padded_single_beam_engine_equals_unpadded(tiny_qwen2_dir):
    """The engine with beam padding on (as with CUDA graphs) returns the same candidates."""
    spec = BeamSpec(width=4, steps=3, max_prompt_tokens=20, max_requests=4)
    tokenizer = Tokenizer.from_dir(tiny_qwen2_dir)
    runner = EagerRunner(make_program(load_model(tiny_qwen2_dir), spec))

    def engine(bucket: int) -> LocalEngine:
        ctx = RequestContext(spec.call_max_tokens, spec.call_max_samples, torch.device("cpu"))
        return LocalEngine(EngineSpec("padding", spec), RequestPacker(tokenizer, spec, bucket), runner,
                           BeamResultBuilder(tokenizer, spec.stop_token_ids, spec.width), [ctx])

    plain, padded = engine(0), engine(16)
    try:
        for text in ("generative retrieval: shoes", "x"):
            want, got = plain.beam(text), padded.beam(text)
            assert got.token_ids.tolist() == want.token_ids.tolist() and got.texts == want.texts
            np.testing.assert_allclose(got.scores, want.scores, rtol=0, atol=1e-5)
    finally:
        plain.close()
        padded.close()


@needs_kernel
def test_tail_tokens_with_the_kernels(tiny_qwen2_dir):
    """The same with the attention kernels themselves (the interpreter on CPU; compiled on CUDA):
    they leave tail rows unwritten (whatever the buffer held) and never read them for a real row.
    (The tail never reaches the vocabulary top-K: only beams' rows are ranked.)"""
    ops = dataclasses.replace(REFERENCE.resolve(), packed_attention=packed_attention.triton_attention,
                              prefix_attention=prefix_attention.launch)
    program = BeamProgram(load_model(tiny_qwen2_dir, device=KERNEL_DEVICE, ops=ops), 4, 3, stop_token_ids=[5])
    reference = BeamProgram(load_model(tiny_qwen2_dir, device=KERNEL_DEVICE), 4, 3, stop_token_ids=[5])
    seqs = [torch.randint(0, 512, (n,), generator=torch.Generator().manual_seed(n)) for n in (7, 1)]
    tokens, positions, cu = packed(seqs)
    padded = [t.to(KERNEL_DEVICE) for t in pad_batch(tokens, positions, cu, 24, padded_samples=2)]
    with torch.no_grad():
        want = reference(*(t.to(KERNEL_DEVICE) for t in (tokens, positions, cu)))
        got = program(*padded)
    assert torch.equal(got[0], want[0]) and torch.equal(got[2], want[2]) and torch.equal(got[3], want[3])
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-4)

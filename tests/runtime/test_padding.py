"""Bucketed padding for CUDA graphs never changes real samples' scores (checked on CPU)."""

import torch

from boundgen.model.loader import load_model
from boundgen.programs.score import ScoreProgram
from boundgen.runtime.graphs import bucket_size, pad_batch
from tests.hf_reference import make_hf_model, save
from tests.model.test_parity import packed


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
        (ref,) = program(tokens, positions, cu)
        for padded_tokens in (36, 40, 64):
            (out,) = program(*pad_batch(tokens, positions, cu, padded_tokens, padded_samples=6))
            assert out.shape == (6, 2)
            torch.testing.assert_close(out[:3], ref, rtol=1e-5, atol=1e-6)

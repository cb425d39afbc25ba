"""Shared fixtures. Checkpoints are written once per session: tests must not modify them."""

import os

import torch  # noqa: E402  (importing torch imports no Triton kernel)

# Without a GPU, Triton kernels run in the interpreter. Read when `@triton.jit` runs: must be
# set before any kernel module is imported. With a GPU the real kernels compile.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import json  # noqa: E402

import pytest  # noqa: E402

from boundgen.model.demo import write_demo_checkpoint  # noqa: E402


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory):
    """Factory: make_checkpoint(preset="tiny-qwen3", seed=0, overrides=None, tie_word_embeddings=None,
    boost_token=None, boost_scale=50.0) -> directory of a demo checkpoint, written once per argument set."""
    written = {}

    def make(preset="tiny-qwen3", seed=0, overrides=None, tie_word_embeddings=None, boost_token=None,
             boost_scale=50.0):
        key = json.dumps([preset, seed, overrides, tie_word_embeddings, boost_token, boost_scale], sort_keys=True)
        if key not in written:
            written[key] = write_demo_checkpoint(
                tmp_path_factory.mktemp(preset), preset, seed, overrides=overrides,
                tie_word_embeddings=tie_word_embeddings, boost_token=boost_token, boost_scale=boost_scale)
        return written[key]

    return make


@pytest.fixture(scope="session")
def tiny_qwen3_dir(make_checkpoint):
    return make_checkpoint("tiny-qwen3")


@pytest.fixture(scope="session")
def tiny_qwen2_dir(make_checkpoint):
    return make_checkpoint("tiny-qwen2")

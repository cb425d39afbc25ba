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


# A constrained beam artifact (tiny Qwen2, W=4, N_gen=3, up to 2 prompts a call) and a catalogue
# for it, built once per session by the CLI (one AOTInductor compile of three packages).
CONSTRAINED_ITEMS = [(11, [40, 50, 60]), (12, [40, 50, 61]), (13, [40, 51, 62]), (14, [41, 52, 63]),
                     (15, [42, 53]), (16, [43]), (17, [44, 54, 64]), (18, [44, 54])]
CONSTRAINED_SUBSETS = {"shoes": [11, 12, 13, 16], "sale": [12, 17, 18]}  # registered with the catalogue


@pytest.fixture(scope="session")
def constrained_build(tiny_qwen2_dir, tmp_path_factory):
    """{"artifact": dir, "catalogue": dir, "items": path of its JSON lines}; tests must not modify them."""
    import subprocess
    import sys
    from pathlib import Path

    root = tmp_path_factory.mktemp("constrained")
    repo = Path(__file__).resolve().parents[1]
    artifact, catalogue, items = root / "cbeam", root / "cat", root / "items.jsonl"
    def line(item, tokens):
        names = [name for name, members in CONSTRAINED_SUBSETS.items() if item in members]
        return json.dumps({"item_id": item, "token_ids": tokens, **({"subsets": names} if names else {})}) + "\n"

    items.write_text("".join(line(i, t) for i, t in CONSTRAINED_ITEMS))
    for args in (["build", tiny_qwen2_dir, "--task", "beam", "--constrained", "--width", "4", "--steps", "3",
                  "--max-prompt-tokens", "32", "--max-requests", "2", "--batching", "--name", "cbeam", "--out", artifact],
                 ["catalogue", "build", items, "--tokenizer", artifact, "--out", catalogue]):
        proc = subprocess.run([sys.executable, "-m", "boundgen", *map(str, args)], cwd=repo, capture_output=True,
                              text=True, timeout=900)
        assert proc.returncode == 0, proc.stderr[-3000:]
    return {"artifact": artifact, "catalogue": catalogue, "items": items}

"""A built artifact: its manifest, and the engine `boundgen.load` makes of it, against the
compiled package called directly (byte-identical) and the eager engine (within tolerance)."""

import json

import numpy as np
import pytest
import torch

import boundgen
from boundgen.artifact.manifest import MANIFEST_FILE, RuntimeConfig, sha256_file
from boundgen.errors import InvalidInput
from boundgen.artifact.program import spec_from_dict
from boundgen.runtime.compiled import load_runner
from boundgen.programs.eager import eager_engine
from boundgen.text.tokenizer import Tokenizer
from tests.concurrency import assert_batched_beams_equal_single

pytestmark = pytest.mark.slow  # AOTInductor compiles (session fixtures)

TEXTS = ["query: running shoes | item: trail running shoe", "hello", "多语言 text ✓ with more words in it"]
PROMPT = "query: running shoes -> item:"


def direct_runner(artifact):
    manifest = json.loads((artifact / MANIFEST_FILE).read_text())
    compiled = manifest["compile"]
    return load_runner(artifact, compiled["packages"], compiled["weights_file"], "cpu",
                       manifest["program"].get("steps", 0))


def test_manifest_describes_the_artifact(score_build):
    artifact, manifest, log = score_build
    assert manifest["schema"] == "boundgen.artifact/3" and manifest["task"] == "score"
    assert set(manifest["files"]) == {"model.pt2", "weights.safetensors", "tokenizer.json", "tokenizer_config.json"}
    assert manifest["compile"]["packages"] == {"model": "model.pt2"}
    for name, digest in manifest["files"].items():
        assert sha256_file(artifact / name) == digest
    assert manifest["interface"]["dims"] == {"T": [1, 40], "B": [1, 5]}
    program = manifest["program"]
    assert (program["max_samples"], program["max_tokens_per_sample"], program["max_total_tokens"]) == (4, 16, 40)
    assert manifest["runtime"] == {"contexts": 2, "executors": 1, "cuda_graphs": False, "batching": False,
                                   "token_bucket": 256, "batch_wait_ms": 0.0, "batch_wait_learned": False,
                                   "catalogue_max_nodes": 0}
    assert manifest["interface"]["tensors"]["probs"] == {"direction": "output", "dtype": "float32", "shape": ["B", 2]}
    # The vocabulary's log-sum-exp and the label logits, for probabilities over the whole vocabulary.
    assert manifest["interface"]["tensors"]["lse"] == {"direction": "output", "dtype": "float32", "shape": ["B"]}
    assert manifest["interface"]["tensors"]["label_logits"] == {"direction": "output", "dtype": "float32",
                                                                "shape": ["B", 2]}
    assert manifest["interface"]["tensors"]["cu_seqlens"] == {"direction": "input", "dtype": "int32",
                                                              "shape": ["B+1"]}
    assert manifest["compile"]["lowering"]["packed_attention"] == "torch"
    assert manifest["compile"]["weights"] == "external" and manifest["compile"]["device"] == "cpu"
    assert manifest["versions"]["torch"] == torch.__version__
    validation = manifest["validation"]
    assert validation["passed"] and validation["tolerances"]["probs"] == 1e-4
    shapes = {c["name"]: (c["samples"], c["tokens"]) for c in validation["cases"]}
    assert shapes["one_sample_one_token"] == (1, 1)
    assert shapes["max_samples_max_tokens"] == (4, 40)
    assert shapes["padded_for_cuda_graphs"] == (5, 40)
    for case in validation["cases"]:
        for name in ("probs", "lse", "label_logits"):
            assert case["outputs"][name]["max_abs_err"] <= 1e-4
    spec = spec_from_dict(manifest["program"])
    assert spec.labels == (" yes", " no") and spec.max_samples == 4
    # Progress lines: "[build  12.3s] stage: ..."
    stages = [line.split("] ")[1].split(":")[0] for line in log.splitlines() if line.startswith("[build")]
    for stage in ("load", "export", "compile", "validate", "write"):
        assert stage in stages


def test_beam_manifest_requires_identical_candidates(beam_build):
    _, manifest, _ = beam_build
    validation = manifest["validation"]
    assert validation["passed"] and validation["ids_must_match"]
    assert [(c["name"], c["samples"], c["tokens"]) for c in validation["cases"]] == [
        ("one_token_prompt", 1, 1), ("representative", 1, 16), ("max_prompt", 1, 32),
        ("several_requests", 2, 17), ("max_requests_max_prompt", 2, 64),
        ("padded_for_cuda_graphs", 2, 24)]  # two prompts (16 + 1 tokens), then 7 tokens of no request
    for case in validation["cases"]:
        assert case["outputs"]["token_ids"]["identical"] and case["outputs"]["beam_indices"]["identical"]
    assert manifest["interface"]["tensors"]["token_ids"]["shape"] == ["R*4", 3]
    assert manifest["interface"]["dims"] == {"L": [1, 64], "R": [1, 2]}
    assert manifest["program"]["stop_token_ids"] == [151643]  # from the checkpoint's generation_config.json
    # One compiled decode step serves every step: three packages, one weights file.
    assert manifest["compile"]["packages"] == {"prefill": "prefill.pt2", "step": "step.pt2", "finish": "finish.pt2"}
    assert set(manifest["files"]) == {"prefill.pt2", "step.pt2", "finish.pt2", "weights.safetensors",
                                      "tokenizer.json", "tokenizer_config.json"}


def test_score_engine_is_byte_identical_to_the_package(score_artifact):
    engine = boundgen.load(score_artifact)
    result = engine.score(TEXTS)
    batch = Tokenizer.from_dir(score_artifact).encode_packed(TEXTS, 16)
    probs, lse, label_logits = direct_runner(score_artifact)(batch.tokens, batch.positions, batch.cu_seqlens)
    assert result.scores.dtype == np.float32 and result.scores.shape == (3, 2)
    assert result.scores.tobytes() == probs.numpy().tobytes()
    want = (label_logits.double() - lse.double()[:, None]).float().numpy()
    assert result.label_logprobs.tobytes() == want.tobytes()
    assert result.num_tokens.tolist() == batch.lengths


def test_beam_engine_is_byte_identical_to_the_package(beam_artifact):
    engine = boundgen.load(beam_artifact)
    result = engine.beam(PROMPT)
    batch = Tokenizer.from_dir(beam_artifact).encode_one(PROMPT, 32)
    token_ids, scores, finished, _ = direct_runner(beam_artifact)(batch.tokens, batch.positions, batch.cu_seqlens)
    assert result.token_ids.tolist() == token_ids.tolist()
    assert result.scores.tobytes() == scores.numpy().tobytes()
    assert result.finished.tolist() == finished.tolist()


def test_score_engine_equals_eager(score_artifact, tiny_qwen3_dir):
    engine = boundgen.load(score_artifact)
    eager = eager_engine(tiny_qwen3_dir, engine_spec_of(score_artifact))
    compiled, reference = engine.score(TEXTS), eager.score(TEXTS)
    np.testing.assert_allclose(compiled.scores, reference.scores, rtol=0, atol=1e-5)
    np.testing.assert_allclose(compiled.label_logprobs, reference.label_logprobs, rtol=0, atol=1e-4)
    assert engine.spec.vocab_outputs
    assert engine.spec.program.labels == (" yes", " no") and engine.spec.program.max_samples == 4


def test_beam_engine_equals_eager(beam_artifact, tiny_qwen2_dir):
    engine = boundgen.load(beam_artifact)
    eager = eager_engine(tiny_qwen2_dir, engine_spec_of(beam_artifact))
    got, want = engine.beam(PROMPT), eager.beam(PROMPT)
    assert got.candidates()[0]["text"] == want.candidates()[0]["text"]
    assert got.token_ids.tolist() == want.token_ids.tolist()
    np.testing.assert_allclose(got.scores, want.scores, rtol=0, atol=1e-4)
    assert engine.spec.program.width == 4 and engine.spec.program.steps == 3


def test_batched_beam_artifact_equals_one_call_per_request(beam_artifact):
    """Two concurrent requests share one call of the compiled stages (R = 2); each gets its own
    rows, equal to running it alone. The artifact was built with batching: load() batches by default."""
    single = boundgen.load(beam_artifact, batching=False)
    batched = boundgen.load(beam_artifact)
    assert batched.spec.runtime.batching and not single.spec.runtime.batching
    assert_batched_beams_equal_single(single, batched, [PROMPT, "x"], most=2)


def engine_spec_of(artifact):
    return spec_from_dict(json.loads((artifact / MANIFEST_FILE).read_text())["program"])


@pytest.mark.parametrize("texts,message", [
    (["a"] * 5, "5 samples; this model accepts at most 4"),
    (["word " * 20], r"sample 0 has 21 tokens, more than the limit of 16"),
    (["one two three four five six seven eight nine ten eleven twelve"] * 4, "tokens in all; this model accepts at most 40"),
    ([], "no samples"),
])
def test_score_beyond_bounds_is_invalid_input(score_artifact, texts, message):
    engine = boundgen.load(score_artifact)
    with pytest.raises(InvalidInput, match=message):
        engine.score(texts)


def test_beam_prompt_beyond_bound_is_invalid_input(beam_artifact):
    engine = boundgen.load(beam_artifact)
    with pytest.raises(InvalidInput, match="has 33 tokens, more than the limit of 32"):
        engine.beam("word" + " word" * 32)
    assert len(engine.beam("word" + " word" * 31).candidates()) == 4  # exactly at the bound: fine


def test_concurrency_settings_come_from_the_manifest_and_can_be_overridden(score_artifact):
    assert len(boundgen.load(score_artifact).contexts) == 2
    engine = boundgen.load(score_artifact, contexts=3, executors=2)
    assert len(engine.contexts) == 3 and engine.spec.runtime.executors == 2
    np.testing.assert_array_equal(engine.score(TEXTS).scores, boundgen.load(score_artifact).score(TEXTS).scores)


def test_single_threaded_runner_for_cuda_graphs_gives_the_same_bytes(score_artifact):
    manifest = json.loads((score_artifact / MANIFEST_FILE).read_text())
    compiled = manifest["compile"]
    single = load_runner(score_artifact, compiled["packages"], compiled["weights_file"], "cpu",
                         runtime=RuntimeConfig(executors=4, cuda_graphs=True))  # single-threaded, as for graphs
    batch = Tokenizer.from_dir(score_artifact).encode_packed(TEXTS, 16)
    inputs = (batch.tokens, batch.positions, batch.cu_seqlens)
    assert single(*inputs)[0].numpy().tobytes() == direct_runner(score_artifact)(*inputs)[0].numpy().tobytes()

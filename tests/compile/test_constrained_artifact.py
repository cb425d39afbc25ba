"""A constrained beam artifact (`boundgen build --task beam --constrained`): the catalogue is a
program input, loaded with the artifact (`boundgen.load(..., catalogue=CAT_DIR)`); its candidates
equal the eager constrained program's and HF `generate(prefix_allowed_tokens_fn=...)`'s, with and
without a per-request allow-list; bad catalogues and allow-lists are refused in the user's terms."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import boundgen
from boundgen.artifact.program import BeamSpec
from boundgen.artifact.tensors import TRIE
from boundgen.errors import ArtifactError, ConfigError, InvalidInput
from boundgen.programs.eager import eager_engine
from boundgen.text.catalogue import Catalogue
from tests.conftest import CONSTRAINED_ITEMS

pytestmark = pytest.mark.slow  # one AOTInductor build of three packages

REPO = Path(__file__).resolve().parents[2]
PROMPTS = ["query: running shoes -> item:", "hello"]
STOP = 151643  # the tiny checkpoints' eos_token_id
SPEC = BeamSpec(width=4, steps=3, stop_token_ids=(STOP,), max_prompt_tokens=32)


@pytest.fixture(scope="module")
def compiled(constrained_build):
    return boundgen.load(constrained_build["artifact"], catalogue=constrained_build["catalogue"])


def eager(model_dir, cat_dir, allow):
    return eager_engine(model_dir, SPEC, catalogue=cat_dir, allow_items=allow)


def test_manifest_records_the_constrained_interface(constrained_build):
    manifest = json.loads((constrained_build["artifact"] / "manifest.json").read_text())
    assert manifest["program"]["constrained"] is True
    tensors = manifest["interface"]["tensors"]
    assert all(tensors[name]["direction"] == "input" for name in TRIE)
    assert [tensors[name]["shape"] for name in TRIE] == [["M"]] * 4 + [["R", "M"]] * 2  # reach, ends: a row a request
    assert manifest["program"]["trie_layout"] == "rows"
    assert tensors["item_ids"] == {"direction": "output", "dtype": "int64", "shape": ["R*4"]}
    names = [case["name"] for case in manifest["validation"]["cases"]]
    assert "representative" in names and "representative+allow_list" in names
    assert manifest["validation"]["passed"]


@pytest.mark.parametrize("allow", [None, (11, 16), (17, 18, 12)])
def test_compiled_candidates_equal_the_eager_program(compiled, tiny_qwen2_dir, constrained_build, allow):
    reference = eager(tiny_qwen2_dir, constrained_build["catalogue"], allow)
    for prompt in PROMPTS:
        got, want = compiled.beam(prompt, allow_items=allow).candidates(), reference.beam(prompt).candidates()
        assert [(c["token_ids"], c["item_id"]) for c in got] == [(c["token_ids"], c["item_id"]) for c in want]
        for g, w in zip(got, want):
            assert (g["score"] is None) == (w["score"] is None)
            if w["score"] is not None:
                assert abs(g["score"] - w["score"]) <= 1e-4
        if allow is not None:
            assert {c["item_id"] for c in got} <= set(allow) | {-1}


def test_compiled_candidates_equal_hf_prefix_allowed_tokens_fn(compiled, tiny_qwen2_dir, constrained_build):
    from transformers import AutoModelForCausalLM

    cat = Catalogue.load(constrained_build["catalogue"])
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_qwen2_dir), dtype=torch.float32).eval()
    prompt = PROMPTS[0]
    ids = torch.as_tensor(compiled.packer.encode([prompt]).tokens, dtype=torch.int64)[None]

    def allowed(batch_id, input_ids):
        node = cat.lookup(input_ids[ids.shape[1]:].tolist())
        if node < 0:
            return [0]
        return cat.allowed(node) + ([STOP] if cat.node_item[node] >= 0 else []) or [0]

    with torch.no_grad():
        out = hf.generate(ids, num_beams=4, num_return_sequences=4, max_new_tokens=3, do_sample=False,
                          length_penalty=0.0, eos_token_id=[STOP], pad_token_id=STOP, output_scores=True,
                          return_dict_in_generate=True, prefix_allowed_tokens_fn=allowed)
    real = int((out.sequences_scores > -1e8).sum())
    hf_rows = []
    for row in out.sequences[:real, ids.shape[1]:].tolist():
        hf_rows.append(row[:row.index(STOP) + 1] if STOP in row else row)
    got = compiled.beam(prompt).candidates()
    assert [c["token_ids"] for c in got[:real]] == hf_rows
    np.testing.assert_allclose([c["score"] for c in got[:real]], out.sequences_scores[:real].numpy(), atol=1e-4)
    codes = {tuple(code): item for item, code in CONSTRAINED_ITEMS}
    assert [c["item_id"] for c in got[:real]] == [codes[tuple(t for t in r if t != STOP)] for r in hf_rows]


def test_allow_lists_that_name_unknown_items_or_leave_nothing_are_invalid_input(compiled):
    with pytest.raises(InvalidInput, match=r"\[99\] are not in the catalogue"):
        compiled.beam(PROMPTS[0], allow_items=[11, 99])
    with pytest.raises(InvalidInput, match="leaves no item"):
        compiled.beam(PROMPTS[0], allow_items=[])


def test_a_constrained_artifact_without_a_catalogue_refuses_requests(constrained_build):
    engine = boundgen.load(constrained_build["artifact"])
    with pytest.raises(InvalidInput, match="no catalogue is loaded"):
        engine.beam(PROMPTS[0])


def _catalogue(tmp_path, codes, tokenizer=None):
    cat = Catalogue.from_sequences(range(len(codes)), codes, tokenizer=tokenizer)
    cat.save(tmp_path / "cat")
    return tmp_path / "cat"


def test_catalogues_that_do_not_fit_the_artifact_are_refused(compiled, constrained_build, tiny_qwen2_dir, tmp_path):
    with pytest.raises(ConfigError, match="has 4 tokens; this beam search generates 3"):
        compiled.load_catalogue(_catalogue(tmp_path / "deep", [[40, 50, 60, 70]]))
    with pytest.raises(ConfigError, match="outside the model's vocabulary"):
        compiled.load_catalogue(_catalogue(tmp_path / "vocab", [[40, 200000, 60]]))
    with pytest.raises(ConfigError, match="another tokenizer"):
        compiled.load_catalogue(_catalogue(tmp_path / "tok", [[40, 50, 60]], {"sha256": "0" * 64}))
    with pytest.raises(ConfigError, match="not built with --constrained"):
        eager_engine(tiny_qwen2_dir, SPEC).load_catalogue(constrained_build["catalogue"])
    assert compiled.beam(PROMPTS[0]).item_ids is not None  # the served catalogue is still the first one


def test_replacing_the_catalogue_serves_the_new_one(constrained_build, tmp_path):
    engine = boundgen.load(constrained_build["artifact"], catalogue=constrained_build["catalogue"])
    engine.load_catalogue(_catalogue(tmp_path, [[45, 55, 65], [45, 56]]))
    items = engine.beam(PROMPTS[0]).item_ids.tolist()
    assert sorted(items) == [-1, -1, 0, 1]


@pytest.mark.parametrize("allow, subset", [(None, "sale"), ((11, 12, 17), "shoes")])
def test_a_named_subset_equals_the_eager_program_and_its_allow_list(compiled, tiny_qwen2_dir, constrained_build,
                                                                     allow, subset):
    """ALLOW_SUBSET on the compiled artifact (its trie inputs derived at load) against the eager
    program given the subset's ids (Catalogue.allowed_ids) and the checkpoint's CLI flag."""
    reference = eager_engine(tiny_qwen2_dir, SPEC, catalogue=constrained_build["catalogue"], allow_items=allow,
                             allow_subset=subset)
    for prompt in PROMPTS:
        got = compiled.beam(prompt, allow_items=allow, allow_subset=subset).candidates()
        want = reference.beam(prompt).candidates()
        assert [(c["token_ids"], c["item_id"]) for c in got] == [(c["token_ids"], c["item_id"]) for c in want]


def cli(*args):
    return subprocess.run([sys.executable, "-m", "boundgen", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)


def test_cli_beam_on_the_artifact_prints_item_ids(compiled, constrained_build, tmp_path):
    art, cat = constrained_build["artifact"], constrained_build["catalogue"]
    proc = cli("beam", art, "--catalogue", cat, "--text", PROMPTS[0], "--allow-items", "11,16")
    assert proc.returncode == 0, proc.stderr[-2000:]
    got, want = json.loads(proc.stdout)["candidates"], compiled.beam(PROMPTS[0], allow_items=[11, 16]).candidates()
    assert [(c["token_ids"], c["item_id"], c["score"] is None) for c in got] == \
        [(c["token_ids"], c["item_id"], c["score"] is None) for c in want]
    assert {c["item_id"] for c in got} == {11, 16, -1}
    proc = cli("beam", art, "--catalogue", cat, "--text", PROMPTS[0], "--allow-subset", "sale")
    assert proc.returncode == 0, proc.stderr[-2000:]
    want = compiled.beam(PROMPTS[0], allow_subset="sale").candidates()
    assert [c["item_id"] for c in json.loads(proc.stdout)["candidates"]] == [c["item_id"] for c in want]
    deep = _catalogue(tmp_path, [[40, 50, 60, 70]])
    for args, words in (([], "pass --catalogue CAT_DIR"), (["--catalogue", deep], "this beam search generates 3"),
                        (["--catalogue", cat, "--allow-items", "99"], "[99] are not in the catalogue"),
                        (["--catalogue", cat, "--allow-subset", "hats"], "no subset 'hats'"),
                        (["--allow-subset", "sale"], "--allow-subset needs --catalogue")):
        proc = cli("beam", art, "--text", PROMPTS[0], *args)
        assert proc.returncode != 0 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_triton_mask_lowering_builds_calls_the_op_by_name_and_equals_the_torch_lowering(
        compiled, tiny_qwen2_dir, constrained_build, tmp_path):
    """--lowering trie_mask=triton, with trie_topk=separate (the mask at every step, not the root's
    alone): on the CPU the packages call boundgen::trie_mask by name (the
    manifest records it, the loader registers it; its CPU kernel is the reference), and the
    candidates equal the torch-lowered artifact's, with and without an allow-list."""
    art = tmp_path / "cbeam_triton"
    manifest = cli_build(tiny_qwen2_dir, art, "--lowering", "trie_mask=triton", "--lowering", "trie_topk=separate")
    assert manifest["compile"]["lowering"]["trie_mask"] == "triton" and "trie_mask" in manifest["compile"]["custom_ops"]
    assert manifest["validation"]["passed"]
    assert_equal_candidates(boundgen.load(art, catalogue=constrained_build["catalogue"]), compiled)


def test_the_separate_selection_builds_and_equals_the_gathered_one(compiled, tiny_qwen2_dir, constrained_build,
                                                                   tmp_path):
    """--lowering trie_topk=separate (each decode step masks the log-probs and takes the top K over
    the vocabulary) exports, compiles and validates, and its candidates equal the default
    artifact's (a decode step's top K over each beam's allowed tokens alone, ops/trie_topk.py), with
    and without an allow-list; the default's manifest records its lowering."""
    assert json.loads((constrained_build["artifact"] / "manifest.json").read_text())["compile"]["lowering"][
        "trie_topk"] == "torch"
    art = tmp_path / "cbeam_separate"
    manifest = cli_build(tiny_qwen2_dir, art, "--lowering", "trie_topk=separate", "--catalogue-max-degree", "64")
    assert manifest["compile"]["lowering"]["trie_topk"] == "separate" and manifest["validation"]["passed"]
    assert_equal_candidates(boundgen.load(art, catalogue=constrained_build["catalogue"]), compiled)


def cli_build(model_dir, art, *flags) -> dict:
    """`boundgen build` of a tiny constrained beam artifact with `flags` added; its manifest."""
    proc = cli("build", model_dir, "--task", "beam", "--constrained", "--width", "4", "--steps", "3",
               "--max-prompt-tokens", "32", "--max-requests", "2", "--batching", *flags, "--name", "cbeam", "--out", art)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((art / "manifest.json").read_text())


def assert_equal_candidates(lowered, compiled):
    for allow in (None, [11, 16]):
        for prompt in PROMPTS:
            got, want = lowered.beam(prompt, allow_items=allow), compiled.beam(prompt, allow_items=allow)
            np.testing.assert_array_equal(got.token_ids, want.token_ids)
            np.testing.assert_array_equal(got.item_ids, want.item_ids)
            np.testing.assert_allclose(got.scores, want.scores, rtol=0, atol=1e-5)


def test_an_artifact_of_one_allow_list_a_call_is_refused_with_a_rebuild(constrained_build, artifact_copy):
    """A constrained artifact built before reach and ends had a row per request (its manifest
    without `trie_layout`) would be called with inputs it cannot take: loading says to rebuild it."""
    from tests.compile.test_loading import edit_manifest
    art = artifact_copy(constrained_build["artifact"])
    edit_manifest(art, lambda manifest: manifest["program"].pop("trie_layout"))
    with pytest.raises(ArtifactError, match=r"one allow-list a call .* rebuild it with `boundgen build"):
        boundgen.load(art, catalogue=constrained_build["catalogue"])

"""Loading refuses what it cannot run as built: tampered files or manifest, another torch,
a device this process lacks, a missing libstdc++ preload where loading would crash."""

import json
import re
import subprocess
import sys

import pytest

import boundgen
from boundgen.artifact import manifest as mf
from boundgen.errors import ArtifactError
from boundgen.runtime import libstdcxx

pytestmark = pytest.mark.slow  # uses the session's built artifacts


def edit_manifest(artifact, change, rehash=True):
    """Apply change(manifest dict) and rewrite manifest.json, with a valid self hash if rehash."""
    path = artifact / mf.MANIFEST_FILE
    manifest = json.loads(path.read_text())
    change(manifest)
    if rehash:
        manifest["manifest_sha256"] = mf._self_hash(manifest)
    path.write_text(json.dumps(manifest, indent=2))


def test_tampered_weight_file_is_refused_by_name(score_artifact, artifact_copy):
    art = artifact_copy(score_artifact)
    data = bytearray((art / "weights.safetensors").read_bytes())
    data[-10] ^= 0x01  # one bit of one weight
    (art / "weights.safetensors").write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="weights.safetensors was modified or corrupted"):
        boundgen.load(art)


def test_missing_file_is_refused_by_name(beam_artifact, artifact_copy):
    art = artifact_copy(beam_artifact)
    (art / "tokenizer.json").unlink()
    with pytest.raises(ArtifactError, match="tokenizer.json listed in the manifest is missing"):
        boundgen.load(art)


def test_edited_manifest_is_refused(score_artifact, artifact_copy):
    art = artifact_copy(score_artifact)
    edit_manifest(art, lambda m: m["program"].update(max_samples=64), rehash=False)
    with pytest.raises(ArtifactError, match="manifest.json was modified after the build"):
        boundgen.load(art)


def test_manifest_that_is_not_json_is_refused(score_artifact, artifact_copy):
    art = artifact_copy(score_artifact)
    (art / mf.MANIFEST_FILE).write_text("{not json")
    with pytest.raises(ArtifactError, match="not valid JSON"):
        boundgen.load(art)


@pytest.mark.parametrize("schema", ["boundgen.artifact/0", "boundgen.artifact/2"])
def test_other_manifest_versions_are_refused_by_name(score_artifact, artifact_copy, schema):
    """/2 is the version before the typed manifest (it recorded the runtime DAG)."""
    art = artifact_copy(score_artifact)
    edit_manifest(art, lambda m: m.update(schema=schema))
    with pytest.raises(ArtifactError, match=f"manifest version '{schema}'.*reads 'boundgen.artifact/3'"):
        boundgen.load(art)


def test_other_torch_version_is_refused_saying_what_differs(score_artifact, artifact_copy):
    import torch

    art = artifact_copy(score_artifact)
    major, minor = torch.__version__.split(".")[:2]
    other = f"{major}.{int(minor) + 1}.0+cu130"
    edit_manifest(art, lambda m: m["versions"].update(torch=other))
    with pytest.raises(ArtifactError, match=rf"torch {re.escape(other)} at build, {re.escape(torch.__version__)} here"):
        boundgen.load(art)


def test_same_torch_minor_with_another_patch_loads(score_artifact, artifact_copy):
    import torch

    art = artifact_copy(score_artifact)
    major, minor = torch.__version__.split(".")[:2]
    edit_manifest(art, lambda m: m["versions"].update(torch=f"{major}.{minor}.99"))
    assert boundgen.load(art).score(["hello"]).scores.shape == (1, 2)


def test_cuda_artifact_without_a_gpu_is_refused(score_artifact, artifact_copy):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    art = artifact_copy(score_artifact)

    def to_cuda(m):
        m["compile"].update(device="cuda", gpu_name="NVIDIA H200", gpu_capability="9.0")
        m["versions"]["cuda"] = "13.0"
    edit_manifest(art, to_cuda)
    with pytest.raises(ArtifactError, match="built for cuda on NVIDIA H200 .* no CUDA device"):
        boundgen.load(art)



def test_not_an_artifact(tmp_path):
    with pytest.raises(ArtifactError, match="not a boundgen artifact: no manifest.json"):
        boundgen.load(tmp_path)


def test_missing_libstdcxx_preload_is_a_clear_error_not_a_crash(score_artifact, monkeypatch):
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    with pytest.raises(ArtifactError, match="LD_PRELOAD=.*libstdc"):
        boundgen.load(score_artifact, libstdcxx_check="require")
    # Where the crash is expected (a CUDA build of torch on Linux), "auto" refuses too.
    monkeypatch.delenv(libstdcxx.SWITCH_ENV, raising=False)
    monkeypatch.setattr(libstdcxx, "torch_needs_preload", lambda: True)
    if libstdcxx.system_libstdcxx() is not None:
        with pytest.raises(ArtifactError, match="refusing to load an AOTInductor package"):
            boundgen.load(score_artifact)
    # With the preload in place it loads.
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
    assert boundgen.load(score_artifact, libstdcxx_check="require").score(["hi"]).scores.shape == (1, 2)


def test_manifest_missing_an_entry_is_refused(score_artifact, artifact_copy):
    art = artifact_copy(score_artifact)
    edit_manifest(art, lambda m: m["compile"].pop("packages"))
    with pytest.raises(ArtifactError, match="lacks the entry 'packages'"):
        boundgen.load(art)


@pytest.mark.parametrize("key,value,message", [
    ("interface", None, "interface must be a JSON object, got NoneType"),
    ("versions", None, "versions must be a JSON object, got NoneType"),
    ("name", 7, "name must be a JSON string, got int"),
    ("files", {"weights.safetensors": 7}, "files must map file names to sha256 digests"),
    ("files", {"/etc/passwd": "00"}, "file /etc/passwd listed in the manifest is missing"),
    ("program", "score", "program must be a JSON object"),
    ("model", {}, "model.config.vocab_size must be a positive integer"),
])
def test_a_manifest_of_the_wrong_shape_is_refused_by_name(score_artifact, artifact_copy, key, value, message):
    """An edited manifest whose self-hash was redone: an ArtifactError naming the entry (the server's 400),
    not an AttributeError deep in loading (500); and no file outside the artifact is read (its hash was
    quoted in the error)."""
    art = artifact_copy(score_artifact)
    edit_manifest(art, lambda m: m.update({key: value}))
    with pytest.raises(ArtifactError, match=re.escape(message)):
        boundgen.load(art)


@pytest.mark.parametrize("ids", [[0, 10 ** 9], [-1, 5], ["a", "b"], [True, 3]])
def test_label_token_ids_outside_the_vocabulary_are_refused_at_load(score_artifact, artifact_copy, ids):
    """An edited manifest's label ids: an ArtifactError at load (the server's 400), not scores labelled
    with ids the model does not have."""
    art = artifact_copy(score_artifact)
    edit_manifest(art, lambda m: m["program"].update(label_token_ids=ids))
    with pytest.raises(ArtifactError, match="label_token_ids .* are not token ids of the model's vocabulary"):
        boundgen.load(art)


def test_a_beam_artifact_serves_without_the_model_programs_or_compiler(beam_artifact):
    """The runtime loads the compiled packages alone: one request runs in a fresh process that
    never imports boundgen's model, programs or compiler; of boundgen's ops it imports just those
    the manifest says the packages call (a CPU package calls the packed attention by name)."""
    code = ("import sys, boundgen; e = boundgen.load(sys.argv[1]); e.warmup(); "
            "print(len(e.beam('query: shoes').candidates())); "
            "print(sorted(m for m in sys.modules if m.split('.')[:2] in (['boundgen', 'model'], "
            "['boundgen', 'programs'], ['boundgen', 'compile'], ['boundgen', 'ops'])))")
    out = subprocess.run([sys.executable, "-c", code, str(beam_artifact)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    called = json.loads((beam_artifact / "manifest.json").read_text())["compile"]["custom_ops"]
    assert called == ["packed_attention"]
    assert out.stdout.split("\n")[:2] == ["4", str(["boundgen.ops", "boundgen.ops.custom"]
                                                    + [f"boundgen.ops.{op}" for op in called])]


_CANDIDATES = ("import sys, json, boundgen\n"
               "for path in sys.argv[1:]:\n"
               "    r = boundgen.load(path).beam('query: running shoes')\n"
               "    print(json.dumps([[c['token_ids'], round(c['score'], 4)] for c in r.candidates()]))\n")


def _built_with_lowering(tiny_qwen2_dir, out, lowering: dict) -> tuple:
    """(artifact dir, manifest) of the tiny beam build with these lowerings."""
    from tests.compile.conftest import BEAM_OPTIONS, _build
    built, manifest, _ = _build(tiny_qwen2_dir, out, dict(BEAM_OPTIONS, lowering=lowering))
    return built, manifest


def _assert_same_candidates(*artifacts) -> None:
    """Each artifact loaded in one fresh process (which registers the ops its manifest names) gives
    the same candidates for one prompt."""
    out = subprocess.run([sys.executable, "-c", _CANDIDATES, *map(str, artifacts)], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    first, *others = map(json.loads, out.stdout.splitlines())
    assert len(others) == len(artifacts) - 1 and all(other == first for other in others)


def test_a_beam_artifact_with_chunked_selection_registers_its_op_and_answers_alike(beam_build, tiny_qwen2_dir,
                                                                                    tmp_path):
    """--lowering vocab_topk=chunks: the packages call chunk_max by name, the manifest says so, a
    fresh process registers it on load, and the candidates equal the default build's."""
    chunked, manifest = _built_with_lowering(tiny_qwen2_dir, tmp_path / "chunks", {"vocab_topk": "chunks"})
    assert manifest["compile"]["custom_ops"] == ["chunk_max", "packed_attention"]
    _assert_same_candidates(beam_build[0], chunked)


def test_a_beam_artifact_with_fused_decode_ops_registers_them_and_answers_alike(beam_build, tiny_qwen2_dir,
                                                                                 tmp_path):
    """--lowering rope_kv_write=triton add_rmsnorm=triton swiglu_down=triton: the step package calls
    the fused ops by name (the K/V write a declared mutation of the suffix buffers, the MLP's
    partial products summed by the add + norm), the manifest says so, a fresh process registers
    them on load, and the candidates equal the default build's."""
    fused, manifest = _built_with_lowering(tiny_qwen2_dir, tmp_path / "fused", {
        "rope_kv_write": "triton", "add_rmsnorm": "triton", "swiglu_down": "triton"})
    assert manifest["compile"]["custom_ops"] == ["add_rmsnorm", "packed_attention", "rope_kv_write", "swiglu_down"]
    _assert_same_candidates(beam_build[0], fused)


def test_a_beam_artifact_with_the_fused_decode_attention_registers_it_and_answers_alike(beam_build, tiny_qwen2_dir,
                                                                                        tmp_path):
    """--lowering decode_attention=triton (with rope_kv_write=triton, which it replaces): the step
    package calls one op a layer from the qkv product to the attention's output (the K/V write a
    declared mutation of the suffix buffers), the manifest says so, a fresh process registers it on
    load, and the candidates equal the default build's."""
    fused, manifest = _built_with_lowering(tiny_qwen2_dir, tmp_path / "fused", {
        "decode_attention": "triton", "rope_kv_write": "triton"})
    assert manifest["compile"]["custom_ops"] == ["decode_attention", "packed_attention"]
    _assert_same_candidates(beam_build[0], fused)


_SCORES = """
import json, sys
import boundgen
for path in sys.argv[1:]:
    print(json.dumps(boundgen.load(path).score(["is this relevant?", "a query and a document", "x"]).scores.tolist()))
"""


def test_a_score_artifact_with_the_fused_attention_registers_its_op_and_scores_alike(score_artifact, tiny_qwen3_dir,
                                                                                      tmp_path):
    """--lowering packed_attention_qk=triton: the prefill package calls the fused q/k norm + RoPE +
    attention by name instead of packed_attention, the manifest records the lowering and the op, and
    a fresh process registers it on load and scores as the default build does, up to FP32 rounding
    (on CPU the op runs the reference composition eagerly, where Inductor compiles the default's norms)."""
    import torch

    from tests.compile.conftest import SCORE_OPTIONS, _build
    fused, manifest, _ = _build(tiny_qwen3_dir, tmp_path / "fused", dict(SCORE_OPTIONS,
                                                                          lowering={"packed_attention_qk": "triton"}))
    assert manifest["compile"]["lowering"]["packed_attention_qk"] == "triton"
    assert manifest["compile"]["custom_ops"] == ["packed_attention_qk"]
    out = subprocess.run([sys.executable, "-c", _SCORES, str(score_artifact), str(fused)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    default, fused_scores = (torch.tensor(json.loads(line)) for line in out.stdout.splitlines())
    torch.testing.assert_close(fused_scores, default, atol=1e-6, rtol=0)


@pytest.mark.parametrize("mode,lowering,fused_ops,groups", [
    ("mlp", {"silu_quant": "triton"}, {"silu_quant"}, ("mlp",)),
    ("mlp,attn", {"silu_quant": "triton", "add_rmsnorm_quant": "triton"},
     {"silu_quant", "add_rmsnorm_quant", "rmsnorm_quant"}, ("mlp", "attn")),
])
def test_an_fp8_score_artifact_records_its_gate_and_serves_close_to_fp32(score_artifact, tiny_qwen3_dir, tmp_path,
                                                                          mode, lowering, fused_ops, groups):
    """--fp8 mlp (with the fused SwiGLU + quantization op), and mlp,attn (with every norm before a
    projection quantizing its output, the first layer's plain norm included): the manifest records
    the mode and the gate against the FP32 program (labels checked per case); the weights file
    holds E4M3 weights for exactly the mode's projections; loaded, the artifact's label
    probabilities are the FP32 artifact's within the FP8 tolerance, and not equal to them."""
    import numpy as np
    from safetensors import safe_open

    from boundgen.compile.validate import FP8_TOLERANCES
    from tests.compile.conftest import SCORE_OPTIONS, _build

    built, manifest, log = _build(tiny_qwen3_dir, tmp_path / "fp8", dict(SCORE_OPTIONS, dtype="bfloat16", fp8=mode,
                                                                        lowering=lowering))
    assert manifest["compile"]["fp8"] == mode and f"FP8 {mode}" in log and "'labels': 'argmax 1.0, spearman" in log
    assert fused_ops <= set(manifest["compile"]["custom_ops"])  # a loading process registers them
    validation = manifest["validation"]
    assert validation["passed"] and validation["reference"] == "float32 eager" and validation["fp8"] == mode
    assert all(case["outputs"]["labels"]["passed"] for case in validation["cases"])
    with safe_open(str(built / "weights.safetensors"), "pt") as f:
        dtypes = {k: f.get_slice(k).get_dtype() for k in f.keys() if k.endswith("weight_q")}
    assert dtypes and set(dtypes.values()) == {"F8_E4M3"}
    projections = {k.split(".")[-2] for k in dtypes}
    assert projections == {"gate_up_proj", "down_proj"} | ({"qkv_proj", "o_proj"} if "attn" in groups else set())
    texts = ["is this relevant?", "a query and a document about something else", "x"]
    fp8_engine, fp32_engine = boundgen.load(built), boundgen.load(score_artifact)
    # the bench counts these groups' FLOPs at the FP8 peak (bench/mfu.py)
    assert fp8_engine.spec.fp8_groups == groups and fp32_engine.spec.fp8_groups == ()
    quantized, exact = fp8_engine.score(texts).scores, fp32_engine.score(texts).scores
    assert np.abs(quantized - exact).max() <= FP8_TOLERANCES["probs"] and not np.array_equal(quantized, exact)


def corrupt_header(art):
    """Overwrite the weights file's JSON header with bytes that are not JSON, and record the file's
    new hash in the manifest: the corruption happened before the artifact was hashed."""
    weights = art / "weights.safetensors"
    data = bytearray(weights.read_bytes())
    data[8:24] = b"\xff" * 16
    weights.write_bytes(bytes(data))
    edit_manifest(art, lambda m: m["files"].update({"weights.safetensors": mf.sha256_file(weights)}))


def test_a_corrupt_weights_header_with_a_matching_hash_is_an_artifact_error(score_artifact, artifact_copy):
    art = artifact_copy(score_artifact)
    corrupt_header(art)
    with pytest.raises(ArtifactError, match="weights.safetensors is not a valid safetensors file"):
        boundgen.load(art)


def test_serve_exits_2_on_a_corrupt_weights_header(score_artifact, artifact_copy):
    """The CLI's exit code for an artifact it cannot load (2), not an internal error's (1)."""
    art = artifact_copy(score_artifact)
    corrupt_header(art)
    done = subprocess.run([sys.executable, "-m", "boundgen", "serve", str(art), "--http-port", "0", "--grpc-port", "0"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "weights.safetensors is not a valid safetensors file" in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr, done.stderr[-2000:]

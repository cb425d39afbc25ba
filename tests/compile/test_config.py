"""Build options: deploy file merged with flags, checked before any compile."""

import json

import pytest

from boundgen.compile import config
from boundgen.compile.export import dim_bounds
from boundgen.errors import ConfigError


def deploy_file(tmp_path, obj):
    path = tmp_path / "deploy.json"
    path.write_text(json.dumps(obj))
    return path


def test_deploy_file_then_flags(tiny_qwen3_dir, tmp_path):
    options, base = config.read_deploy_file(deploy_file(tmp_path, {
        "task": "score", "labels": [" yes", " no"], "max_samples": 15, "max_tokens_per_sample": 256,
        "lowering": {"packed_attention": "triton"}, "contexts": 3, "dtype": "float32", "batching": True}))
    options.update(max_samples=8, name="w1")  # flags win
    cfg = config.resolve(tiny_qwen3_dir, tmp_path / "out", options, base)
    assert cfg.name == "w1" and cfg.device == "cpu" and cfg.dtype == "float32"
    assert cfg.spec.max_samples == 8 and cfg.spec.max_tokens_per_sample == 256
    assert cfg.spec.max_total_tokens == 8 * 256  # default: samples x tokens per sample
    assert cfg.spec.label_token_ids == (9834, 902)
    assert cfg.lowering.packed_attention == "triton" and cfg.runtime.contexts == 3 and cfg.weights == "external"
    assert cfg.runtime.batching and not cfg.runtime.cuda_graphs
    assert dim_bounds(cfg.spec) == {"T": (1, 2048), "B": (1, 9)}


def test_beam_defaults(tiny_qwen2_dir, tmp_path):
    cfg = config.resolve(tiny_qwen2_dir, tmp_path / "beam", {"task": "beam", "width": 100, "steps": 5,
                                                             "max_prompt_tokens": 512})
    assert cfg.name == "beam" and cfg.spec.stop_token_ids == (151643,)
    assert cfg.runtime.batch_wait_ms == 0.0  # never waits for company unless asked
    waiting = config.resolve(tiny_qwen2_dir, tmp_path / "beam", {"task": "beam", "width": 4, "steps": 2,
                                                                 "batch_wait_ms": 5})
    assert waiting.runtime.batch_wait_ms == 5
    assert dim_bounds(cfg.spec) == {"L": (1, 512), "R": (1, 1)}


@pytest.mark.parametrize("options,message", [
    ({"task": "rank"}, "--task must be score or beam"),
    ({"task": "score", "labels": [" yes"], "width": 4}, "width do not apply to a score build"),
    ({"task": "beam", "width": 4}, "needs --width and --steps"),
    ({"task": "beam", "width": 4, "steps": 9}, r"in \[1, 5\]"),
    ({"task": "score"}, "needs --labels"),
    ({"task": "score", "labels": [" yes please"]}, "exactly one token"),
    ({"task": "score", "labels": [" yes"], "device": "tpu"}, "--device must be cpu or cuda"),
    ({"task": "score", "labels": [" yes"], "weights": "inline"}, "weights must be one of external, packaged"),
    ({"task": "score", "labels": [" yes"], "lowering": {"packed_attention": "cuda"}}, "no lowering 'cuda'"),
    ({"task": "score", "labels": [" yes"], "lowering": {"softmax": "triton"}}, "unknown ops in lowering: softmax"),
    ({"task": "score", "labels": [" yes"], "max_samples": "15"}, "max_samples must be an integer"),
    ({"task": "score", "labels": [" yes"], "max_tokens_per_sample": 64, "max_total_tokens": 32}, "exceeds"),
    ({"task": "score", "labels": [" yes"], "fp8": "mlp"}, "--fp8 mlp needs --dtype bfloat16"),
    ({"task": "score", "labels": [" yes"], "fp8": "mlp,attn", "dtype": "float32"},
     "--fp8 mlp,attn needs --dtype bfloat16"),
    ({"task": "beam", "width": 4, "steps": 2, "fp8": "mlp,attn", "dtype": "float16"}, "needs --dtype bfloat16"),
    ({"task": "score", "labels": [" yes"], "fp8": "all", "dtype": "bfloat16"},
     "fp8 must be one of 'none', 'mlp', 'mlp,attn'; got 'all'"),
    ({"task": "score", "labels": [" yes"], "fp8": "attn,mlp", "dtype": "bfloat16"}, "fp8 must be one of"),
    ({"task": "beam", "width": 4, "steps": 2, "fp8": "mlp", "dtype": "bfloat16", "lowering": {"swiglu_down": "triton"}},
     "--fp8 mlp and --lowering swiglu_down=triton both replace the down projection"),
    ({"task": "beam", "width": 4, "steps": 2, "fp8": "mlp,attn", "dtype": "bfloat16",
      "lowering": {"swiglu_down": "triton"}}, "--fp8 mlp,attn and --lowering swiglu_down=triton both replace"),
    ({"task": "score", "labels": [" yes"], "lowering": {"silu_quant": "triton"}}, "silu_quant=triton .* needs --fp8"),
    ({"task": "score", "labels": [" yes"], "lowering": {"add_rmsnorm_quant": "triton"}},
     "add_rmsnorm_quant=triton .* needs --fp8 mlp"),
    ({"task": "beam", "width": 4, "steps": 2, "batch_wait_ms": 25}, "batch_wait_ms must be a number of ms from 0"),
    ({"task": "beam", "width": 4, "steps": 2, "batch_wait_ms": -1}, "batch_wait_ms must be a number"),
    ({"task": "score", "labels": [" yes"], "tolerances": {"bogus": 1}}, "tolerances has unknown names bogus"),
    ({"task": "score", "labels": [" yes"], "tolerances": {"probs": -1}}, "tolerances must map output names to numbers >= 0"),
    ({"task": "score", "labels": [" yes"], "name": "a/b?x"}, "--name must be letters, digits"),
    ({"task": "score", "labels": [" yes"], "name": "../../etc"}, "--name must be letters, digits"),
    ({"task": "beam", "width": 4, "steps": 2, "catalogue_max_degree": 64}, "catalogue_max_degree bounds a constrained"),
    ({"task": "beam", "width": 4, "steps": 2, "length_penalty": float("nan")}, "length_penalty must be a number in"),
    ({"task": "beam", "width": 4, "steps": 2, "length_penalty": 2000.0}, "length_penalty must be a number in"),
    ({"task": "beam", "width": 4, "steps": 2, "stop_token_ids": [-1]}, "stop_token_ids must be token ids"),
    ({"task": "beam", "width": 4, "steps": 2, "stop_token_ids": [99999999]}, "outside the model's vocabulary"),
])
def test_bad_options_are_clear_errors(tiny_qwen3_dir, tmp_path, options, message):
    with pytest.raises(ConfigError, match=message):
        config.resolve(tiny_qwen3_dir, tmp_path / "out", options)


def test_deploy_file_errors(tmp_path):
    with pytest.raises(ConfigError, match="unknown keys: max_batch"):
        config.read_deploy_file(deploy_file(tmp_path, {"max_batch": 4}))
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ConfigError, match="not valid JSON"):
        config.read_deploy_file(tmp_path / "bad.json")
    with pytest.raises(ConfigError, match="not found"):
        config.read_deploy_file(tmp_path / "missing.json")
    with pytest.raises(ConfigError, match="is a directory"):
        config.read_deploy_file(tmp_path)
    (tmp_path / "latin1.json").write_bytes(b'{"name": "caf\xe9"}')
    with pytest.raises(ConfigError, match="not UTF-8"):
        config.read_deploy_file(tmp_path / "latin1.json")
    (tmp_path / "twice.json").write_text('{"max_samples": 2, "max_samples": 3}')  # the last one was taken
    with pytest.raises(ConfigError, match="gives 'max_samples' twice; give each key once"):
        config.read_deploy_file(tmp_path / "twice.json")


def test_an_artifact_directory_that_is_no_model_name_asks_for_one(tiny_qwen3_dir, tmp_path):
    with pytest.raises(ConfigError, match="the artifact directory's name .the default --name. must be letters"):
        config.resolve(tiny_qwen3_dir, tmp_path / "my art", {"task": "score", "labels": [" yes"]})
    assert config.resolve(tiny_qwen3_dir, tmp_path / "my art", {"task": "score", "labels": [" yes"],
                                                                "name": "my-art"}).name == "my-art"


def test_lowering_flags():
    assert config.parse_lowering_flags(["packed_attention=triton", "prefix_attention = triton"]) == {
        "packed_attention": "triton", "prefix_attention": "triton"}
    with pytest.raises(ConfigError, match="OP=IMPL"):
        config.parse_lowering_flags(["triton"])


def test_refuses_to_overwrite_a_directory_that_is_not_an_artifact(tiny_qwen3_dir, tmp_path):
    from boundgen.compile.pipeline import build

    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    cfg = config.resolve(tiny_qwen3_dir, out, {"task": "score", "labels": [" yes"]})
    with pytest.raises(ConfigError, match="not a boundgen artifact; refusing to overwrite"):
        build(cfg)
    assert (out / "notes.txt").read_text() == "keep me"


def test_fp8_from_the_deploy_file_or_the_flag(tiny_qwen3_dir, tmp_path):
    options = {"task": "score", "labels": [" yes"], "dtype": "bfloat16"}
    assert config.resolve(tiny_qwen3_dir, tmp_path / "a", options).fp8 == "none"
    cfg = config.resolve(tiny_qwen3_dir, tmp_path / "a", dict(options, fp8="mlp"))
    assert cfg.fp8 == "mlp" and "FP8 mlp" in cfg.summary()
    cfg = config.resolve(tiny_qwen3_dir, tmp_path / "a", dict(options, fp8="mlp,attn",
                                                               lowering={"add_rmsnorm_quant": "triton"}))
    assert cfg.fp8 == "mlp,attn" and "FP8 mlp,attn" in cfg.summary()
    assert "fp8" in config.deploy_keys()

"""Demo checkpoints: HF-format files that transformers and boundgen's loader both accept."""

import json

import pytest
import torch
from safetensors import safe_open

from boundgen.cli.main import main
from boundgen.errors import ConfigError
from boundgen.model import demo
from boundgen.model.config import ModelConfig
from boundgen.model.loader import load_model

transformers = pytest.importorskip("transformers")


def hf_load(path):
    model, info = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                                    output_loading_info=True)
    assert not any(info[k] for k in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs")), info
    return model.eval()


def tensors(path):
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        return {name: f.get_tensor(name) for name in f.keys()}


def check_logits_match(path, seq_len=9):
    hf = hf_load(path)
    ours = load_model(path)
    ids = torch.randint(0, 151936, (seq_len,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ref = hf(ids[None]).logits[0]
        hidden, _ = ours.prefill(ids, torch.arange(seq_len), torch.tensor([0, seq_len], dtype=torch.int32))
        got = ours.logits(hidden)
    assert (got - ref).abs().max() <= 1e-4 * ref.abs().max()


@pytest.mark.parametrize("fixture", ["tiny_qwen3_dir", "tiny_qwen2_dir"])
def test_tiny_presets_load_in_hf_and_boundgen(request, fixture):
    path = request.getfixturevalue(fixture)
    assert sorted(p.name for p in path.iterdir()) == sorted(demo.DEMO_FILES)
    check_logits_match(path)


@pytest.mark.parametrize("preset", list(demo.PRESETS))
def test_config_is_what_transformers_writes(tmp_path, preset):
    raw = demo.hf_config(preset)
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "config.json").write_text(json.dumps(raw))
    transformers.AutoConfig.from_pretrained(tmp_path / "in").save_pretrained(tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text()) == raw
    ModelConfig.from_hf_dict(raw)


@pytest.mark.parametrize("preset", list(demo.PRESETS))
def test_tensor_plan_matches_hf_model(preset):
    raw = demo.hf_config(preset)
    with torch.device("meta"):
        hf = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**raw))
    tied = raw["tie_word_embeddings"]
    expected = {k: tuple(v.shape) for k, v in hf.state_dict().items() if not (tied and k == "lm_head.weight")}
    plan = demo.tensor_plan(ModelConfig.from_hf_dict(raw))
    assert {k: shape for k, (shape, _) in plan.items()} == expected


def test_large_preset_shapes():
    q3 = ModelConfig.from_hf_dict(demo.hf_config("qwen3-0.6b"))
    assert (q3.hidden_size, q3.num_layers, q3.num_heads, q3.num_kv_heads, q3.head_dim, q3.intermediate_size) == (
        1024, 28, 16, 8, 128, 3072)
    assert q3.tie_word_embeddings and q3.qk_norm and not q3.qkv_bias and q3.rope_theta == 1e6
    assert q3.max_position_embeddings == 40960 and q3.vocab_size == 151936
    q2 = ModelConfig.from_hf_dict(demo.hf_config("qwen2.5-0.5b"))
    assert (q2.hidden_size, q2.num_layers, q2.num_heads, q2.num_kv_heads, q2.head_dim, q2.intermediate_size) == (
        896, 24, 14, 2, 64, 4864)
    assert q2.tie_word_embeddings and q2.qkv_bias and not q2.qk_norm and q2.max_position_embeddings == 32768
    for preset in ("qwen3-0.6b", "qwen2.5-0.5b"):
        assert demo.hf_config(preset)["dtype"] == "bfloat16"
    n = sum(torch.Size(shape).numel() for shape, _ in demo.tensor_plan(q3).values())
    assert 590e6 < n < 600e6  # Qwen3-0.6B: 596M parameters with the tied embedding


def test_generation_config(tiny_qwen3_dir, tiny_qwen2_dir):
    for path, eos in ((tiny_qwen3_dir, [151645, 151643]), (tiny_qwen2_dir, 151643)):
        gen = json.loads((path / "generation_config.json").read_text())
        assert {k: v for k, v in gen.items() if k != "transformers_version"} == {
            "bos_token_id": 151643, "eos_token_id": eos, "pad_token_id": 151643}
        loaded = transformers.GenerationConfig.from_pretrained(path)
        assert not loaded.do_sample and loaded.pad_token_id == 151643


def test_weights_are_seeded_and_exercise_norms_and_biases(tiny_qwen2_dir, make_checkpoint):
    a = tensors(tiny_qwen2_dir)
    assert all(t.dtype == torch.float32 for t in a.values())
    assert tensors(make_checkpoint("tiny-qwen2", seed=0)).keys() == a.keys()
    b = tensors(make_checkpoint("tiny-qwen2", seed=1))
    assert not torch.equal(a["model.embed_tokens.weight"], b["model.embed_tokens.weight"])
    norm = a["model.layers.0.input_layernorm.weight"]
    assert 0.02 < (norm - 1).std() < 0.2
    bias = a["model.layers.1.self_attn.k_proj.bias"]
    assert bias.abs().min() > 0 and 0.02 < bias.std() < 0.2
    assert 0.018 < a["model.layers.0.mlp.down_proj.weight"].std() < 0.022


def test_seed_is_reproducible_byte_for_byte(tmp_path, tiny_qwen3_dir):
    again = demo.write_demo_checkpoint(tmp_path / "again", "tiny-qwen3", seed=0)
    for name in demo.DEMO_FILES:
        assert (again / name).read_bytes() == (tiny_qwen3_dir / name).read_bytes(), name


def test_qk_norm_weights_are_not_ones(tiny_qwen3_dir):
    t = tensors(tiny_qwen3_dir)
    assert not torch.allclose(t["model.layers.0.self_attn.q_norm.weight"], torch.ones(16))
    assert not torch.allclose(t["model.layers.1.self_attn.k_norm.weight"], torch.ones(16))


@pytest.mark.parametrize("preset,overrides", [
    ("tiny-qwen3", {"head_dim": 32, "num_key_value_heads": 1}),
    ("tiny-qwen3", {"num_attention_heads": 5, "num_key_value_heads": 5, "hidden_size": 80, "attention_bias": True}),
    ("tiny-qwen2", {"num_attention_heads": 2, "num_key_value_heads": 1, "num_hidden_layers": 3}),
])
def test_overrides_and_untied(make_checkpoint, preset, overrides):
    path = make_checkpoint(preset, seed=3, overrides=overrides, tie_word_embeddings=False)
    raw = json.loads((path / "config.json").read_text())
    assert all(raw[k] == v for k, v in overrides.items()) and raw["tie_word_embeddings"] is False
    assert len(raw["layer_types"]) == raw["num_hidden_layers"] == raw["max_window_layers"]
    assert "lm_head.weight" in tensors(path)
    check_logits_match(path)


def test_untying_keeps_the_other_tensors(tiny_qwen3_dir, make_checkpoint):
    tied, untied = tensors(tiny_qwen3_dir), tensors(make_checkpoint("tiny-qwen3", tie_word_embeddings=False))
    assert set(untied) - set(tied) == {"lm_head.weight"}
    assert all(torch.equal(tied[k], untied[k]) for k in tied)


def test_boost_token_is_emitted(make_checkpoint):
    token = 151645
    path = make_checkpoint("tiny-qwen3", boost_token=token, tie_word_embeddings=False)
    head = tensors(path)["lm_head.weight"]
    assert head[token].norm() > 20 * head[:1000].norm(dim=1).mean()
    hf = hf_load(path)
    ids = torch.randint(0, 151643, (1, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        top = hf(ids).logits[0].argmax(-1)
    hits = (top == token).float().mean().item()
    assert 0.1 < hits < 0.9, f"boosted token is the argmax at {hits:.0%} of positions"


def test_boost_token_needs_untied_and_valid_id(tmp_path):
    with pytest.raises(ConfigError, match="untied"):
        demo.write_demo_checkpoint(tmp_path / "a", "tiny-qwen3", boost_token=5)
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        demo.write_demo_checkpoint(tmp_path / "b", "tiny-qwen3", boost_token=151936, tie_word_embeddings=False)


def test_unknown_preset(tmp_path):
    with pytest.raises(ConfigError, match="unknown demo preset 'qwen9'"):
        demo.write_demo_checkpoint(tmp_path, "qwen9")


def test_refuses_to_overwrite_other_directories(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="not empty and is not a boundgen demo checkpoint"):
        demo.write_demo_checkpoint(tmp_path, "tiny-qwen2")
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="not a directory"):
        demo.write_demo_checkpoint(tmp_path / "file", "tiny-qwen2")


def test_cli_writes_and_rewrites_a_demo_checkpoint(tmp_path, capsys):
    out = tmp_path / "ckpt"
    assert main(["demo-model", str(out), "--preset", "tiny-qwen2", "--seed", "7"]) == 0
    assert demo.is_demo_checkpoint(out)
    assert "tiny-qwen2" in capsys.readouterr().out
    assert main(["demo-model", str(out), "--preset", "tiny-qwen3"]) == 0  # a demo checkpoint may be replaced
    assert json.loads((out / "config.json").read_text())["model_type"] == "qwen3"
    (out / "extra.bin").write_bytes(b"")
    assert main(["demo-model", str(out), "--preset", "tiny-qwen3"]) == 2
    assert "refusing to overwrite" in capsys.readouterr().err

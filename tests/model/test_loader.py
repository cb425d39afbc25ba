"""Checkpoint and config errors name what is wrong."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from boundgen.errors import ConfigError
from boundgen.model.config import ModelConfig
from boundgen.model.loader import load_model
from tests.hf_reference import make_hf_model, save


@pytest.fixture()
def ckpt(tmp_path):
    return save(make_hf_model("qwen2", seed=1), tmp_path / "m")


def edit_config(path, **changes):
    cfg_path = f"{path}/config.json"
    cfg = json.load(open(cfg_path))
    cfg.update(changes)
    json.dump(cfg, open(cfg_path, "w"))


def edit_weights(path, fn):
    w = load_file(f"{path}/model.safetensors")
    fn(w)
    save_file(w, f"{path}/model.safetensors")


def test_loads(ckpt):
    model = load_model(ckpt)
    assert model.cfg.family == "qwen2" and model.cfg.qkv_bias and not model.cfg.qk_norm


@pytest.mark.parametrize("changes,message", [
    ({"architectures": ["LlamaForCausalLM"]}, "unsupported architecture"),
    ({"some_new_knob": 3}, "does not understand: some_new_knob"),
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"use_sliding_window": True}, "use_sliding_window"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}}, "yarn"),
    ({"num_key_value_heads": 3}, "multiple of num_key_value_heads"),
    ({"rms_norm_eps": "x"}, "a value boundgen cannot use: could not convert"),  # was a ValueError
    ({"rms_norm_eps": 0}, "rms_norm_eps must be a positive number"),
    ({"hidden_size": "64"}, "a value boundgen cannot use"),  # was a TypeError
    ({"num_hidden_layers": True}, "num_layers must be a positive integer, got True"),  # ran as one layer
])
def test_config_errors(ckpt, changes, message):
    edit_config(ckpt, **changes)
    with pytest.raises(ConfigError, match=message):
        load_model(ckpt)


def test_rope_theta_from_either_key():
    base = {"architectures": ["Qwen2ForCausalLM"], "vocab_size": 8, "hidden_size": 8, "intermediate_size": 8,
            "num_hidden_layers": 1, "num_attention_heads": 2}
    assert ModelConfig.from_hf_dict({**base, "rope_theta": 5e5}).rope_theta == 5e5
    assert ModelConfig.from_hf_dict({**base, "rope_parameters": {"rope_type": "default", "rope_theta": 7.0}}).rope_theta == 7.0


def test_missing_tensor(ckpt):
    edit_weights(ckpt, lambda w: w.pop("model.layers.1.mlp.up_proj.weight"))
    with pytest.raises(ConfigError, match=r"missing tensor model.layers.1.mlp.up_proj.weight \(expected shape \[96, 64\]\)"):
        load_model(ckpt)


def test_misshaped_tensor(ckpt):
    edit_weights(ckpt, lambda w: w.update({"model.norm.weight": torch.ones(65)}))
    with pytest.raises(ConfigError, match=r"model.norm.weight has shape \[65\], expected \[64\]"):
        load_model(ckpt)


def test_unexpected_tensor(ckpt):
    edit_weights(ckpt, lambda w: w.update({"model.layers.0.mlp.extra.weight": torch.ones(2)}))
    with pytest.raises(ConfigError, match="does not use: model.layers.0.mlp.extra.weight"):
        load_model(ckpt)


def test_no_pickle_and_sharded_index(ckpt, tmp_path):
    import os
    w = load_file(f"{ckpt}/model.safetensors")
    names = sorted(w)
    half = len(names) // 2
    save_file({n: w[n] for n in names[:half]}, f"{ckpt}/model-00001-of-00002.safetensors")
    save_file({n: w[n] for n in names[half:]}, f"{ckpt}/model-00002-of-00002.safetensors")
    index = {"weight_map": {n: f"model-0000{1 if i < half else 2}-of-00002.safetensors" for i, n in enumerate(names)}}
    json.dump(index, open(f"{ckpt}/model.safetensors.index.json", "w"))
    os.remove(f"{ckpt}/model.safetensors")
    sharded = load_model(ckpt)
    assert sharded.cfg.num_layers == 2
    os.remove(f"{ckpt}/model.safetensors.index.json")
    torch.save({}, f"{ckpt}/pytorch_model.bin")
    with pytest.raises(ConfigError, match="pickled .bin checkpoints are not loaded"):
        load_model(ckpt)


def test_a_corrupt_safetensors_header_is_a_config_error(ckpt):
    with open(f"{ckpt}/model.safetensors", "r+b") as f:
        f.seek(8)
        f.write(b"\xff" * 16)
    with pytest.raises(ConfigError, match="model.safetensors is not a valid safetensors file"):
        load_model(ckpt)

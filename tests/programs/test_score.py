"""The score program against HF forward on each sample alone (FP32)."""

import pytest
import torch
from safetensors.torch import save_file

from boundgen.errors import ConfigError
from boundgen.model.loader import load_model
from boundgen.programs.head import MLPHead
from boundgen.programs.score import ScoreProgram
from tests.hf_reference import make_hf_model, save
from tests.model.test_parity import packed


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    hf = make_hf_model("qwen3", seed=2, tied=False)
    return hf, load_model(save(hf, tmp_path_factory.mktemp("m")))


def samples(lengths, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 512, (n,), generator=gen) for n in lengths]


@pytest.mark.parametrize("lengths", [[1], [7, 37, 64, 1], [5] * 15])
def test_label_probs_match_hf(pair, lengths):
    hf, model = pair
    labels = [17, 300, 4]
    seqs = samples(lengths)
    with torch.no_grad():
        probs, lse, label_logits = ScoreProgram(model, labels)(*packed(seqs))
        logits = torch.stack([hf(s[None]).logits[0, -1].float() for s in seqs])  # [B, V]
    ref = torch.softmax(logits[:, labels], -1)
    assert probs.dtype == torch.float32 and probs.shape == (len(seqs), 3)
    torch.testing.assert_close(probs, ref, rtol=1e-4, atol=1e-6)
    # SGLang's apply_softmax false: the softmax over all V logits, read at the labels.
    assert lse.dtype == label_logits.dtype == torch.float32 and lse.shape == (len(seqs),)
    vocab = torch.exp(label_logits.double() - lse.double()[:, None])
    torch.testing.assert_close(vocab, torch.softmax(logits.double(), -1)[:, labels], rtol=1e-4, atol=1e-7)


def test_topk_over_vocabulary(pair):
    hf, model = pair
    seqs = samples([3, 9])
    with torch.no_grad():
        probs, lse, label_logits, ids, top = ScoreProgram(model, [1, 2], topk=5)(*packed(seqs))
        ref = torch.stack([torch.softmax(hf(s[None]).logits[0, -1].float(), -1) for s in seqs])
    ref_top, ref_ids = torch.topk(ref, 5)
    assert torch.equal(ids, ref_ids) and label_logits.shape == (2, 2) and lse.shape == (2,)
    torch.testing.assert_close(top, ref_top, rtol=1e-4, atol=1e-6)


def test_mlp_head(pair, tmp_path):
    hf, model = pair
    gen = torch.Generator().manual_seed(0)
    w0, b0, w1 = torch.randn(8, 64, generator=gen), torch.randn(8, generator=gen), torch.randn(3, 8, generator=gen)
    path = tmp_path / "head.safetensors"
    save_file({"layers.0.weight": w0, "layers.0.bias": b0, "layers.1.weight": w1}, str(path),
              metadata={"activation": "gelu", "output": "sigmoid", "labels": "a,b,c"})
    head = MLPHead.load(path, 64)
    assert head.labels == ["a", "b", "c"]
    seqs = samples([4, 6])
    with torch.no_grad():
        (out,) = ScoreProgram(model, head=head)(*packed(seqs))
        last = torch.stack([hf(s[None], output_hidden_states=True).hidden_states[-1][0, -1] for s in seqs])
    ref = torch.sigmoid(torch.nn.functional.gelu(last @ w0.T + b0) @ w1.T)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-5)


def test_mlp_head_errors(tmp_path):
    path = tmp_path / "bad.safetensors"
    save_file({"layers.0.weight": torch.zeros(2, 32)}, str(path))
    with pytest.raises(ConfigError, match="hidden size 32"):
        MLPHead.load(path, 64)
    save_file({"layers.0.weight": torch.zeros(2, 64), "extra": torch.zeros(1)}, str(path))
    with pytest.raises(ConfigError, match="unexpected tensors: extra"):
        MLPHead.load(path, 64)
    with pytest.raises(ConfigError, match="not found"):
        MLPHead.load(tmp_path / "missing.safetensors", 64)


@pytest.mark.parametrize("tensors,metadata,message", [
    ({"layers.0.weight": torch.zeros(64)}, {}, "must be a matrix"),
    ({"layers.0.weight": torch.zeros(3, 64, 2)}, {}, "must be a matrix"),
    ({"layers.0.weight": torch.zeros(0, 64)}, {}, "at least one row"),
    ({"layers.0.weight": torch.zeros(3, 64), "layers.0.bias": torch.zeros(5)}, {}, "bias must have shape \\[3\\]"),
    ({"layers.0.weight": torch.zeros(3, 64), "layers.0.bias": torch.zeros(3, 1)}, {}, "bias must have shape"),
    ({"layers.0.weight": torch.full((3, 64), float("nan"))}, {}, "finite floating-point"),
    ({"layers.0.weight": torch.zeros(3, 64, dtype=torch.int32)}, {}, "finite floating-point"),
    ({"layers.0.weight": torch.zeros(3, 64)}, {"labels": "a,b"}, "names 2 labels for 3 classes"),
])
def test_a_head_file_of_the_wrong_shape_is_a_clear_error(tmp_path, tensors, metadata, message):
    """Each was an IndexError or RuntimeError at load or at the first call (the CLI's "internal error"),
    a 0-class head answered empty scores and a NaN head printed NaN, which is not JSON."""
    path = tmp_path / "head.safetensors"
    save_file(tensors, str(path), metadata=metadata)
    with pytest.raises(ConfigError, match=message):
        MLPHead.load(path, 64)

"""`POST /v1/score` (SGLang's score request shape) on a real server process: the same numbers as the
KServe v2 infer of the same texts, labels in any order or a subset (renormalised), item_first, and
a JSON 400 naming the problem for what a score artifact cannot answer."""

from __future__ import annotations


import numpy as np
import pytest
import tritonclient.http as thttp

from tests.server.conftest import SCORE_SPEC, post_json

YES, NO = SCORE_SPEC.program.label_token_ids


def post(server, body) -> tuple[int, dict]:
    return post_json(server, "/v1/score", body)


def kserve_scores(server, texts) -> np.ndarray:
    t = thttp.InferInput("TEXT", [len(texts)], "BYTES")
    t.set_data_from_numpy(np.array([x.encode() for x in texts], dtype=object))
    return thttp.InferenceServerClient(server.http_url).infer("fscore", [t]).as_numpy("SCORES")


def test_same_scores_as_kserve(fake_server):
    body = {"query": "query: shoes | item: ", "items": ["trail runner", "desk lamp"], "label_token_ids": [YES, NO],
            "apply_softmax": True}
    status, answer = post(fake_server, body)
    assert status == 200 and answer["model"] == "fscore" and answer["object"] == "scoring"
    want = kserve_scores(fake_server, ["query: shoes | item: trail runner", "query: shoes | item: desk lamp"])
    np.testing.assert_allclose(np.array(answer["scores"]), want, rtol=1e-6, atol=1e-7)
    # Labels in another order, a subset (renormalised: the softmax over the subset's logits), item_first.
    _, swapped = post(fake_server, {**body, "label_token_ids": [NO, YES], "model": "fscore"})
    np.testing.assert_allclose(np.array(swapped["scores"]), want[:, ::-1], rtol=1e-6, atol=1e-7)
    _, subset = post(fake_server, {**body, "label_token_ids": [NO]})
    assert subset["scores"] == [[1.0], [1.0]]
    _, first = post(fake_server, {**body, "items": "trail runner", "item_first": True})
    np.testing.assert_allclose(np.array(first["scores"]),
                               kserve_scores(fake_server, ["trail runnerquery: shoes | item: "]), rtol=1e-6, atol=1e-7)


def test_usage_counts_the_tokens_of_every_sample(fake_server):
    body = {"query": "query: shoes | item: ", "items": ["trail runner", "desk lamp shade"],
            "label_token_ids": [YES, NO], "apply_softmax": True}
    status, answer = post(fake_server, body)
    assert status == 200  # the fake engine's tokens are words: 6 + 7
    assert answer["usage"] == {"prompt_tokens": 13, "completion_tokens": 0, "total_tokens": 13}


@pytest.mark.parametrize("change,message", [
    ({"apply_softmax": False}, "rebuild it"),  # the fake engine gives no vocabulary log-sum-exp, as an old artifact
    ({"apply_softmax": "no"}, "apply_softmax must be true or false"),
    ({"label_token_ids": [YES, 12345]}, "are not labels of this model"),
    ({"items": [[1, 2, 3]]}, "token-id lists with a tokenized query"),
    ({"query": [1, 2]}, "with query as token ids, items must be a non-empty list of token-id lists"),
    ({"model": "fbeam"}, "is a beam model"),
    ({"model": "nope"}, "unknown model 'nope'"),
    ({"items": []}, "non-empty list"),
    ({"top_k": 3, "temperature": 0}, "unknown fields 'temperature', 'top_k'"),
])
def test_what_a_score_artifact_cannot_answer_is_a_json_400(fake_server, change, message):
    body = {"query": "q", "items": ["a"], "label_token_ids": [YES, NO], "apply_softmax": True, **change}
    status, answer = post(fake_server, body)
    assert status == 400 and message in answer["message"] and answer["error"] == answer["message"]
    assert {k: answer[k] for k in ("object", "type", "param", "code")} == {  # SGLang's ErrorResponse
        "object": "error", "type": "BadRequestError", "param": None, "code": 400}
    assert kserve_scores(fake_server, ["still serving"]).shape == (1, 2)


@pytest.fixture(scope="module")
def eager_score(launch, tiny_qwen3_dir, tmp_path_factory):
    """A real server over the eager engine of the tiny Qwen3 (labels " yes", " no", " maybe")."""
    from boundgen.text.tokenizer import Tokenizer
    from tests.server.real import write_eager_artifact

    labels = [" yes", " no", " maybe"]
    ids = list(Tokenizer.from_dir(tiny_qwen3_dir).label_token_ids(labels))
    spec = {"task": "score", "labels": labels, "label_token_ids": ids, "max_samples": 4,
            "max_tokens_per_sample": 32, "max_total_tokens": 128}
    server = launch([write_eager_artifact(tmp_path_factory.mktemp("eager") / "escore", tiny_qwen3_dir, spec, "escore")])
    yield server, ids
    assert server.stop() == 0


def test_both_softmax_modes_on_a_real_engine_equal_hf(eager_score, tiny_qwen3_dir):
    """apply_softmax false: HF's softmax over the whole vocabulary at the labels (FP32); true: the
    softmax over the requested labels' logits; usage: the tokens the model ran."""
    import torch
    from transformers import AutoModelForCausalLM

    from boundgen.text.tokenizer import Tokenizer

    server, ids = eager_score
    query, items = "query: running shoes | item: ", ["trail shoe", "咖啡 拿铁", "desk lamp"]
    wanted = [ids[2], ids[0]]  # a subset, in another order
    body = {"query": query, "items": items, "label_token_ids": wanted}  # apply_softmax: SGLang's default, false
    status, vocab = post(server, body)
    assert status == 200, vocab
    status, labels = post(server, {**body, "apply_softmax": True})
    assert status == 200, labels

    batch = Tokenizer.from_dir(tiny_qwen3_dir).encode_packed([query + i for i in items], max_tokens_per_sample=32,
                                                             template="{text}")
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_qwen3_dir), torch_dtype=torch.float32).eval()
    with torch.no_grad():
        logits = torch.stack([hf(batch.tokens[a:b][None]).logits[0, -1].double()
                              for a, b in zip(batch.cu_seqlens[:-1].tolist(), batch.cu_seqlens[1:].tolist())])
    np.testing.assert_allclose(vocab["scores"], torch.softmax(logits, -1)[:, wanted].numpy(), rtol=1e-4, atol=1e-9)
    np.testing.assert_allclose(labels["scores"], torch.softmax(logits[:, wanted], -1).numpy(), rtol=1e-4, atol=1e-7)
    tokens = int(batch.tokens.shape[0])
    assert vocab["usage"] == labels["usage"] == {"prompt_tokens": tokens, "completion_tokens": 0,
                                                 "total_tokens": tokens}


def test_a_loading_server_answers_503_not_no_model():
    """Before its artifacts are loaded a server knows no model: /v1/score is 503, as infer is."""
    from boundgen.server.config import ServerConfig
    from boundgen.server.metrics import ServerMetrics
    from boundgen.server.models import ModelSet
    from boundgen.server.score_api import pick_model
    from boundgen.server.status import Unavailable

    with pytest.raises(Unavailable, match="still loading"):
        pick_model(ModelSet(ServerConfig(), ServerMetrics()), None)



def test_pre_tokenized_query_and_items_score_as_hf_on_those_ids(eager_score, tiny_qwen3_dir):
    """SGLang's token-id form: query ids + item ids go to the model as they are (no template), as HF
    scores the same ids (FP32, apply_softmax false: the whole vocabulary's softmax at the labels);
    ids outside the vocabulary are 400, never run."""
    import torch
    from transformers import AutoModelForCausalLM

    from boundgen.text.tokenizer import Tokenizer

    server, ids = eager_score
    tok = Tokenizer.from_dir(tiny_qwen3_dir)
    q = tok.encode_packed(["query: running shoes | item: "], 32).tokens.tolist()
    item_ids = [tok.encode_packed([item], 32).tokens.tolist() for item in ["trail shoe", "咖啡 拿铁"]]
    status, by_ids = post(server, {"query": q, "items": item_ids, "label_token_ids": ids[:2]})
    assert status == 200, by_ids
    status, item_first = post(server, {"query": q, "items": item_ids, "label_token_ids": ids[:2], "item_first": True})
    assert status == 200, item_first
    hf = AutoModelForCausalLM.from_pretrained(str(tiny_qwen3_dir), torch_dtype=torch.float32).eval()
    for answer, samples in ((by_ids, [q + i for i in item_ids]), (item_first, [i + q for i in item_ids])):
        with torch.no_grad():
            logits = torch.stack([hf(torch.tensor([s])).logits[0, -1].double() for s in samples])
        np.testing.assert_allclose(answer["scores"], torch.softmax(logits, -1)[:, ids[:2]].numpy(), rtol=1e-4,
                                   atol=1e-9)
        assert answer["usage"]["prompt_tokens"] == sum(map(len, samples))
    status, answer = post(server, {"query": q, "items": [[151_936]], "label_token_ids": ids[:2]})
    assert status == 400 and "outside this model's vocabulary" in answer["message"], answer

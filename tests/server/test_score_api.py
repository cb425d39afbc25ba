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


@pytest.mark.parametrize("change,message", [
    ({"apply_softmax": False}, "apply_softmax must be true"),
    ({"label_token_ids": [YES, 12345]}, "are not labels of this model"),
    ({"items": [[1, 2, 3]]}, "pre-tokenized items are not supported"),
    ({"query": [1, 2]}, "pre-tokenized queries are not supported"),
    ({"model": "fbeam"}, "is a beam model"),
    ({"model": "nope"}, "unknown model 'nope'"),
    ({"items": []}, "non-empty list"),
])
def test_what_a_score_artifact_cannot_answer_is_a_json_400(fake_server, change, message):
    body = {"query": "q", "items": ["a"], "label_token_ids": [YES, NO], "apply_softmax": True, **change}
    status, answer = post(fake_server, body)
    assert status == 400 and message in answer["error"]
    assert kserve_scores(fake_server, ["still serving"]).shape == (1, 2)


def test_a_loading_server_answers_503_not_no_model():
    """Before its artifacts are loaded a server knows no model: /v1/score is 503, as infer is."""
    from boundgen.server.config import ServerConfig
    from boundgen.server.metrics import ServerMetrics
    from boundgen.server.models import ModelSet
    from boundgen.server.score_api import pick_model
    from boundgen.server.status import Unavailable

    with pytest.raises(Unavailable, match="still loading"):
        pick_model(ModelSet(ServerConfig(), ServerMetrics()), None)

"""`POST /v1/score`: SGLang's score request shape on a score artifact, the migration path for
users of SGLang's (and vLLM's) scoring route. KServe v2 `infer` stays the fast path: this route
builds the same request and runs it through the same admission and engine.

    request   {"query": "...", "items": ["...", ...] | "...", "label_token_ids": [id, ...],
               "apply_softmax": true, "item_first": false, "model": "name"}
    response  {"scores": [[p per label id, ...] per item], "model": "name", "object": "scoring",
               "usage": {"prompt_tokens": null, "total_tokens": null}}

Each item's text is query + item (item + query with `item_first`), scored as one sample. A
score artifact computes the softmax over its own label tokens, so `label_token_ids` must be
some of the artifact's labels (any order): the scores are the artifact's probabilities of those
labels renormalised over them, which is exactly the softmax over their logits
(`apply_softmax: true`). `apply_softmax: false` (probabilities over the whole vocabulary) and
pre-tokenized query or items are refused with 400, saying so. `model` may be left out when the
server holds one score model.

Bounds come before work: more items than the model's max_samples are refused by their count
(400 naming the limit) before any text is built or encoded, and a text that is not valid
Unicode (a lone surrogate, which JSON's \\ud800 escapes can carry) is 400 naming the item.
"""

from __future__ import annotations

import numpy as np

from boundgen.errors import InvalidInput
from boundgen.server.models import LOADING
from boundgen.server.status import Unavailable
from boundgen.server.tensors import Tensor

ROUTE = "/v1/score"


def parse(obj) -> dict:
    """The request's fields, checked (InvalidInput naming what is wrong)."""
    if not isinstance(obj, dict):
        raise InvalidInput("a /v1/score request is a JSON object with query, items and label_token_ids")
    query, items = obj.get("query"), obj.get("items")
    if not isinstance(query, str):
        raise InvalidInput("query must be a text (pre-tokenized queries are not supported: send the text)")
    items = [items] if isinstance(items, str) else items
    if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
        raise InvalidInput("items must be a text or a non-empty list of texts (pre-tokenized items are not "
                           "supported: send the texts)")
    ids = obj.get("label_token_ids")
    if (not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
            or len(set(ids)) != len(ids)):
        raise InvalidInput("label_token_ids must be a non-empty list of distinct token ids")
    if obj.get("apply_softmax", False) is not True:
        raise InvalidInput("apply_softmax must be true: a boundgen score artifact gives the softmax over its "
                           "label tokens, not probabilities over the whole vocabulary")
    item_first = obj.get("item_first", False)
    if not isinstance(item_first, bool):
        raise InvalidInput("item_first must be true or false")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("model must be a model name")
    return {"query": query, "items": items, "item_first": item_first, "label_token_ids": ids, "model": model}


def pick_model(models, requested: str | None) -> str:
    """The model to score with: the one named, else the server's only score model (also when
    named "default", SGLang's name for the model a server was started with)."""
    if models.state == LOADING:  # its models are not known yet: 503, not "no score model here"
        raise Unavailable("the server is still loading its models")
    if requested == "default" and "default" not in models.models:
        requested = None
    return models.pick(requested, "score", ROUTE)


def text_tensor(parsed: dict, model: str, max_samples: int) -> Tensor:
    """TEXT [N] of a parsed request: its items (at most `max_samples`, model `model`'s bound,
    checked before any text is built), each joined with the query, as UTF-8."""
    items, query = parsed["items"], parsed["query"]
    if len(items) > max_samples:
        raise InvalidInput(f"items has {len(items)} texts, over the limit of {max_samples} per request "
                           f"(max_samples of model {model})")
    query_bytes = utf8(query, "query")
    parts = [utf8(item, f"items[{i}]") for i, item in enumerate(items)]
    texts = [part + query_bytes if parsed["item_first"] else query_bytes + part for part in parts]
    return Tensor("TEXT", "BYTES", (len(texts),), texts)


def utf8(text: str, where: str) -> bytes:
    """`text` as UTF-8; 400 naming `where` for one that cannot be (a lone surrogate from a JSON escape)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{where} is not valid UTF-8 text: it holds a lone surrogate "
                           f"({text[exc.start]!r} at character {exc.start})") from None


def scores(probs: np.ndarray, artifact_ids: list[int], wanted: list[int]) -> list[list[float]]:
    """The artifact's label probabilities [N, L] -> the wanted labels' softmax, in their order."""
    missing = [i for i in wanted if i not in artifact_ids]
    if missing:
        raise InvalidInput(f"label_token_ids {missing} are not labels of this model; its labels are {artifact_ids}")
    columns = probs[:, [artifact_ids.index(i) for i in wanted]].astype(np.float64)
    return (columns / columns.sum(axis=1, keepdims=True)).tolist()


def response(model: str, values: list[list[float]]) -> dict:
    return {"scores": values, "model": model, "object": "scoring",
            "usage": {"prompt_tokens": None, "total_tokens": None}}

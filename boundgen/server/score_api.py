"""`POST /v1/score`: SGLang's score request shape on a score artifact, the migration path for
users of SGLang's (and vLLM's) scoring route. Its samples go to the engine as KServe v2 `infer`'s
would (the same checks, admission and engine: signature.Signature.call, models.ModelSet.run),
without being made into tensors.

    request   {"query": "...", "items": ["...", ...] | "...", "label_token_ids": [id, ...],
               "apply_softmax": false, "item_first": false, "model": "name"}
    response  {"scores": [[p per label id, ...] per item], "model": "name", "object": "scoring",
               "usage": {"prompt_tokens": n, "completion_tokens": 0, "total_tokens": n}}
    error     {"object": "error", "message": "...", "type": "BadRequestError", "param": null,
               "code": 400, "error": "..."}    SGLang's ErrorResponse ("error" too, as on every route)

Each item's text is query + item (item + query with `item_first`), scored as one sample;
`label_token_ids` must be some of the artifact's labels (any order):
- `apply_softmax: false` (SGLang's default): each label's probability over the whole vocabulary,
  the softmax over all V next-token logits read at the label id, exp(label_logit - lse) from the
  program's FP32 outputs (KServe output LABEL_LOGPROBS). An artifact built before the program
  gave the vocabulary log-sum-exp (or with an MLP head) is refused with 400 saying to rebuild.
- `apply_softmax: true`: the softmax over the requested labels' logits, i.e. the artifact's label
  probabilities renormalised over the requested ones.
`usage.prompt_tokens` counts the tokens of all samples as the model ran them (its template
included; KServe output NUM_TOKENS). Pre-tokenized query or items (lists of ids) are refused
with 400 saying so (the engine takes texts). Unknown fields are 400 naming them. `model` may be
left out (or be SGLang's "default") when the server holds one score model.

Bounds come before work: more items than the model's max_samples are refused by their count
(400 naming the limit) before any text is built or encoded, and a text that is not valid
Unicode (a lone surrogate, which JSON's \\ud800 escapes can carry) is 400 naming the item.
"""

from __future__ import annotations

import json

import numpy as np
from aiohttp import web

from boundgen.errors import InvalidInput
from boundgen.server import http_bodies
from boundgen.server.models import LOADING
from boundgen.server.signature import REBUILD, EngineCall
from boundgen.server.status import Unavailable, status_of
from boundgen.text.utf8 import utf8

ROUTE = "/v1/score"
FIELDS = ("query", "items", "label_token_ids", "apply_softmax", "item_first", "model")
# SGLang's error "type" by HTTP status (OpenAI's names), for clients that branch on it.
ERROR_TYPES = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError", 429: "RateLimitError",
               503: "ServiceUnavailableError", 504: "TimeoutError"}


def parse(obj) -> dict:
    """The request's fields, checked (InvalidInput naming what is wrong)."""
    if not isinstance(obj, dict):
        raise InvalidInput("a /v1/score request is a JSON object with query, items and label_token_ids")
    unknown = sorted(k for k in obj if k not in FIELDS)
    if unknown:
        raise InvalidInput(f"a /v1/score request has unknown fields {', '.join(map(repr, unknown))}; "
                           f"it takes {', '.join(FIELDS)}")
    query, items = obj.get("query"), obj.get("items")
    # SGLang's two forms: texts (query str, items str or [str]) or token ids (query [int], items [[int]]):
    # token ids go to the model as they are, query and item ids concatenated, without a template.
    tokenized = _token_ids(query)
    if tokenized:
        if not isinstance(items, list) or not items or not all(_token_ids(i) for i in items):
            raise InvalidInput("with query as token ids, items must be a non-empty list of token-id lists")
    else:
        if not isinstance(query, str):
            raise InvalidInput("query must be a text, or a non-empty list of token ids")
        items = [items] if isinstance(items, str) else items
        if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
            raise InvalidInput("items must be a text or a non-empty list of texts (token-id lists with a "
                               "tokenized query)")
    ids = obj.get("label_token_ids")
    if (not isinstance(ids, list) or not ids or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids)
            or len(set(ids)) != len(ids)):
        raise InvalidInput("label_token_ids must be a non-empty list of distinct token ids")
    apply_softmax, item_first = obj.get("apply_softmax", False), obj.get("item_first", False)
    if not isinstance(apply_softmax, bool):
        raise InvalidInput("apply_softmax must be true or false")
    if not isinstance(item_first, bool):
        raise InvalidInput("item_first must be true or false")
    model = obj.get("model")
    if model is not None and not isinstance(model, str):
        raise InvalidInput("model must be a model name")
    return {"query": query, "items": items, "item_first": item_first, "label_token_ids": ids,
            "apply_softmax": apply_softmax, "model": model, "tokenized": tokenized}


def _token_ids(value) -> bool:
    """Whether `value` is a pre-tokenized text: a non-empty list of integers."""
    return isinstance(value, list) and bool(value) and all(isinstance(i, int) and not isinstance(i, bool)
                                                           for i in value)


def pick_model(models, requested: str | None) -> str:
    """The model to score with: the one named, else the server's only score model (also when
    named "default", SGLang's name for the model a server was started with)."""
    if models.state == LOADING:  # its models are not known yet: 503, not "no score model here"
        raise Unavailable("the server is still loading its models")
    if requested == "default" and "default" not in models.models:
        requested = None
    return models.pick(requested, "score", ROUTE)


def text_items(parsed: dict, model: str, max_samples: int) -> list[bytes]:
    """The samples of a parsed request: its items (at most `max_samples`, model `model`'s bound,
    checked before any text is built), each joined with the query, as UTF-8."""
    items, query = parsed["items"], parsed["query"]
    if len(items) > max_samples:
        raise InvalidInput(f"items has {len(items)} texts, over the limit of {max_samples} per request "
                           f"(max_samples of model {model})")
    query_bytes = utf8(query, "query")
    parts = [utf8(item, f"items[{i}]") for i, item in enumerate(items)]
    return [part + query_bytes if parsed["item_first"] else query_bytes + part for part in parts]


def token_call(parsed: dict, model: str, max_samples: int) -> EngineCall:
    """A tokenized request's samples (query ids + item ids, or item + query with item_first), as the
    engine call that runs them; the count is checked before any sample is built."""
    items, query = parsed["items"], list(parsed["query"])
    if len(items) > max_samples:
        raise InvalidInput(f"items has {len(items)} token-id lists, over the limit of {max_samples} per request "
                           f"(max_samples of model {model})")
    samples = tuple(tuple(item + query if parsed["item_first"] else query + item) for item in items)
    return EngineCall("score", (), token_ids=samples)


async def run(models, name: str, parsed: dict, deadline: float) -> dict:
    """The response body of a parsed request on score model `name`: one engine call of its samples
    through `models.run` (admission, deadline, engine), its result turned into SGLang's answer."""
    model = models.get(name, "")  # the one run() runs on: no await between (repository.py)
    vocab = not parsed["apply_softmax"]
    if vocab and "LABEL_LOGPROBS" not in [t.name for t in model.signature.outputs]:
        raise InvalidInput(f"apply_softmax false (probabilities over the whole vocabulary) is not available on "
                           f"model {name}: {REBUILD}; or send apply_softmax true")
    max_samples = model.signature.max_samples
    if parsed["tokenized"]:
        call = token_call(parsed, name, max_samples)
    else:
        call = model.signature.call(text_items(parsed, name, max_samples))
    result = await models.run(name, call, deadline)
    if result.num_tokens is None:
        raise InvalidInput(f"model {name} does not report token counts")
    if vocab and result.label_logprobs is None:
        raise InvalidInput(f"model {name} gave no vocabulary log-probabilities: {REBUILD}")
    values = np.asarray(result.label_logprobs if vocab else result.scores, dtype=np.float32)
    labels = list(model.engine.spec.program.label_token_ids)
    if vocab:
        table = vocab_scores(values, labels, parsed["label_token_ids"])
    else:
        table = scores(values, labels, parsed["label_token_ids"])
    return response(name, table, int(np.asarray(result.num_tokens, dtype=np.int64).sum()))


def _columns(values: np.ndarray, artifact_ids: list[int], wanted: list[int]) -> np.ndarray:
    missing = [i for i in wanted if i not in artifact_ids]
    if missing:
        raise InvalidInput(f"label_token_ids {missing} are not labels of this model; its labels are {artifact_ids}")
    return values[:, [artifact_ids.index(i) for i in wanted]].astype(np.float64)


def scores(probs: np.ndarray, artifact_ids: list[int], wanted: list[int]) -> list[list[float]]:
    """The artifact's label probabilities [N, L] -> the wanted labels' softmax, in their order."""
    columns = _columns(probs, artifact_ids, wanted)
    return (columns / columns.sum(axis=1, keepdims=True)).tolist()


def vocab_scores(logprobs: np.ndarray, artifact_ids: list[int], wanted: list[int]) -> list[list[float]]:
    """The labels' log-probabilities over the whole vocabulary [N, L] -> the wanted labels'
    probabilities, in their order (not renormalised: they sum to at most 1)."""
    return np.exp(_columns(logprobs, artifact_ids, wanted)).tolist()


def response(model: str, values: list[list[float]], prompt_tokens: int | None = None) -> dict:
    return {"scores": values, "model": model, "object": "scoring",
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 0, "total_tokens": prompt_tokens}}


def error_response(exc: BaseException) -> web.Response:
    """SGLang's error body (its ErrorResponse: object, message, type, param, code) with the status
    of `exc` (status.py), and "error" as every boundgen route answers it; otherwise the response
    of every route (http_bodies.error_response: logging, closing after an unread body)."""
    response = http_bodies.error_response(exc)
    status = status_of(exc)
    response.text = json.dumps({"object": "error", "message": status.message,
                                "type": ERROR_TYPES.get(status.http, "InternalServerError"), "param": None,
                                "code": status.http, "error": status.message})
    return response

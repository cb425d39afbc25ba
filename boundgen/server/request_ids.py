"""Request ids: one per request, the client's own when it sends one, echoed back and logged.

    HTTP   request header `X-Request-ID`        -> response header `X-Request-ID` on every answer,
                                                   errors included (kserve/http_api.py's middleware)
    gRPC   metadata `x-request-id`              -> trailing metadata `x-request-id` on every call,
                                                   errors included (kserve/grpc_api.py)

A client's id is kept when it is 1 to MAX_LENGTH printable ASCII characters without spaces (what
proxies such as Envoy and nginx send: a UUID or similar); anything else, or none, is replaced by
a new uuid4 hex, so that what reaches the access log and the answer is always one plain token.
The id of the request being handled is a context variable (`current()`), set where the request
enters (each HTTP request and gRPC call runs in its own asyncio task): the access log
(logs.access) reads it without every layer in between passing it on.
"""

from __future__ import annotations

import re
import uuid
from contextvars import ContextVar
from dataclasses import dataclass

HEADER = "X-Request-ID"
METADATA_KEY = "x-request-id"  # gRPC metadata keys are lower case
MAX_LENGTH = 128
MAX_ROUTE = 256  # a logged route (an HTTP path) is cut to this many characters
_TOKEN = re.compile(r"[\x21-\x7e]{1,%d}" % MAX_LENGTH)


@dataclass(frozen=True)
class RequestTag:
    """What the access log says about the request being handled besides its outcome."""

    id: str
    route: str  # HTTP "POST /v2/models/m/infer"; gRPC "/inference.GRPCInferenceService/ModelInfer"
    protocol: str  # "http" | "grpc"


_CURRENT: ContextVar[RequestTag | None] = ContextVar("boundgen_request", default=None)


def request_id(given: str | None) -> str:
    """The id to use for a request that brought `given` (None: none): it, if it is one token of
    printable ASCII up to MAX_LENGTH characters, else a new uuid4 hex."""
    if given and _TOKEN.fullmatch(given):
        return given
    return uuid.uuid4().hex


def begin(given: str | None, route: str, protocol: str) -> RequestTag:
    """Tag the request being handled in this task (and the tasks it starts) from here on."""
    tag = RequestTag(request_id(given), route[:MAX_ROUTE], protocol)
    _CURRENT.set(tag)
    return tag


def enter(tag: RequestTag) -> None:
    """Tag the request being handled here with an existing tag (a stream's request, a call counted late)."""
    _CURRENT.set(tag)


def current() -> RequestTag | None:
    """The tag of the request being handled, None outside one."""
    return _CURRENT.get()


def from_metadata(metadata) -> str | None:
    """The `x-request-id` value of gRPC invocation metadata (pairs of key and value), if any."""
    for key, value in metadata or ():
        if key == METADATA_KEY and isinstance(value, str):
            return value
    return None

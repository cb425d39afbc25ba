"""Request ids: one per request, the client's own when it sends one, echoed back and logged;
and who sent the request (its client key), whose turn in a model's queue it takes.

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

The client key (serve --client-key, `client_key`): by default (`address-id`) the client's own
id, header `X-Client-ID` / metadata `x-client-id` (one token, as a request id), as one client of
its address's group, else its address without the port (HTTP and gRPC alike), so that the
connections of one host are one client. Queues take the hosts in turn, then a host's clients
(runtime/fair_queue.py): clients behind one proxy share its address and tell themselves apart
with their ids, and a host that sends many ids gets one turn among the hosts, however many ids it
claims. `id` takes the id alone (each id its own turn among all: what a server behind several
proxies whose clients must not share a turn by proxy needs); `address` the address alone. The
address also travels beside the key (`RequestTag.source`): a host refused many times in a moment
gets its refusals held back whatever ids it sends (server/admission.py `RecentRefusals`).
"""

from __future__ import annotations

import re
import uuid
from contextvars import ContextVar
from dataclasses import dataclass

from boundgen.runtime.fair_queue import within

CLIENT_KEYS = ("address-id", "id", "address")  # serve --client-key; the first is the default
DEFAULT_CLIENT_KEY = CLIENT_KEYS[0]

HEADER = "X-Request-ID"
METADATA_KEY = "x-request-id"  # gRPC metadata keys are lower case
CLIENT_HEADER = "X-Client-ID"
CLIENT_METADATA_KEY = "x-client-id"
MAX_LENGTH = 128
MAX_ROUTE = 256  # a logged route (an HTTP path) is cut to this many characters
_TOKEN = re.compile(r"[\x21-\x7e]{1,%d}" % MAX_LENGTH)


@dataclass(frozen=True)
class RequestTag:
    """What the access log says about the request being handled besides its outcome."""

    id: str
    route: str  # HTTP "POST /v2/models/m/infer"; gRPC "/inference.GRPCInferenceService/ModelInfer"
    protocol: str  # "http" | "grpc"
    client: str = ""  # who sent it: its client key (client_key; "" unknown)
    source: str = ""  # the address it came from, whatever id it claims ("" unknown)


_CURRENT: ContextVar[RequestTag | None] = ContextVar("boundgen_request", default=None)


def request_id(given: str | None) -> str:
    """The id to use for a request that brought `given` (None: none): it, if it is one token of
    printable ASCII up to MAX_LENGTH characters, else a new uuid4 hex."""
    if given and _TOKEN.fullmatch(given):
        return given
    return uuid.uuid4().hex


def client_key(given: str | None, address: str | None, by: str = DEFAULT_CLIENT_KEY) -> str:
    """Who sent a request that brought client id `given` from `address` (a host, no port), by serve
    --client-key: "address-id", the id as a client of its address's group when it is one token
    (runtime/fair_queue.py `within`: hosts take turns, then a host's ids), else the address; "id",
    the id alone when it is one token, else the address; "address", the address."""
    if by != "address" and given and _TOKEN.fullmatch(given):
        return f"id:{given}" if by == "id" else within(address or "", f"id:{given}")
    return address or ""


def grpc_peer_host(peer: str | None) -> str:
    """The host of a gRPC peer ("ipv4:127.0.0.1:5000" -> "127.0.0.1", "ipv6:[::1]:5000" -> "::1"),
    as HTTP's remote address names it."""
    if not peer:
        return ""
    kind, _, address = peer.partition(":")
    if kind not in ("ipv4", "ipv6"):
        return peer  # a Unix socket: its path
    host = address.rsplit(":", 1)[0]
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def begin(given: str | None, route: str, protocol: str, client: str = "", source: str = "") -> RequestTag:
    """Tag the request being handled in this task (and the tasks it starts) from here on;
    `client`: its client key (`client_key`); `source`: its address (a host, no port)."""
    tag = RequestTag(request_id(given), route[:MAX_ROUTE], protocol, client, source)
    _CURRENT.set(tag)
    return tag


def enter(tag: RequestTag) -> None:
    """Tag the request being handled here with an existing tag (a stream's request, a call counted late)."""
    _CURRENT.set(tag)


def current() -> RequestTag | None:
    """The tag of the request being handled, None outside one."""
    return _CURRENT.get()


def from_metadata(metadata, key: str = METADATA_KEY) -> str | None:
    """The `key` (`x-request-id`) value of gRPC invocation metadata (pairs of key and value), if any."""
    for name, value in metadata or ():
        if name == key and isinstance(value, str):
            return value
    return None

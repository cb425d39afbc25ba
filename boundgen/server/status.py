"""What a failed request tells its client: one error class per outcome, with its HTTP status and gRPC code.

`InvalidInput` (boundgen/errors.py) is raised by the tensor decoding, the model signature and
the engine alike; the server maps it here to 400 / INVALID_ARGUMENT. The engine raises
`boundgen.errors.DeadlineExceeded` for a request whose deadline passed while it waited inside
the engine (runtime/batcher.py), and the server raises the same class where a deadline passes
in admission or after the call: 504 / DEADLINE_EXCEEDED. `boundgen.errors.Cancelled` is raised
only for a request whose client has gone (admission.py sets its `cancelled` event), so no answer
reaches anyone; it maps to outcome `cancelled` (gRPC CANCELLED; HTTP 499, nginx's "client closed
request") without a log line. Everything else a request can hit is a `ServeError` below. The
`outcome` names are the `outcome` label of the request counter in metrics.py.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import grpc

from boundgen import errors
from boundgen.errors import DeadlineExceeded, InvalidInput  # DeadlineExceeded: the one class, server's and engine's

log = logging.getLogger("boundgen.server")


class ServeError(Exception):
    """A request the server answers with an error status; the message is shown to the client."""

    outcome = "internal_error"


class Overloaded(ServeError, errors.Overloaded):
    """The model's queue is full: rejected at once, or the newest request of a client holding more
    than its share of the queue gave its place to another client's (runtime/fair_queue.py)."""

    outcome = "rejected"


def check_deadline(deadline: float, model: str) -> None:
    """Raise DeadlineExceeded if `deadline` (monotonic seconds) has passed: a front end's last look
    before it sends a success it encoded after the model returned, so none is sent late."""
    late = time.monotonic() - deadline
    if late > 0:
        raise DeadlineExceeded(f"the answer of model {model} was ready {late * 1e3:.1f} ms after the request's "
                               "deadline; it was dropped")


class Unavailable(ServeError):
    """The server is still loading, or draining before shutdown."""

    outcome = "unavailable"


class ReadTimeout(ServeError):
    """The HTTP request body did not arrive in full within --read-timeout-s (HTTP only)."""

    outcome = "read_timeout"


class Unauthenticated(ServeError):
    """The API key is missing or wrong."""

    outcome = "unauthenticated"


class Unsupported(ServeError):
    """A protocol feature this server does not offer, or not as started (CUDA shared memory;
    client shared memory without --allow-client-shm; tracing): 501 / UNIMPLEMENTED with the reason,
    as Triton answers a feature it lacks."""

    outcome = "unsupported"


@dataclass(frozen=True)
class Status:
    http: int
    grpc: grpc.StatusCode
    outcome: str
    message: str


_CODES = {
    "invalid_input": (400, grpc.StatusCode.INVALID_ARGUMENT),
    "rejected": (429, grpc.StatusCode.RESOURCE_EXHAUSTED),
    "deadline_exceeded": (504, grpc.StatusCode.DEADLINE_EXCEEDED),
    "unavailable": (503, grpc.StatusCode.UNAVAILABLE),
    "unauthenticated": (401, grpc.StatusCode.UNAUTHENTICATED),
    "cancelled": (499, grpc.StatusCode.CANCELLED),
    "read_timeout": (408, grpc.StatusCode.DEADLINE_EXCEEDED),
    "not_supported": (400, grpc.StatusCode.UNAVAILABLE),  # as Triton answers a repository load it does not allow
    "unsupported": (501, grpc.StatusCode.UNIMPLEMENTED),
    "internal_error": (500, grpc.StatusCode.INTERNAL),
}


def answered(outcome: str, protocol: str) -> int | str:
    """What a request with `outcome` was answered: over HTTP the status (200 for a success), over
    gRPC the code's name ("OK", "INVALID_ARGUMENT"); what the access log records."""
    http, code = (200, grpc.StatusCode.OK) if outcome == "success" else _CODES.get(outcome, _CODES["internal_error"])
    return http if protocol == "http" else code.name


def status_of(exc: BaseException) -> Status:
    """The status a client gets for `exc`; unexpected exceptions become 500 / INTERNAL."""
    if isinstance(exc, InvalidInput):
        outcome, message = "invalid_input", str(exc)
    elif isinstance(exc, ServeError):
        outcome, message = exc.outcome, str(exc)
    elif isinstance(exc, errors.Overloaded):  # the engine process's queue (server/deploy/engine_host.py)
        outcome, message = "rejected", str(exc)
    elif isinstance(exc, errors.DeadlineExceeded):  # the engine's: it waited inside the engine, not run
        outcome, message = "deadline_exceeded", str(exc)
    elif isinstance(exc, errors.Cancelled):  # the client went away; the answer reaches nobody
        outcome, message = "cancelled", str(exc)
    else:
        outcome, message = "internal_error", f"internal error: {type(exc).__name__}: {exc}"
    http, code = _CODES[outcome]
    return Status(http, code, outcome, message)


def answer_status(exc: BaseException) -> Status:
    """`status_of(exc)` for a front end about to answer with it: an internal error is logged first,
    with its traceback, since the client sees only its one-line message."""
    status = status_of(exc)
    if status.outcome == "internal_error":
        log.error("internal error", exc_info=exc)
    return status

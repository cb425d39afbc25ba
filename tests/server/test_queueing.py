"""Admission through a real server: full queue 429, deadline in the queue 504 (never run),
deadline passing inside the engine 504 (never run), late answers dropped, cancel and disconnect
free their place, and reach the engine (a request cancelled while it waits there never runs).
One slot, one queue place; requests are held running with the fake engine's `hold=FILE` until
the test releases them.
The default deadline (30 s) is far beyond every wait here, so a freed place is the client's doing."""

from __future__ import annotations

import socket
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from tests.server.conftest import INFLIGHT, QUEUED, SCORE_SPEC, metric, wait_metric
from tests.server.fake_engine import read_events, read_log, wait_for_event, write_fake_artifact


@pytest.fixture
def pool():
    with ThreadPoolExecutor(8) as executor:
        yield executor


class Hold:
    """A text that keeps its engine call running until `release()`."""

    def __init__(self, root):
        self.path = root / f"release-{uuid.uuid4().hex}"
        self.text = f"hold={self.path}"

    def release(self):
        self.path.touch()


def http_infer(server, text, timeout_us=None):
    t = thttp.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([text.encode()], dtype=object))
    return thttp.InferenceServerClient(server.http_url, network_timeout=60).infer("fscore", [t], timeout=timeout_us)


def grpc_input(text):
    t = tgrpc.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([text.encode()], dtype=object))
    return t


def grpc_infer(server, text, client_timeout=None, timeout_us=None):
    return tgrpc.InferenceServerClient(server.grpc_url).infer("fscore", [grpc_input(text)], timeout=timeout_us,
                                                             client_timeout=client_timeout)


def ran(server, text) -> bool:
    return any(text in call["texts"] for call in read_log(server.log))


def send_and_leave(server, text) -> socket.socket:
    """An HTTP infer request on a raw connection, which the caller closes to disconnect."""
    body = ('{"inputs":[{"name":"TEXT","datatype":"BYTES","shape":[1],"data":["%s"]}]}' % text).encode()
    sock = socket.create_connection((server.host, server.http_port), timeout=10)
    sock.sendall(b"POST /v2/models/fscore/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    return sock


def occupy(server, pool):
    """Start a held request and wait until it is running in the engine (admitted is not enough: the
    next request must find the engine's worker taken); returns (hold, future)."""
    hold = Hold(server.root)
    future = pool.submit(http_infer, server, hold.text)
    wait_metric(server, INFLIGHT, 1)
    wait_for_event(server.log, hold.text, "started")
    return hold, future


def test_full_queue_rejects_at_once(one_slot, pool):
    a, fa = occupy(one_slot, pool)
    b = Hold(one_slot.root)
    fb = pool.submit(grpc_infer, one_slot, b.text)
    wait_metric(one_slot, QUEUED, 1)
    with pytest.raises(InferenceServerException) as http_err:
        http_infer(one_slot, "rejected over http")
    assert http_err.value.status() == "429" and "at capacity" in http_err.value.message()
    with pytest.raises(InferenceServerException) as grpc_err:
        grpc_infer(one_slot, "rejected over grpc")
    assert grpc_err.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    b.release()
    a.release()
    assert fa.result(30).as_numpy("SCORES").shape == (1, 2)
    assert fb.result(30).as_numpy("SCORES").shape == (1, 2)
    assert not ran(one_slot, "rejected over http") and not ran(one_slot, "rejected over grpc")


def expect_deadline_exceeded(server, text: str, protocol: str) -> str | None:
    """Send `text` with a 150 ms deadline the way `protocol` says; it must fail with 504 /
    DEADLINE_EXCEEDED. Returns the server's message (None where the gRPC client gave up first
    and wrote its own)."""
    with pytest.raises(InferenceServerException) as err:
        if protocol == "http":
            http_infer(server, text, timeout_us=150_000)
        elif protocol == "grpc-timeout-parameter":
            grpc_infer(server, text, timeout_us=150_000)
        else:
            grpc_infer(server, text, client_timeout=0.15)
    expected = "504" if protocol == "http" else "StatusCode.DEADLINE_EXCEEDED"
    assert err.value.status() == expected, err.value
    return None if protocol == "grpc-deadline" else err.value.message()


@pytest.mark.parametrize("protocol", ["http", "grpc-timeout-parameter", "grpc-deadline"])
def test_deadline_in_queue_is_504_and_never_runs(one_slot, pool, protocol):
    a, fa = occupy(one_slot, pool)
    text = f"expires in queue {protocol}"
    message = expect_deadline_exceeded(one_slot, text, protocol)
    if message is not None:
        assert "not run" in message
    wait_metric(one_slot, QUEUED, 0)
    a.release()
    fa.result(30)
    assert not ran(one_slot, text)


@pytest.fixture(scope="module")
def busy_engine(launch, tmp_path_factory):
    """Two admission slots over an engine that runs one call at once (as a batching engine with
    one context): the second admitted request waits inside the engine."""
    root = tmp_path_factory.mktemp("busy_engine")
    log = root / "calls.jsonl"
    server = launch([write_fake_artifact(root / "fscore", SCORE_SPEC, log=log, workers=1)],
                    args=["--max-inflight", "2", "--max-queue", "1", "--default-timeout-ms", "30000"])
    server.log, server.root = log, root
    yield server
    assert server.stop() == 0


@pytest.mark.parametrize("protocol", ["http", "grpc-timeout-parameter", "grpc-deadline"])
def test_deadline_inside_the_engine_is_504_and_never_runs(busy_engine, pool, protocol):
    """The server hands the deadline to the engine: a request admitted but waiting inside the
    engine is not run once it expires, and answers 504 before the busy call ends."""
    expired = f'boundgen_requests_total{{model="fscore",outcome="deadline_exceeded",protocol="{protocol[:4]}"}}'
    before = metric(busy_engine, expired)
    a, fa = occupy(busy_engine, pool)
    text = f"expires inside the engine {protocol}"
    message = expect_deadline_exceeded(busy_engine, text, protocol)
    if message is not None:
        assert "waiting for a worker" in message and "not run" in message
    wait_metric(busy_engine, expired, before + 1)
    a.release()
    assert fa.result(30).as_numpy("SCORES").shape == (1, 2)
    # A few quick calls: the held call (~150 ms, the deadline above, plus polling) enters the admission's
    # moving average of compute time, and the next variant's 150 ms request must not be refused
    # before the engine for looking too short (a margin of a few ms without these).
    for _ in range(3):
        assert http_infer(busy_engine, "has time left", timeout_us=20_000_000).as_numpy("SCORES").shape == (1, 2)
    assert not ran(busy_engine, text) and ran(busy_engine, "has time left")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cancel_inside_the_engine_never_runs(busy_engine, pool, protocol):
    """The server hands the client's cancellation to the engine: a request admitted but waiting
    inside the busy engine leaves it unrun once its client goes away, and its slot frees while
    the busy call still runs."""
    cancelled = f'boundgen_requests_total{{model="fscore",outcome="cancelled",protocol="{protocol}"}}'
    before = metric(busy_engine, cancelled)
    a, fa = occupy(busy_engine, pool)
    text = f"cancelled inside the engine {protocol}"
    if protocol == "http":
        with send_and_leave(busy_engine, text):
            wait_for_event(busy_engine.log, text, "waiting")
    else:
        client = tgrpc.InferenceServerClient(busy_engine.grpc_url)
        call = client.async_infer("fscore", [grpc_input(text)], callback=lambda result, error: None)
        wait_for_event(busy_engine.log, text, "waiting")
        call.cancel()
    wait_metric(busy_engine, INFLIGHT, 1)  # its engine call returned while `a` still holds the engine
    refused = [r["error"] for r in read_events(busy_engine.log, "refused") if text in r["texts"]]
    assert refused == ["Cancelled"]
    wait_metric(busy_engine, cancelled, before + 1)
    a.release()
    assert fa.result(30).as_numpy("SCORES").shape == (1, 2)
    assert not ran(busy_engine, text)


def test_answer_after_deadline_is_504(fake_server):
    """Runs on the shared server, whose fast engine's compute estimate lets the request start."""
    with pytest.raises(InferenceServerException) as err:
        http_infer(fake_server, "sleep=0.3 too slow", timeout_us=100_000)
    assert err.value.status() == "504" and "after the request's deadline" in err.value.message()


def test_http_disconnect_while_queued_frees_the_place(one_slot, pool):
    a, fa = occupy(one_slot, pool)
    with send_and_leave(one_slot, "gone while queued"):
        wait_metric(one_slot, QUEUED, 1)
    wait_metric(one_slot, QUEUED, 0)  # the server noticed the client leave
    c = Hold(one_slot.root)
    fc = pool.submit(http_infer, one_slot, c.text)  # would be 429 if the place were still taken
    wait_metric(one_slot, QUEUED, 1)
    a.release()
    c.release()
    fa.result(30), fc.result(30)
    assert not ran(one_slot, "gone while queued")


def test_grpc_cancel_while_queued_frees_the_place(one_slot, pool):
    a, fa = occupy(one_slot, pool)
    client = tgrpc.InferenceServerClient(one_slot.grpc_url)
    results = []
    ctx = client.async_infer("fscore", [grpc_input("cancelled while queued")], callback=lambda r, e: results.append(e))
    wait_metric(one_slot, QUEUED, 1)
    ctx.cancel()
    wait_metric(one_slot, QUEUED, 0)
    c = Hold(one_slot.root)
    fc = pool.submit(grpc_infer, one_slot, c.text)
    wait_metric(one_slot, QUEUED, 1)
    a.release()
    c.release()
    fa.result(30), fc.result(30)
    assert not ran(one_slot, "cancelled while queued")


def test_disconnect_while_running_holds_the_slot_until_done(one_slot, pool):
    cancelled = 'boundgen_requests_total{model="fscore",outcome="cancelled",protocol="http"}'
    before = metric(one_slot, cancelled)
    a = Hold(one_slot.root)
    with send_and_leave(one_slot, a.text):
        wait_metric(one_slot, INFLIGHT, 1)
    b = Hold(one_slot.root)
    fb = pool.submit(http_infer, one_slot, b.text)
    wait_metric(one_slot, QUEUED, 1)  # the engine is still busy with the abandoned request
    a.release()
    b.release()
    assert fb.result(30).as_numpy("SCORES").shape == (1, 2)
    calls = [c["texts"][0] for c in read_log(one_slot.log)]
    assert calls.index(a.text) < calls.index(b.text)
    wait_metric(one_slot, cancelled, before + 1)

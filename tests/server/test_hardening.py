"""Reliability issue, second round: what a hostile or careless client could do to a real server
(a fake-engine `boundgen serve` process). Shared memory truncated under the server's read, keys
outside the prefix, inputs in shared memory over the body limit; absurd shapes; request counts
refused before any work; lone surrogates; a non-ASCII Authorization header; undecodable gRPC
messages to every method; gRPC requests that expire before their handler runs, counted; /v1/beam
overload that leaves no unretrieved task exception; a slow body's deadline counted from its head."""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import uuid
import zlib

import grpc
import numpy as np
import pytest

from boundgen.server.kserve import pb
from boundgen.server.kserve.tensors import serialize_bytes
from tests.server.conftest import BEAM_SPEC, SCORE_SPEC, metric
from tests.server.fake_engine import wait_for_event, write_fake_artifact
from tests.server.test_reliability import NOT_HUNG_S, http, json_body, read_until_closed

KEY = "sesame"


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory):
    root = tmp_path_factory.mktemp("hardening")
    return [write_fake_artifact(root / "fscore", SCORE_SPEC, log=root / "calls.jsonl"),
            write_fake_artifact(root / "fbeam", BEAM_SPEC)]


@pytest.fixture(scope="module")
def server(launch, artifacts):
    """Client shared memory on, one request in flight and four queued per model, no API key."""
    server = launch(artifacts, args=["--allow-client-shm", "--max-inflight", "1", "--max-queue", "4"])
    server.log = artifacts[0].parent / "calls.jsonl"  # fscore's calls
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def keyed(launch, artifacts):
    server = launch(artifacts, args=["--allow-client-shm"], env={**os.environ, "BOUNDGEN_API_KEY": KEY})
    yield server
    assert server.stop() == 0


def post(server, path, body, headers=None):
    """(status, JSON answer) of a POST."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    code, _, answer = http(server, "POST", path, data, {"Content-Type": "application/json", **(headers or {})})
    return code, json.loads(answer) if answer else None


def requests_total(server, protocol: str, model: str | None = None) -> float:
    """Inference requests counted over `protocol`, whatever their outcome, and whatever their model label
    unless `model` names one ("" for requests that named no served model)."""
    _, _, text = http(server, "GET", "/metrics")
    labels = [f'protocol="{protocol}"', *([f'model="{model}"'] if model is not None else [])]
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.decode().splitlines()
               if line.startswith("boundgen_requests_total{") and all(label in line for label in labels))


def shm_object(size: int) -> tuple[str, int]:
    """A fresh POSIX shared memory object under the server's default prefix: (key, fd)."""
    key = f"/boundgen-test-{uuid.uuid4().hex[:12]}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, size)
    return key, fd


def shm_infer_body(region: str, byte_size: int) -> dict:
    return {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "parameters": {
        "shared_memory_region": region, "shared_memory_byte_size": byte_size}}]}


# ---- 1. shared memory -----------------------------------------------------------------------

def test_a_client_truncating_its_object_under_a_read_fails_only_its_request(launch, artifacts):
    """The object shrinks to 0 and grows back, over and over, while the server reads 3 MB from
    it: a mapping would fault (SIGBUS kills the server); each read must fail or succeed alone."""
    server = launch(artifacts, args=["--allow-client-shm"])  # its own: the old code died here
    size = 3 << 20
    key, fd = shm_object(size)
    name = f"trunc-{uuid.uuid4().hex[:8]}"
    stop = threading.Event()

    def truncate():
        while not stop.is_set():
            os.ftruncate(fd, 0)
            os.ftruncate(fd, size)

    flipper = threading.Thread(target=truncate, daemon=True)
    try:
        assert post(server, f"/v2/systemsharedmemory/region/{name}/register",
                    {"key": key, "offset": 0, "byte_size": size})[0] == 200
        flipper.start()
        codes = set()
        for _ in range(60):
            code, answer = post(server, "/v2/models/fscore/infer", shm_infer_body(name, size))
            codes.add(code)
            assert code == 400 and name in answer["error"], answer
    finally:
        stop.set()
        if flipper.is_alive():
            flipper.join()
        os.close(fd)
        os.unlink(f"/dev/shm{key}")
        post(server, "/v2/systemsharedmemory/unregister", b"")
    assert server.proc.poll() is None, server.tail()
    assert http(server, "GET", "/v2/health/live")[0] == 200
    assert server.stop() == 0


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_key_outside_the_prefix_is_refused(server, protocol):
    key = f"/other-{uuid.uuid4().hex[:12]}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, 64)
    try:
        if protocol == "http":
            code, answer = post(server, "/v2/systemsharedmemory/region/outside/register", {"key": key, "offset": 0, "byte_size": 64})
            assert code == 400, answer
            message = answer["error"]
        else:
            call = grpc_call(server, "SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterResponse)
            with pytest.raises(grpc.RpcError) as err:
                call(pb.SystemSharedMemoryRegisterRequest(name="outside", key=key, byte_size=64).SerializeToString(),
                     timeout=10)
            assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            message = err.value.details()
        assert "must start with '/boundgen'" in message and "--shm-prefix" in message, message
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{key}")


def test_an_input_in_shared_memory_is_held_to_the_body_limit(server):
    size = (4 << 20) + 1024  # over the default --max-body-bytes of 4 MiB
    key, fd = shm_object(size)
    name = f"big-{uuid.uuid4().hex[:8]}"
    try:
        assert post(server, f"/v2/systemsharedmemory/region/{name}/register", {"key": key, "offset": 0, "byte_size": size})[0] == 200
        code, answer = post(server, "/v2/models/fscore/infer", shm_infer_body(name, size))
        assert code == 400 and name in answer["error"] and "--max-body-bytes" in answer["error"], answer
    finally:
        post(server, f"/v2/systemsharedmemory/region/{name}/unregister", b"")
        os.close(fd)
        os.unlink(f"/dev/shm{key}")


def test_unregistering_every_region_needs_the_key(keyed):
    """A guard: every route but the health checks already needed the key."""
    key, fd = shm_object(64)
    auth = {"Authorization": f"Bearer {KEY}"}
    try:
        assert post(keyed, "/v2/systemsharedmemory/region/kept/register", {"key": key, "offset": 0, "byte_size": 64}, auth)[0] == 200
        assert post(keyed, "/v2/systemsharedmemory/unregister", b"")[0] == 401
        code, _, listed = http(keyed, "GET", "/v2/systemsharedmemory/status", headers=auth)
        assert code == 200 and [r["name"] for r in json.loads(listed)] == ["kept"]
        assert post(keyed, "/v2/systemsharedmemory/unregister", b"", auth)[0] == 200
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{key}")


# ---- 2. bounds before work ------------------------------------------------------------------

@pytest.mark.parametrize("shape,message", [
    # A serving process converts integers of at most 640 digits (app.MAX_INT_DIGITS): longer ones make
    # the body invalid JSON before its shape is read; shorter absurd ones are too large a dimension.
    ("[1" + "0" * 4000 + "]", "not valid JSON"),
    ("[1" + "0" * 4000 + ", 1" + "0" * 4000 + "]", "not valid JSON"),
    ("[1" + "0" * 600 + "]", "shape dimension too large"),
    (str([1 << 40]), "more elements than a request within the server's limit"),
])
def test_absurd_shapes_are_400_before_any_allocation(server, shape, message):
    body = ('{"inputs": [{"name": "TEXT", "datatype": "FP32", "shape": ' + shape + ', "data": [1.0]}]}').encode()
    code, answer = post(server, "/v2/models/fscore/infer", body)
    assert code == 400 and message in answer["error"], answer
    assert len(answer["error"]) < 300  # the number itself is not echoed back


def test_grpc_shape_past_the_body_limit_is_400(server):
    request = pb.ModelInferRequest(model_name="fscore")
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1 << 62, 1 << 62])
    request.raw_input_contents.append(b"")
    with pytest.raises(grpc.RpcError) as err:
        grpc_call(server, "ModelInfer", pb.ModelInferResponse)(request.SerializeToString(), timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "more elements than a request within the server's limit" in err.value.details()


def test_score_items_are_counted_before_they_are_built(server):
    code, answer = post(server, "/v1/score", {"query": "q ", "items": ["a"] * 5, "label_token_ids": [9693],
                                              "apply_softmax": True})
    assert code == 400 and "items has 5 texts, over the limit of 4" in answer["error"], answer


def test_beam_prompts_are_counted_before_they_are_admitted(server):
    code, answer = post(server, "/v1/beam", {"prompts": ["a"] * 6})
    assert code == 400, answer  # used to be 429, after the first prompts had run
    assert "prompts has 6 texts, over the limit of 5" in answer["error"], answer


@pytest.mark.parametrize("path,body", [
    ("/v1/score", {"query": "q ", "items": ["a"] * 50_000, "label_token_ids": [9693], "apply_softmax": True}),
    ("/v1/beam", {"prompts": ["a"] * 20_000}),
    ("/v1/rerank", {"query": "q", "documents": [{"text": "a"}] * 20_000}),
    ("/v2/models/fscore/infer", {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a"],
                                             "parameters": {"x": [0] * 200_000}}]}),
    ("/v2/models/fscore/infer", {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [300_000],
                                             "data": ["a"] * 300_000}]}),
    ("/v2/logging", {"log_info": [True] * 20_000}),
], ids=["score-items", "beam-prompts", "rerank-documents", "infer-parameters", "infer-strings", "logging"])
def test_bodies_of_too_many_json_values_are_refused_unparsed(server, path, body):
    code, answer = post(server, path, body)
    assert code == 400, answer
    error = answer.get("error") or answer.get("message")
    assert "JSON values" in error and "refused before it was parsed" in error, answer


LONG, MANY = "a" * ((4 << 20) - 1024), ["a" * 250_000] * 16  # within the body limit; over every text bound


@pytest.mark.parametrize("path,body", [
    ("/v2/models/fscore/infer", {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [LONG]}]}),
    ("/v2/models/fscore/infer", {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [16], "data": MANY}]}),
    ("/v1/score", {"query": LONG, "items": ["a"], "label_token_ids": [9693]}),
    ("/v1/beam", {"prompts": MANY}),
    ("/v1/rerank", {"query": "q", "documents": MANY}),
], ids=["infer-one", "infer-many", "score-query", "beam-prompts", "rerank-documents"])
def test_bodies_of_texts_over_every_bound_are_refused_unparsed(server, path, body):
    """Strings past the longest text a request can hold, or past all its texts together, are refused
    as they arrive (json_values.py): never joined, parsed, nor sent to the JSON worker."""
    code, answer = post(server, path, body)
    assert code == 400, answer
    error = answer.get("error") or answer.get("message")
    assert "bytes of strings" in error or "a string of at least" in error, answer
    assert "refused before it was parsed" in error, answer


TRICKY = '\\",:[]{}\\\\"\u00e9' * 12  # one "token" of escaped quotes and backslashes, commas, colons, brackets


def test_requests_at_their_limits_are_served_whatever_their_texts_hold(server):
    code, answer = post(server, "/v1/score", {"query": "q ", "items": [TRICKY] * 4, "label_token_ids": [9693],
                                              "apply_softmax": True})
    assert code == 200 and len(answer["scores"]) == 4, answer
    code, answer = post(server, "/v2/models/fscore/infer", {
        "inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [4], "data": [TRICKY] * 4}],
        "parameters": {f"p{i}": TRICKY for i in range(200)}, "outputs": [{"name": "SCORES"}]})
    assert code == 200 and answer["outputs"][0]["shape"] == [4, 2], answer
    code, answer = post(server, "/v1/beam", {"prompts": [TRICKY] * 5})
    assert code == 200 and len(answer["results"]) == 5, answer


def test_a_compressed_body_is_held_to_the_limit_as_it_inflates(server):
    """Inflating stops at the limit: the answer closes the connection, so the rest of the body
    is not read (aiohttp would otherwise inflate all of it, for up to 10 s, to keep it alive)."""
    code, headers, answer = http(server, "POST", "/v2/models/fscore/infer", gzip_bomb(256),
                                 {"Content-Type": "application/json", "Content-Encoding": "gzip"})
    error = json.loads(answer)["error"]  # the size limit, or (spaces) the bytes outside strings first
    assert code == 400 and ("--max-body-bytes" in error or "bytes outside strings" in error), answer
    assert headers["Connection"] == "close"
    start = time.monotonic()  # inflating the remaining 252 MiB kept the event loop busy for seconds
    assert http(server, "GET", "/v2/health/live")[0] == 200
    assert time.monotonic() - start < 0.8


def gzip_bomb(mib: int) -> bytes:
    """`mib` MiB of spaces, gzipped (about 1 KB per MiB)."""
    packer, chunk = zlib.compressobj(9, zlib.DEFLATED, 31), b" " * (1 << 20)
    return b"".join([*(packer.compress(chunk) for _ in range(mib)), packer.flush()])


# ---- 3. deadlines from arrival --------------------------------------------------------------

def test_a_slow_body_counts_against_the_timeout(server):
    """The `timeout` parameter counts from the head: a body that took longer arrives expired.
    (A guard: the handler already started before its body was read; an arrival middleware now
    notes the time.)"""
    body = json_body(["a"], {"timeout": 200_000})  # 200 ms
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    sock.sendall(b"POST /v2/models/fscore/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:10])
    time.sleep(0.5)
    sock.sendall(body[10:])
    answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 504"), answer


def _hold_the_slot(server, tmp_path) -> tuple[socket.socket, os.PathLike]:
    """A request that holds fscore's one slot until the returned file is made: (its connection, the file)."""
    release = tmp_path / f"release-{uuid.uuid4().hex}"
    holder = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    held = json_body([f"hold={release}"])
    holder.sendall(b"POST /v2/models/fscore/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                   + f"Content-Length: {len(held)}\r\n\r\n".encode() + held)
    wait_for_event(server.log, f"hold={release}", "started")
    return holder, release


def test_a_pipelined_request_counts_its_timeout_from_its_head(server, tmp_path):
    """Two requests in one write on one connection, while another connection's request holds the
    one slot: aiohttp starts the second once the first is answered (504 after its 300 ms in the
    queue), but the second's 200 ms count from when its head was parsed (connections.py
    head_time), so it has expired on its turn. The clock used to start at its turn: with the slot
    freed right then, it ran and succeeded 500 ms after it arrived with a 200 ms timeout."""
    holder, release = _hold_the_slot(server, tmp_path)
    first, second = json_body(["a"], {"timeout": 300_000}), json_body(["b"], {"timeout": 200_000})
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    sock.sendall(b"POST /v2/models/fscore/infer HTTP/1.1\r\nHost: x\r\n"
                 + f"Content-Length: {len(first)}\r\n\r\n".encode() + first
                 + b"POST /v2/models/fscore/infer HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                 + f"Content-Length: {len(second)}\r\n\r\n".encode() + second)
    answers = sock.recv(65536)
    assert answers.startswith(b"HTTP/1.1 504"), answers  # the first, expired in the queue
    release.touch()  # the slot frees as the second's turn comes
    answers += read_until_closed(sock)
    read_until_closed(holder)
    assert answers.count(b"HTTP/1.1 504") == 2 and b"had already passed when it arrived" in answers, answers


def test_pipelined_requests_of_a_client_that_leaves_are_all_counted(server, tmp_path):
    """Requests pipelined on one connection behind one that waits for the slot, and the client
    closes: the first is cancelled in the queue; those behind it were parsed but never reached a
    handler, and aiohttp drops them unseen. Each is still counted (cancelled), under its model (""
    for none the server has); a GET of another route is not an inference request. 1 of 10 were."""
    holder, release = _hold_the_slot(server, tmp_path)
    before, before_none = requests_total(server, "http", "fscore"), requests_total(server, "http", "")
    body = json_body(["a"])
    infer = (b"POST /v2/models/fscore/infer HTTP/1.1\r\nHost: x\r\n"
             + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    score = json.dumps({"query": "q", "items": ["a"], "label_token_ids": [9693], "apply_softmax": True}).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    sock.sendall(infer * 3 + b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n"
                 + infer.replace(b"fscore", b"nosuch") + infer.replace(b"/models/fscore/", b"/models/fscore/versions/1/")
                 + b"POST /v1/score HTTP/1.1\r\nHost: x\r\n" + f"Content-Length: {len(score)}\r\n\r\n".encode()
                 + score)
    time.sleep(0.3)  # the first in the queue, the rest parsed and waiting behind it
    sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (requests_total(server, "http", "fscore") - before < 4
                                           or requests_total(server, "http", "") - before_none < 2):
        time.sleep(0.05)
    release.touch()
    read_until_closed(holder)
    assert requests_total(server, "http", "fscore") - before == 5  # the three, the versioned one, the holder's
    assert requests_total(server, "http", "") - before_none == 2  # nosuch, and /v1/score's model is in its unread body


def test_a_client_that_half_closes_is_taken_as_gone(server, tmp_path):
    """TCP cannot tell a half-close (shutdown(SHUT_WR)) from a close before the server writes: both
    are the peer's EOF. The server takes both as the client leaving, so a queued request of a client
    that left is cancelled (tests/server/test_queueing.py), and a half-closing client gets no answer."""
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=10)
    sock.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
    assert sock.recv(65536).startswith(b"HTTP/1.1 200")
    sock.shutdown(socket.SHUT_WR)  # on a kept-alive connection: the server closes it at once
    assert read_until_closed(sock) == b""
    assert http(server, "GET", "/v2/health/ready")[0] == 200


def test_the_head_watch_closes_a_trickled_head_whatever_aiohttp_does():
    """With aiohttp's keep-alive timer off (as in aiohttp versions that do not start it with the
    connection), the protocol's own watch closes a connection whose head trickles in for one to two
    head timeouts, and keeps one that parsed a head in each period."""
    import asyncio

    from aiohttp import web, web_server

    from boundgen.server.connections import LimitedRequestHandler

    class Transport(asyncio.Transport):
        def __init__(self):
            super().__init__()
            self.closed_at = None

        def get_extra_info(self, name, default=None):
            return default

        def is_closing(self):
            return self.closed_at is not None

        def close(self):
            if self.closed_at is None:
                self.closed_at = time.monotonic()

        def write(self, data):
            pass

    async def answer(request):
        return web.Response()

    async def main():
        manager = web_server.Server(answer)
        trickled, fed = Transport(), Transport()
        slow = LimitedRequestHandler(manager, loop=asyncio.get_running_loop(), max_connections=10,
                                     head_timeout_s=0.2, keepalive_timeout=0)
        busy = LimitedRequestHandler(manager, loop=asyncio.get_running_loop(), max_connections=10,
                                     head_timeout_s=0.2, keepalive_timeout=100)  # kept alive between requests
        start = time.monotonic()
        slow.connection_made(trickled)
        busy.connection_made(fed)
        for i in range(12):  # 0.6 s: a byte of a head on one, a whole request each 0.05 s on the other
            slow.data_received(b"GET /a HTTP/1.1\r\nX-Slow: " if i == 0 else b"a")
            busy.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
            await asyncio.sleep(0.05)
        assert trickled.closed_at is not None and 0.15 <= trickled.closed_at - start <= 0.5, trickled.closed_at
        assert fed.closed_at is None
        busy.connection_lost(None)

    asyncio.run(main())


def test_a_connection_the_server_closes_before_its_first_request_closes_at_once():
    """The server stops (aiohttp's `close` of every connection) just after accepting a connection,
    before its handler task has waited for a request: the connection is closed then, not left open
    with its request's bytes dropped until the idle timeout (which a stopping server waited for,
    its clients answered nothing). One that has a request is answered first, as before."""
    import asyncio

    from aiohttp import web, web_server

    from boundgen.server.connections import LimitedRequestHandler

    class Transport(asyncio.Transport):
        def __init__(self):
            super().__init__()
            self.closed, self.written = False, b""

        def get_extra_info(self, name, default=None):
            return default

        def is_closing(self):
            return self.closed

        def close(self):
            self.closed = True

        def write(self, data):
            self.written += data

    async def answer(request):
        return web.Response(text="ok")

    async def main():
        manager = web_server.Server(answer)
        loop = asyncio.get_running_loop()
        fresh, asked = Transport(), Transport()
        new = LimitedRequestHandler(manager, loop=loop, max_connections=10, keepalive_timeout=30)
        busy = LimitedRequestHandler(manager, loop=loop, max_connections=10, keepalive_timeout=30)
        new.connection_made(fresh)
        busy.connection_made(asked)
        busy.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")
        new.close()  # before either handler task's first step
        busy.close()
        new.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")  # dropped: the connection is closing
        await asyncio.sleep(0.1)
        assert fresh.closed and fresh.written == b""
        assert asked.written.startswith(b"HTTP/1.1 200") and asked.closed
        await asyncio.wait_for(manager.shutdown(5.0), 1.0)  # nothing left to wait for

    asyncio.run(main())


def test_a_body_that_arrives_after_the_stop_began_is_read_and_answered(launch, artifacts):
    """A POST whose head came before SIGTERM and whose body came after the server closed its connections
    (a slow upload across the stop): aiohttp drops what arrives on a closing connection, so the body
    never came, the answer was a 408 after --read-timeout-s (20 s here) and the exit waited as long.
    Its body is let in now: answered at once (503: the server admits nothing new), exit 0 at once."""
    server = launch(artifacts, args=["--read-timeout-s", "20"])
    body = json_body(["a"])
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=30)
    sock.sendall(b"POST /v2/models/fscore/infer HTTP/1.1\r\nHost: x\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode())
    time.sleep(0.2)  # the head parsed
    start = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(1.0)  # the drain done (nothing admitted) and the connections closing
    sock.sendall(body)
    answer = read_until_closed(sock)
    assert answer.startswith(b"HTTP/1.1 503"), answer[:300]
    assert server.proc.wait(NOT_HUNG_S) == 0
    assert time.monotonic() - start < NOT_HUNG_S


def test_answers_while_the_server_drains_close_their_connection(launch, tmp_path):
    """A keep-alive client's request answered while the server drains carries `Connection: close`: without
    it the client sent its next request on a connection about to close, sent and never answered."""
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC, log=tmp_path / "calls.jsonl")],
                    args=["--max-inflight", "1"])
    server.log = tmp_path / "calls.jsonl"
    request = json_body(["a"])
    request = (b"POST /v2/models/fscore/infer HTTP/1.1\r\nHost: x\r\n"
               + f"Content-Length: {len(request)}\r\n\r\n".encode() + request)
    kept = socket.create_connection(("127.0.0.1", server.http_port), timeout=NOT_HUNG_S)
    kept.sendall(request)
    head, _ = read_one_answer(kept)
    assert head.startswith(b"HTTP/1.1 200") and b"connection: close" not in head.lower(), head
    holder, release = _hold_the_slot(server, tmp_path)  # the drain waits for it
    server.proc.send_signal(signal.SIGTERM)
    end = time.monotonic() + NOT_HUNG_S
    while "draining" not in "".join(server.output) and time.monotonic() < end:
        time.sleep(0.05)
    kept.sendall(request)
    head, _ = read_one_answer(kept)
    assert head.startswith(b"HTTP/1.1 503") and b"connection: close" in head.lower(), head
    release.touch()
    assert read_until_closed(holder).startswith(b"HTTP/1.1 200")
    assert server.proc.wait(NOT_HUNG_S) == 0


def read_one_answer(sock) -> tuple[bytes, bytes]:
    """(head, body) of the next answer on a keep-alive connection (its Content-Length read)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    size = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(body) < size:
        chunk = sock.recv(65536)
        assert chunk, data
        body += chunk
    return head, body


def test_the_protocol_notes_each_pipelined_head_as_it_is_parsed():
    """LimitedRequestHandler stamps each request head when aiohttp parses it; `head_time` gives a
    request's stamp and forgets those of requests before it that never reached the application."""
    import asyncio

    from aiohttp import web, web_server

    from boundgen.server.connections import LimitedRequestHandler

    async def main():
        manager = web_server.Server(lambda request: web.Response())
        handler = LimitedRequestHandler(manager, loop=asyncio.get_running_loop(), max_connections=10)
        before = time.monotonic()
        handler.data_received(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\nGET /b HTTP/1.1\r\nHost: x\r\n\r\n")
        heads = list(handler._heads)
        assert [message.path for message, _ in heads] == ["/a", "/b"]
        assert all(before <= parsed <= time.monotonic() for _, parsed in heads)
        assert handler.head_time(heads[1][0]) == heads[1][1] and not handler._heads  # /a dropped
        assert handler.head_time(heads[0][0]) is None

    asyncio.run(main())


# ---- 4. errors in the contract's codes ------------------------------------------------------

@pytest.mark.parametrize("route,body,where", [
    ("/v1/score", b'{"query": "q", "items": ["ok", "\\ud800"], "label_token_ids": [9693], "apply_softmax": true}',
     "items[1]"),
    ("/v1/score", b'{"query": "\\udfff", "items": ["ok"], "label_token_ids": [9693], "apply_softmax": true}', "query"),
    ("/v1/beam", b'{"prompt": "\\ud800"}', "prompt"),
    ("/v1/beam", b'{"prompts": ["ok", "x\\ud800"]}', "prompts[1]"),
])
def test_lone_surrogates_are_400(server, route, body, where):
    code, answer = post(server, route, body)
    assert code == 400 and answer["error"].startswith(f"{where} is not valid UTF-8"), answer


@pytest.mark.parametrize("method,path", [
    ("GET", "/v2"), ("GET", "/metrics"), ("POST", "/v2/models/fscore/infer"), ("POST", "/v1/score"),
    ("POST", "/v1/beam"), ("GET", "/v2/systemsharedmemory/status"), ("POST", "/v2/systemsharedmemory/unregister"),
])
def test_a_non_ascii_authorization_header_is_401(keyed, method, path):
    for value in (b"Bearer \xff\xfe", "Bearer sésame".encode()):
        sock = socket.create_connection(("127.0.0.1", keyed.http_port), timeout=10)
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n".encode()
                     + b"Authorization: " + value + b"\r\n\r\n{}")
        answer = read_until_closed(sock)
        assert answer.startswith(b"HTTP/1.1 401"), answer


@pytest.mark.parametrize("path,model", [("/v2/models/fscore/infer", "fscore"), ("/v1/score", ""), ("/v1/beam", ""),
                                        ("/v1/rerank", ""), ("/rerank", ""), ("/score", "")])
def test_a_401_on_any_inference_route_is_counted(keyed, path, model):
    """Every inference request is counted whatever its end: the JSON routes' 401s too (model "": their
    model is named in the body, not read), not only /infer's."""
    key = f'boundgen_requests_total{{model="{model}",outcome="unauthenticated",protocol="http"}}'
    before = metric(keyed, key, KEY)
    assert post(keyed, path, {})[0] == 401
    assert metric(keyed, key, KEY) == before + 1


def grpc_call(server, method, response_cls):
    """A raw unary call of the service: it takes request bytes, so a test can send any."""
    channel = grpc.insecure_channel(server.grpc_url)
    return channel.unary_unary(f"/{pb.SERVICE}/{method}", request_serializer=lambda b: b,
                               response_deserializer=response_cls.FromString)


UNDECODABLE = b"\xff\xff\xff\xff"


@pytest.mark.parametrize("method", ["ServerMetadata", "ModelMetadata", "ModelReady", "ModelConfig",
                                    "RepositoryIndex", "SystemSharedMemoryRegister", "LogSettings", "ServerLive"])
def test_undecodable_grpc_messages_are_invalid_argument(server, keyed, method):
    with pytest.raises(grpc.RpcError) as err:
        grpc_call(server, method, pb.ServerLiveResponse)(UNDECODABLE, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value
    assert "not a valid" in err.value.details()
    if method != "ServerLive":  # the health checks need no key; the others ask for it first
        with pytest.raises(grpc.RpcError) as err:
            grpc_call(keyed, method, pb.ServerLiveResponse)(UNDECODABLE, timeout=10)
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED, err.value


# ---- 5. metrics -----------------------------------------------------------------------------

def test_grpc_requests_that_expire_before_their_handler_are_counted(server):
    request = pb.ModelInferRequest(model_name="fscore")
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(serialize_bytes([b"hello"]))
    data = request.SerializeToString()
    call = grpc_call(server, "ModelInfer", pb.ModelInferResponse)
    call(data, timeout=10)
    before = requests_total(server, "grpc")
    calls = [call.future(data, timeout=0.002) for _ in range(200)]
    for c in calls:
        try:
            c.result()
        except grpc.RpcError:
            pass
    end = time.monotonic() + 5
    while requests_total(server, "grpc") - before < 180 and time.monotonic() < end:
        time.sleep(0.05)
    # gRPC itself drops a few calls before it looks their method up: those never reach the server's code.
    assert requests_total(server, "grpc") - before >= 180, requests_total(server, "grpc") - before


def test_beam_overload_leaves_no_unretrieved_task_exception():
    """One prompt is refused (429) while another waits; cancelled, the waiting one still ends with
    an error (as asyncio.wait_for does when its timeout and a cancellation meet, Python 3.11): that
    error must be retrieved, not logged as "Task exception was never retrieved"."""
    import asyncio
    import gc
    from types import SimpleNamespace

    from boundgen.server import beam_api
    from boundgen.server.status import DeadlineExceeded, Overloaded

    class Models:
        def get(self, name):
            return SimpleNamespace(admission=SimpleNamespace(max_inflight=1, max_queue=4),
                                   signature=SimpleNamespace(call=lambda items: items))

        async def run(self, name, call, deadline):
            if call == [b"refused"]:
                raise Overloaded("model fbeam is at capacity")
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                raise DeadlineExceeded("the deadline passed as the request was cancelled") from None

    unretrieved = []

    async def main():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: unretrieved.append(context))
        with pytest.raises(Overloaded):
            await beam_api.run(Models(), "fbeam", ["waits", "refused"], time.monotonic() + 10)
        await asyncio.sleep(0.05)  # the cancelled task ends with its error
        gc.collect()

    asyncio.run(main())
    gc.collect()
    assert not unretrieved, unretrieved


# ---- 3. no success after its deadline -------------------------------------------------------

def late_models(monkeypatch):
    """A ModelSet whose model answers 100 ms after it was asked, whatever the deadline (as when the
    answer is encoded after the engine returned): the front end must not send it as a success."""
    import asyncio

    from boundgen.server.config import ServerConfig
    from boundgen.server.kserve import inference
    from boundgen.server.metrics import ServerMetrics
    from boundgen.server.models import ModelSet
    from boundgen.server.kserve.tensors import Tensor

    models = ModelSet(ServerConfig(http_port=0, grpc_port=0), ServerMetrics())
    models.set_ready()

    async def infer(models, name, version, tensors, requested, deadline):
        await asyncio.sleep(0.1)
        return inference.Answer([Tensor("SCORES", "FP32", (1, 2), np.zeros(2, dtype=np.float32))], {})

    monkeypatch.setattr(inference, "infer", infer)
    return models


def test_http_sends_no_success_after_the_deadline(monkeypatch):
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from boundgen.server.kserve.http_api import HttpFrontend

    models = late_models(monkeypatch)

    async def main():
        async with TestClient(TestServer(HttpFrontend(models, models.config).app())) as client:
            answer = await client.post("/v2/models/fscore/infer", data=json_body(["a"], {"timeout": 50_000}))
            return answer.status, await answer.json()

    status, answer = asyncio.run(main())
    assert status == 504 and "after the request's deadline" in answer["error"], answer


@pytest.mark.parametrize("route,body", [("/v1/rerank", {"query": "q", "documents": ["a", "b"]}),
                                        ("/score", {"text_1": "q", "text_2": ["a", "b"]})])
def test_the_rerank_routes_send_no_success_after_the_deadline(monkeypatch, route, body):
    import asyncio

    from aiohttp.test_utils import TestClient, TestServer

    from boundgen.server import rerank_api
    from boundgen.server.config import ServerConfig
    from boundgen.server.kserve.http_api import HttpFrontend
    from boundgen.server.metrics import ServerMetrics
    from boundgen.server.models import ModelSet

    models = ModelSet(ServerConfig(http_port=0, grpc_port=0, default_timeout_ms=50), ServerMetrics())
    models.set_ready()

    async def relevance(models, name, texts, deadline):  # answers 100 ms after it was asked, whatever the deadline
        await asyncio.sleep(0.1)
        return [0.5] * len(texts)

    monkeypatch.setattr(rerank_api, "relevance", relevance)
    monkeypatch.setattr(rerank_api, "pick_model", lambda *args: "fscore")

    async def main():
        async with TestClient(TestServer(HttpFrontend(models, models.config).app())) as client:
            answer = await client.post(route, json=body)
            return answer.status, await answer.json()

    status, answer = asyncio.run(main())
    assert status == 504 and "after the request's deadline" in str(answer), answer


def test_grpc_sends_no_success_after_the_deadline(monkeypatch):
    import asyncio

    from boundgen.server.kserve.grpc_api import GrpcFrontend
    from boundgen.server.status import DeadlineExceeded

    models = late_models(monkeypatch)
    request = pb.ModelInferRequest(model_name="fscore")
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1])
    request.raw_input_contents.append(serialize_bytes([b"a"]))
    request.parameters["timeout"].int64_param = 50_000
    context = type("Context", (), {"invocation_metadata": lambda self: (), "time_remaining": lambda self: None})()
    with pytest.raises(DeadlineExceeded, match="after the request's deadline"):
        asyncio.run(GrpcFrontend(models, models.config)._infer(request, context, time.monotonic()))


def test_grpc_counts_the_timeout_from_when_grpc_took_the_call(monkeypatch):
    """A ModelInfer call's arrival is when gRPC looked its method up (Arrivals), not when its
    handler ran: under a burst the handler starts later, and the `timeout` parameter's clock
    must not wait for it."""
    import asyncio

    from boundgen.server.kserve.grpc_api import GrpcFrontend

    models = late_models(monkeypatch)
    frontend, seen = GrpcFrontend(models, models.config), {}

    async def infer(request, context, arrived):
        seen["arrived"] = arrived
        return pb.ModelInferResponse()

    frontend._infer = infer
    context = type("Context", (), {"invocation_metadata": lambda self: (), "time_remaining": lambda self: None})()

    async def call():
        frontend.arriving(())
        looked_up = time.monotonic()
        await asyncio.sleep(0.2)  # the loop is busy with other calls
        await frontend.model_infer(pb.ModelInferRequest(model_name="fscore"), context)
        return looked_up

    looked_up = asyncio.run(call())
    assert looked_up - 0.05 <= seen["arrived"] <= looked_up, (seen, looked_up)


@pytest.mark.parametrize("route,body", [
    ("/v1/score", b'{"query": "q", "items": '),  # not JSON
    ("/v1/score", b'{"query": "q", "items": ["a"], "label_token_ids": [1], "model": "no-such-model"}'),
    ("/v1/beam", b'{"prompt": 7}'),
    ("/v1/rerank", b'{"query": "q"}'),
    ("/score", b'[]'),
])
def test_a_json_route_counts_a_request_refused_before_its_model_is_known(server, route, body):
    """Every request is counted in boundgen_requests_total, also one refused before its body named
    a model it could be counted under (model label "")."""
    key = 'boundgen_requests_total{model="",outcome="invalid_input",protocol="http"}'
    before = metric(server, key)
    code, _ = post(server, route, body)
    assert code == 400
    assert metric(server, key) == before + 1


@pytest.mark.parametrize("route,model", [("/v2/models/fscore/infer", "fscore"), ("/v1/score", "")])
def test_a_client_gone_during_its_body_is_counted_cancelled(server, route, model):
    """A client that closes its connection before its body has arrived in full went away (499,
    `cancelled`, nothing logged as an error), not an internal error."""
    body = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a"]}]}).encode()
    counted = {o: f'boundgen_requests_total{{model="{model}",outcome="{o}",protocol="http"}}'
               for o in ("cancelled", "internal_error")}
    before = {o: metric(server, k) for o, k in counted.items()}
    host, port = server.http_url.rsplit(":", 1)
    with socket.create_connection((host, int(port))) as s:
        s.sendall(f"POST {route} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body) + 100}\r\n\r\n".encode() + body)
        time.sleep(0.3)
    for _ in range(100):
        if metric(server, counted["cancelled"]) == before["cancelled"] + 1:
            break
        time.sleep(0.05)
    assert metric(server, counted["cancelled"]) == before["cancelled"] + 1
    assert metric(server, counted["internal_error"]) == before["internal_error"]


# ---- 6. replicas ----------------------------------------------------------------------------

def test_the_router_skips_a_worker_whose_channel_failed():
    """A worker whose gRPC channel failed (its process gone or going) gets no new call, even while
    its supervisor has not yet seen the exit; with none left, 503."""
    from prometheus_client import CollectorRegistry

    from boundgen.server.deploy.replicas import WorkerPool
    from boundgen.server.status import Unavailable

    pool = WorkerPool([], [None, None], [], None, CollectorRegistry(), lambda line: None)
    for w in pool.workers:
        w.up = True
    pool.workers[0].channel_state = grpc.ChannelConnectivity.TRANSIENT_FAILURE  # idle tie: worker 0 would be first
    assert [pool.acquire().index for _ in range(3)] == [1, 1, 1]
    pool.workers[1].channel_state = grpc.ChannelConnectivity.SHUTDOWN
    with pytest.raises(Unavailable):
        pool.acquire()


def test_the_router_prefers_connected_channels():
    """A channel that has just lost its connection (IDLE while it reconnects) may be a worker
    killed a moment ago: connected workers get the calls while any is; with none connected, the
    live ones still do (gRPC connects on the call)."""
    from prometheus_client import CollectorRegistry

    from boundgen.server.deploy.replicas import WorkerPool

    pool = WorkerPool([], [None, None], [], None, CollectorRegistry(), lambda line: None)
    for w in pool.workers:
        w.up, w.channel_state = True, grpc.ChannelConnectivity.READY
    pool.workers[0].channel_state = grpc.ChannelConnectivity.IDLE  # idle tie: worker 0 would be first
    assert [pool.acquire().index for _ in range(3)] == [1, 1, 1]
    pool.workers[1].channel_state = grpc.ChannelConnectivity.CONNECTING
    assert pool.acquire().index == 0  # no channel connected: live workers still get calls, fewest in flight first


def test_the_shm_prefix_is_checked():
    from boundgen.server.config import ServerConfig

    assert ServerConfig(shm_prefix="/").shm_prefix == "/"
    for bad in ("boundgen", "/a/b", ""):
        with pytest.raises(ValueError, match="shm_prefix"):
            ServerConfig(shm_prefix=bad)

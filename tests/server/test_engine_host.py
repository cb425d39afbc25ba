"""The engine process's side of the front ends' link (server/deploy/engine_host.py): a front end that stops
reading blocks no answer to another, and the watch over stuck front ends gives no verdict while the engine
process itself was stopped."""

from __future__ import annotations

import socket
import time

import pytest

from boundgen.server.deploy import link
from boundgen.server.deploy.engine_host import EngineHost


@pytest.fixture
def host_and_two(tmp_path):
    """An EngineHost (no model) and two front ends' connections to it, A accepted first."""
    host = EngineHost(str(tmp_path / "engine.sock"), max_queue=4)
    socks = []
    for _ in range(2):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(host.path)
        assert link.read_frame(sock)["op"] == link.MODELS
        socks.append(sock)
    deadline = time.monotonic() + 5
    while len(host._connections) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    yield host, host._connections, socks
    for sock in socks:
        sock.close()
    host.close()


def next_error(sock, timeout_s: float) -> dict:
    sock.settimeout(timeout_s)
    while True:
        message = link.read_frame(sock)
        if message["op"] == link.ERROR:
            return message


def test_a_front_end_that_reads_nothing_delays_no_answer_to_another(host_and_two):
    """A's link is full (it reads nothing: stopped, stuck); an answer to B, sent after one to A by the same
    shared thread (the held 429s'), still reaches B at once: each connection writes on its own thread."""
    host, (conn_a, conn_b), (sock_a, sock_b) = host_and_two
    big = {"op": link.ERROR, "id": 1, "kind": "overloaded", "message": "x" * (8 << 20)}  # past any socket buffer
    host._hold(conn_a, big, 0.0)
    host._hold(conn_b, {"op": link.ERROR, "id": 2, "kind": "overloaded", "message": "for B"}, 0.05)
    started = time.monotonic()
    got = next_error(sock_b, 5.0)
    assert got["id"] == 2 and time.monotonic() - started < 2.0


def test_no_verdict_on_the_front_ends_while_the_pinger_was_late(host_and_two):
    """A ready front end with a ping unanswered for long is stuck, unless the engine process's own pinger
    has not run for two rounds (the process was stopped): its PONG may be waiting unread."""
    host, (conn_a, _), _ = host_and_two
    conn_a.state, conn_a.pid = "ready", 4242
    conn_a.unanswered = time.monotonic() - 100
    host._pinged = time.monotonic()
    assert host.stuck(3.0) == [4242]
    host._pinged = time.monotonic() - 3 * link.PING_INTERVAL_S
    assert host.stuck(3.0) == []


def test_frames_keep_their_order_and_bytes_when_the_socket_fills(host_and_two):
    """Frames go out at once while the socket takes them, else through the writer thread (the rest of one the
    socket took in part, then every later one behind it): a reader that falls behind and catches up gets each
    frame whole and in the order sent."""
    _, (conn_a, _), (sock_a, _) = host_and_two
    sizes = [10, 3 << 20, 10, 1 << 20, 10, 10, 5 << 20, 10]  # the large ones fill the socket mid-frame
    for i, size in enumerate(sizes):
        conn_a.send({"op": link.ERROR, "id": i, "kind": "internal", "message": chr(ord("a") + i) * size})
    assert conn_a.pending > 0  # some went through the writer: nothing reads yet
    sock_a.settimeout(10.0)
    got = []
    while len(got) < len(sizes):
        message = link.read_frame(sock_a)
        if message["op"] == link.ERROR:
            got.append(message)
    assert [m["id"] for m in got] == list(range(len(sizes)))
    assert all(m["message"] == chr(ord("a") + i) * size for i, (m, size) in enumerate(zip(got, sizes)))
    deadline = time.monotonic() + 5
    while conn_a.pending and time.monotonic() < deadline:
        time.sleep(0.01)
    assert conn_a.pending == 0
    conn_a.send({"op": link.ERROR, "id": 99, "kind": "internal", "message": "small"})  # at once again
    assert next_error(sock_a, 5.0)["id"] == 99

"""A model's queue is fair across clients, through a real server: a burst from one client does
not delay another client's request behind all of it, clients are told apart by X-Client-ID /
x-client-id or else by their host (HTTP and gRPC alike), and a full queue refuses the greedy
client's newest request rather than a newcomer's. One slot; requests held running with the fake
engine's `hold=FILE` until the test releases them, so every assertion is about order, not time.
The same for the engine process's queue (serve --frontends N), fed over the link as front ends
feed it, the client named in each SUBMIT."""

from __future__ import annotations

import socket
import threading
import time
import uuid
from contextlib import contextmanager
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from types import SimpleNamespace

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from boundgen.runtime.batcher import Batcher
from boundgen.runtime.local_engine import CallShare
from boundgen.server.admission import FLOOD_REFUSALS
from boundgen.server.deploy import link
from boundgen.server import request_ids
from boundgen.server.deploy.engine_host import EngineHost
from tests.server.conftest import INFLIGHT, QUEUED, SCORE_SPEC, wait_metric
from tests.server.fake_engine import read_log, wait_for_event, write_fake_artifact
from tests.runtime.held import wait_until

QUEUE = 8


@pytest.fixture(scope="module")
def server(launch, tmp_path_factory):
    root = tmp_path_factory.mktemp("fairness")
    log = root / "calls.jsonl"
    server = launch([write_fake_artifact(root / "fscore", SCORE_SPEC, log=log)],
                    args=["--max-inflight", "1", "--max-queue", str(QUEUE), "--default-timeout-ms", "30000"])
    server.log, server.root = log, root
    yield server
    assert server.stop() == 0


@pytest.fixture
def pool():
    with ThreadPoolExecutor(QUEUE + 4) as executor:
        yield executor


def http_infer(server, text: str, client: str | None):
    t = thttp.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([text.encode()], dtype=object))
    headers = {"X-Client-ID": client} if client else None
    return thttp.InferenceServerClient(server.http_url, network_timeout=60).infer("fscore", [t], headers=headers)


def grpc_infer(server, text: str, client: str | None):
    t = tgrpc.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([text.encode()], dtype=object))
    headers = {"x-client-id": client} if client else None
    return tgrpc.InferenceServerClient(server.grpc_url).infer("fscore", [t], headers=headers)


def burst_then_one(server, pool, a: str | None, b: str | None, tag: str, burst: int):
    """A held request, then `burst` queued one by one, from client `a` (HTTP); then one from client
    `b` (gRPC); then the hold is released. The texts in the order they ran, and each request's
    outcome ("ok" or its status) by text."""
    hold = server.root / f"release-{uuid.uuid4().hex}"
    held = f"{tag}-held hold={hold}"
    futures = {held: pool.submit(http_infer, server, held, a)}
    wait_metric(server, INFLIGHT, 1)
    wait_for_event(server.log, held, "started")
    for i in range(burst):
        futures[f"{tag}-a{i}"] = pool.submit(http_infer, server, f"{tag}-a{i}", a)
        wait_metric(server, QUEUED, i + 1)
    futures[f"{tag}-b"] = b_future = pool.submit(grpc_infer, server, f"{tag}-b", b)
    if burst < QUEUE:
        wait_metric(server, QUEUED, burst + 1)
    else:  # b's answer (429) or a's newest refused in its place
        wait_until_one_done([b_future, futures[f"{tag}-a{burst - 1}"]])
    hold.touch()
    outcomes = {}
    for text, future in futures.items():
        try:
            future.result(30)
            outcomes[text] = "ok"
        except InferenceServerException as exc:
            outcomes[text] = exc.status()
    ran = [t for call in sorted(read_log(server.log), key=lambda c: c["start"]) for t in call["texts"]
           if t.startswith(f"{tag}-")]
    return [t.split(" ")[0] for t in ran], outcomes


def wait_until_one_done(futures) -> None:
    done, _ = wait(futures, timeout=10, return_when=FIRST_COMPLETED)
    assert done, "neither request was answered"


def test_a_later_client_waits_for_one_request_of_a_burst_not_all_of_it(server, pool):
    ran, outcomes = burst_then_one(server, pool, "A", "B", "ids", burst=5)
    assert set(outcomes.values()) == {"ok"}, outcomes
    assert ran == ["ids-held", "ids-a0", "ids-b", "ids-a1", "ids-a2", "ids-a3", "ids-a4"]


def test_without_ids_the_clients_of_one_host_are_one_client(server, pool):
    """HTTP and gRPC name the same host alike: B's request (gRPC) from A's host (HTTP) is one more
    of A's, first in first out."""
    ran, outcomes = burst_then_one(server, pool, None, None, "host", burst=5)
    assert set(outcomes.values()) == {"ok"}, outcomes
    assert ran == ["host-held", *(f"host-a{i}" for i in range(5)), "host-b"]


@pytest.fixture(scope="module")
def by_address(launch, tmp_path_factory):
    """The same server with `--client-key address`."""
    root = tmp_path_factory.mktemp("fairness-by-address")
    log = root / "calls.jsonl"
    server = launch([write_fake_artifact(root / "fscore", SCORE_SPEC, log=log)],
                    args=["--max-inflight", "1", "--max-queue", str(QUEUE), "--default-timeout-ms", "30000",
                          "--client-key", "address"])
    server.log, server.root = log, root
    yield server
    assert server.stop() == 0


def test_by_address_the_ids_of_one_host_are_one_client(by_address, pool):
    """--client-key address: A's and B's ids from one host are one client's, first in first out
    (with ids, B's request runs second: the first test above)."""
    ran, outcomes = burst_then_one(by_address, pool, "A", "B", "addr", burst=5)
    assert set(outcomes.values()) == {"ok"}, outcomes
    assert ran == ["addr-held", *(f"addr-a{i}" for i in range(5)), "addr-b"]


def test_a_full_queue_refuses_the_greedy_clients_newest_request(server, pool):
    ran, outcomes = burst_then_one(server, pool, "A", "B", "full", burst=QUEUE)
    newest = f"full-a{QUEUE - 1}"
    assert outcomes[newest] == "429" and outcomes["full-b"] == "ok", outcomes
    assert [text for text, outcome in outcomes.items() if outcome != "ok"] == [newest]
    assert ran[:3] == ["full-held", "full-a0", "full-b"] and newest not in ran, ran


def test_a_full_queue_refuses_a_client_that_holds_its_share(server, pool):
    ran, outcomes = burst_then_one(server, pool, "A", "A", "same", burst=QUEUE)
    assert outcomes["same-b"] == "StatusCode.RESOURCE_EXHAUSTED", outcomes
    assert ran == ["same-held", *(f"same-a{i}" for i in range(QUEUE))]


# ---- the engine process's queue (serve --frontends N): the client key travels on the link ----

class HeldEngine:
    """Stands in for a LocalEngine in the engine process: its queue is a real Batcher, a call holds
    one request, and the first call waits for `release`. `ran`: each call's first token, in order."""

    def __init__(self):
        self.spec = SCORE_SPEC
        self.packer = SimpleNamespace(tokenizer=SimpleNamespace(source="unused", options={}))
        self.ran, self.release = [], threading.Event()
        self._batcher = Batcher(["ctx"], self._run, fits=lambda batch, item: False)

    def _run(self, ctx, items):
        self.ran.append(int(items[0].tokens[0]))
        if len(self.ran) == 1:
            assert self.release.wait(10), "the test never released the engine"
        return [CallShare([np.zeros((1, 2), np.float32)], 0.0, 0.0, 1)]

    def enqueue(self, packed, deadline=None, cancelled=None, client="", max_queue=None, allow_items=None,
                allow_subset=None):
        assert allow_items is None and allow_subset is None  # a score model: no filter comes
        return self._batcher.enqueue(packed, deadline, cancelled, client, max_queue)

    def withdraw(self, ticket):
        return self._batcher.withdraw(ticket)

    @property
    def queued(self):
        return self._batcher.queued


def submit(sock, rid: int, client: str, source: str = "") -> None:
    """A front end's SUBMIT of a one-token request whose token is `rid`."""
    sock.sendall(link.frame({"op": link.SUBMIT, "id": rid, "model": "fscore", "deadline": time.monotonic() + 30,
                             "client": client, "source": source, "tokens": link.pack_array(np.array([rid], "<i4")),
                             "positions": link.pack_array(np.array([0], "<i4")),
                             "cu_seqlens": link.pack_array(np.array([0, 1], "<i4")), "lengths": [1]}))


@contextmanager
def hosted(tmp_path, max_queue: int, refusal_hold_s: float = 0.0):
    """(host, engine, sock): an EngineHost serving a HeldEngine, and a front end's connection to it."""
    engine = HeldEngine()
    host = EngineHost(str(tmp_path / "engine.sock"), max_queue=max_queue, refusal_hold_s=refusal_hold_s)
    host.add("fscore", engine, "unused")
    host.set_state("ready")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(host.path)
    try:
        assert link.read_frame(sock)["op"] == link.MODELS
        yield host, engine, sock
    finally:
        engine.release.set()
        sock.close()
        host.close()
        engine._batcher.close()


@pytest.fixture
def engine_host(tmp_path):
    with hosted(tmp_path, max_queue=4) as parts:
        yield parts


def busy_and_full(sock, engine, waiting: int, client: str = "A") -> None:
    """Request 0 of `client` running (held), its requests 1..`waiting` queued."""
    submit(sock, 0, client)
    wait_until(lambda: engine.ran == [0], "the engine is busy")
    for rid in range(1, waiting + 1):
        submit(sock, rid, client)
    wait_until(lambda: engine.queued == waiting, "the queue is full")


def answers(sock, n: int) -> dict:
    """The next `n` answers by request id: "ok" or the error's kind."""
    out = {}
    while len(out) < n:
        message = link.read_frame(sock)
        if message["op"] in (link.RESULT, link.ERROR):
            out[message["id"]] = "ok" if message["op"] == link.RESULT else message["kind"]
    return out


def test_the_engine_process_takes_the_clients_front_ends_name_in_turn(engine_host):
    host, engine, sock = engine_host
    submit(sock, 0, "A")
    wait_until(lambda: engine.ran == [0], "the engine is busy")
    for rid in (1, 2, 3):
        submit(sock, rid, "A")
    wait_until(lambda: engine.queued == 3, "A's three queued")
    submit(sock, 100, "B")
    wait_until(lambda: engine.queued == 4, "B's queued")
    engine.release.set()
    assert answers(sock, 5) == {0: "ok", 1: "ok", 2: "ok", 3: "ok", 100: "ok"}
    assert engine.ran == [0, 1, 100, 2, 3]


def test_the_engine_process_refuses_the_greedy_clients_newest_when_full(engine_host):
    host, engine, sock = engine_host
    submit(sock, 0, "A")
    wait_until(lambda: engine.ran == [0], "the engine is busy")
    for rid in (1, 2, 3, 4):
        submit(sock, rid, "A")
    wait_until(lambda: engine.queued == 4, "the queue is full")
    submit(sock, 5, "A")
    assert answers(sock, 1) == {5: "overloaded"}
    submit(sock, 100, "B")
    assert answers(sock, 1) == {4: "overloaded"}
    engine.release.set()
    assert answers(sock, 5) == {0: "ok", 1: "ok", 2: "ok", 3: "ok", 100: "ok"}
    assert engine.ran == [0, 1, 100, 2, 3]


def test_the_engine_process_holds_back_a_refusal_to_a_client_with_requests_waiting(tmp_path):
    """As one process does (server/admission.py): A, with requests waiting, gets its 429 the hold
    late; C, with none, at once, while A's is still held."""
    hold = 1.0
    with hosted(tmp_path, max_queue=2, refusal_hold_s=hold) as (host, engine, sock):
        submit(sock, 0, "A")
        wait_until(lambda: engine.ran == [0], "the engine is busy")
        submit(sock, 1, "A")
        submit(sock, 2, "B")
        wait_until(lambda: engine.queued == 2, "the queue is full")
        start = time.monotonic()
        submit(sock, 3, "A")
        submit(sock, 4, "C")
        assert answers(sock, 1) == {4: "overloaded"}  # C: at once, while A's 429 is held
        assert time.monotonic() - start < hold / 2
        assert answers(sock, 1) == {3: "overloaded"}
        assert time.monotonic() - start >= hold * 0.95
        engine.release.set()
        assert answers(sock, 3) == {0: "ok", 1: "ok", 2: "ok"}


@pytest.mark.parametrize("who", ["front end", "engine"])
def test_a_draining_front_end_or_engine_gets_the_refusals_held_for_it_at_once(tmp_path, who):
    """As one process's Admission.close does: a drain waits for nothing held back. The refusal is
    held for far longer than the test waits for it."""
    with hosted(tmp_path, max_queue=1, refusal_hold_s=30.0) as (host, engine, sock):
        busy_and_full(sock, engine, 1)
        submit(sock, 2, "A")
        wait_until(lambda: len(host._held) == 1, "A's refusal is held")
        start = time.monotonic()
        if who == "front end":
            sock.sendall(link.frame({"op": link.STATE, "frontend": 0, "state": "draining"}))
        else:
            host.set_state("draining")
        assert answers(sock, 1) == {2: "overloaded"}
        assert time.monotonic() - start < 5.0
        engine.release.set()
        assert answers(sock, 2) == {0: "ok", 1: "ok"}


def test_the_engine_process_holds_the_refusals_of_an_address_that_sends_many_ids(tmp_path):
    """As one process does (server/admission.py RecentRefusals): past FLOOD_REFUSALS refusals of one
    address within the hold, its refusals are held whatever client ids they name; another address's
    refusal comes at once meanwhile."""
    hold = 1.0
    with hosted(tmp_path, max_queue=1, refusal_hold_s=hold) as (host, engine, sock):
        busy_and_full(sock, engine, 1)
        start = time.monotonic()
        first = range(10, 10 + FLOOD_REFUSALS - 1)
        for rid in first:
            submit(sock, rid, f"id:x{rid}", "10.0.0.9")
        assert answers(sock, len(first)) == {rid: "overloaded" for rid in first}
        assert time.monotonic() - start < hold / 2
        submit(sock, 99, "id:x99", "10.0.0.9")  # the address's FLOOD_REFUSALS-th: held
        submit(sock, 100, "id:y", "10.0.0.10")  # another address: at once, while 99's is held
        assert answers(sock, 1) == {100: "overloaded"}
        assert time.monotonic() - start < hold / 2
        assert answers(sock, 1) == {99: "overloaded"}
        assert time.monotonic() - start >= hold * 0.95
        engine.release.set()
        assert answers(sock, 2) == {0: "ok", 1: "ok"}


def test_the_engine_process_gives_a_host_of_many_ids_one_turn_among_the_hosts(tmp_path):
    """serve's default --client-key address-id, as front ends send it: a host that sends each request
    under a new id is one turn among the hosts, and at a full queue one of its requests gives its
    place to another host's, though each of its ids holds only one."""
    burst = [request_ids.client_key(f"x{rid}", "10.0.0.2") for rid in range(1, 5)]
    victim = request_ids.client_key(None, "10.0.0.1")
    with hosted(tmp_path, max_queue=4) as (host, engine, sock):
        submit(sock, 0, burst[0], "10.0.0.2")
        wait_until(lambda: engine.ran == [0], "the engine is busy")
        for rid, client in zip((1, 2, 3, 4), burst):
            submit(sock, rid, client, "10.0.0.2")
        wait_until(lambda: engine.queued == 4, "the queue is full")
        submit(sock, 100, victim, "10.0.0.1")
        assert answers(sock, 1) == {4: "overloaded"}, "the burst's newest gives its place"
        engine.release.set()
        assert answers(sock, 5) == {0: "ok", 1: "ok", 2: "ok", 3: "ok", 100: "ok"}
        assert engine.ran == [0, 1, 100, 2, 3]

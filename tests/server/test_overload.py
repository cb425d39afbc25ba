"""Overload: an open-loop burst far above capacity (one slot, a 50 ms engine, requests every
4 ms with 300 ms deadlines). Every answer is a success, 429 or 504; no success arrives after
its deadline; rejected and queue-expired requests never reach the engine; the server is
ready and serving afterwards.

The only clock check is the contract's: a success within its deadline, plus SLACK_S for
loopback transport and the client's own event loop. A server that ignored deadlines would
answer successes up to MAX_QUEUE x 50 ms = 1 s late, far beyond it.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
import tritonclient.grpc.aio as tgrpc_aio
import tritonclient.http as thttp
import tritonclient.http.aio as thttp_aio
from tritonclient.utils import InferenceServerException

from tests.server.conftest import SCORE_SPEC, metric, wait_metric
from tests.server.fake_engine import read_log, write_fake_artifact

REQUESTS = 150
INTERVAL_S = 0.004  # 250 requests/s against a capacity of 20/s
TIMEOUT_S = 0.3
SLACK_S = 0.5
MAX_QUEUE = 20
OK, REJECTED, EXPIRED = "ok", "rejected", "expired"
STATUS = {"200": OK, "429": REJECTED, "504": EXPIRED, "StatusCode.RESOURCE_EXHAUSTED": REJECTED,
          "StatusCode.DEADLINE_EXCEEDED": EXPIRED}


@pytest.fixture(scope="module")
def slow_server(launch, tmp_path_factory):
    root = tmp_path_factory.mktemp("overload")
    log = root / "calls.jsonl"
    server = launch([write_fake_artifact(root / "fscore", SCORE_SPEC, sleep_s=0.05, log=log)],
                    args=["--max-inflight", "1", "--max-queue", str(MAX_QUEUE)])
    server.log = log
    yield server
    assert server.stop() == 0


async def burst(protocol: str, server) -> list[tuple[str, str, str, float]]:
    """(text, outcome, message, client-side seconds) per request, sent on a fixed schedule."""
    if protocol == "http":
        client, mod = thttp_aio.InferenceServerClient(server.http_url, conn_limit=REQUESTS + 10), thttp_aio
    else:
        client, mod = tgrpc_aio.InferenceServerClient(server.grpc_url), tgrpc_aio

    async def one(i):
        await asyncio.sleep(i * INTERVAL_S)  # open loop: the schedule ignores answers
        text = f"burst {protocol} {i}"
        tensor = mod.InferInput("TEXT", [1], "BYTES")
        tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
        start = time.monotonic()
        try:
            if protocol == "http":
                await client.infer("fscore", [tensor], timeout=int(TIMEOUT_S * 1e6))
            else:
                await client.infer("fscore", [tensor], client_timeout=TIMEOUT_S)
            outcome, message = OK, ""
        except InferenceServerException as exc:
            outcome, message = STATUS.get(exc.status(), f"unexpected {exc.status()}"), exc.message() or ""
        return text, outcome, message, time.monotonic() - start

    try:
        return await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(REQUESTS))), 60.0)
    finally:
        await client.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_open_loop_burst(slow_server, protocol):
    results = asyncio.run(burst(protocol, slow_server))
    outcomes = [r[1] for r in results]
    assert set(outcomes) <= {OK, REJECTED, EXPIRED}, sorted(set(outcomes))
    assert outcomes.count(OK) >= 1 and outcomes.count(REJECTED) >= 1 and outcomes.count(EXPIRED) >= 1, (
        {o: outcomes.count(o) for o in set(outcomes)})
    late = [(text, seconds) for text, outcome, _, seconds in results if outcome == OK and seconds > TIMEOUT_S + SLACK_S]
    assert not late, f"successes after their deadline: {late[:5]}"

    wait_metric(slow_server, 'boundgen_inflight_requests{model="fscore"}', 0)
    wait_metric(slow_server, 'boundgen_queue_depth{model="fscore"}', 0)
    ran = {call["texts"][0] for call in read_log(slow_server.log)}
    rejected = [text for text, outcome, _, _ in results if outcome == REJECTED]
    never_run = [text for text, outcome, message, _ in results if outcome == EXPIRED and "not run" in message]
    assert not ran.intersection(rejected), "a rejected request reached the engine"
    assert not ran.intersection(never_run), "a request that expired in the queue reached the engine"
    assert ran.issuperset(text for text, outcome, _, _ in results if outcome == OK)

    if protocol == "http":  # every request counted once, by outcome
        counted = sum(metric(slow_server, f'boundgen_requests_total{{model="fscore",outcome="{o}",protocol="http"}}')
                      for o in ("success", "rejected", "deadline_exceeded"))
        assert counted == REQUESTS

    client = thttp.InferenceServerClient(slow_server.http_url)
    assert client.is_server_ready()
    tensor = thttp.InferInput("TEXT", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([b"after the burst"], dtype=object))
    assert client.infer("fscore", [tensor]).as_numpy("SCORES").shape == (1, 2)


def test_an_empty_text_is_refused_400_under_a_full_queue(launch, tmp_path):
    """The content check needs no tokenizer, so it comes before admission: an empty text meeting a
    full queue is answered 400 (it was 429, its fault unseen until a slot was free)."""
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC, sleep_s=0.5)],
                    args=["--max-inflight", "1", "--max-queue", "1"])

    async def run():
        client = thttp_aio.InferenceServerClient(server.http_url, conn_limit=8)

        async def send(text):
            tensor = thttp_aio.InferInput("TEXT", [1], "BYTES")
            tensor.set_data_from_numpy(np.array([text.encode()], dtype=object))
            try:
                await client.infer("fscore", [tensor])
                return "200", ""
            except InferenceServerException as exc:
                return exc.status(), exc.message() or ""

        try:
            busy = [asyncio.ensure_future(send(f"busy {i}")) for i in range(2)]  # the slot and the queue's place
            await asyncio.to_thread(wait_metric, server, 'boundgen_queue_depth{model="fscore"}', 1.0)
            answers = [await send(text) for text in ("", "  \n", "one more")]
            await asyncio.gather(*busy)
            return answers
        finally:
            await client.close()

    try:
        empty, blank, good = asyncio.run(run())
        assert empty[0] == "400" and "sample 0 is empty or whitespace only" in empty[1], empty
        assert blank[0] == "400" and "sample 0 is empty or whitespace only" in blank[1], blank
        assert good[0] == "429", good  # the queue is full for a request without a fault
    finally:
        assert server.stop() == 0

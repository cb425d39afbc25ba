"""Reading and parsing a request body off the path other requests wait on (server/http_bodies.py,
inflation.py, json_worker.py): a compressed body inflated here a bounded step at a time, yielding
to the event loop between steps and stopping at the limit; a body over its JSON values answered at
once, its rest dropped unparsed, then closed; a large body parsed in a worker process; compressed
and large bodies within the limits served as before."""

from __future__ import annotations

import asyncio
import gzip
import json
import os
import socket
import sys
import zlib

import brotli
import pytest
from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request

from boundgen.errors import InvalidInput
from boundgen.server.config import ServerConfig
from boundgen.server.http_bodies import STEP, BodyTooLarge, parse_json, read_body
from boundgen.server.inflation import Inflater
from boundgen.server.json_values import ENVELOPE, ValueCount
from boundgen.server.json_worker import LARGE, JsonWorker
from tests.server.conftest import BEAM_SPEC, SCORE_SPEC
from tests.server.fake_engine import write_fake_artifact
from tests.server.test_reliability import NOT_HUNG_S, http, json_body, read_until_closed

LIMIT = 1 << 20


def spaces(mib: int, encoding: str) -> bytes:
    """`mib` MiB of spaces, inside a JSON string (so that only the size limit refuses them: spaces outside
    strings are refused sooner, by json_values' bytes-outside-strings bound), compressed as Content-Encoding
    `encoding` sends them."""
    data = b'"' + b" " * (mib << 20)
    if encoding == "br":
        return brotli.compress(data)
    wbits = {"gzip": 31, "deflate": 15, "raw-deflate": -15}[encoding]
    packer = zlib.compressobj(9, zlib.DEFLATED, wbits)
    return packer.compress(data) + packer.flush()


# ---- inflation ------------------------------------------------------------------------------

@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate", "br"])
def test_inflation_gives_bounded_steps_and_stops_where_its_reader_does(encoding):
    """A 64 MiB bomb read to a 1 MiB limit: every step at most STEP bytes, and no more inflated
    than the limit and one step, whatever the compressed chunks (the whole body at once here)."""
    inflater = Inflater("deflate" if encoding == "raw-deflate" else encoding)
    taken = 0
    for part in inflater.steps(spaces(64, encoding), STEP):
        assert 0 < len(part) <= STEP
        taken += len(part)
        if taken > LIMIT:
            break
    assert taken > LIMIT and inflater.inflated <= LIMIT + STEP


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate", "br"])
def test_inflation_is_exact_in_any_chunks(encoding):
    text = json.dumps({"data": [f"text {i} é" for i in range(20_000)]}).encode()
    if encoding == "br":
        sent = brotli.compress(text)
    else:
        packer = zlib.compressobj(6, zlib.DEFLATED, {"gzip": 31, "deflate": 15, "raw-deflate": -15}[encoding])
        sent = packer.compress(text) + packer.flush()
    inflater = Inflater("deflate" if encoding == "raw-deflate" else encoding)
    out = b"".join(part for start in range(0, len(sent), 777)
                   for part in inflater.steps(sent[start:start + 777], 1000))
    inflater.finish()
    assert out == text


def test_concatenated_gzip_members_are_inflated_in_turn():
    inflater = Inflater("gzip")
    assert b"".join(inflater.steps(gzip.compress(b"[1, ") + gzip.compress(b"2]"), STEP)) == b"[1, 2]"
    inflater.finish()


def test_a_cut_or_corrupt_stream_is_bad_input():
    cut = Inflater("gzip")
    list(cut.steps(gzip.compress(b'{"a": 1}' * 100)[:-20], STEP))
    with pytest.raises(InvalidInput, match="ends before its end"):
        cut.finish()
    with pytest.raises(InvalidInput, match="not valid gzip"):
        list(Inflater("gzip").steps(b"\x1f\x8b not gzip at all", STEP))
    with pytest.raises(InvalidInput, match="not supported"):
        Inflater("zstd")


# ---- read_body on a stream as the server's connections give it (not inflated) -----------------

def body_request(body: bytes, headers: dict) -> "web.Request":
    """A request whose body stream holds `body` as it came over the wire (as Ray's proxy hands it)."""
    loop = asyncio.get_running_loop()
    protocol = type("Flow", (), {"_reading_paused": False, "pause_reading": lambda self: None,
                                 "resume_reading": lambda self, resume_parser=True: None})()
    payload = StreamReader(protocol, 1 << 16, loop=loop)
    payload.feed_data(body)
    payload.feed_eof()
    return make_mocked_request("POST", "/v2/models/m/infer", headers=headers, payload=payload)


def test_read_body_inflates_a_step_at_a_time_and_refuses_at_the_limit():
    """The bomb is refused at the limit, and other tasks ran between its steps: at least one turn
    per STEP inflated (before, the stream was taken as it came: 64 KiB of gzip, no refusal)."""
    async def main():
        turns, done = 0, asyncio.Event()

        async def other():
            nonlocal turns
            while not done.is_set():
                turns += 1
                await asyncio.sleep(0)

        ticker = asyncio.ensure_future(other())
        await asyncio.sleep(0)
        request = body_request(spaces(64, "gzip"), {"Content-Encoding": "gzip"})
        try:
            with pytest.raises(BodyTooLarge, match="--max-body-bytes"):
                await read_body(request, ServerConfig(max_body_bytes=LIMIT))
        finally:
            done.set()
            await ticker
        return turns

    assert asyncio.run(main()) >= LIMIT // STEP


def test_read_body_gives_a_compressed_body_inflated():
    text = json_body(["a"] * 3)

    async def main():
        request = body_request(gzip.compress(text), {"Content-Encoding": "GZip"})
        return await read_body(request, ServerConfig())

    assert asyncio.run(main()) == text


@pytest.mark.parametrize("header", ["gzip, gzip", "compress", "x-gzip", "gzip;q=1", "gzíp"])
def test_read_body_refuses_a_coding_it_cannot_undo(header):
    """Before, any value but one of the four codings was taken as identity: a body sent with
    `gzip, gzip` reached the JSON parser still compressed, and its bounds counted it compressed."""
    async def main():
        request = body_request(gzip.compress(gzip.compress(json_body(["a"]))), {"Content-Encoding": header})
        await read_body(request, ServerConfig())

    with pytest.raises(InvalidInput, match="Content-Encoding .* is not supported here"):
        asyncio.run(main())


@pytest.mark.parametrize("header", ["gzip, chunked", "deflate,chunked", "chunked, chunked"])
def test_read_body_refuses_a_transfer_coding_besides_chunked(header):
    """Before, `Transfer-Encoding: gzip, chunked` was read as chunked alone: the gzip bytes reached the
    JSON parser as they were."""
    async def main():
        await read_body(body_request(gzip.compress(json_body(["a"])), {"Transfer-Encoding": header}), ServerConfig())

    with pytest.raises(InvalidInput, match="Transfer-Encoding .* is not supported here"):
        asyncio.run(main())


@pytest.mark.parametrize("header", ["identity", " Identity ", ""])
def test_read_body_takes_identity_as_sent(header):
    async def main():
        return await read_body(body_request(json_body(["a"]), {"Content-Encoding": header}), ServerConfig())

    assert asyncio.run(main()) == json_body(["a"])


# ---- a real server ------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def server(launch, tmp_path_factory):
    root = tmp_path_factory.mktemp("bodies")
    server = launch([write_fake_artifact(root / "fscore", SCORE_SPEC), write_fake_artifact(root / "fbeam", BEAM_SPEC)],
                    args=["--read-timeout-s", "60"])
    yield server
    assert server.stop() == 0


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "raw-deflate", "br"])
def test_compressed_bodies_within_the_limits_are_served(server, encoding):
    text = json_body(["a query", "another"])
    if encoding == "br":
        sent = brotli.compress(text)
    else:
        packer = zlib.compressobj(6, zlib.DEFLATED, {"gzip": 31, "deflate": 15, "raw-deflate": -15}[encoding])
        sent = packer.compress(text) + packer.flush()
    code, _, answer = http(server, "POST", "/v2/models/fscore/infer", sent,
                           {"Content-Type": "application/json",
                            "Content-Encoding": "deflate" if encoding == "raw-deflate" else encoding})
    assert code == 200, answer
    assert json.loads(answer)["outputs"][0]["shape"] == [2, 2]


def test_a_body_in_two_codings_is_a_400_that_names_the_header(server):
    sent = gzip.compress(gzip.compress(json_body(["a query"])))
    code, _, answer = http(server, "POST", "/v2/models/fscore/infer", sent,
                           {"Content-Type": "application/json", "Content-Encoding": "gzip, gzip"})
    assert code == 400, answer
    assert "Content-Encoding gzip, gzip is not supported" in json.loads(answer)["error"]


def test_a_chunked_body_in_another_transfer_coding_is_a_400_that_names_it(server):
    sent = gzip.compress(json_body(["a query"]))
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=NOT_HUNG_S)
    sock.sendall(b"POST /v2/models/fscore/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: gzip, chunked\r\nConnection: close\r\n\r\n"
                 + f"{len(sent):x}\r\n".encode() + sent + b"\r\n0\r\n\r\n")
    head, _, error = read_until_closed(sock).partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400"), head
    assert "Transfer-Encoding gzip, chunked is not supported" in json.loads(error)["error"]


def test_a_body_over_its_json_values_is_answered_before_its_rest_then_closed(server):
    """Only the first 256 KiB of a 4 MB body of a million strings is sent: the 400 comes at once
    (before, the server waited for the rest, up to --read-timeout-s, to count it whole); the rest is
    then read and dropped, and the connection closed, so that a client that sends all of its
    body before it reads gets the answer, not a reset."""
    body = ('{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": [%s]}]}'
            % ",".join(['"a"'] * 1_000_000)).encode()
    sock = socket.create_connection(("127.0.0.1", server.http_port), timeout=NOT_HUNG_S)
    sock.sendall(b"POST /v2/models/fscore/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body[:256 << 10])
    answer = b""
    while b"\r\n\r\n" not in answer or len(answer) < answer.index(b"\r\n\r\n") + 4 + length(answer):
        chunk = sock.recv(65536)
        assert chunk, answer
        answer += chunk
    head, _, error = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400") and b"Connection: close" in head, head
    assert "JSON values" in json.loads(error)["error"]
    sock.sendall(body[256 << 10:])
    assert read_until_closed(sock) == b""


def length(answer: bytes) -> int:
    """The Content-Length of an answer whose head has arrived."""
    head = answer.partition(b"\r\n\r\n")[0].decode().lower()
    return int(head.split("content-length:")[1].split("\r\n")[0])


def test_a_utf16_body_is_counted_whole_before_it_is_refused(server):
    """A UTF-16 body's bytes may look like more values than it holds: it is read to its end and
    counted as UTF-8 (served here), never refused early for them."""
    body = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}],
                       "parameters": {"pad": "\u2200," * 3000}}, ensure_ascii=False).encode("utf-16")
    count = ValueCount(ENVELOPE)  # U+2200 is the bytes 00 22: a quote each, so the commas look outside strings
    count.feed(body)
    assert count.over and not count.final
    code, _, answer = http(server, "POST", "/v2/models/fscore/infer", body, {"Content-Type": "application/json"})
    assert code == 200, answer


# ---- large bodies parsed in a worker process ----------------------------------------------------

def worker_processes(pid: int) -> list[str]:
    """The command lines of `pid`'s child processes that are JSON workers."""
    found = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            for child in f.read().split():
                with open(f"/proc/{child}/cmdline", "rb") as c:
                    line = c.read().replace(b"\0", b" ").decode()
                if "boundgen.server.json_worker" in line:
                    found.append(line)
    return found


def test_a_large_body_is_parsed_in_a_worker_process_and_answered_as_before(server):
    """A body of LARGE bytes or more is parsed by the server's JSON worker (before, on the event
    loop), with the same answers: served, or refused with parse_json's messages."""
    pad = "x" * LARGE
    body = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": ["a", "b"]}],
                       "parameters": {"pad": pad}}).encode()
    code, _, answer = http(server, "POST", "/v2/models/fscore/infer", body, {"Content-Type": "application/json"})
    assert code == 200 and json.loads(answer)["outputs"][0]["shape"] == [2, 2], answer
    assert len(worker_processes(server.proc.pid)) == 1
    code, _, answer = http(server, "POST", "/v1/score", json.dumps(
        {"query": "q ", "items": ["a", "b"], "label_token_ids": [9693], "apply_softmax": True, "pad": pad}).encode(),
        {"Content-Type": "application/json"})
    assert code == 400 and "unknown fields 'pad'" in json.loads(answer)["message"], answer  # parsed, then checked
    for bad, error in ((body[:-2] + b" " * 10, "is not valid JSON: Expecting"),
                       (b'"' + b"\xff" * LARGE + b'"', "not valid UTF-8")):
        code, _, answer = http(server, "POST", "/v2/models/fscore/infer", bad, {"Content-Type": "application/json"})
        assert code == 400 and error in json.loads(answer)["error"], answer
    assert len(worker_processes(server.proc.pid)) == 1  # one worker, kept


@pytest.mark.parametrize("body,error", [
    (b"NaN", "NaN is not a JSON value"),
    (b'{"timeout": Infinity}', "Infinity is not a JSON value"),
    (b"[-Infinity]", "-Infinity is not a JSON value"),
    (b'{"top_n": 1e999}', "the number 1e999 is out of range"),
])
def test_what_json_has_not_is_not_valid_json(body, error):
    """Python's reader took NaN, Infinity and 1e999 (as inf): a 400 came later, from a field's check,
    or none at all. Here and in the worker alike."""
    async def main(worker):
        try:
            with pytest.raises(InvalidInput, match=f"not valid JSON: {error}"):
                await worker.loads(body + b" " * LARGE, "the request body", parse_json)
        finally:
            await worker.close()

    with pytest.raises(InvalidInput, match=f"not valid JSON: {error}"):
        parse_json(body, "the request body")
    asyncio.run(main(JsonWorker()))


def test_the_worker_keeps_its_servers_digit_limit_and_its_pipes_in_step_when_a_caller_is_cancelled():
    body = b'{"n": ' + b"7" * 700 + b', "pad": "' + b"x" * LARGE + b'"}'

    async def main(worker):
        with pytest.raises(InvalidInput, match="not valid JSON: Exceeds the limit") as refused:
            await worker.loads(body, "the request body", parse_json)
        assert "set_int_max_str_digits" not in str(refused.value)  # Python's advice to programmers, left out
        call = asyncio.ensure_future(worker.loads(b'["' + b"y" * (16 << 20) + b'"]', "the request body", parse_json))
        await asyncio.sleep(0.01)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await worker.loads(b'{"pad": "' + b"x" * LARGE + b'"}', "it", parse_json) == {"pad": "x" * LARGE}
        await worker.close()

    digits = sys.get_int_max_str_digits()
    sys.set_int_max_str_digits(640)  # as every serving process (app.py)
    try:
        asyncio.run(main(JsonWorker()))
    finally:
        sys.set_int_max_str_digits(digits)


def test_a_stalled_worker_is_replaced_and_its_body_parsed_here():
    """A worker that does not answer within its bound (here stopped with SIGSTOP) is killed: the body
    it held is parsed in the server, the next goes to a new worker; before, the request waited on
    the stopped worker for ever, and every large body behind it too."""
    import os
    import signal
    import time

    body = b'{"pad": "' + b"x" * LARGE + b'"}'

    async def main(worker):
        assert await worker.loads(body, "it", parse_json) == {"pad": "x" * LARGE}  # the worker started
        stopped = worker._proc
        os.kill(stopped.pid, signal.SIGSTOP)
        start = time.monotonic()
        assert await worker.loads(body, "it", parse_json) == {"pad": "x" * LARGE}
        assert 0.4 < time.monotonic() - start < 5.0
        assert await worker.loads(body, "it", parse_json) == {"pad": "x" * LARGE}
        assert worker._proc is not stopped and worker._proc.returncode is None
        await stopped.wait()  # killed (SIGKILL ends a stopped process too)
        await worker.close()

    asyncio.run(main(JsonWorker(answer_s=0.5)))

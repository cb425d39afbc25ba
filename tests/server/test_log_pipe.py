"""A server whose stderr nobody reads (a log shipper that hung, a pipe left open) keeps serving: its
log records wait in a bounded queue for a writer thread, never written by the thread that handles
a request; once the pipe is read again they all come out, and with the pipe full SIGTERM still
drains and stops the server. Past the queue's bound lines are dropped and counted, and the writer
says how many. With front-end processes too (they share the pipe)."""

from __future__ import annotations

import fcntl
import os
import re
import signal
import subprocess
import threading
import time
import urllib.request

import pytest

from boundgen.server import logs
from tests.server.conftest import FAKE_SERVE, REPO, SCORE_SPEC
from tests.server.fake_engine import write_fake_artifact
from tests.server.test_real_engine import eager_models  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow
REQUESTS = 1500  # ~120-byte access records: ~180 KB, about three times what a Linux pipe holds
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _score(port: int, model: str) -> int:
    body = b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a relevant document"]}]}'
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v2/models/{model}/infer", data=body,
                                     headers={"Content-Type": "application/json"})
    with _OPENER.open(request, timeout=10) as answer:
        return answer.status


def _wait_ready(port: int, timeout_s: float = 60.0) -> None:
    """Until the first ready answer: with front ends every one of them is ready from then on (each
    connection lands on any of them; the requests that follow must not meet a 503)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with _OPENER.open(f"http://127.0.0.1:{port}/v2/health/ready", timeout=2) as answer:
                if answer.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.02)
    raise AssertionError(f"the server was not ready within {timeout_s} s")


def _drain(fd: int) -> bytes:
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    fcntl.fcntl(fd, fcntl.F_SETFL, flags | os.O_NONBLOCK)
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            return b"".join(chunks)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


@pytest.mark.parametrize("frontends", [None, 2], ids=["one_process", "frontends_2"])
def test_a_stderr_nobody_reads_stalls_no_request(tmp_path, frontends, eager_models):
    """One process with a fake engine; two front ends around a real eager model (front ends need its
    tokenizer)."""
    read_end, write_end = os.pipe()
    model = "escore" if frontends else "fscore"
    artifact = eager_models["score"] if frontends else write_fake_artifact(tmp_path / "fscore", SCORE_SPEC)
    args = [str(artifact), "--http-port", "0", "--grpc-port", "0", "--access-log",
            *(["--frontends", str(frontends)] if frontends else [])]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as serve runs by default
    proc = subprocess.Popen(FAKE_SERVE + args, stdout=subprocess.PIPE, stderr=write_end, text=True, cwd=REPO, env=env)
    os.close(write_end)
    try:
        port = None
        for line in proc.stdout:  # serve's status lines go to stdout, which this test reads
            match = re.search(r"listening http=[^ ]*:(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        assert port is not None, "the server did not say where it listens"
        threading.Thread(target=proc.stdout.read, daemon=True).start()
        _wait_ready(port)
        slowest = 0.0
        for i in range(REQUESTS):
            sent = time.monotonic()
            try:
                assert _score(port, model) == 200
            except Exception as exc:
                raise AssertionError(f"request {i}: {exc}; stderr: {_drain(read_end)[-3000:]!r}") from exc
            slowest = max(slowest, time.monotonic() - sent)
        assert slowest < 5.0, f"a request took {slowest:.1f} s"  # none waited for the pipe
        logged, deadline = b"", time.monotonic() + 20  # the pipe read again: the queue held every record
        while logged.count(b"boundgen.access") < REQUESTS and time.monotonic() < deadline:
            logged += _drain(read_end)
            time.sleep(0.05)
        assert logged.count(b"boundgen.access") == REQUESTS and b"dropped" not in logged
        for _ in range(REQUESTS):  # the pipe full again, and left so: SIGTERM still drains and stops
            assert _score(port, model) == 200
        stopping = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        assert code == 0 and time.monotonic() - stopping < 30
    finally:
        proc.kill()
        proc.wait()
        os.close(read_end)


class _StuckStream:
    """A stream that takes nothing until `unblock` is set (a pipe nobody reads)."""
    name = "<stderr>"

    def __init__(self):
        self.unblock, self.text = threading.Event(), ""

    def write(self, text):
        self.unblock.wait()
        self.text += text

    def flush(self):
        pass


def test_past_its_bound_the_writer_drops_lines_and_says_how_many():
    """While the stream takes nothing, writing never waits; lines past the queue's bound are dropped
    and counted; once the stream takes lines the queued ones come out in order, then the count."""
    stream = _StuckStream()
    writer = logs.LineWriter(stream, capacity=3)
    started = time.monotonic()
    for i in range(10):
        writer.write(f"line {i}")
    assert time.monotonic() - started < 1.0
    time.sleep(0.2)
    assert 6 <= writer.dropped() <= 7  # the writer holds one line, the queue three
    stream.unblock.set()
    writer.close()
    kept = 10 - writer.dropped()
    assert stream.text.splitlines() == [f"line {i}" for i in range(kept)] + [
        f"boundgen: {writer.dropped()} lines dropped: stderr was not read"]


def test_a_file_or_a_buffer_is_written_at_once(tmp_path, capsys):
    """Only pipes wait for a reader: a file (or a test's buffer) takes each line as it is said."""
    with open(tmp_path / "log.txt", "w") as f:
        assert not logs.is_pipe(f)
        logs.say(f, "a status line")
        assert (tmp_path / "log.txt").read_text() == "a status line\n"
    read_end, write_end = os.pipe()
    with os.fdopen(write_end, "w") as pipe:
        assert logs.is_pipe(pipe)
    os.close(read_end)


class _SlowStream(_StuckStream):
    """A stream that takes a line every 5 ms (a reader that is alive but slow)."""

    def write(self, text):
        time.sleep(0.005)
        self.text += text


def test_while_lines_are_dropped_the_writer_says_so_every_second():
    """Under steady overload the queue never empties: the drops are still reported as they go on,
    not only once the load stops."""
    stream = _SlowStream()
    stream.unblock.set()
    writer = logs.LineWriter(stream, capacity=5)
    end = time.monotonic() + 2.5
    while time.monotonic() < end:
        writer.write("a record")
        time.sleep(0.001)
    reports = stream.text.count("lines dropped")  # while still loaded: nothing has been closed yet
    writer.close()
    assert reports >= 1 and writer.dropped() > 0


@pytest.mark.parametrize("frontends", [None, 2], ids=["one_process", "frontends_2"])
def test_a_log_reader_that_goes_away_stalls_nothing_and_the_drain_exits_0(tmp_path, frontends, eager_models):
    """The reader of stdout and stderr exits (a log shipper killed): writes meet EPIPE. Requests are
    answered as before, and SIGTERM drains and stops with exit 0, not Python's 120 for an exit whose
    last flush failed, and with no traceback."""
    model = "escore" if frontends else "fscore"
    artifact = eager_models["score"] if frontends else write_fake_artifact(tmp_path / "fscore", SCORE_SPEC)
    args = [str(artifact), "--http-port", "0", "--grpc-port", "0", "--access-log",
            *(["--frontends", str(frontends)] if frontends else [])]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    proc = subprocess.Popen(FAKE_SERVE + args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            cwd=REPO, env=env)
    try:
        port = None
        for line in proc.stdout:
            match = re.search(r"listening http=[^ ]*:(\d+)", line)
            if match:
                port = int(match.group(1))
                break
        assert port is not None, "the server did not say where it listens"
        _wait_ready(port)
        proc.stdout.close()  # the reader goes away: every later write to either stream meets EPIPE
        proc.stderr.close()
        for _ in range(50):
            assert _score(port, model) == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        proc.kill()
        proc.wait()

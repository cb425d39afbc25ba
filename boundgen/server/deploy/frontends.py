"""`boundgen serve --frontends N`: N front-end processes around one engine process.

    clients -> HTTP / gRPC ports, shared by N front-end processes (SO_REUSEPORT)
                 front end (frontend.py): protocol, tokenizing, result encoding, in its own GIL
                   -> link (link.py: a Unix socket, token ids and result rows as raw arrays)
    this process: EngineHost (engine_host.py): one queue per model, the batcher, program calls

This process binds both ports first (so that port 0 picks one number for everyone), starts the
front ends, says "listening" once each listens, loads and warms up the artifacts (on a thread, so
that a stop meanwhile exits at once), then tells the front ends to become ready (a front end killed
from outside meanwhile is started again). A front end that exits is restarted (its own in-flight
requests fail with it; the engine withdraws what it had queued); one that is ready but whose event
loop answers no ping for --frontend-hang-s (stopped, or stuck in a bug) is killed first, and so is a
restarted one not ready within START_TIMEOUT_S; one that fails MAX_FAILED_STARTS starts in a row
(exits with an error or crashes before it is ready) stops serve (exit 1). SIGTERM / SIGINT /
SIGHUP (app.STOP_SIGNALS): every front end drains (new requests 503; what it admitted finishes) and
exits, then the engine admits nothing more and the engines close; exit 0, or 1 where a front end's
drain ended in an error or a crash (one stuck past the drain timeout is killed and named, as one
process names its own). If this process dies, the front ends see the link close (and their
lifeline pipe) and exit: no half-alive server.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from boundgen.errors import BoundgenError
from boundgen.server import logs
from boundgen.server.app import LISTENING, STOP_SIGNALS
from boundgen.server.config import ServerConfig
from boundgen.server.deploy import link
from boundgen.server.deploy.engine_host import EngineHost
from boundgen.server.deploy.replicas import LIFELINE_ENV

START_TIMEOUT_S = 120.0  # a front end must listen (and later be ready) within this long
RESTART_BACKOFF_S = 0.5  # before a restart, times the front end's failed starts in a row plus one (at most 5 s)
MAX_FAILED_STARTS = 5  # a front end that fails this many starts in a row stops serve
# The signals of a process's own crash: an exit by one of these before it is ready is a failed start, as an exit
# with an error is; one killed from outside (SIGKILL, SIGTERM: the OOM killer, an operator) says nothing of it.
CRASH_SIGNALS = frozenset({signal.SIGSEGV, signal.SIGABRT, signal.SIGBUS, signal.SIGILL, signal.SIGFPE})


def default_frontends(cores: int | None = None) -> int:
    """Front-end processes when --frontends is not given: one per four usable cores, 1 to 8;
    1 (everything in one process) below four cores."""
    cores = cores if cores is not None else usable_cores()
    return 1 if cores < 4 else max(2, min(8, cores // 4))


def usable_cores(cpu_max: str = "/sys/fs/cgroup/cpu.max") -> int:
    """The cores this process may use: its CPU affinity, capped by a cgroup v2 CPU quota (a
    container's CPU limit, which the affinity does not show)."""
    cores = len(os.sched_getaffinity(0))
    try:
        quota, period = open(cpu_max).read().split()[:2]
    except (OSError, ValueError):
        return cores
    if quota == "max":
        return cores
    return max(1, min(cores, int(int(quota) / int(period))))


class _Frontend:
    def __init__(self, index: int, argv: list[str], env: dict, lifeline: int):
        self.index, self.argv, self.env, self.lifeline = index, argv, env, lifeline
        self.process: subprocess.Popen | None = None
        self.restarts = 0
        self.failed_starts = 0  # starts in a row that failed before it was ready
        self.restart_at: float | None = None  # time.monotonic() of a restart that waits out its backoff
        self.started_at = 0.0  # time.monotonic() of its last start
        self.start_timed_out = False  # killed for not becoming ready within START_TIMEOUT_S of its start

    def start(self) -> None:
        self.started_at, self.start_timed_out = time.monotonic(), False
        self.process = subprocess.Popen(self.argv + ["--index", str(self.index)], env=self.env,
                                        stdout=sys.stderr, pass_fds=(self.lifeline,))

    def failed_start(self, code: int, was_ready: bool) -> bool | None:
        """Whether its exit with `code` was a failed start: True (an error, a crash or a start that timed out,
        before it was ready), False (it had been ready), None (killed from outside before it was ready: no
        verdict)."""
        if was_ready:
            return False
        if self.start_timed_out or code >= 0 or -code in CRASH_SIGNALS:
            return True
        return None


def serve_frontends(artifact_dirs: Sequence[str | Path], config: ServerConfig, count: int,
                    engine_factory: Callable, out=sys.stdout) -> int:
    """Run the engine process and `count` front ends until SIGTERM / SIGINT; the exit code."""
    logs.configure(config.log_format, config.log_level)
    say_lock = threading.Lock()

    def say(message: str) -> None:  # to a pipe without waiting for its reader (logs.say)
        with say_lock:
            logs.say(out, logs.status_line(message, config.log_format))

    if not link.native_msgpack():
        say("warning: msgpack runs without its C extension (pure Python) in this Python: every request crosses "
            "the front ends' link slower; install msgpack's wheel for this interpreter")
    stop = threading.Event()
    for sig in STOP_SIGNALS:
        signal.signal(sig, lambda *_: stop.set())
    workdir = tempfile.mkdtemp(prefix="boundgen-serve-")
    host = EngineHost(os.path.join(workdir, "engine.sock"), config.max_queue, config.refusal_hold_ms / 1e3)
    http_hold, http_port = _reserve(config.host, config.http_port, "HTTP")
    grpc_hold, grpc_port = _reserve(config.host, config.grpc_port, "gRPC")
    child = dataclasses.replace(config, http_port=http_port, grpc_port=grpc_port)
    lifeline = os.pipe()
    env = dict(os.environ, **{LIFELINE_ENV: str(lifeline[0])})
    argv = [sys.executable, "-m", "boundgen.server.deploy.frontend", *map(str, artifact_dirs),
            "--link", host.path, "--config", json.dumps(dataclasses.asdict(child))]
    frontends = [_Frontend(i, argv, env, lifeline[0]) for i in range(count)]
    engines = []
    try:
        for fe in frontends:
            fe.start()
        if not _wait(host, count, "listening", frontends, stop, say):
            raise BoundgenError(f"the front-end processes did not all listen within {START_TIMEOUT_S:.0f} s")
        http_hold.close()
        grpc_hold.close()
        say(f"{LISTENING} http={config.host}:{http_port} grpc={config.host}:{grpc_port} frontends={count}")
        for path in artifact_dirs:
            if stop.is_set():
                return 0
            say(f"boundgen serve: loading {path}")
            loaded, engine = _unless_stopped(stop, engine_factory, Path(path))
            if not loaded:
                return 0
            engines.append(engine)
            if not _unless_stopped(stop, engine.warmup)[0]:
                engines.remove(engine)  # still warming up on its thread: left to the exit, not closed under it
                return 0
            host.add(engine.spec.name, engine, str(path))
            say(f"boundgen serve: model {engine.spec.name} ({engine.spec.task}) loaded and warmed up, "
                f"queue {config.max_queue}")
        host.set_state("ready")
        if not _wait(host, count, "ready", frontends, stop, say):
            raise BoundgenError(f"the front-end processes were not all ready within {START_TIMEOUT_S:.0f} s")
        host.set_state("serving")  # each front end answers ready from now on, all of them at once
        say(f"boundgen serve: ready, models: {', '.join(host.models)}, {count} front-end processes")
        failed = _supervise(frontends, stop, say, host, config.frontend_hang_s)
        if failed:
            say(f"boundgen serve: error: {failed}; stopping")
        say("boundgen serve: draining (new requests get 503 / UNAVAILABLE)")
        # The front ends first: each stops admitting and finishes what it admitted, which the engine
        # still takes; then the engine admits nothing more.
        drain_failed = False
        for fe, killed in _stop_frontends(frontends, config.drain_timeout_s + 5.0):
            pid, code = fe.process.pid, fe.process.returncode
            if killed:  # a drain past its time, as in one process (app.py): said, not an error of serve
                say(f"boundgen serve: front-end process {fe.index} (pid {pid}) had not drained "
                    f"{config.drain_timeout_s + 5.0:g} s after SIGTERM (stopped or stuck); killed it, with the "
                    "requests it held")
            elif code != 0 and (code != -signal.SIGTERM or host.was_ready(pid)):
                # (one that our SIGTERM ended before it was ready never listened: it held nothing)
                drain_failed = True
                say(f"boundgen serve: error: front-end process {fe.index} (pid {pid}) {_exit_words(code)} while "
                    "draining (its error, if any, is above); the requests it held may have failed")
        host.set_state("draining")
        return 1 if failed or drain_failed else 0
    finally:
        _stop_frontends(frontends, 0.0)
        for engine in engines:
            engine.close()
        host.close()
        os.close(lifeline[1])
        http_hold.close()
        grpc_hold.close()
        shutil.rmtree(workdir, ignore_errors=True)
        say("boundgen serve: stopped")


def _unless_stopped(stop: threading.Event, fn: Callable, *args) -> tuple[bool, object]:
    """`fn(*args)` (a load, a warm-up: seconds to minutes) on a daemon thread, waited for until it ends or
    `stop` is set: (True, its result), or (False, None) when stopped first, the thread left to the exit, so
    that a SIGTERM while a model loads exits at once, as one process does (app.in_daemon_thread; here
    the load ran on the main thread, and a stop waited for the load and its warm-up). Its error is raised."""
    ended, box = threading.Event(), {}

    def target():
        try:
            box["result"] = fn(*args)
        except BaseException as exc:  # handed to the waiting thread
            box["error"] = exc
        finally:
            ended.set()

    threading.Thread(target=target, name="boundgen-loader", daemon=True).start()
    while not ended.wait(0.1):
        if stop.is_set():
            return False, None
    if "error" in box:
        raise box["error"]
    return True, box["result"]


def _reserve(host: str, port: int, what: str) -> tuple[socket.socket, int]:
    """Bind host:port with SO_REUSEPORT (port 0: the kernel picks one) and hold it until the
    front ends listen on the same number."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host.strip("[]"), port))
    except OSError as exc:
        sock.close()
        raise BoundgenError(f"cannot listen for {what} on {host}:{port}: {exc.strerror or exc}") from None
    return sock, sock.getsockname()[1]


def _wait(host: EngineHost, count: int, state: str, frontends: list[_Frontend], stop: threading.Event, say) -> bool:
    """Until `count` front ends say `state` (True), serve is stopped (True) or START_TIMEOUT_S passes (False).
    A front end killed from outside meanwhile (SIGKILL, SIGTERM: the OOM killer, an operator), or one that had
    been ready, is started again; one that fails its start (an error, a crash) stops serve: its error is above."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline and not stop.is_set():
        if host.wait_frontends(count, state, 0.2):
            return True
        for fe in frontends:
            code = fe.process.poll()
            if code is None:
                continue
            if fe.failed_start(code, host.was_ready(fe.process.pid)):  # not one killed from outside, nor a ready one
                raise BoundgenError(f"front-end process {fe.index} {_exit_words(code)} while starting (its error is "
                                    "above)")
            fe.restarts += 1
            say(f"boundgen serve: front-end process {fe.index} {_exit_words(code)} while starting; starting it again "
                f"(restart {fe.restarts})")
            fe.start()
    return stop.is_set()


def _supervise(frontends: list[_Frontend], stop: threading.Event, say, host: EngineHost,
               hang_s: float) -> str | None:
    """Until `stop` (then None): restart a front end that exits, after a backoff that grows with its failed
    starts in a row (the watch over the others goes on meanwhile); kill one that is ready but has answered no
    ping for `hang_s` seconds (0: never), which then restarts: stopped or stuck, it would keep taking its share
    of new connections (SO_REUSEPORT) and answer none of them; kill a restarted one that is not ready within
    START_TIMEOUT_S (it does not listen before: it would only hang there). A front end that fails
    MAX_FAILED_STARTS starts in a row (`_Frontend.failed_start`: its model's files gone, a broken install)
    cannot serve: what to say, and serve stops, rather than restart it for ever."""
    while not stop.wait(0.2):
        stuck = set(host.stuck(hang_s)) if hang_s > 0 else set()
        for fe in frontends:
            if fe.restart_at is not None:
                if time.monotonic() >= fe.restart_at:
                    fe.restart_at = None
                    fe.start()
                continue
            pid = fe.process.pid
            if fe.process.poll() is None:
                if pid in stuck:
                    _kill(fe)  # first: saying it may block (a log pipe nobody reads), the kill must not
                    say(f"boundgen serve: front-end process {fe.index} (pid {pid}) answered no ping for {hang_s:g} "
                        "s (its event loop was stopped or stuck); killed it")
                elif time.monotonic() - fe.started_at > START_TIMEOUT_S and not host.was_ready(pid):
                    fe.start_timed_out = True  # a restart that hangs before it is ready (it does not listen yet)
                    _kill(fe)
                    say(f"boundgen serve: front-end process {fe.index} (pid {pid}) was not ready "
                        f"{START_TIMEOUT_S:.0f} s after its start; killed it")
            code = fe.process.poll()
            if code is None:
                continue
            failed = fe.failed_start(code, host.was_ready(pid))
            if failed is not None:
                fe.failed_starts = fe.failed_starts + 1 if failed else 0
            how = _exit_words(code)
            if fe.failed_starts >= MAX_FAILED_STARTS:
                return (f"front-end process {fe.index} failed {fe.failed_starts} starts in a row (the last "
                        f"{how}, before it was ready; its error is above)")
            fe.restarts += 1
            backoff = min(RESTART_BACKOFF_S * (fe.failed_starts + 1), 5.0)
            say(f"boundgen serve: front-end process {fe.index} {how}; restarting it in {backoff:g} s "
                f"(restart {fe.restarts})")
            fe.restart_at = time.monotonic() + backoff
    return None


def _kill(fe: _Frontend) -> None:
    fe.process.kill()
    fe.process.wait()


def _exit_words(code: int) -> str:
    """How a process ended, from its return code: "exited with code 1", "was killed by SIGKILL"."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


def _stop_frontends(frontends: list[_Frontend], timeout_s: float) -> list[tuple[_Frontend, bool]]:
    """SIGTERM every front end (they drain), wait up to `timeout_s`, then SIGKILL what is left; each front
    end that was running, with whether it had to be killed."""
    live = [fe for fe in frontends if fe.process is not None and fe.process.poll() is None]
    for fe in live:
        fe.process.send_signal(signal.SIGTERM)
    deadline, stopped = time.monotonic() + timeout_s, []
    for fe in live:
        try:
            fe.process.wait(max(0.0, deadline - time.monotonic()))
            stopped.append((fe, False))
        except subprocess.TimeoutExpired:
            _kill(fe)
            stopped.append((fe, True))
    return stopped

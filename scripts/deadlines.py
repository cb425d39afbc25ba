"""Deadlines under load: does any success reach its client after its deadline?

    PYTHONPATH=. .venv/bin/python scripts/deadlines.py                  # fake engine, one process
    PYTHONPATH=. .venv/bin/python scripts/deadlines.py --frontends 2    # tiny eager model, 2 front ends
    ... --scenarios open_loop_http,grpc_burst --json deadlines.json --small

Each scenario sends requests with a deadline into a real `boundgen serve` (the servers of
scripts/starvation.py) while the server is busy, and times every answer at the client, from just
before its request is sent to its answer read. The server counts a request's deadline from the
moment its head is read, so a success may reach the client after the deadline only by loopback and
the client's own scheduling: a success is late when it took longer than its deadline plus
--slack-ms. Connections are opened before the clock starts. Scenarios:

- big_bodies: another client sends 4 MB bodies (one long string, parsed off the event loop, and a
  million one-character strings, refused by their count) in a loop; meanwhile one HTTP and one
  gRPC client send small score requests one after another with a `timeout` parameter of 20 ms.
- grpc_burst: 300 gRPC score requests at once, each with a `timeout` parameter of 100 ms.
- grpc_deadline_burst: the same with gRPC deadlines (the client's `timeout`) instead.
  After each gRPC burst the same burst goes to a bare grpc.aio server in its own process that
  answers every call at once: its latest answer is what gRPC alone adds to the burst's last call
  on this host, time no server's clock sees (grpc.aio hands a connection's calls to Python one at
  a time), so a `timeout` parameter's success can be late by up to about that much.
- open_loop_http: 400 HTTP score requests 0.5 ms apart whatever the answers, `timeout` 60 ms.

Every answer must be a success, 429 / RESOURCE_EXHAUSTED or 504 / DEADLINE_EXCEEDED; the table
gives their counts, the late successes (the goal: none), the latest success against its deadline,
and whether the server was still ready after the scenario and drained to exit 0 at the end (a
crash: the goal is none). Exit status 1 unless every scenario met all of it.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from scripts.starvation import (HttpClient, Target, grpc_caller, grpc_infer_bytes, http_once,  # noqa: E402
                                infer_body, server_ready, start_server)

SLACK_MS = 20.0  # loopback and the client's own scheduling, on a host the server shares
FULL = {"big_bodies": 120, "grpc_burst": 300, "grpc_deadline_burst": 300, "open_loop_http": 400}
SMALL = {"big_bodies": 30, "grpc_burst": 100, "grpc_deadline_burst": 100, "open_loop_http": 150}
SUCCESS, REFUSED, EXPIRED = "success", "refused", "expired"
ANSWERS = {200: SUCCESS, 429: REFUSED, 504: EXPIRED, "OK": SUCCESS, "RESOURCE_EXHAUSTED": REFUSED,
           "DEADLINE_EXCEEDED": EXPIRED}
TEXT = "query: running shoes | item: trail shoe"


@dataclass
class Answers:
    """The answers of one scenario: each one's kind and, for successes, seconds past the deadline."""
    counts: collections.Counter = field(default_factory=collections.Counter)
    past: list = field(default_factory=list)  # a success's latency minus its deadline, seconds
    note: str = ""
    floor_ms: float | None = None  # the same burst answered at once by a bare gRPC server: its latest answer

    def add(self, answer, latency_s: float, deadline_s: float) -> None:
        kind = ANSWERS.get(answer, f"unexpected {answer}")
        self.counts[kind] += 1
        if kind == SUCCESS:
            self.past.append(latency_s - deadline_s)


def timed_body(texts, timeout_us: int) -> bytes:
    body = json.loads(infer_body(texts))
    body["parameters"] = {"timeout": timeout_us}
    return json.dumps(body).encode()


def timed_grpc_bytes(model: str, timeout_us: int | None) -> bytes:
    from boundgen.server.kserve import pb

    request = pb.ModelInferRequest.FromString(grpc_infer_bytes(model, [TEXT]))
    if timeout_us is not None:
        request.parameters["timeout"].int64_param = timeout_us
    return request.SerializeToString()


# ---- scenarios -------------------------------------------------------------------------------

def big_bodies(t: Target, n: int, answers: Answers) -> None:
    """n small requests a protocol (20 ms `timeout`), one after another, while 4 MB bodies arrive."""
    deadline_s, stop = 0.020, threading.Event()
    bodies = [infer_body(["a" * ((4 << 20) - 256)]),
              ('{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1000000], "data": [%s]}]}'
               % ",".join(['"a"'] * 1_000_000)).encode()]
    answers.note = "20 ms timeout, beside 4 MB bodies (one string; a million strings)"

    def noise():
        i = 0
        while not stop.is_set():
            http_once(t.http_port, f"/v2/models/{t.score}/infer", bodies[i % 2])
            i += 1

    def http_loop():
        client, body = HttpClient(t.http_port, "measured"), timed_body([TEXT], int(deadline_s * 1e6))
        for _ in range(n):
            start = time.monotonic()
            status = client.post(f"/v2/models/{t.score}/infer", body)
            answers.add(status, time.monotonic() - start, deadline_s)
        client.close()

    def grpc_loop():
        send, channel = grpc_caller(t.grpc_port, "measured")
        data = timed_grpc_bytes(t.score, int(deadline_s * 1e6))
        for _ in range(n):
            start = time.monotonic()
            code = send(data)
            answers.add(code, time.monotonic() - start, deadline_s)
        channel.close()

    noisy = [threading.Thread(target=noise, daemon=True) for _ in range(2)]
    for thread in noisy:
        thread.start()
    time.sleep(0.3)  # the bodies are arriving
    measured = [threading.Thread(target=loop) for loop in (http_loop, grpc_loop)]
    for thread in measured:
        thread.start()
    for thread in measured:
        thread.join(300.0)
    stop.set()
    for thread in noisy:
        thread.join(60.0)


async def _grpc_burst(t: Target, n: int, deadline_s: float, parameter: bool, answers: Answers) -> None:
    import grpc

    data = timed_grpc_bytes(t.score, int(deadline_s * 1e6) if parameter else None)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{t.grpc_port}") as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer", request_serializer=lambda b: b,
                                   response_deserializer=lambda b: b)
        await channel.channel_ready()

        async def one():
            start = time.monotonic()
            try:
                await call(data, timeout=30.0 if parameter else deadline_s)
                code = "OK"
            except grpc.aio.AioRpcError as err:
                code = err.code().name
            answers.add(code, time.monotonic() - start, deadline_s)

        await asyncio.gather(*(one() for _ in range(n)))


def bare_floor_ms(data: bytes, n: int) -> float:
    """The latest answer, ms, of n calls of `data` at once on one channel to the bare grpc.aio server of
    boundgen.bench.grpc_floor in its own process (each answered at once, with W2's fixed answer): what gRPC
    itself adds to the last call of such a burst, on this host, which no server's clock can see (the calls
    wait to be handed to Python one at a time)."""
    import grpc

    from boundgen.bench.grpc_floor import start_server

    process, port = start_server("aio")
    try:
        async def burst() -> float:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer",
                                           request_serializer=lambda b: b, response_deserializer=lambda b: b)
                await channel.channel_ready()

                async def one() -> float:
                    start = time.monotonic()
                    await call(data, timeout=30.0)
                    return time.monotonic() - start

                return max(await asyncio.gather(*(one() for _ in range(n))))

        return asyncio.run(burst()) * 1e3
    finally:
        process.terminate()
        process.join(5)


def grpc_burst(t: Target, n: int, answers: Answers) -> None:
    answers.note = f"{n} at once, `timeout` parameter 100 ms"
    asyncio.run(_grpc_burst(t, n, 0.100, True, answers))
    answers.floor_ms = bare_floor_ms(timed_grpc_bytes(t.score, 100_000), n)


def grpc_deadline_burst(t: Target, n: int, answers: Answers) -> None:
    answers.note = f"{n} at once, gRPC deadline 100 ms"
    asyncio.run(_grpc_burst(t, n, 0.100, False, answers))
    answers.floor_ms = bare_floor_ms(timed_grpc_bytes(t.score, None), n)


async def _open_loop_http(t: Target, n: int, interval_s: float, deadline_s: float, answers: Answers) -> None:
    """n requests on n connections opened beforehand (a connection's setup is the client's, not the
    request's), each written at its time on the schedule whatever the answers."""
    body = timed_body([TEXT], int(deadline_s * 1e6))
    request = (f"POST /v2/models/{t.score}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    connections = [await asyncio.open_connection("127.0.0.1", t.http_port) for _ in range(n)]
    await asyncio.sleep(0.2)  # every connection accepted

    async def one(i, reader, writer):
        await asyncio.sleep(i * interval_s)  # open loop: the schedule ignores the answers
        start = time.monotonic()
        writer.write(request)
        try:
            line = await reader.readline()
            status = int(line.split()[1]) if line.startswith(b"HTTP/") else "no answer"
        except (OSError, ValueError, IndexError) as err:
            status = type(err).__name__
        answers.add(status, time.monotonic() - start, deadline_s)
        writer.close()

    await asyncio.gather(*(one(i, reader, writer) for i, (reader, writer) in enumerate(connections)))


def open_loop_http(t: Target, n: int, answers: Answers) -> None:
    answers.note = f"{n} requests 0.5 ms apart, `timeout` 60 ms"
    asyncio.run(_open_loop_http(t, n, 0.0005, 0.060, answers))


SCENARIOS = {
    "big_bodies": ("20 ms timeouts beside 4 MB bodies (HTTP and gRPC)", big_bodies),
    "grpc_burst": ("gRPC burst, `timeout` parameter", grpc_burst),
    "grpc_deadline_burst": ("gRPC burst, gRPC deadlines", grpc_deadline_burst),
    "open_loop_http": ("HTTP open loop", open_loop_http),
}


# ---- the run ---------------------------------------------------------------------------------

def run(frontends: int = 1, engine: str | None = None, scenarios=None, sizes=None, slack_ms: float = SLACK_MS,
        say=print) -> dict:
    engine = engine or ("fake" if frontends == 1 else "eager")
    sizes = {**FULL, **(sizes or {})}
    root = Path(tempfile.mkdtemp(prefix="boundgen-deadlines-"))
    server, target = start_server(frontends, engine, root)
    results = {"frontends": frontends, "engine": engine, "slack_ms": slack_ms, "scenarios": []}
    try:
        for name in scenarios or SCENARIOS:
            title, fn = SCENARIOS[name]
            answers = Answers()
            fn(target, sizes[name], answers)
            alive = server.proc.poll() is None and server_ready(server)
            late = [p for p in answers.past if p * 1e3 > slack_ms]
            results["scenarios"].append({
                "scenario": name, "title": title, "note": answers.note, "answers": dict(answers.counts),
                "late": len(late), "latest_ms": max(answers.past, default=float("nan")) * 1e3,
                "bare_grpc_latest_ms": answers.floor_ms,
                "per_contract": set(answers.counts) <= {SUCCESS, REFUSED, EXPIRED} and answers.counts[SUCCESS] > 0,
                "server_ready_after": alive})
            say(f"{name}: {dict(answers.counts)} late={len(late)} server ready={alive}")
            time.sleep(0.5)
    finally:
        results["server_exit"] = server.stop()
    return results


def ok(results: dict) -> bool:
    return results["server_exit"] == 0 and all(
        s["per_contract"] and s["server_ready_after"] and s["late"] == 0 for s in results["scenarios"])


def table(results: dict) -> str:
    lines = [f"frontends {results['frontends']}, engine {results['engine']}, late: over the deadline by more than "
             f"{results['slack_ms']:g} ms at the client; server exit {results['server_exit']}", "",
             "| scenario | requests | success / 429 / 504 | late successes | latest success, ms past its deadline "
             "| bare gRPC server, latest answer ms | server ready after |", "| --- | --- | --- | ---: | ---: | ---: | --- |"]
    for s in results["scenarios"]:
        a = s["answers"]
        other = sum(v for k, v in a.items() if k not in (SUCCESS, REFUSED, EXPIRED))
        floor = "" if s.get("bare_grpc_latest_ms") is None else f"{s['bare_grpc_latest_ms']:.1f}"
        lines.append(f"| {s['title']}: {s['note']} | {sum(a.values())} | {a.get(SUCCESS, 0)} / {a.get(REFUSED, 0)} / "
                     f"{a.get(EXPIRED, 0)}{f' (other: {other})' if other else ''} | {s['late']} "
                     f"| {s['latest_ms']:.1f} | {floor} | {'yes' if s['server_ready_after'] else 'NO'} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frontends", type=int, default=1, help="serve --frontends N (N > 1: the tiny eager model)")
    p.add_argument("--engine", choices=("fake", "eager"), help="default: fake with --frontends 1, else eager")
    p.add_argument("--scenarios", help=f"comma-separated, of: {', '.join(SCENARIOS)} (default: all)")
    p.add_argument("--slack-ms", type=float, default=SLACK_MS, help="a success later than its deadline by more "
                   "than this, at the client, is late")
    p.add_argument("--small", action="store_true", help="the CI sizes (tests/server/test_deadlines_script.py)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    names = args.scenarios.split(",") if args.scenarios else None
    unknown = sorted(set(names or ()) - set(SCENARIOS))
    if unknown:
        p.error(f"unknown scenarios {', '.join(unknown)}; choose from {', '.join(SCENARIOS)}")
    results = run(args.frontends, args.engine, names, SMALL if args.small else None, args.slack_ms,
                  say=lambda s: print(s, file=sys.stderr, flush=True))
    print(table(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0 if ok(results) else 1


if __name__ == "__main__":
    sys.exit(main())

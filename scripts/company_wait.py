"""The company wait against clients that come back late: a closed loop on the real batcher.

    PYTHONPATH=. .venv/bin/python scripts/company_wait.py
    ... --clients 4 --back-ms 3,5,6 --waits 5,8,learned --call-ms 9 --per-request-ms 0.45

C client threads each enqueue a request into runtime/batcher.py's Batcher (one request context, calls
of up to 8), wait for its result, then spend a time drawn from N(back, 1 ms) before the next (what a
served client's answer and next request cost between two calls: encoding, the link, gRPC, the
client, tokenizing), for --seconds. A call sleeps call-ms + per-request-ms a request (a W2 beam call
on an H100: 7.2 ms for one request, 13.3 for eight). For each way back and each wait (a fixed wait
in ms, or `learned`: runtime/company.py with the first fixed wait as its floor), the table gives
requests a second, the mean latency (the way back included, as a client sees it) and the requests a
call held. With --open-loop RATES, the same waits against requests sent at exponential gaps whatever
the answers (no one comes back: what a wait costs there). No GPU: the batching policy alone, not the
model.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time

from boundgen.bench.loadgen import nearest_rank
from boundgen.runtime.batcher import Batcher


def sleeping_batcher(wait_ms: float, learned: bool, call_ms: float, per_request_ms: float) -> Batcher:
    """The real batcher over one request context whose calls (of up to 8) sleep call-ms + per-request-ms a request."""
    def run_batch(ctx, items):
        time.sleep((call_ms + per_request_ms * len(items)) / 1e3)
        return items

    return Batcher(["ctx"], run_batch, fits=lambda batch, item: len(batch) < 8, linger_s=wait_ms / 1e3,
                   learn_linger=learned)


def closed_loop(clients: int, back_ms: float, wait_ms: float, learned: bool, call_ms: float,
                per_request_ms: float, seconds: float, seed: int = 0) -> tuple[float, float, float]:
    """(requests a second, mean latency ms, requests a call)."""
    batcher = sleeping_batcher(wait_ms, learned, call_ms, per_request_ms)
    latencies: list[float] = []
    stop = time.monotonic() + seconds

    def client(k: int) -> None:
        rng = random.Random(seed * 1000 + k)
        back = max(0.0, rng.gauss(back_ms, 1.0)) / 1e3
        while time.monotonic() < stop:
            start = time.monotonic()
            batcher.enqueue(k, client=k).future.result()
            latencies.append((time.monotonic() - start + back) * 1e3)  # the way back is the client's wait too
            time.sleep(back)
            back = max(0.0, rng.gauss(back_ms, 1.0)) / 1e3

    threads = [threading.Thread(target=client, args=(k,)) for k in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.close()
    return len(latencies) / seconds, statistics.mean(latencies), batcher.items / max(1, batcher.batches)


def open_loop(rate: float, wait_ms: float, learned: bool, call_ms: float, per_request_ms: float, seconds: float,
              clients: int = 16, seed: int = 1) -> tuple[float, float, float]:
    """Requests at exponential gaps of mean 1 / rate whatever the answers (16 clients in turn):
    (mean latency ms, P99 ms, requests a call)."""
    batcher = sleeping_batcher(wait_ms, learned, call_ms, per_request_ms)
    rng, latencies, tickets = random.Random(seed), [], []
    due = time.monotonic()
    stop = due + seconds
    while due < stop:
        due += rng.expovariate(rate)
        time.sleep(max(0.0, due - time.monotonic()))
        sent = time.monotonic()
        ticket = batcher.enqueue(len(tickets), client=len(tickets) % clients)
        ticket.future.add_done_callback(lambda _, sent=sent: latencies.append((time.monotonic() - sent) * 1e3))
        tickets.append(ticket)
    for ticket in tickets:
        ticket.future.result()
    batcher.close()
    ranked = sorted(latencies)
    return statistics.mean(ranked), nearest_rank(ranked, 99), batcher.items / max(1, batcher.batches)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--back-ms", default="3,5,6",
                   help="comma list: each client's mean time between an answer and its next request")
    p.add_argument("--waits", default="5,8,learned", help="comma list of fixed waits in ms, or 'learned'")
    p.add_argument("--call-ms", type=float, default=9.0)
    p.add_argument("--per-request-ms", type=float, default=0.45)
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--open-loop", default="", metavar="RATES",
                   help="comma list of requests a second: also an open loop at each rate, for every wait")
    args = p.parse_args(argv)
    waits = args.waits.split(",")
    floor = next((float(w) for w in waits if w != "learned"), 0.0)

    def label(wait: str) -> str:
        return f"learned (floor {floor:g} ms)" if wait == "learned" else f"fixed {float(wait):g} ms"

    def fixed_ms(wait: str) -> float:  # a learned wait's floor is the first fixed one
        return floor if wait == "learned" else float(wait)

    print("| way back (ms) | company wait | requests/s | mean ms | requests a call |\n|---:|---|---:|---:|---:|")
    for back in (float(b) for b in args.back_ms.split(",")):
        for wait in waits:
            qps, mean, fill = closed_loop(args.clients, back, fixed_ms(wait), wait == "learned", args.call_ms,
                                          args.per_request_ms, args.seconds)
            print(f"| {back:g} | {label(wait)} | {qps:.1f} | {mean:.1f} | {fill:.2f} |", flush=True)
    if args.open_loop:
        print("\n| open loop (requests/s) | company wait | mean ms | P99 ms | requests a call |\n"
              "|---:|---|---:|---:|---:|")
        for rate in (float(r) for r in args.open_loop.split(",")):
            for wait in waits:
                mean, p99, fill = open_loop(rate, fixed_ms(wait), wait == "learned", args.call_ms,
                                            args.per_request_ms, args.seconds)
                print(f"| {rate:g} | {label(wait)} | {mean:.1f} | {p99:.1f} | {fill:.2f} |", flush=True)


if __name__ == "__main__":
    main()

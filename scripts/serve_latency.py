"""Per-request cost of the three ways to serve one artifact: plain `boundgen serve`, `--replicas N`
(one front end, N worker processes) and `--ray --replicas N` (Ray Serve's proxies and replicas).

    .venv/bin/python scripts/serve_latency.py ARTIFACT_DIR [--replicas 2] [--requests 300] [--samples 4]

Each server is started as its own process (launch.ServerProcess), warmed up, then measured with
tritonclient: `--requests` sequential score requests over gRPC and over HTTP (latency: mean,
p50, p99 in ms), then the same number over gRPC from 4 client threads at once (requests/s).
Every request is the same `--samples` texts of ~`--words` words. Prints a markdown table.
On a small CPU model this measures what each path adds per request, not GPU capacity.
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp

from boundgen.server.deploy.launch import ServerProcess, free_port

WARMUP = 20
THREADS = 4
TIMEOUT_US = 30_000_000  # the `timeout` parameter: long enough that no request expires; only time is measured


def texts(samples: int, words: int) -> np.ndarray:
    vocabulary = "the quick brown fox jumps over a lazy dog near river bank".split()
    return np.array([" ".join(vocabulary[(i + j) % len(vocabulary)] for j in range(words)).encode()
                     for i in range(samples)], dtype=object)


def one(client, mod, model: str, data: np.ndarray) -> float:
    t = mod.InferInput("TEXT", [len(data)], "BYTES")
    t.set_data_from_numpy(data)
    start = time.perf_counter()
    client.infer(model, [t], timeout=TIMEOUT_US)
    return time.perf_counter() - start


def latency(url: str, mod, model: str, data: np.ndarray, n: int) -> dict:
    client = mod.InferenceServerClient(url)
    for _ in range(WARMUP):
        one(client, mod, model, data)
    ms = np.array([one(client, mod, model, data) for _ in range(n)]) * 1e3
    return {"mean": ms.mean(), "p50": np.percentile(ms, 50), "p99": np.percentile(ms, 99)}


def throughput(url: str, model: str, data: np.ndarray, n: int) -> float:
    clients = [tgrpc.InferenceServerClient(url) for _ in range(THREADS)]
    for c in clients:
        one(c, tgrpc, model, data)
    start = time.perf_counter()
    with ThreadPoolExecutor(THREADS) as pool:
        list(pool.map(lambda i: one(clients[i % THREADS], tgrpc, model, data), range(n)))
    return n / (time.perf_counter() - start)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("artifact")
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--requests", type=int, default=300)
    p.add_argument("--samples", type=int, default=4)
    p.add_argument("--words", type=int, default=24)
    args = p.parse_args()
    model = Path(args.artifact).name
    data = texts(args.samples, args.words)
    modes = {"serve": [], f"serve --replicas {args.replicas}": ["--replicas", str(args.replicas)],
             f"serve --ray --replicas {args.replicas}": ["--ray", "--replicas", str(args.replicas)]}
    rows = []
    for name, flags in modes.items():
        ports = ["--http-port", str(free_port()), "--grpc-port", str(free_port())] if "--ray" in flags else []
        server = ServerProcess([args.artifact], args=[*flags, *ports], ready_timeout_s=600)
        started = time.perf_counter()
        with server:
            ready_s = time.perf_counter() - started
            grpc_ms = latency(server.grpc_url, tgrpc, model, data, args.requests)
            http_ms = latency(server.http_url, thttp, model, data, args.requests)
            qps = throughput(server.grpc_url, model, data, args.requests)
        rows.append((name, grpc_ms, http_ms, qps, ready_s))
        print(f"{name}: done", file=sys.stderr, flush=True)
    print(f"| mode | gRPC mean / p50 / p99 ms | HTTP mean / p50 / p99 ms | gRPC req/s, {THREADS} clients | ready after s |")
    print("|---|---|---|---|---|")
    for name, g, h, qps, ready_s in rows:
        print(f"| `{name}` | {g['mean']:.2f} / {g['p50']:.2f} / {g['p99']:.2f} | "
              f"{h['mean']:.2f} / {h['p50']:.2f} / {h['p99']:.2f} | {qps:.0f} | {ready_s:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

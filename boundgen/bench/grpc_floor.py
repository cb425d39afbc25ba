"""The floor of one KServe v2 ModelInfer round trip in Python gRPC on this host, whatever the server does.

    python -m boundgen.bench.grpc_floor [--calls 2000] [--server-cores 0-7] [--client-cores 8]
                                        [--servers aio,sync,served] [--handler-ms 0]

A bare server in its own process (`grpc.aio`, as `serve`'s front ends run, and the thread-pool
`grpc.server` beside it: which of grpcio's two Python servers costs less a call) answers every ModelInfer with one fixed W2-sized
response (100 candidates: TOKEN_IDS [100, 5] INT32, SCORES [100] FP32, TEXT_OUT [100] BYTES); a
synchronous grpcio client (as `boundgen bench --grpc` uses) sends one W2-sized request at a time.
What it prints is the least a served request's `rpc` stage can be on this host (bench tables: the
client's end-to-end minus the server's handling, here `rpc`), with the same libraries and messages
and no work in the handler; the served path's own costs are what `rpc` shows beyond it.

`served` is not bare: `serve`'s own server (server/app.py: its gRPC service, admission, worker
thread and metrics) with a stand-in W2 engine, the same messages. Its `rpc` against the bare
servers' is what our stack adds outside its handler.

`--handler-ms X`: every handler idles X ms before it answers (the bare ones asleep on the event loop
or their thread; `served`'s engine on its worker thread), as a served request waits for the GPU.
Compare a served c=1 `rpc` with the floor at the handler time it had, not with the default 0:
after an idle wait the client's and the server's threads wake on cold cores and caches, and the same
gRPC round trip costs about twice as much. On a 2-core EPYC VM (3 runs of 1000 calls, rpc means):
bare grpc.aio 0.49-0.51 ms back to back and 1.01-1.50 ms with 10 ms idle in the handler (1.29 ms when
only the client idles 10 ms between calls), `served` 0.47-0.52 and 1.12-1.32 ms: that, not the
server's code, is most of a served `rpc` over the default floor. The bench's own client
(grpc_client.GrpcTarget: the request built and the answer read into a result each call) adds
~0.15 ms more to its `rpc` than this client's prebuilt request does.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
import threading
import time
from multiprocessing import get_context

import numpy as np

from boundgen.bench.host import core_ranges, cpu_model, parse_cores
from boundgen.bench.loadgen import nearest_rank

WIDTH, STEPS, TEXT_BYTES = 100, 5, 20  # W2's answer: 100 candidates of 5 tokens, ~20-byte texts


def _pb():
    from boundgen.server.kserve import pb

    return pb


def w2_response():
    pb = _pb()
    response = pb.ModelInferResponse(model_name="floor", model_version="1")
    texts = b"".join(struct.pack("<I", TEXT_BYTES) + b"x" * TEXT_BYTES for _ in range(WIDTH))
    for name, datatype, shape, raw in (("TOKEN_IDS", "INT32", [WIDTH, STEPS], np.zeros((WIDTH, STEPS), "<i4").tobytes()),
                                       ("SCORES", "FP32", [WIDTH], np.zeros(WIDTH, "<f4").tobytes()),
                                       ("TEXT_OUT", "BYTES", [WIDTH], texts)):
        out = response.outputs.add()
        out.name, out.datatype = name, datatype
        out.shape.extend(shape)
        response.raw_output_contents.append(raw)
    return response


def w2_request():
    pb = _pb()
    request = pb.ModelInferRequest(model_name="floor")
    request.parameters[pb.TIMINGS_PARAMETER].bool_param = True  # as `boundgen bench --grpc` asks: the handler's time
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "TEXT", "BYTES"
    tensor.shape.append(1)
    text = ("a query about running shoes " * 10).encode()[:256]  # a W2 prompt is ~64 tokens
    request.raw_input_contents.append(struct.pack("<I", len(text)) + text)
    return request


SERVERS = ("aio", "sync", "served")


def _answer(template, started: float):
    """The W2 response with the handler's time since `started`, as a served one reports it."""
    response = type(template)()
    response.CopyFrom(template)
    response.parameters["timing_handler_ms"].double_param = (time.monotonic() - started) * 1e3
    return response


class _W2Engine:
    """A stand-in beam engine for `served`: W2's answer after `idle_s` on the worker thread."""

    def __init__(self, idle_s: float):
        from boundgen.artifact.program import BeamSpec
        from boundgen.runtime.engine import EngineSpec

        self.idle_s = idle_s
        self.spec = EngineSpec("floor", BeamSpec(width=WIDTH, steps=STEPS, max_prompt_tokens=1024))

    def beam(self, text, deadline=None, cancelled=None):
        from boundgen.runtime.results import BeamResult

        if self.idle_s:
            time.sleep(self.idle_s)
        return BeamResult(np.zeros((WIDTH, STEPS), np.int32), np.zeros(WIDTH, np.float32), np.zeros(WIDTH, bool),
                          ["x" * TEXT_BYTES] * WIDTH, {"model": self.idle_s})

    def warmup(self) -> None:
        pass

    def close(self) -> None:
        pass


def _serve_ours(port_queue, idle_s: float) -> None:
    """`served`: serve's own server (server/app.py) around a _W2Engine, gRPC on a free port."""
    from boundgen.server.app import BackgroundServer
    from boundgen.server.config import ServerConfig

    with open(os.devnull, "w") as quiet:
        server = BackgroundServer(["floor"], ServerConfig(host="127.0.0.1", http_port=0, grpc_port=0),
                                  engine_factory=lambda path: _W2Engine(idle_s), out=quiet).start()
        port_queue.put(server.server.grpc_port)
        threading.Event().wait()  # until measure() ends this process


def _serve(port_queue, cores, kind: str = "aio", handler_ms: float = 0.0) -> None:
    """The server (its own process): every ModelInfer answered with W2's response after
    `handler_ms` idle, its handler's time in `timing_handler_ms`."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    if cores:
        os.sched_setaffinity(0, cores)
    idle_s = handler_ms / 1e3
    if kind == "served":
        _serve_ours(port_queue, idle_s)
        return
    pb = _pb()
    if kind == "sync":
        template = w2_response()

        def answer(request, context):
            started = time.monotonic()
            if idle_s:
                time.sleep(idle_s)
            return _answer(template, started)

        handler = grpc.unary_unary_rpc_method_handler(answer, request_deserializer=pb.ModelInferRequest.FromString,
                                                      response_serializer=pb.ModelInferResponse.SerializeToString)
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(pb.SERVICE, {"ModelInfer": handler}),))
        port_queue.put(server.add_insecure_port("127.0.0.1:0"))
        server.start()
        server.wait_for_termination()
        return

    async def run():
        template = w2_response()

        async def infer(request, context):
            started = time.monotonic()
            if idle_s:
                await asyncio.sleep(idle_s)
            return _answer(template, started)

        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(infer, request_deserializer=pb.ModelInferRequest.FromString,
                                                      response_serializer=pb.ModelInferResponse.SerializeToString)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(pb.SERVICE, {"ModelInfer": handler}),))
        port_queue.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(run())


def start_server(kind: str = "aio", cores: set[int] | None = None, handler_ms: float = 0.0):
    """A server of `kind` (SERVERS) in a fresh interpreter (no state of this one's gRPC in it), on `cores`:
    (its process, its gRPC port). The caller ends the process (terminate, join)."""
    ctx = get_context("spawn")
    ports = ctx.Queue()
    process = ctx.Process(target=_serve, args=(ports, cores, kind, handler_ms), daemon=True)
    process.start()
    try:
        return process, ports.get(timeout=60)
    except BaseException:
        process.terminate()
        raise


def measure(calls: int = 2000, warmup: int = 200, server_cores: set[int] | None = None, server: str = "aio",
            handler_ms: float = 0.0) -> dict:
    """Sequential round trips against the server of kind `server` (SERVERS), each handler idle
    `handler_ms`: {server, handler_ms, calls, mean_ms, p50_ms, p99_ms (end to end), rpc_mean_ms,
    rpc_p50_ms, rpc_p99_ms (end to end minus the handler's time, as bench tables' `rpc`)}."""
    if server not in SERVERS:
        raise ValueError(f"no bare server {server!r}: one of {', '.join(SERVERS)}")
    if handler_ms < 0:
        raise ValueError(f"handler_ms must be >= 0, got {handler_ms}")
    import grpc

    pb = _pb()
    process, port = start_server(server, server_cores, handler_ms)
    try:
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        infer = channel.unary_unary(f"/{pb.SERVICE}/ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        request = w2_request()
        for _ in range(warmup):
            infer(request, timeout=30)
        times, rpc = [], []
        for _ in range(calls):
            start = time.perf_counter()
            answer = infer(request, timeout=30)
            times.append((time.perf_counter() - start) * 1e3)
            rpc.append(times[-1] - answer.parameters["timing_handler_ms"].double_param)
        channel.close()
        if len(answer.outputs) != 3:
            raise RuntimeError(f"the {server} server answered {len(answer.outputs)} outputs, not 3")
    finally:
        process.terminate()
        process.join(5)
    times.sort()
    rpc.sort()
    return {"server": server, "handler_ms": handler_ms, "calls": calls, "mean_ms": statistics.fmean(times),
            "p50_ms": nearest_rank(times, 50), "p99_ms": nearest_rank(times, 99), "rpc_mean_ms": statistics.fmean(rpc),
            "rpc_p50_ms": nearest_rank(rpc, 50), "rpc_p99_ms": nearest_rank(rpc, 99)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m boundgen.bench.grpc_floor", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--server-cores", default=None, help="cores of the bare server (e.g. 0-7)")
    parser.add_argument("--client-cores", default=None, help="cores of the client, this process (e.g. 8)")
    parser.add_argument("--servers", default="aio,sync", help="servers to measure, in turn: aio (bare grpc.aio, "
                        "as serve runs), sync (bare grpc.server on a thread pool), served (serve's own server "
                        "around a stand-in W2 engine)")
    parser.add_argument("--handler-ms", default="0", help="idle ms in each handler before it answers, a comma "
                        "list to measure each (e.g. 0,8: a served c=1 request's model time)")
    args = parser.parse_args(argv)
    kinds = [k for k in args.servers.split(",") if k]
    if not kinds or any(k not in SERVERS for k in kinds):
        parser.error(f"--servers: a comma list of {', '.join(SERVERS)}, got {args.servers!r}")
    if args.client_cores:
        os.sched_setaffinity(0, parse_cores(args.client_cores))
    try:
        idles = [float(x) for x in args.handler_ms.split(",") if x]
    except ValueError:
        idles = []
    if not idles or any(x < 0 for x in idles):
        parser.error(f"--handler-ms: a comma list of ms >= 0, got {args.handler_ms!r}")
    server_cores = parse_cores(args.server_cores) if args.server_cores else None
    names = {"aio": "bare grpc.aio server", "sync": "bare grpc.server, 4 threads",
             "served": "serve's server, stand-in engine"}
    for idle in idles:
        for kind in kinds:
            row = measure(args.calls, server_cores=server_cores, server=kind, handler_ms=idle)
            print(f"gRPC ModelInfer floor ({names[kind]}, handler idle {idle:g} ms, sync grpcio client, W2-sized "
                  f"messages): rpc mean {row['rpc_mean_ms']:.3f} ms, p50 {row['rpc_p50_ms']:.3f}, p99 "
                  f"{row['rpc_p99_ms']:.3f}; end to end mean {row['mean_ms']:.3f} ms, p50 {row['p50_ms']:.3f}, p99 "
                  f"{row['p99_ms']:.3f} over {row['calls']} calls; "
                  f"host {cpu_model()}, {os.cpu_count()} cores, server cores "
                  f"{core_ranges(server_cores) if server_cores else 'any'}, client cores "
                  f"{core_ranges(os.sched_getaffinity(0))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

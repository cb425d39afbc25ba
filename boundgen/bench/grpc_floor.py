"""The floor of one KServe v2 ModelInfer round trip in Python gRPC on this host, whatever the server does.

    python -m boundgen.bench.grpc_floor [--calls 2000] [--server-cores 0-7] [--client-cores 8] [--servers aio,sync]

A bare server in its own process (`grpc.aio`, as `serve`'s front ends run, and the thread-pool
`grpc.server` beside it: which of grpcio's two Python servers costs less a call) answers every ModelInfer with one fixed W2-sized
response (100 candidates: TOKEN_IDS [100, 5] INT32, SCORES [100] FP32, TEXT_OUT [100] BYTES), built
once; a synchronous grpcio client (as `boundgen bench --grpc` uses) sends one W2-sized request at a
time. What it prints is the least a served request's `rpc` stage can be on this host (bench tables:
the client's end-to-end minus the server's handling), with the same libraries and messages and no
work at all in the handler; the served path's own costs are what `rpc` shows beyond it.
"""

from __future__ import annotations

import argparse
import os
import statistics
import struct
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
    tensor = request.inputs.add()
    tensor.name, tensor.datatype = "TEXT", "BYTES"
    tensor.shape.append(1)
    text = ("a query about running shoes " * 10).encode()[:256]  # a W2 prompt is ~64 tokens
    request.raw_input_contents.append(struct.pack("<I", len(text)) + text)
    return request


SERVERS = ("aio", "sync")


def _serve(port_queue, cores, kind: str = "aio") -> None:
    """The bare server (its own process): every ModelInfer answered with the same response."""
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    import grpc

    if cores:
        os.sched_setaffinity(0, cores)
    pb = _pb()
    if kind == "sync":
        response = w2_response()
        handler = grpc.unary_unary_rpc_method_handler(lambda request, context: response,
                                                      request_deserializer=pb.ModelInferRequest.FromString,
                                                      response_serializer=pb.ModelInferResponse.SerializeToString)
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(pb.SERVICE, {"ModelInfer": handler}),))
        port_queue.put(server.add_insecure_port("127.0.0.1:0"))
        server.start()
        server.wait_for_termination()
        return

    async def run():
        response = w2_response()

        async def infer(request, context):
            return response

        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(infer, request_deserializer=pb.ModelInferRequest.FromString,
                                                      response_serializer=pb.ModelInferResponse.SerializeToString)
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(pb.SERVICE, {"ModelInfer": handler}),))
        port_queue.put(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()

    asyncio.run(run())


def measure(calls: int = 2000, warmup: int = 200, server_cores: set[int] | None = None, server: str = "aio") -> dict:
    """Sequential round trips against the bare server of kind `server` (SERVERS): {server, calls,
    mean_ms, p50_ms, p99_ms}."""
    if server not in SERVERS:
        raise ValueError(f"no bare server {server!r}: one of {', '.join(SERVERS)}")
    import grpc

    pb = _pb()
    ctx = get_context("spawn")  # a fresh interpreter: no state of this one's gRPC in the server
    ports = ctx.Queue()
    process = ctx.Process(target=_serve, args=(ports, server_cores, server), daemon=True)
    process.start()
    try:
        port = ports.get(timeout=60)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        infer = channel.unary_unary(f"/{pb.SERVICE}/ModelInfer", request_serializer=pb.ModelInferRequest.SerializeToString,
                                    response_deserializer=pb.ModelInferResponse.FromString)
        request = w2_request()
        for _ in range(warmup):
            infer(request, timeout=30)
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            answer = infer(request, timeout=30)
            times.append((time.perf_counter() - start) * 1e3)
        channel.close()
        if len(answer.outputs) != 3:
            raise RuntimeError(f"the bare server answered {len(answer.outputs)} outputs, not 3")
    finally:
        process.terminate()
        process.join(5)
    times.sort()
    return {"server": server, "calls": calls, "mean_ms": statistics.fmean(times), "p50_ms": nearest_rank(times, 50),
            "p99_ms": nearest_rank(times, 99)}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m boundgen.bench.grpc_floor", description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--server-cores", default=None, help="cores of the bare server (e.g. 0-7)")
    parser.add_argument("--client-cores", default=None, help="cores of the client, this process (e.g. 8)")
    parser.add_argument("--servers", default=",".join(SERVERS), help="bare servers to measure, in turn: aio "
                        "(grpc.aio, as serve runs) and/or sync (grpc.server on a thread pool)")
    args = parser.parse_args(argv)
    kinds = [k for k in args.servers.split(",") if k]
    if not kinds or any(k not in SERVERS for k in kinds):
        parser.error(f"--servers: a comma list of {', '.join(SERVERS)}, got {args.servers!r}")
    if args.client_cores:
        os.sched_setaffinity(0, parse_cores(args.client_cores))
    server_cores = parse_cores(args.server_cores) if args.server_cores else None
    names = {"aio": "grpc.aio server", "sync": "grpc.server, 4 threads"}
    for kind in kinds:
        row = measure(args.calls, server_cores=server_cores, server=kind)
        print(f"gRPC ModelInfer floor (bare {names[kind]}, sync grpcio client, W2-sized messages): mean "
              f"{row['mean_ms']:.3f} ms, p50 {row['p50_ms']:.3f}, p99 {row['p99_ms']:.3f} over {row['calls']} calls; "
              f"host {cpu_model()}, {os.cpu_count()} cores, server cores "
              f"{core_ranges(server_cores) if server_cores else 'any'}, client cores {core_ranges(os.sched_getaffinity(0))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Malformed and hostile requests against a real `boundgen serve` (fake engines: no artifact or
GPU needed); prints each case, the answer expected by docs/serving.md and the one given, and how
many were answered per contract. Exit status 1 if any was not.

    PYTHONPATH=. .venv/bin/python scripts/adversarial.py

The server is tests/server/fake_serve.py's (the real server, engines from fake_engine.py) with
--allow-client-shm, one request in flight and four queued per model, and an API key.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import threading
import uuid
import zlib
from pathlib import Path

import grpc

from boundgen.server.kserve import pb
from boundgen.server.deploy.launch import ServerProcess
from tests.server.conftest import BEAM_SPEC, SCORE_SPEC
from tests.server.fake_engine import write_fake_artifact

KEY = "adversarial"


def raw_http(server, method: str, path: str, body: bytes = b"", headers: bytes = b"", key: bool = True) -> int:
    """The status of one HTTP request sent byte for byte (the server closes the connection)."""
    auth = f"Authorization: Bearer {KEY}\r\n".encode() if key else b""
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=30) as sock:
        sock.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\n".encode() + auth + headers + b"\r\n" + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def post(server, path: str, obj, headers: bytes = b"", key: bool = True) -> int:
    return raw_http(server, "POST", path, obj if isinstance(obj, bytes) else json.dumps(obj).encode(), headers, key)


def grpc_code(server, method: str, data: bytes, key: bool = True) -> str:
    channel = grpc.insecure_channel(server.grpc_url)
    call = channel.unary_unary(f"/{pb.SERVICE}/{method}", request_serializer=lambda b: b,
                               response_deserializer=lambda b: b)
    try:
        call(data, timeout=10, metadata=[("authorization", f"Bearer {KEY}")] if key else None)
        return "OK"
    except grpc.RpcError as err:
        return err.code().name
    finally:
        channel.close()


def infer_json(shape: str, datatype: str = "BYTES", data: str = '["a"]') -> bytes:
    return ('{"inputs": [{"name": "TEXT", "datatype": "%s", "shape": %s, "data": %s}]}' % (datatype, shape, data)).encode()


def truncated_shm(server) -> int:
    """Reads of a 3 MB region whose object is truncated and regrown over and over: the worst
    status of 30 requests, or 0 if the server died (SIGBUS)."""
    size, key = 3 << 20, f"/boundgen-adv-{uuid.uuid4().hex[:8]}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, size)
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            os.ftruncate(fd, 0)
            os.ftruncate(fd, size)

    post(server, "/v2/systemsharedmemory/region/adv/register", {"key": key, "offset": 0, "byte_size": size})
    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "parameters": {
            "shared_memory_region": "adv", "shared_memory_byte_size": size}}]}
        return max(post(server, "/v2/models/fscore/infer", body) for _ in range(30))
    except OSError:
        return 0
    finally:
        stop.set()
        flipper.join()
        os.close(fd)
        os.unlink(f"/dev/shm{key}")
        if server.proc.poll() is None:
            post(server, "/v2/systemsharedmemory/unregister", b"")


def cases(server):
    """(case, expected, thunk giving the answer); each answer is an HTTP status or a gRPC code name.
    The shared memory case comes last: on a server that maps regions it can kill the server."""
    bomb = zlib.compressobj(9, zlib.DEFLATED, 31)
    gzip_bomb = b"".join([*(bomb.compress(b" " * (1 << 20)) for _ in range(64)), bomb.flush()])
    deflater = zlib.compressobj(9, zlib.DEFLATED, 15)
    deflate_bomb = b"".join([*(deflater.compress(b" " * (1 << 20)) for _ in range(64)), deflater.flush()])
    huge = "1" + "0" * 4000
    undecodable = b"\xff\xff\xff\xff"
    return [
        ("shape dimension 10^4000", 400, lambda: post(server, "/v2/models/fscore/infer", infer_json(f"[{huge}]"))),
        ("two dimensions 10^4000", 400, lambda: post(server, "/v2/models/fscore/infer", infer_json(f"[{huge}, {huge}]"))),
        ("shape [2^40] FP32, one value", 400,
         lambda: post(server, "/v2/models/fscore/infer", infer_json("[1099511627776]", "FP32", "[1.0]"))),
        ("gRPC shape [2^62, 2^62]", "INVALID_ARGUMENT", lambda: grpc_code(server, "ModelInfer", _grpc_huge_shape())),
        ("/v1/score with 50,000 items", 400, lambda: post(server, "/v1/score", {
            "query": "q", "items": ["a"] * 50_000, "label_token_ids": [9693], "apply_softmax": True})),
        ("/v1/beam with 20,000 prompts", 400, lambda: post(server, "/v1/beam", {"prompts": ["a"] * 20_000})),
        ("gRPC TEXT shape of 40,000 dimensions", "INVALID_ARGUMENT",
         lambda: grpc_code(server, "ModelInfer", _grpc_shape("fscore", [1] * 40_000))),
        ("TEXT [1000000] of 1-character strings (4 MB)", 400, lambda: post(
            server, "/v2/models/fscore/infer", infer_json("[1000000]", data="[" + ",".join(['"a"'] * 1_000_000) + "]"))),
        ("deflate body inflating to 64 MiB", 400,
         lambda: post(server, "/v2/models/fscore/infer", deflate_bomb, b"Content-Encoding: deflate\r\n")),
        ("gzip body inflating to 64 MiB", 400,
         lambda: post(server, "/v2/models/fscore/infer", gzip_bomb, b"Content-Encoding: gzip\r\n")),
        ("lone surrogate in /v1/score", 400, lambda: post(server, "/v1/score", b'{"query": "q", "items": ["\\ud800"], '
                                                                            b'"label_token_ids": [9693], "apply_softmax": true}')),
        ("lone surrogate in /v1/beam", 400, lambda: post(server, "/v1/beam", b'{"prompt": "\\ud800"}')),
        ("lone surrogate in /infer", 400, lambda: post(server, "/v2/models/fscore/infer", infer_json("[1]", data='["\\ud800"]'))),
        ("non-ASCII Authorization on /v2", 401,
         lambda: raw_http(server, "GET", "/v2", headers=b"Authorization: Bearer \xff\xfe\r\n", key=False)),
        ("non-ASCII Authorization on /infer", 401, lambda: raw_http(
            server, "POST", "/v2/models/fscore/infer", b"{}", b"Authorization: Bearer s\xc3\xa9same\r\n", key=False)),
        ("non-ASCII Authorization on /metrics", 401,
         lambda: raw_http(server, "GET", "/metrics", headers=b"Authorization: \xff\r\n", key=False)),
        ("unregister every region without the key", 401,
         lambda: post(server, "/v2/systemsharedmemory/unregister", b"", key=False)),
        ("register a key outside --shm-prefix", 400, lambda: post(
            server, "/v2/systemsharedmemory/region/x/register", {"key": "/etc-passwd", "offset": 0, "byte_size": 8})),
        ("undecodable ServerMetadata", "INVALID_ARGUMENT", lambda: grpc_code(server, "ServerMetadata", undecodable)),
        ("undecodable ModelConfig", "INVALID_ARGUMENT", lambda: grpc_code(server, "ModelConfig", undecodable)),
        ("undecodable LogSettings", "INVALID_ARGUMENT", lambda: grpc_code(server, "LogSettings", undecodable)),
        ("undecodable ModelInfer", "INVALID_ARGUMENT", lambda: grpc_code(server, "ModelInfer", undecodable)),
        ("undecodable ModelMetadata without the key", "UNAUTHENTICATED",
         lambda: grpc_code(server, "ModelMetadata", undecodable, key=False)),
        ("TEXT [1] of one 4 MB string", 400, lambda: post(
            server, "/v2/models/fscore/infer", infer_json("[1]", data='["' + "a" * ((4 << 20) - 256) + '"]'))),
        ("TEXT [16] of 250 kB strings", 400, lambda: post(
            server, "/v2/models/fscore/infer", infer_json("[16]", data='["' + '","'.join(["a" * 250_000] * 16) + '"]'))),
        ("/v1/beam with a width", 400, lambda: post(server, "/v1/beam", {"prompt": "a", "width": 1000})),
        ("register a key with a lone surrogate", 400, lambda: post(
            server, "/v2/systemsharedmemory/region/x/register", b'{"key": "/boundgen-\\ud800", "offset": 0, "byte_size": 8}')),
        ("a plain body said to be in two codings (gzip, gzip)", 400, lambda: post(
            server, "/v2/models/fscore/infer", infer_json("[1]"), b"Content-Encoding: gzip, gzip\r\n")),
        ('a bare JSON value as data ("data": "a")', 400,
         lambda: post(server, "/v2/models/fscore/infer", infer_json("[1]", data='"a"'))),
        ("timeout parameter 10^309", 400, lambda: post(server, "/v2/models/fscore/infer", infer_json("[1]")[:-1]
                                                       + b', "parameters": {"timeout": 1' + b"0" * 309 + b"}}")),
        ("shared memory truncated while read (worst of 30)", 400, lambda: truncated_shm(server)),
    ]


def _grpc_huge_shape() -> bytes:
    return _grpc_shape("fscore", [1 << 62, 1 << 62], b"")


def _grpc_shape(model: str, shape: list[int], raw: bytes = b"\x01\x00\x00\x00a") -> bytes:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="TEXT", datatype="BYTES", shape=shape)
    request.raw_input_contents.append(raw)
    return request.SerializeToString()


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="boundgen-adversarial-"))
    dirs = [write_fake_artifact(root / "fscore", SCORE_SPEC), write_fake_artifact(root / "fbeam", BEAM_SPEC)]
    server = ServerProcess(dirs, command=[sys.executable, "-m", "tests.server.fake_serve"],
                           args=["--allow-client-shm", "--max-inflight", "1", "--max-queue", "4"],
                           env={**os.environ, "BOUNDGEN_API_KEY": KEY}, cwd=Path(__file__).resolve().parents[1])
    server.start()
    rows, good = [], 0
    try:
        for name, expected, thunk in cases(server):
            try:
                got = thunk()
            except Exception as exc:  # noqa: BLE001 - a dead server or a dropped connection is an answer too
                got = f"{type(exc).__name__}"
            alive = server.proc.poll() is None
            ok = got == expected and alive
            good += ok
            rows.append((name, expected, got if alive else f"{got}, server died", "yes" if ok else "NO"))
    finally:
        server.stop()
    width = max(len(r[0]) for r in rows)
    print(f"{'case':<{width}}  expected          got               per contract")
    for name, expected, got, ok in rows:
        print(f"{name:<{width}}  {str(expected):<16}  {str(got):<16}  {ok}")
    print(f"{good} of {len(rows)} answered per contract")
    return 0 if good == len(rows) else 1


if __name__ == "__main__":
    sys.exit(main())

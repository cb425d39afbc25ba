"""A KServe v2 HTTP client for the load generator, on the standard library's http.client.

Request: `POST /v2/models/{model}/infer` with the binary tensor extension: a JSON header naming
input TEXT BYTES [N] with `binary_data_size`, then the length-prefixed texts (as tritonclient
sends them), and `binary_data_output` so that outputs come back raw after the JSON header
(`Inference-Header-Content-Length`); outputs sent as JSON `data` are read too. Response ->
output tensors by name -> ScoreResult | BeamResult (grpc_client.to_result, shared with gRPC).

Connections: one keep-alive HTTP/1.1 connection per calling thread, so each in-flight slot of
the load generator holds its own connection, reused request after request; a connection the
server closed between requests is reopened once. A non-200 answer raises `HttpError`, which
the load generator counts as `http.<status>`. Results carry no timings, as over gRPC.
"""

from __future__ import annotations

import http.client
import json
import threading

import numpy as np

from boundgen.artifact.tasks import task_named
from boundgen.bench.grpc_client import NUMPY_DTYPES, decode_bytes, encode_bytes, to_result
from boundgen.bench.tasks import bench_task

HEADER_LENGTH = "Inference-Header-Content-Length"


class HttpError(Exception):
    """A non-200 answer; `http_status` names it in the load generator's error counts."""

    def __init__(self, status: int, message: str):
        super().__init__(f"HTTP {status}: {message}")
        self.http_status = status


def split_address(address: str) -> tuple[str, int]:
    """'host:port' (or 'http://host:port') -> (host, port)."""
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = hostport.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"an HTTP target is HOST:PORT, got {address!r}")
    return host.strip("[]"), int(port)


def infer_body(texts) -> tuple[bytes, int]:
    """(body, JSON header length) of a binary-extension infer request with TEXT = `texts`."""
    raw = encode_bytes([t.encode("utf-8") for t in texts])
    head = json.dumps({"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(texts)],
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "parameters": {"binary_data_output": True}}, separators=(",", ":")).encode()
    return head + raw, len(head)


def parse_outputs(body: bytes, header_length: int | None) -> dict:
    """An infer response body -> {name: list of bytes (BYTES) | array}."""
    head, binary = (body, b"") if header_length is None else (body[:header_length], body[header_length:])
    outs, offset = {}, 0
    for out in json.loads(head)["outputs"]:
        shape = tuple(int(d) for d in out["shape"])
        count = int(np.prod(shape)) if shape else 1
        size = (out.get("parameters") or {}).get("binary_data_size")
        if size is not None:
            raw = binary[offset:offset + size]
            offset += size
            outs[out["name"]] = (decode_bytes(raw, count) if out["datatype"] == "BYTES" else
                                 np.frombuffer(raw, dtype=NUMPY_DTYPES[out["datatype"]]).reshape(shape))
        elif out["datatype"] == "BYTES":
            outs[out["name"]] = [d.encode("utf-8") if isinstance(d, str) else bytes(d) for d in out["data"]]
        else:
            outs[out["name"]] = np.asarray(out["data"], dtype=NUMPY_DTYPES[out["datatype"]]).reshape(shape)
    return outs


class HttpTarget:
    """Callable `request -> ScoreResult | BeamResult` against one model of a running server."""

    def __init__(self, address: str, model: str, task: str, timeout_s: float = 30.0):
        bench_task(task)  # ValueError for a task that is none
        self.host, self.port = split_address(address)
        self.model, self.task, self.timeout_s = model, task, timeout_s
        self.path = f"/v2/models/{model}/infer"
        self._local = threading.local()
        self._lock = threading.Lock()
        self._connections: list[http.client.HTTPConnection] = []

    def _connection(self, fresh: bool = False) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is not None and fresh:
            conn.close()
        if conn is None or fresh:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            self._local.conn, self._local.used = conn, False
            with self._lock:
                self._connections.append(conn)
        return conn

    def _send(self, method: str, path: str, body: bytes | None = None, headers: dict | None = None):
        """(status, headers, body) over this thread's connection; reopened once if the server had closed it."""
        conn = self._connection()
        for attempt in (0, 1):
            try:
                conn.request(method, path, body=body, headers=headers or {})
                resp = conn.getresponse()
                data = resp.read()
                self._local.used = True
                if resp.will_close:
                    conn.close()
                return resp.status, resp, data
            except (http.client.RemoteDisconnected, ConnectionResetError, BrokenPipeError):
                if attempt or not self._local.used:  # a fresh connection that fails is the server's answer
                    raise
                conn = self._connection(fresh=True)
        raise AssertionError("unreachable")

    def ready(self) -> bool:
        status, _, _ = self._send("GET", f"/v2/models/{self.model}/ready")
        return status == 200

    def __call__(self, request):
        texts = task_named(self.task).request_texts(request.texts)
        body, head_len = infer_body(texts)
        status, resp, data = self._send("POST", self.path, body, {
            "Content-Type": "application/octet-stream", HEADER_LENGTH: str(head_len)})
        if status != 200:
            try:
                message = json.loads(data).get("error", "")
            except (ValueError, AttributeError):
                message = data[:200].decode("utf-8", errors="replace")
            raise HttpError(status, message)
        length = resp.getheader(HEADER_LENGTH)
        return to_result(self.task, parse_outputs(data, int(length) if length is not None else None))

    def close(self):
        with self._lock:
            for conn in self._connections:
                conn.close()
            self._connections.clear()

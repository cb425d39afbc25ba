"""A tiny threaded KServe v2 HTTP server for the bench's client tests: score model "m" (SCORES
FP32 [N, 2], the first column a text's length), binary or JSON outputs as asked, keep-alive,
and a count of the connections it accepted. A text "overload" answers 429, "close" closes the
connection after answering."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from boundgen.bench.grpc_client import decode_bytes

HEADER_LENGTH = "Inference-Header-Content-Length"


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    def _answer(self, status: int, body: bytes, headers: dict | None = None, close: bool = False):
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        ready = self.path == "/v2/models/m/ready"
        self._answer(200 if ready else 404, b"{}")

    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.path != "/v2/models/m/infer":
            return self._answer(404, json.dumps({"error": "no such model"}).encode())
        n = int(self.headers.get(HEADER_LENGTH, len(body)))
        head = json.loads(body[:n])
        (inp,) = head["inputs"]
        texts = decode_bytes(body[n:], inp["shape"][0])
        if texts[0] == b"overload":
            return self._answer(429, json.dumps({"error": "too many requests in flight"}).encode())
        scores = np.array([[len(t), 1.0] for t in texts], dtype="<f4")
        out = {"name": "SCORES", "datatype": "FP32", "shape": [len(texts), 2]}
        if (head.get("parameters") or {}).get("binary_data_output"):
            raw = scores.tobytes()
            out["parameters"] = {"binary_data_size": len(raw)}
            js = json.dumps({"model_name": "m", "outputs": [out]}).encode()
            self._answer(200, js + raw, {HEADER_LENGTH: str(len(js))}, close=texts[0] == b"close")
        else:
            out["data"] = scores.ravel().tolist()
            self._answer(200, json.dumps({"model_name": "m", "outputs": [out]}).encode(), close=texts[0] == b"close")


class FakeServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self._thread = threading.Thread(target=self.serve_forever, daemon=True)

    def get_request(self):
        sock, addr = super().get_request()
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # headers and body go in two writes
        self.connections += 1
        return sock, addr

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.server_address[1]}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self.shutdown()
        self.server_close()

"""Bad input: 400 / INVALID_ARGUMENT with a message naming the problem, over both protocols;
the server stays healthy and answers the next good request."""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

from tests.server.test_endpoints import NO_PROXY, client

STATUS = {"http": "400", "grpc": "StatusCode.INVALID_ARGUMENT"}


def tensor(protocol, name, datatype, shape, data):
    mod = thttp if protocol == "http" else tgrpc
    t = mod.InferInput(name, shape, datatype)
    t.set_data_from_numpy(data)
    return t


def texts(*items):
    return np.array([t.encode() if isinstance(t, str) else t for t in items], dtype=object)


# (case, model, input name, datatype, shape, data, requested outputs, words the message must hold)
CASES = [
    ("unknown model", "nope", "TEXT", "BYTES", [1], texts("a"), None, ["unknown model 'nope'", "fscore"]),
    ("wrong tensor name", "fscore", "TXT", "BYTES", [1], texts("a"), None, ["no input 'TXT'", "TEXT"]),
    ("wrong dtype", "fscore", "TEXT", "FP32", [1], np.array([1.0], dtype=np.float32), None, ["must be BYTES", "FP32"]),
    ("wrong shape", "fscore", "TEXT", "BYTES", [2, 1], texts("a", "b").reshape(2, 1), None, ["shape [N]", "[2, 1]"]),
    ("empty batch", "fscore", "TEXT", "BYTES", [0], np.array([], dtype=object), None, ["empty", "1 to 4"]),
    ("too many samples", "fscore", "TEXT", "BYTES", [5], texts(*"abcde"), None, ["5 samples", "limit of 4"]),
    ("sample over token limit", "fscore", "TEXT", "BYTES", [2], texts("ok", "w " * 9), None, ["sample 1", "limit of 8"]),
    ("empty sample", "fscore", "TEXT", "BYTES", [1], texts("  "), None, ["sample 0", "empty"]),
    ("invalid utf-8", "fscore", "TEXT", "BYTES", [2], texts(b"ok", b"ab\xff\xfe"), None, ["TEXT[1]", "UTF-8"]),
    ("beam with two prompts", "fbeam", "TEXT", "BYTES", [2], texts("a", "b"), None, ["shape [1]", "[2]"]),
    ("unknown output", "fscore", "TEXT", "BYTES", [1], texts("a"), "NOPE", ["no output 'NOPE'", "SCORES"]),
    ("body over the size limit", "fscore", "TEXT", "BYTES", [1], texts("x" * 70_000), None, ["limit of 65536"]),
]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("case,model,name,datatype,shape,data,output,words", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_400(fake_server, protocol, case, model, name, datatype, shape, data, output, words):
    c = client(protocol, fake_server)
    mod = thttp if protocol == "http" else tgrpc
    outputs = [mod.InferRequestedOutput(output)] if output else None
    with pytest.raises(InferenceServerException) as info:
        c.infer(model, [tensor(protocol, name, datatype, shape, data)], outputs=outputs)
    assert info.value.status() == STATUS[protocol], info.value
    for word in words:
        assert word in info.value.message(), (word, info.value.message())


def post(server, body: bytes, headers=None):
    request = urllib.request.Request(f"http://{server.http_url}/v2/models/fscore/infer", data=body,
                                     headers=headers or {"Content-Type": "application/json"})
    try:
        with NO_PROXY.open(request, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


BINARY_HEAD = b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "parameters": {"binary_data_size": 9}}]}'


@pytest.mark.parametrize("body,headers,words", [
    (b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["\xff"]}]}', None, ["UTF-8"]),
    (b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["\\ud800"]}]}', None,
     ["element 0", "UTF-8"]),
    (b"{not json", None, ["not valid JSON"]),
    (b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [2], "data": ["a"]}]}', None, ["2 elements", "has 1"]),
    (b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1]}]}', None, ["has none of 'data'"]),
    (BINARY_HEAD + b"abc", {"Inference-Header-Content-Length": str(len(BINARY_HEAD))}, ["binary_data_size 9"]),
    (BINARY_HEAD + b"\x06\x00\x00\x00abcde", {"Inference-Header-Content-Length": str(len(BINARY_HEAD))},
     ["element 0 says 6 bytes", "only 5 remain"]),
    (b'{"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["a"]}], "parameters": {"timeout": -5}}',
     None, ["timeout"]),
    (b'{"inputs": [{"name": "TEXT", "datatype": "STRING", "shape": [1], "data": ["a"]}]}', None, ["unknown datatype"]),
])
def test_malformed_http_bodies(fake_server, body, headers, words):
    status, answer = post(fake_server, body, headers)
    assert status == 400, answer
    for word in words:
        assert word in answer["error"], (word, answer)


def test_healthy_after_bad_input(fake_server):
    for protocol in ("http", "grpc"):
        c = client(protocol, fake_server)
        with pytest.raises(InferenceServerException):
            c.infer("fscore", [tensor(protocol, "TEXT", "BYTES", [1], texts(b"\xff"))])
        assert c.is_server_ready()
        result = c.infer("fscore", [tensor(protocol, "TEXT", "BYTES", [1], texts("fine"))])
        assert result.as_numpy("SCORES").shape == (1, 2)

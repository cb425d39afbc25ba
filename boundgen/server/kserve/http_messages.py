"""KServe v2 inference bodies over HTTP: a request's JSON and binary tensor data into Tensors,
the outputs into a response. The aiohttp application, its routes and handlers: http_api.py;
reading a body within the server's limits and the JSON error body: server/http_bodies.py.

Binary extension: the header `Inference-Header-Content-Length: N` says the body is N bytes of
JSON followed by raw tensor data; each input with `parameters.binary_data_size` takes its bytes
from there in order. Outputs come back binary when requested (`parameters.binary_data` per
output, or request-level `parameters.binary_data_output`), JSON otherwise; an input or output
with `parameters.shared_memory_region` is read from or written to a registered region
(shared_memory.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

from aiohttp import web

from boundgen.errors import InvalidInput
from boundgen.server.http_bodies import parse_json
from boundgen.server.kserve.shared_memory import ClientRegions, SharedMemory, Slice, tensor_ref
from boundgen.server.kserve.tensors import Tensor, check_header, check_rank, from_json, from_raw, to_json, to_raw
from boundgen.server.served import VERSION

HEADER_LENGTH = "Inference-Header-Content-Length"

ShapeCheck = Callable[[str, str, tuple], None]  # (input name, datatype, shape); raises InvalidInput


@dataclass
class HttpInferRequest:
    id: str | None
    tensors: list[Tensor]
    outputs: list[str] | None  # requested names; None: all
    binary: dict[str, bool] = field(default_factory=dict)  # per requested output: raw bytes, not JSON?
    binary_default: bool = False  # for outputs not in `binary`
    parameters: dict[str, Any] = field(default_factory=dict)
    shared_memory: dict[str, Slice] = field(default_factory=dict)  # outputs to write to shared memory


def _params(obj: dict, where: str) -> dict:
    params = obj.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInput(f"{where}: 'parameters' must be a JSON object")
    return params


def split_infer_body(body: bytes, header_length: str | None) -> tuple[bytes, memoryview]:
    """The JSON of an HTTP inference body and the binary tensor data after it (header_length:
    the binary extension's header, None when absent)."""
    if header_length is None:
        return body, memoryview(b"")
    try:
        n = int(header_length)
    except ValueError:
        raise InvalidInput(f"header {HEADER_LENGTH} must be an integer, got {header_length!r}") from None
    if not 0 <= n <= len(body):
        raise InvalidInput(f"header {HEADER_LENGTH} says {n} bytes of JSON, the body has {len(body)}")
    return body[:n], memoryview(body)[n:]


def parse_infer_body(body: bytes, header_length: str | None, shared_memory: ClientRegions | None = None,
                     limit: int | None = None, check_shape: ShapeCheck | None = None,
                     head: Any = None) -> HttpInferRequest:
    """An inference request from an HTTP body (JSON, or JSON + binary tensor data), its tensors
    in shared memory read from `shared_memory`'s regions. `limit` (--max-body-bytes) bounds each
    shape before anything is allocated for it, and each input read from shared memory;
    `check_shape(name, datatype, shape)` (the model's own bounds, http_api.shape_check) runs
    on each input's header before its data is converted: a TEXT [1000000] of one-character
    strings, within the body limit, is refused by its shape, not after a million conversions.
    `head`: the body's JSON already parsed (elsewhere: http_bodies.loads), else None."""
    shared_memory = shared_memory or SharedMemory().client(lambda: None)
    body, binary = split_infer_body(body, header_length)
    obj = parse_json(body, "the request body") if head is None else head
    if not isinstance(obj, dict):
        raise InvalidInput("the request body must be a JSON object with 'inputs'")
    inputs = obj.get("inputs")
    if not isinstance(inputs, list):
        raise InvalidInput("the request needs 'inputs', a list of tensors")
    tensors, offset = [], 0
    for i, inp in enumerate(inputs):
        if not isinstance(inp, dict):
            raise InvalidInput(f"inputs[{i}] must be a JSON object")
        check_rank(inp.get("name"), inp.get("shape"))
        name, datatype, shape = check_header(inp.get("name"), inp.get("datatype"), inp.get("shape"), limit)
        if check_shape is not None:
            check_shape(name, datatype, shape)
        params = _params(inp, f"input {name}")
        size, ref = params.get("binary_data_size"), tensor_ref(name, params)
        if ref is not None:
            if size is not None or "data" in inp:
                raise InvalidInput(f"input {name} has shared_memory_region and also "
                                   f"{'data' if 'data' in inp else 'binary_data_size'}; send one")
            tensors.append(shared_memory.slice(name, ref).read_tensor(name, datatype, shape, limit))
        elif size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidInput(f"input {name}: binary_data_size must be a non-negative integer, got {size!r}")
            if "data" in inp:
                raise InvalidInput(f"input {name} has both 'data' and binary_data_size; send one")
            if offset + size > len(binary):
                raise InvalidInput(f"input {name}: binary_data_size {size} runs past the end of the binary data "
                                   f"({len(binary) - offset} bytes left)")
            tensors.append(from_raw(name, datatype, shape, binary[offset:offset + size]))
            offset += size
        elif "data" in inp:
            tensors.append(from_json(name, datatype, shape, inp["data"]))
        else:
            raise InvalidInput(f"input {name} has none of 'data', parameters.binary_data_size, "
                               "parameters.shared_memory_region")
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    parameters = _params(obj, "request")
    default_binary = parameters.get("binary_data_output", False) is True
    outputs, flags, slices = None, {}, {}
    if obj.get("outputs") is not None:
        if not isinstance(obj["outputs"], list):
            raise InvalidInput("'outputs' must be a list of {\"name\": ...} objects")
        outputs = []
        for i, out in enumerate(obj["outputs"]):
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise InvalidInput(f"outputs[{i}] must be an object with a string 'name'")
            out_params = _params(out, f"output {out['name']}")
            if "classification" in out_params:
                raise InvalidInput(f"output {out['name']}: the classification extension is not supported")
            outputs.append(out["name"])
            ref = tensor_ref(out["name"], out_params)
            if ref is not None:
                if out_params.get("binary_data") is True:
                    raise InvalidInput(f"output {out['name']} asks for shared memory and binary_data; ask for one")
                slices[out["name"]] = shared_memory.slice(out["name"], ref)
            flags[out["name"]] = out_params.get("binary_data", default_binary) is True
    request_id = obj.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    return HttpInferRequest(request_id, tensors, outputs, flags, default_binary, parameters, slices)


def encode_infer_response(model: str, request: HttpInferRequest, outputs: list[Tensor]) -> web.Response:
    """`outputs` as `request` asked for each: into its shared memory region, binary after the JSON, or JSON."""
    entries, chunks = [], []
    for t in outputs:
        entry = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if t.name in request.shared_memory:
            entry["parameters"] = request.shared_memory[t.name].write_tensor(t)
        elif request.binary.get(t.name, request.binary_default):
            raw = to_raw(t)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = to_json(t)
        entries.append(entry)
    head = {"model_name": model, "model_version": VERSION, "outputs": entries}
    if request.id is not None:
        head["id"] = request.id
    head_bytes = json.dumps(head, separators=(",", ":")).encode()
    if not chunks:
        return web.Response(body=head_bytes, content_type="application/json")
    return web.Response(body=head_bytes + b"".join(chunks), content_type="application/octet-stream",
                        headers={HEADER_LENGTH: str(len(head_bytes))})

"""KServe v2 gRPC messages to and from the server's types: a ModelInferRequest's inputs into
Tensors (raw contents, typed contents or shared memory), the outputs into a ModelInferResponse,
InferParameter maps as plain values, and a request that does not decode as a value the handler
answers (`Undecodable`). The service that uses them: grpc_api.py.
"""

from __future__ import annotations

import json

from boundgen.errors import InvalidInput
from boundgen.server.kserve import pb
from boundgen.server.kserve.shared_memory import ClientRegions, SharedMemory, Slice, tensor_ref
from boundgen.server.kserve.tensors import Tensor, check_header, check_rank, from_grpc_contents, from_raw, to_raw
from boundgen.server.served import VERSION


class Undecodable:
    """What the request deserializer hands the handler instead of a message it refused."""

    def __init__(self, reason: str):
        self.reason = reason
        self.model_name = ""


def decoder(request_cls):
    """`request_cls.FromString`, handing the handler an `Undecodable` instead of raising (which gRPC
    would answer INTERNAL)."""
    def decode(data: bytes):
        try:
            return request_cls.FromString(data)
        except Exception as exc:  # protobuf's DecodeError
            return Undecodable(f"the request is not a valid {request_cls.DESCRIPTOR.name}: {exc}")

    return decode


def param_value(p):
    """An InferParameter's (or SettingValue's) value, whichever field holds it; None when unset."""
    kind = p.WhichOneof("parameter_choice")
    return None if kind is None else getattr(p, kind)


def params(parameters) -> dict:
    """A protobuf map of InferParameter (or Triton's SettingValue) as plain values."""
    return {key: param_value(value) for key, value in parameters.items()}


def set_param(p, value) -> None:
    """Set an InferParameter from a plain value (anything but bool, int, float, str: as JSON text)."""
    if isinstance(value, bool):
        p.bool_param = value
    elif isinstance(value, int):
        p.int64_param = value
    elif isinstance(value, float):
        p.double_param = value
    elif isinstance(value, str):
        p.string_param = value
    else:
        p.string_param = json.dumps(value)


def parse_infer_request(request, shared_memory: ClientRegions | None = None, limit: int | None = None,
                        check_shape=None) -> tuple[list[Tensor], dict[str, Slice]]:
    """The request's input tensors (those in shared memory read from `shared_memory`'s regions),
    and the shared memory places of the outputs that ask for one. `limit` (--max-body-bytes)
    bounds each shape before anything is allocated for it, and each input read from shared memory;
    `check_shape(name, datatype, shape)` (http_api.shape_check) runs before each input's data
    is converted."""
    shared_memory = shared_memory or SharedMemory().client(lambda: None)
    refs = [tensor_ref(inp.name, params(inp.parameters)) for inp in request.inputs]
    raw, inline = request.raw_input_contents, sum(ref is None for ref in refs)
    if raw and len(raw) != inline:
        raise InvalidInput(f"raw_input_contents has {len(raw)} entries for {inline} inputs not in shared memory; "
                           "send one per such input, in order")
    tensors, next_raw = [], 0
    for inp, ref in zip(request.inputs, refs):
        check_rank(inp.name, inp.shape)
        name, datatype, shape = check_header(inp.name, inp.datatype, list(inp.shape), limit)
        if check_shape is not None:
            check_shape(name, datatype, shape)
        if ref is not None:
            if inp.HasField("contents"):
                raise InvalidInput(f"input {name} has contents and shared_memory_region; send one")
            tensors.append(shared_memory.slice(name, ref).read_tensor(name, datatype, shape, limit))
        elif raw:
            if inp.HasField("contents"):
                raise InvalidInput(f"input {name} has contents and raw_input_contents; send one")
            tensors.append(from_raw(name, datatype, shape, raw[next_raw]))
            next_raw += 1
        else:
            tensors.append(from_grpc_contents(name, datatype, shape, inp.contents))
    slices = {}
    for out in request.outputs:
        ref = tensor_ref(out.name, params(out.parameters))
        if ref is not None:
            slices[out.name] = shared_memory.slice(out.name, ref)
    return tensors, slices


def infer_response(request, outputs: list[Tensor], slices: dict[str, Slice]) -> pb.ModelInferResponse:
    """The ModelInferResponse of `request` with `outputs`: each in `raw_output_contents`, or written
    to its shared memory place in `slices` (an empty raw entry for it, as Triton answers)."""
    response = pb.ModelInferResponse(model_name=request.model_name, model_version=VERSION, id=request.id)
    for t in outputs:
        out = response.outputs.add(name=t.name, datatype=t.datatype, shape=list(t.shape))
        if t.name in slices:
            for key, value in slices[t.name].write_tensor(t).items():
                set_param(out.parameters[key], value)
            response.raw_output_contents.append(b"")
        else:
            response.raw_output_contents.append(to_raw(t))
    return response

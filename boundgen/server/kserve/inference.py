"""KServe v2 inference in the core's terms: a request's input tensors become the model's
`EngineCall` (server/signature.py), the engine's result becomes its output tensors.

    HTTP (http_api.py) | gRPC (grpc_api.py)   Tensors, requested output names
      -> infer: ModelSet.admitting            the model (503 once draining, 400 unknown)
         engine_call                          TEXT [and ALLOW_ITEMS] -> EngineCall, with the
                                              Signature's checks (names, datatypes, shape, UTF-8)
         output_names                         the outputs asked for, else the model's defaults
         ServedModel.run                      admission, the engine -> ScoreResult | BeamResult
         output_tensors                       the result's arrays (the task's) -> Tensors
      -> Answer: the output tensors and the engine's stage timings

The core never sees a Tensor: the JSON routes build their EngineCall from texts
(`Signature.call`) and read the result themselves.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from boundgen.errors import InvalidInput
from boundgen.runtime.results import BeamResult, ScoreResult
from boundgen.server.models import ModelSet
from boundgen.server.signature import EngineCall, Signature
from boundgen.server.kserve.tensors import Tensor


@dataclass(frozen=True)
class Answer:
    """What an inference request gets back: its output tensors, in the order asked for, and the
    engine's stage timings (seconds; runtime/results.py), which a gRPC client may ask to see."""

    outputs: list[Tensor]
    timings: dict


async def infer(models: ModelSet, name: str, version: str, tensors: Sequence[Tensor],
                requested: Sequence[str] | None, deadline: float) -> Answer:
    """Check, admit, run and turn into tensors one request; raises InvalidInput or a status.ServeError."""
    model = models.admitting(name, version)
    call = engine_call(model.signature, tensors)
    names = output_names(model.signature, requested)
    result = await model.run(call, deadline)
    return Answer(output_tensors(model.signature, result, names), result.timings)


def engine_call(signature: Signature, tensors: Sequence[Tensor]) -> EngineCall:
    """The engine call of a request's input tensors: TEXT (BYTES), and ALLOW_ITEMS (INT64) where
    the model takes it; InvalidInput naming what is wrong."""
    name = signature.name
    by_name = {}
    known = [t.name for t in signature.inputs]
    for t in tensors:
        if t.name not in known:
            raise InvalidInput(f"model {name} has no input {t.name!r}; its inputs are "
                               + ", ".join(f"{s.name} ({s.datatype})" for s in signature.inputs))
        if t.name in by_name:
            raise InvalidInput(f"input {t.name} was given twice")
        by_name[t.name] = t
    text = by_name.get("TEXT")
    if text is None:
        raise InvalidInput(f"model {name} needs input TEXT (BYTES), the request has none")
    if text.datatype != "BYTES":
        raise InvalidInput(f"input TEXT must be BYTES, got {text.datatype}")
    call = signature.call(text.data, text.shape)
    allow = by_name.get("ALLOW_ITEMS")
    if allow is not None:
        if allow.datatype != "INT64":
            raise InvalidInput(f"input ALLOW_ITEMS must be INT64 (item ids), got {allow.datatype}")
        if len(allow.shape) != 1:
            raise InvalidInput(f"input ALLOW_ITEMS must have shape [K] (a list of item ids), got {list(allow.shape)}")
        call = signature.allowing(call, allow.data)
    subset = by_name.get("ALLOW_SUBSET")
    if subset is not None:
        if subset.datatype != "BYTES" or list(subset.shape) != [1] or len(subset.data) != 1:
            raise InvalidInput(f"input ALLOW_SUBSET must be BYTES of shape [1] (one subset's name), got "
                               f"{subset.datatype} {list(subset.shape)}")
        try:
            name = bytes(subset.data[0]).decode("utf-8")
        except UnicodeDecodeError:
            raise InvalidInput("input ALLOW_SUBSET is not UTF-8") from None
        call = signature.allowing(call, subset=name)
    return call


def output_names(signature: Signature, requested: Sequence[str] | None) -> tuple[str, ...]:
    """The output names to return, in order; the model's default ones when none were requested."""
    known = [t.name for t in signature.outputs]
    if not requested:
        return signature.defaults
    for name in requested:
        if name not in known:
            raise InvalidInput(f"model {signature.name} has no output {name!r}; its outputs are {', '.join(known)}")
    if len(set(requested)) != len(requested):
        raise InvalidInput(f"an output was requested twice: {list(requested)}")
    return tuple(requested)


def output_tensors(signature: Signature, result: ScoreResult | BeamResult, names: Sequence[str]) -> list[Tensor]:
    """The requested output tensors of an engine result (its arrays: the task's `output_arrays`)."""
    all_outputs = {}
    for name, (datatype, data) in signature.task.output_arrays(result, names, signature.name).items():
        if datatype == "BYTES":
            all_outputs[name] = Tensor(name, datatype, (len(data),), data)
        else:
            all_outputs[name] = Tensor(name, datatype, tuple(data.shape), data.reshape(-1))
    return [all_outputs[n] for n in names]

"""KServe v2 tensors on the wire: JSON `data`, raw bytes (HTTP binary extension, gRPC raw
contents) and gRPC typed contents, to and from one protocol-neutral `Tensor` (below).

Raw layout (both protocols): elements flattened row-major, little-endian, no padding. A
BYTES element is a 4-byte little-endian unsigned length followed by that many bytes.
Every malformed tensor raises `InvalidInput` naming the tensor and what was expected.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from boundgen.errors import InvalidInput, shown

# KServe datatype -> numpy dtype (little-endian); BYTES is a list of `bytes` instead.
NUMPY_DTYPES = {
    "BOOL": np.dtype("bool"),
    "UINT8": np.dtype("<u1"), "UINT16": np.dtype("<u2"), "UINT32": np.dtype("<u4"), "UINT64": np.dtype("<u8"),
    "INT8": np.dtype("<i1"), "INT16": np.dtype("<i2"), "INT32": np.dtype("<i4"), "INT64": np.dtype("<i8"),
    "FP16": np.dtype("<f2"), "FP32": np.dtype("<f4"), "FP64": np.dtype("<f8"),
}
DATATYPES = tuple(NUMPY_DTYPES) + ("BYTES",)

# gRPC InferTensorContents field holding each datatype when raw contents are not used.
GRPC_CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents", "INT32": "int_contents",
    "INT64": "int64_contents", "UINT8": "uint_contents", "UINT16": "uint_contents",
    "UINT32": "uint_contents", "UINT64": "uint64_contents", "FP32": "fp32_contents",
    "FP64": "fp64_contents", "BYTES": "bytes_contents",
}

_LEN = struct.Struct("<I")


@dataclass
class Tensor:
    """A named array of a request's inputs or outputs, whichever protocol carried it (HTTP JSON or
    binary, gRPC, shared memory); kserve/inference.py turns it into the core's EngineCall and back."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: Any  # flat: a numpy array of the datatype's dtype (NUMPY_DTYPES), or list[bytes] for BYTES

    @property
    def size(self) -> int:
        return len(self.data)


MAX_DIM = (1 << 63) - 1  # a shape dimension is an int64 in gRPC; JSON's unbounded integers are held to it too


def _shown(shape) -> str:
    """A client's shape for a message, cut short: a dimension may have thousands of digits."""
    dims = [str(d) if not isinstance(d, int) or d.bit_length() <= 64 else f"<{len(str(d))}-digit number>"
            for d in list(shape)[:8]]
    return "[" + ", ".join(dims) + (", ...]" if len(shape) > 8 else "]")


MAX_RANK = 64  # dimensions a tensor may have (numpy's own limit); a shape with more is refused by its length


def check_rank(name: Any, shape: Any) -> None:
    """Refuse a shape of more than MAX_RANK dimensions by its length alone, before its dimensions
    are looked at one by one (40,000 of them cost the event loop ~30 ms, and a message echoing
    them 120 KB)."""
    if isinstance(shape, list) or hasattr(shape, "__len__") and not isinstance(shape, (str, bytes, dict)):
        if len(shape) > MAX_RANK:  # a JSON list, or gRPC's repeated field (another type: check_header's error)
            raise InvalidInput(f"tensor {str(name)[:80]}: shape has {len(shape)} dimensions, more than the "
                               f"{MAX_RANK} a tensor may have")


def check_header(name: Any, datatype: Any, shape: Any, max_elements: int | None = None) -> tuple[str, str, tuple[int, ...]]:
    """Validate a tensor's name, datatype and shape as sent by a client, before anything is
    allocated for it: with `max_elements` (the body limit: every element takes at least a byte of
    the request), a shape with more elements is refused."""
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"every tensor needs a non-empty string 'name', got {repr(name)[:80]}")
    if datatype not in DATATYPES:
        raise InvalidInput(f"tensor {name}: unknown datatype {datatype!r}; expected one of {', '.join(DATATYPES)}")
    if not isinstance(shape, (list, tuple)) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
        given = _shown(shape) if isinstance(shape, (list, tuple)) else repr(shape)[:80]
        raise InvalidInput(f"tensor {name}: 'shape' must be a list of integers, got {given}")
    if any(d < 0 for d in shape):
        raise InvalidInput(f"tensor {name}: shape {_shown(shape)} has a negative dimension")
    if any(d > MAX_DIM for d in shape):
        raise InvalidInput(f"tensor {name}: shape dimension too large in {_shown(shape)} (at most {MAX_DIM})")
    if max_elements is not None and 0 not in shape:
        count = 1
        for d in shape:  # stops at the first dimension past the bound: never a huge product
            count *= d
            if count > max_elements:
                raise InvalidInput(f"tensor {name}: shape {_shown(shape)} has more elements than a request within "
                                   f"the server's limit of {max_elements} bytes (--max-body-bytes) can hold")
    return name, datatype, tuple(int(d) for d in shape)


def element_count(shape: tuple[int, ...]) -> int:
    return math.prod(shape)


# ---- raw bytes ------------------------------------------------------------------------------

def serialize_bytes(items: list[bytes]) -> bytes:
    parts = []
    for item in items:
        parts.append(_LEN.pack(len(item)))
        parts.append(item)
    return b"".join(parts)


def deserialize_bytes(name: str, raw: bytes | memoryview, count: int) -> list[bytes]:
    view = memoryview(raw)
    items, offset = [], 0
    for i in range(count):
        if offset + 4 > len(view):
            raise InvalidInput(f"tensor {name}: raw BYTES data ends inside the length prefix of element {i} "
                               f"({len(view)} bytes for {count} elements)")
        (length,) = _LEN.unpack_from(view, offset)
        offset += 4
        if offset + length > len(view):
            raise InvalidInput(f"tensor {name}: raw BYTES element {i} says {length} bytes, "
                               f"only {len(view) - offset} remain")
        items.append(bytes(view[offset:offset + length]))
        offset += length
    if offset != len(view):
        raise InvalidInput(f"tensor {name}: {len(view) - offset} bytes left over after {count} BYTES elements "
                           f"(does the shape match the data?)")
    return items


def from_raw(name: str, datatype: str, shape: tuple[int, ...], raw: bytes | memoryview) -> Tensor:
    count = element_count(shape)
    if datatype == "BYTES":
        if count * 4 > len(raw):
            raise InvalidInput(f"tensor {name}: shape {_shown(shape)} needs at least {count * 4} bytes "
                               f"of BYTES length prefixes, got {len(raw)} bytes")
        return Tensor(name, datatype, shape, deserialize_bytes(name, raw, count))
    dtype = NUMPY_DTYPES[datatype]
    if len(raw) != count * dtype.itemsize:
        raise InvalidInput(f"tensor {name}: shape {_shown(shape)} of {datatype} needs {count * dtype.itemsize} "
                           f"bytes, got {len(raw)}")
    return Tensor(name, datatype, shape, np.frombuffer(raw, dtype=dtype).copy())


def to_raw(tensor: Tensor) -> bytes:
    if tensor.datatype == "BYTES":
        return serialize_bytes(tensor.data)
    return np.ascontiguousarray(tensor.data, dtype=NUMPY_DTYPES[tensor.datatype]).tobytes()


# ---- JSON -----------------------------------------------------------------------------------

def _flatten(data: list) -> list:
    out, stack = [], [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def from_json(name: str, datatype: str, shape: tuple[int, ...], data: Any) -> Tensor:
    """A tensor from the JSON `data` member (nested or flat lists, row-major; a bare value, even for
    one element, is refused as KServe v2 says: before, `"data": "a"` passed as ["a"])."""
    if not isinstance(data, list):
        raise InvalidInput(f"tensor {name}: 'data' must be a JSON array (flat or nested, row-major), "
                           f"got {type(data).__name__}")
    flat = _flatten(data)
    count = element_count(shape)
    if len(flat) != count:
        raise InvalidInput(f"tensor {name}: shape {_shown(shape)} has {count} elements, 'data' has {len(flat)}")
    if datatype == "BYTES":
        items = []
        for i, item in enumerate(flat):
            if not isinstance(item, str):
                raise InvalidInput(f"tensor {name}: BYTES element {i} must be a JSON string, "
                                   f"got {type(item).__name__}")
            try:
                items.append(item.encode("utf-8"))
            except UnicodeEncodeError:
                raise InvalidInput(f"tensor {name}: element {i} is not valid UTF-8 (it holds a lone surrogate)") from None
        return Tensor(name, datatype, shape, items)
    want_bool, integer = datatype == "BOOL", datatype.startswith(("INT", "UINT"))
    for i, item in enumerate(flat):
        # A number with a fraction or an exponent is no integer value: numpy's cast would cut 11.5 to 11
        if (isinstance(item, bool) != want_bool or not isinstance(item, (int, float))
                or integer and isinstance(item, float)):
            raise InvalidInput(f"tensor {name}: element {i} is {shown(item)}, not a value of datatype {datatype}")
    try:
        array = np.asarray(flat, dtype=NUMPY_DTYPES[datatype])
    except (OverflowError, ValueError) as exc:
        raise InvalidInput(f"tensor {name}: 'data' does not fit {datatype}: {exc}") from None
    return Tensor(name, datatype, shape, array)


def to_json(tensor: Tensor) -> list:
    if tensor.datatype == "BYTES":
        return [item.decode("utf-8", errors="replace") for item in tensor.data]
    return np.asarray(tensor.data).reshape(-1).tolist()


# ---- gRPC typed contents --------------------------------------------------------------------

def from_grpc_contents(name: str, datatype: str, shape: tuple[int, ...], contents) -> Tensor:
    """A tensor from `InferTensorContents` (used when the request has no raw contents)."""
    if datatype == "FP16":
        raise InvalidInput(f"tensor {name}: FP16 must be sent in raw_input_contents")
    field = GRPC_CONTENTS_FIELD[datatype]
    values = getattr(contents, field)
    count = element_count(shape)
    if len(values) != count:
        raise InvalidInput(f"tensor {name}: shape {_shown(shape)} has {count} elements, "
                           f"contents.{field} has {len(values)}")
    if datatype == "BYTES":
        return Tensor(name, datatype, shape, list(values))
    try:
        array = np.asarray(list(values), dtype=NUMPY_DTYPES[datatype])
    except OverflowError as exc:
        raise InvalidInput(f"tensor {name}: contents do not fit {datatype}: {exc}") from None
    return Tensor(name, datatype, shape, array)

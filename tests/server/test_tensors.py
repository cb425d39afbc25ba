"""Wire encodings of tensors: raw (binary extension, gRPC raw contents), JSON, gRPC typed contents."""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from boundgen.errors import InvalidInput
from boundgen.server.kserve import pb
from boundgen.server.kserve.tensors import (Tensor, check_header, from_grpc_contents, from_json, from_raw, serialize_bytes,
                                     to_json, to_raw)


def test_bytes_raw_matches_tritonclient():
    items = [b"", b"a", "héllo".encode(), bytes(range(256))]
    ours = serialize_bytes(items)
    theirs = serialize_byte_tensor(np.array(items, dtype=object)).item()
    assert ours == theirs
    assert from_raw("T", "BYTES", (4,), theirs).data == items
    assert list(deserialize_bytes_tensor(to_raw(Tensor("T", "BYTES", (4,), items)))) == items


@pytest.mark.parametrize("datatype,dtype", [("FP32", np.float32), ("INT32", np.int32), ("INT64", np.int64),
                                            ("FP16", np.float16), ("BOOL", np.bool_), ("UINT8", np.uint8)])
def test_numeric_raw_round_trip(datatype, dtype):
    array = (np.arange(6) % 3).astype(dtype).reshape(2, 3)
    t = from_raw("X", datatype, (2, 3), array.tobytes())
    np.testing.assert_array_equal(t.data.reshape(2, 3), array)
    assert to_raw(t) == array.tobytes()


@pytest.mark.parametrize("raw,shape,message", [
    (b"\x01\x00\x00", (1,), "length prefix"),
    (b"\x05\x00\x00\x00abc", (1,), "says 5 bytes"),
    (b"\x01\x00\x00\x00ab", (1,), "left over"),
    (b"", (2,), "at least 8 bytes"),
])
def test_bad_raw_bytes(raw, shape, message):
    with pytest.raises(InvalidInput, match=message):
        from_raw("TEXT", "BYTES", shape, raw)


def test_raw_size_must_match_shape():
    with pytest.raises(InvalidInput, match="needs 12 bytes, got 8"):
        from_raw("X", "FP32", (3,), b"\x00" * 8)


def test_json_nested_and_flat():
    assert from_json("T", "BYTES", (2, 1), [["a"], ["b"]]).data == [b"a", b"b"]
    t = from_json("X", "INT32", (2, 2), [[1, 2], [3, 4]])
    assert t.data.tolist() == [1, 2, 3, 4] and to_json(t) == [1, 2, 3, 4]
    assert to_json(Tensor("T", "BYTES", (1,), ["é".encode()])) == ["é"]


@pytest.mark.parametrize("datatype,data,message", [
    ("BYTES", ["a", 1], "element 1 must be a JSON string"),
    ("BYTES", ["\ud800"], "not valid UTF-8"),
    ("INT32", [1, "2"], "element 1"),
    ("INT8", [1000], "does not fit INT8"),
    ("FP32", [True], "element 0"),
    ("BYTES", ["a"], "has 2 elements"),
    ("BYTES", "a", "must be a JSON array"),
    ("INT64", 3, "must be a JSON array"),
    ("BYTES", {"a": 1}, "must be a JSON array"),
    # numpy's cast cut a fraction off: an allow-list's 11.5 ran item 11
    ("INT64", [11, 11.5], "element 1 is 11.5, not a value of datatype INT64"),
    ("UINT32", [2.0], "element 0 is 2.0, not a value of datatype UINT32"),
])
def test_bad_json(datatype, data, message):
    shape = (2,) if message == "has 2 elements" else (len(data),) if isinstance(data, list) else (1,)
    with pytest.raises(InvalidInput, match=message):
        from_json("T", datatype, shape, data)


@pytest.mark.parametrize("name,datatype,shape,message", [
    ("", "BYTES", [1], "non-empty string"),
    ("T", "STRING", [1], "unknown datatype"),
    ("T", "BYTES", [-1], "negative"),
    ("T", "BYTES", "1", "list of integers"),
    ("T", "BYTES", [1.5], "list of integers"),
])
def test_bad_header(name, datatype, shape, message):
    with pytest.raises(InvalidInput, match=message):
        check_header(name, datatype, shape)


def test_grpc_typed_contents():
    contents = pb.InferTensorContents(bytes_contents=[b"a", b"b"])
    assert from_grpc_contents("T", "BYTES", (2,), contents).data == [b"a", b"b"]
    contents = pb.InferTensorContents(fp32_contents=[0.5, 1.5, 2.5])
    assert from_grpc_contents("X", "FP32", (3,), contents).data.tolist() == [0.5, 1.5, 2.5]
    with pytest.raises(InvalidInput, match="contents.bytes_contents has 1"):
        from_grpc_contents("T", "BYTES", (2,), pb.InferTensorContents(bytes_contents=[b"a"]))


def test_json_fractions_are_fine_where_the_datatype_takes_them():
    assert from_json("T", "FP32", (2,), [1.5, 2]).data.tolist() == [1.5, 2.0]
    assert from_json("T", "INT64", (2,), [11, -3]).data.tolist() == [11, -3]

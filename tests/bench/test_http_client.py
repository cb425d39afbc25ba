"""The bench's KServe v2 HTTP client against a fake server on loopback (tests/bench/fake_kserve_http.py)."""

from dataclasses import dataclass

import numpy as np
import pytest

from boundgen.bench.http_client import HttpError, HttpTarget, parse_outputs, split_address
from boundgen.bench.loadgen import closed_loop

from tests.bench.fake_kserve_http import FakeServer


@dataclass
class Req:
    texts: tuple
    samples: int = 1


def test_split_address():
    assert split_address("localhost:8000") == ("localhost", 8000)
    assert split_address("http://10.0.0.1:80/") == ("10.0.0.1", 80)
    with pytest.raises(ValueError):
        split_address("localhost")


def test_json_outputs_parse():
    body = b'{"outputs": [{"name": "SCORES", "datatype": "FP32", "shape": [1, 2], "data": [0.25, 0.75]},' \
           b' {"name": "TEXT_OUT", "datatype": "BYTES", "shape": [1], "data": ["ok"]}]}'
    outs = parse_outputs(body, None)
    np.testing.assert_array_equal(outs["SCORES"], np.array([[0.25, 0.75]], dtype=np.float32))
    assert outs["TEXT_OUT"] == [b"ok"]


def test_score_round_trip_keep_alive_and_errors():
    with FakeServer() as server:
        target = HttpTarget(server.address, "m", "score")
        try:
            assert target.ready()
            for _ in range(3):  # one connection, reused
                result = target(Req(("ab", "\u00e9t\u00e9")))
                np.testing.assert_array_equal(result.scores, np.array([[2, 1], [5, 1]], dtype=np.float32))
            assert server.connections == 1
            target(Req(("close",)))  # the server closes after answering: the next request reconnects
            target(Req(("abc",)))
            assert server.connections == 2
            with pytest.raises(HttpError) as err:
                target(Req(("overload",)))
            assert err.value.http_status == 429 and "too many" in str(err.value)
            with pytest.raises(HttpError):
                HttpTarget(server.address, "nope", "score")(Req(("a",)))
        finally:
            target.close()


def test_closed_loop_over_http_one_connection_per_slot():
    with FakeServer() as server:
        target = HttpTarget(server.address, "m", "score")
        try:
            pool = [Req(("abc",)), Req(("overload",))]
            stats = closed_loop(target, pool, 3, duration_s=0.3, warmup_s=0.05, progress=None)
        finally:
            target.close()
        assert stats.completed > 0 and set(stats.errors) == {"http.429"}
        assert server.connections == 3

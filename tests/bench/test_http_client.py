"""The bench's KServe v2 HTTP client against a fake server on loopback (tests/bench/fake_kserve_http.py)
and against `boundgen serve` with fake engines, beside the gRPC client."""

from dataclasses import dataclass

import numpy as np
import pytest

from boundgen.bench.grpc_client import GrpcTarget
from boundgen.bench.http_client import HttpError, HttpTarget, parse_outputs, split_address
from boundgen.bench.loadgen import closed_loop, error_name
from boundgen.server.deploy.launch import ServerProcess

from tests.bench.fake_kserve_http import FakeServer
from tests.server.conftest import BEAM_SPEC, FAKE_SERVE, REPO, SCORE_SPEC
from tests.server.fake_engine import write_fake_artifact


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


def test_http_and_grpc_targets_agree_on_a_real_server(tmp_path):
    """`boundgen serve` (fake engines) answers the HTTP target as it answers the gRPC one."""
    dirs = [write_fake_artifact(tmp_path / "fscore", SCORE_SPEC), write_fake_artifact(tmp_path / "fbeam", BEAM_SPEC)]
    server = ServerProcess(dirs, args=[], command=FAKE_SERVE, cwd=REPO, ready_timeout_s=60.0).start()
    try:
        answers = []
        for kind, address in ((HttpTarget, server.http_url), (GrpcTarget, server.grpc_url)):
            score, beam = kind(address, "fscore", "score"), kind(address, "fbeam", "beam")
            assert score.ready()
            with pytest.raises(Exception) as err:
                score(Req(("x",) * 9))  # over the model's 4 samples
            answers.append((score(Req(("a b", "c"))), beam(Req(("hello",))), error_name(err.value)))
            score.close()
            beam.close()
        (s_http, b_http, e_http), (s_grpc, b_grpc, e_grpc) = answers
        np.testing.assert_array_equal(s_http.scores, s_grpc.scores)
        np.testing.assert_array_equal(b_http.token_ids, b_grpc.token_ids)
        np.testing.assert_array_equal(b_http.scores, b_grpc.scores)
        assert b_http.texts == b_grpc.texts and len(b_http.texts) == 3
        assert (e_http, e_grpc) == ("http.400", "grpc.INVALID_ARGUMENT")
    finally:
        server.kill()

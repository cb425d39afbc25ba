"""The gRPC floor: a bare server in its own process answers W2-sized messages, timed by a sync client."""

import pytest

from boundgen.bench import grpc_floor
from boundgen.bench.host import core_ranges, parse_cores


def test_parse_cores_inverts_core_ranges():
    assert parse_cores("0-3,8,10-11") == {0, 1, 2, 3, 8, 10, 11}
    assert core_ranges(parse_cores("0-3,8,10-11")) == "0-3,8,10-11"
    with pytest.raises(ValueError):
        parse_cores("3-1")
    with pytest.raises(ValueError):
        parse_cores("a")


def test_the_messages_are_w2_sized():
    response = grpc_floor.w2_response()
    assert [o.name for o in response.outputs] == ["TOKEN_IDS", "SCORES", "TEXT_OUT"]
    assert [list(o.shape) for o in response.outputs] == [[100, 5], [100], [100]]
    assert len(response.raw_output_contents[0]) == 100 * 5 * 4
    request = grpc_floor.w2_request()
    assert request.inputs[0].datatype == "BYTES" and len(request.raw_input_contents[0]) > 200
    assert request.parameters["boundgen_timings"].bool_param  # as the bench client asks: the handler's time back


@pytest.mark.parametrize("server", grpc_floor.SERVERS)
def test_round_trips_against_the_bare_server(server):
    row = grpc_floor.measure(calls=20, warmup=2, server=server)
    assert row["calls"] == 20 and row["server"] == server
    assert 0 < row["p50_ms"] <= row["p99_ms"]
    assert row["mean_ms"] > 0
    assert 0 < row["rpc_p50_ms"] <= row["rpc_p99_ms"] and row["rpc_mean_ms"] <= row["mean_ms"]


@pytest.mark.parametrize("server", ["aio", "served"])
def test_the_handlers_idle_time_is_left_out_of_rpc(server):
    """--handler-ms: each handler idles that long; `rpc` is the end to end less the handler's own
    time (as bench tables count it), so the idle shows in the end to end only."""
    row = grpc_floor.measure(calls=10, warmup=2, server=server, handler_ms=30)
    assert row["handler_ms"] == 30
    assert row["p50_ms"] >= 30
    assert row["rpc_p50_ms"] < row["p50_ms"] - 25


def test_an_unknown_server_is_refused():
    with pytest.raises(ValueError, match="no bare server 'threads'"):
        grpc_floor.measure(calls=1, server="threads")
    with pytest.raises(SystemExit):
        grpc_floor.main(["--servers", "aio,threads"])
    with pytest.raises(ValueError, match="handler_ms"):
        grpc_floor.measure(calls=1, handler_ms=-1)
    for bad in ("-1", "x", ""):
        with pytest.raises(SystemExit):
            grpc_floor.main(["--handler-ms", bad])

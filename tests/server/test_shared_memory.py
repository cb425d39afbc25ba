"""System shared memory through unmodified tritonclient (http and grpc) and
tritonclient.utils.shared_memory, as Triton's shared memory examples use them: inputs read from
a region (BYTES in tritonclient's length-prefixed serialization), outputs written to one, region
status and unregister; the errors for unknown regions, slices outside a region and sizes that do
not match; refusal without --allow-client-shm; CUDA shared memory: no regions, register refused."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
import tritonclient.utils.shared_memory as shm
from tritonclient import utils
from tritonclient.utils import InferenceServerException

from tests.server.conftest import BEAM_SPEC, REPO, SCORE_SPEC, post_json
from tests.server.fake_engine import FakeEngine
from tests.server.test_endpoints import NO_PROXY, client

TEXTS = ["hello world", "héllo wörld ✓", "a b c"]


@pytest.fixture
def regions():
    """make(size) -> (name, key, handle) of a fresh POSIX shared memory object; all destroyed afterwards."""
    made = []

    def make(size):
        name = f"r{uuid.uuid4().hex[:12]}"
        key = f"/boundgen-{name}"  # under the server's default --shm-prefix
        handle = shm.create_shared_memory_region(name, key, size, create_only=True)
        made.append(handle)
        return name, key, handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def mod(protocol):
    return thttp if protocol == "http" else tgrpc


def serialized(texts):
    data = utils.serialize_byte_tensor(np.array([t.encode() for t in texts], dtype=object))
    return data, utils.serialized_byte_size(data)


def status(c, protocol, name=""):
    """{name: (key, offset, byte_size)} as the server lists its regions."""
    if protocol == "http":
        listed = c.get_system_shared_memory_status(name)
    else:
        listed = list(c.get_system_shared_memory_status(name, as_json=True).get("regions", {}).values())
    return {r["name"]: (r["key"], int(r.get("offset", 0)), int(r["byte_size"])) for r in listed}


def output_parameters(result, name, protocol):
    output = result.get_output(name)
    if protocol == "http":
        return output["parameters"], output["shape"], "data" in output
    params = {k: getattr(v, v.WhichOneof("parameter_choice")) for k, v in output.parameters.items()}
    return params, list(output.shape), False


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_score_round_trip_through_shared_memory(shm_server, regions, protocol):
    c = client(protocol, shm_server)
    data, size = serialized(TEXTS)
    offset = 24  # the input starts inside the region, not at its start
    name_in, key_in, handle_in = regions(offset + size)
    shm.set_shared_memory_region(handle_in, [data], offset=offset)
    out_size = len(TEXTS) * 2 * 4
    name_out, key_out, handle_out = regions(out_size + 16)
    c.register_system_shared_memory(name_in, key_in, offset + size)
    c.register_system_shared_memory(name_out, key_out, out_size, offset=16)  # a region inside its object
    assert status(c, protocol) == {name_in: (key_in, 0, offset + size), name_out: (key_out, 16, out_size)}
    assert status(c, protocol, name_out) == {name_out: (key_out, 16, out_size)}

    text = mod(protocol).InferInput("TEXT", [len(TEXTS)], "BYTES")
    text.set_shared_memory(name_in, size, offset=offset)
    scores = mod(protocol).InferRequestedOutput("SCORES")
    scores.set_shared_memory(name_out, out_size)
    result = c.infer("fscore", [text], outputs=[scores], request_id="s1")

    params, shape, has_data = output_parameters(result, "SCORES", protocol)
    assert params == {"shared_memory_region": name_out, "shared_memory_byte_size": out_size, "shared_memory_offset": 0}
    assert shape == [3, 2] and not has_data
    got = shm.get_contents_as_numpy(handle_out, np.float32, shape, offset=16)
    np.testing.assert_array_equal(got, FakeEngine(SCORE_SPEC).score(TEXTS).scores)
    if protocol == "grpc":  # one raw entry per output, empty for one in shared memory (as Triton answers)
        assert list(result.get_response().raw_output_contents) == [b""]

    c.unregister_system_shared_memory(name_in)
    assert status(c, protocol) == {name_out: (key_out, 16, out_size)}
    c.unregister_system_shared_memory()
    assert status(c, protocol) == {}
    c.unregister_system_shared_memory(name_in)  # unknown by now: nothing to do, as Triton's


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_beam_bytes_output_and_inline_outputs_beside_it(shm_server, regions, protocol):
    """TEXT_OUT (BYTES) goes to shared memory; TOKEN_IDS in the same answer comes back as usual."""
    c = client(protocol, shm_server)
    data, size = serialized(["a prompt"])
    name_in, key_in, handle_in = regions(size)
    shm.set_shared_memory_region(handle_in, [data])
    name_out, key_out, handle_out = regions(1024)
    c.register_system_shared_memory(name_in, key_in, size)
    c.register_system_shared_memory(name_out, key_out, 1024)
    try:
        text = mod(protocol).InferInput("TEXT", [1], "BYTES")
        text.set_shared_memory(name_in, size)
        text_out = mod(protocol).InferRequestedOutput("TEXT_OUT")
        text_out.set_shared_memory(name_out, 1024)
        result = c.infer("fbeam", [text], outputs=[mod(protocol).InferRequestedOutput("TOKEN_IDS"), text_out])
        expected = FakeEngine(BEAM_SPEC).beam("a prompt")
        np.testing.assert_array_equal(result.as_numpy("TOKEN_IDS"), expected.token_ids)
        params, shape, _ = output_parameters(result, "TEXT_OUT", protocol)
        written = sum(4 + len(t.encode()) for t in expected.texts)
        assert params["shared_memory_byte_size"] == written and shape == [3]
        got = shm.get_contents_as_numpy(handle_out, np.object_, shape)
        assert [t.decode() for t in got] == expected.texts
    finally:
        c.unregister_system_shared_memory()


def _error(call) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as err:
        call()
    return err.value


def test_a_symbolic_link_is_not_followed(shm_server, tmp_path):
    """A link in /dev/shm to another file: registering it must not map that file."""
    target = tmp_path / "not-shared"
    target.write_bytes(b"\0" * 64)
    link = Path("/dev/shm") / f"boundgen-link-{uuid.uuid4().hex[:12]}"
    link.symlink_to(target)
    try:
        err = _error(lambda: thttp.InferenceServerClient(shm_server.http_url).register_system_shared_memory(
            "linked", f"/{link.name}", 64))
        assert err.status() == "400" and f"cannot open shared memory object '/{link.name}'" in err.message()
    finally:
        link.unlink()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_errors_name_the_region_and_the_problem(shm_server, regions, protocol):
    c = client(protocol, shm_server)
    bad = "400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT"
    data, size = serialized(TEXTS)
    name, key, handle = regions(size)
    shm.set_shared_memory_region(handle, [data])
    c.register_system_shared_memory(name, key, size)
    try:
        def infer(region=name, byte_size=size, offset=0, out=None):
            text = mod(protocol).InferInput("TEXT", [len(TEXTS)], "BYTES")
            text.set_shared_memory(region, byte_size, offset=offset)
            outputs = None
            if out is not None:
                outputs = [mod(protocol).InferRequestedOutput("SCORES")]
                outputs[0].set_shared_memory(*out)
            return c.infer("fscore", [text], outputs=outputs)

        for message, call in {
            "unknown shared memory region 'nope'": lambda: infer(region="nope"),
            "runs past the end of region": lambda: infer(offset=8),
        }.items():
            err = _error(call)
            assert err.status() == bad and message in err.message(), (message, err.message())
        # A slice shorter than the serialized texts: the length prefixes run past it.
        err = _error(lambda: infer(byte_size=size - 1))
        assert err.status() == bad and f"shared memory region '{name}'" in err.message()
        # An output slice too small for SCORES (3 x 2 FP32 = 24 bytes): answered 400, not written.
        err = _error(lambda: infer(out=(name, 8)))
        assert err.status() == bad and "output SCORES is 24 bytes" in err.message()
        assert shm.get_contents_as_numpy(handle, np.object_, [3])[0] == TEXTS[0].encode()

        for message, call in {
            "already registered": lambda: c.register_system_shared_memory(name, key, size),
            "cannot open shared memory object '/boundgen-no-such-object'":
                lambda: c.register_system_shared_memory("other", "/boundgen-no-such-object", 16),
            "runs past the end of object": lambda: c.register_system_shared_memory("other", key, size + 1),
            "not a shared memory object's name": lambda: c.register_system_shared_memory("other", "/../etc", 16),
            "unknown shared memory region 'nope'": lambda: status(c, protocol, "nope"),
        }.items():
            err = _error(call)
            assert err.status() == bad and message in err.message(), (message, err.message())
        assert list(status(c, protocol)) == [name]
    finally:
        c.unregister_system_shared_memory()


def test_http_errors_are_json_bodies(shm_server):
    code, body = post_json(shm_server, "/v2/systemsharedmemory/region/x/register", {"key": 7})
    assert code == 400 and "key must be a shared memory object's name" in body["error"]
    code, body = post_json(shm_server, "/v2/models/fscore/infer", {"inputs": [
        {"name": "TEXT", "datatype": "BYTES", "shape": [1], "data": ["x"],
         "parameters": {"shared_memory_region": "x", "shared_memory_byte_size": 4}}]})
    assert code == 400 and "input TEXT has shared_memory_region and also data" in body["error"]
    code, body = post_json(shm_server, "/v2/models/fscore/infer", {"inputs": [
        {"name": "TEXT", "datatype": "BYTES", "shape": [1], "parameters": {"shared_memory_region": "x"}}]})
    assert code == 400 and "needs shared_memory_byte_size" in body["error"]


def test_a_key_no_file_can_be_named_is_400(shm_server):
    """A lone surrogate (JSON's \\ud800) cannot be a file name: 400, not a 500 from encoding it."""
    for key in ("/boundgen-\ud800", "/boundgen-\udc80"):
        code, body = post_json(shm_server, "/v2/systemsharedmemory/region/x/register",
                               {"key": key, "offset": 0, "byte_size": 8})
        assert code == 400 and "not a shared memory object's name" in body["error"], body


def test_regions_a_user_may_hold_are_bounded(regions, monkeypatch):
    """Each region holds an open descriptor: one user's MAX_REGIONS_PER_USER-th is refused (a client
    registering in a loop ran the server out of descriptors and its listeners failed, for good)."""
    import os

    from boundgen.errors import InvalidInput
    from boundgen.server.kserve import shared_memory

    monkeypatch.setattr(shared_memory, "MAX_REGIONS_PER_USER", 3)
    monkeypatch.setattr(shared_memory, "MAX_REGIONS", 5)
    _, key, _ = regions(64)
    memory, me = shared_memory.SharedMemory(allowed=True), os.getuid()
    for i in range(3):
        memory.register(f"r{i}", key, 0, 8, user=me)
    with pytest.raises(InvalidInput, match="holds 3 regions, the most one user may .3.; unregister some first"):
        memory.register("r3", key, 0, 8, user=me)
    memory.unregister("r0", user=me)
    memory.register("r3", key, 0, 8, user=me)  # room again
    others = me + 1  # another user's regions count towards the server's bound
    memory.unregister("r3", user=me)
    memory.regions.update({(others, f"o{i}"): memory.regions[me, "r1"] for i in range(3)})  # 2 + 3 = 5
    with pytest.raises(InvalidInput, match="the server holds 5 regions, its most; unregister some first"):
        memory.register("r3", key, 0, 8, user=me)
    memory.close()


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_refused_without_allow_client_shm(fake_server, regions, protocol):
    c = client(protocol, fake_server)
    unsupported = "501" if protocol == "http" else "StatusCode.UNIMPLEMENTED"
    name, key, _ = regions(64)
    assert status(c, protocol) == {}  # status answers, with no region (as Triton's)
    for call in (lambda: c.register_system_shared_memory(name, key, 64),
                 lambda: c.unregister_system_shared_memory(name), lambda: c.unregister_system_shared_memory()):
        err = _error(call)
        assert err.status() == unsupported and "--allow-client-shm" in err.message()
    text = mod(protocol).InferInput("TEXT", [1], "BYTES")
    text.set_shared_memory(name, 64)
    err = _error(lambda: c.infer("fscore", [text]))
    assert err.status() == ("400" if protocol == "http" else "StatusCode.INVALID_ARGUMENT")
    assert "--allow-client-shm" in err.message()
    metadata = c.get_server_metadata() if protocol == "http" else c.get_server_metadata(as_json=True)
    assert "system_shared_memory" not in metadata["extensions"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_cuda_shared_memory_has_no_regions_and_refuses_to_register(shm_server, protocol):
    c = client(protocol, shm_server)
    if protocol == "http":
        assert c.get_cuda_shared_memory_status() == []
        call = lambda: c.register_cuda_shared_memory("gpu0", base64.b64encode(b"\0" * 64).decode(), 0, 64)
    else:
        assert c.get_cuda_shared_memory_status(as_json=True).get("regions", {}) == {}
        call = lambda: c.register_cuda_shared_memory("gpu0", b"\0" * 64, 0, 64)
    err = _error(call)
    assert err.status() == ("501" if protocol == "http" else "StatusCode.UNIMPLEMENTED")
    assert "does not support CUDA shared memory" in err.message() and "CPU" in err.message()
    c.unregister_cuda_shared_memory()
    metadata = c.get_server_metadata() if protocol == "http" else c.get_server_metadata(as_json=True)
    assert "system_shared_memory" in metadata["extensions"]


def test_cuda_refusal_is_a_json_body(shm_server):
    code, body = post_json(shm_server, "/v2/cudasharedmemory/region/gpu0/register",
                           {"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 64})
    assert code == 501 and "CUDA shared memory" in body["error"]
    with NO_PROXY.open(f"http://{shm_server.http_url}/v2/cudasharedmemory/status", timeout=10) as r:
        assert json.loads(r.read()) == []


def test_not_with_ray(fake_dirs):
    """Ray's proxy spreads calls over replicas: a region registered on one would be unknown to the others."""
    proc = subprocess.run([sys.executable, "-m", "tests.server.fake_serve", str(fake_dirs["score"]),
                           "--allow-client-shm", "--ray"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--allow-client-shm cannot be combined with --ray" in proc.stderr, proc.stderr

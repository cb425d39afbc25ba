"""`boundgen serve --frontends N`: front-end processes around one engine process
(server/deploy/). Outputs equal the in-process engine's over both protocols; errors keep their
codes across the link; a front end that dies is restarted; the engine process dying takes the
front ends with it; SIGTERM drains to exit 0. A constrained beam model with its catalogue
(the session's constrained artifact) answers ALLOW_ITEMS / allow_items and ITEM_IDS / item_id
through two front ends as the same model in one process, its refusals in the same words."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

import boundgen
from boundgen.errors import InvalidInput
from boundgen.server.deploy.frontends import MAX_FAILED_STARTS
from tests.server import test_constrained_serving as constrained
from tests.server.conftest import SCORE_SPEC, post_json
from tests.server.fake_engine import write_fake_artifact
from tests.server.real import eager_engine_from_config, write_eager_artifact
from tests.server.test_real_engine import PROMPT, TEXTS, eager_models, infer  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow


def children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    return [int(p) for p in out.split()]


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"{what} did not happen within {timeout_s} s")


@pytest.fixture(scope="module")
def frontends_server(launch, eager_models):
    server = launch([eager_models["score"], eager_models["beam"]], args=["--frontends", "2"])
    yield server
    if server.proc.poll() is None:
        assert server.stop() == 0


@pytest.fixture(scope="module")
def engines(eager_models):
    return {task: eager_engine_from_config(json.loads((d / "eager.json").read_text()))
            for task, d in eager_models.items()}


def test_two_front_end_processes_serve(frontends_server):
    assert "frontends=2" in "".join(frontends_server.output)
    assert len(children(frontends_server.proc.pid)) == 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_outputs_equal_in_process_engine(frontends_server, engines, protocol):
    for _ in range(4):  # new connections land on either front end
        got = infer(protocol, frontends_server, "escore", TEXTS).as_numpy("SCORES")
        np.testing.assert_allclose(got, engines["score"].score(TEXTS).scores, rtol=1e-5, atol=1e-7)
    expected = engines["beam"].beam(PROMPT)
    answer = infer(protocol, frontends_server, "ebeam", [PROMPT])
    np.testing.assert_array_equal(answer.as_numpy("TOKEN_IDS"), expected.token_ids)
    np.testing.assert_allclose(answer.as_numpy("SCORES"), expected.scores, rtol=1e-5, atol=1e-6)
    assert [t.decode() for t in answer.as_numpy("TEXT_OUT")] == expected.texts


def test_errors_keep_their_codes(frontends_server):
    client = thttp.InferenceServerClient(frontends_server.http_url)
    t = thttp.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([("word " * 200).encode()], dtype=object))
    with pytest.raises(InferenceServerException, match="32") as err:  # over max_tokens_per_sample (32)
        client.infer("escore", [t])
    assert "400" in str(err.value.status()) or err.value.status() is None
    g = tgrpc.InferenceServerClient(frontends_server.grpc_url)
    t = tgrpc.InferInput("TEXT", [1], "BYTES")
    t.set_data_from_numpy(np.array([b"hello"], dtype=object))
    with pytest.raises(InferenceServerException) as err:  # 1 us: past before anything runs
        g.infer("escore", [t], timeout=1)
    assert err.value.status() == "StatusCode.DEADLINE_EXCEEDED", err.value


def test_a_front_end_killed_while_serve_starts_is_started_again(launch, eager_models, engines):
    """SIGKILL (the OOM killer, an operator) to a front end before serve is ready: it is started again and serve
    becomes ready and serves, where it stopped with exit 2 blaming an error that was not there."""
    server = launch([eager_models["score"]], args=["--frontends", "2"], wait_ready=False)
    victim = wait_for(lambda: children(server.proc.pid), 10, "a front end")[0]
    os.kill(victim, signal.SIGKILL)
    server.wait_ready(60)
    assert "was killed by SIGKILL while starting; starting it again" in "".join(server.output)
    got = infer("http", server, "escore", TEXTS).as_numpy("SCORES")
    np.testing.assert_allclose(got, engines["score"].score(TEXTS).scores, rtol=1e-5, atol=1e-7)
    assert server.stop() == 0


def test_log_settings_are_read_but_not_changed_while_front_ends_run(frontends_server):
    """A change would reach the one front end a connection lands on, and the engine process none:
    refused (501, saying why); the settings still read, and a request that changes nothing passes."""
    client = thttp.InferenceServerClient(frontends_server.http_url)
    assert client.get_log_settings()["log_format"] == "text"
    assert client.update_log_settings({"log_format": "text"})["log_format"] == "text"
    with pytest.raises(InferenceServerException, match="--log-format when starting serve") as err:
        client.update_log_settings({"log_format": "json"})
    assert "501" in str(err.value.status())
    for _ in range(4):  # on every front end
        assert thttp.InferenceServerClient(frontends_server.http_url).get_log_settings()["log_format"] == "text"


def test_a_dead_front_end_is_restarted(frontends_server, engines):
    victim = children(frontends_server.proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: "restarting" in "".join(frontends_server.output), 10, "a restart line")
    wait_for(lambda: len([p for p in children(frontends_server.proc.pid) if p != victim]) == 2, 20,
             "two live front ends")
    assert_serves_after_restart(frontends_server, engines)


def test_a_restarted_front_end_listens_once_it_can_answer(frontends_server):
    """While a restarted front end loads its tokenizers (~0.5 s a model) the other serves; it takes its share
    of new connections only once it can answer them: no request of a stream of new connections gets 503."""
    body = {"inputs": [{"name": "TEXT", "shape": [1], "datatype": "BYTES", "data": ["hello"]}]}
    def listened() -> int:
        return "".join(frontends_server.output).count("] boundgen serve: listening")

    before = listened()
    victim = children(frontends_server.proc.pid)[0]
    os.kill(victim, signal.SIGKILL)
    statuses, until, give_up = [], None, time.monotonic() + 60
    while until is None or time.monotonic() < until:
        try:
            statuses.append(post_json(frontends_server, "/v2/models/escore/infer", body)[0])
        except OSError:  # a connection the killed process had accepted, reset with it
            statuses.append("reset")
        if until is None and listened() > before:
            until = time.monotonic() + 2.0  # the new one listens: new connections reach both
        assert time.monotonic() < give_up, "the killed front end did not listen again within 60 s"
    assert 503 not in statuses, f"{statuses.count(503)} of {len(statuses)} requests got 503 during the restart"
    assert statuses[-20:] == [200] * 20


def assert_serves_after_restart(server, engines) -> None:
    """Six requests answered right, once the restarted front end is ready (within seconds; meanwhile the
    other serves, and a request that reaches the new one before it is ready gets 503)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            got = [infer("http", server, "escore", TEXTS).as_numpy("SCORES") for _ in range(6)]
            break
        except InferenceServerException:
            time.sleep(0.2)
    for scores in got:
        np.testing.assert_allclose(scores, engines["score"].score(TEXTS).scores, rtol=1e-5, atol=1e-7)


def test_a_stopped_front_end_is_killed_and_restarted(launch, eager_models, engines):
    """A front end whose event loop stops (SIGSTOP here; a stuck loop alike) would keep its share of new
    connections (SO_REUSEPORT) and answer none: it answers no ping, so it is killed and restarted."""
    server = launch([eager_models["score"]], args=["--frontends", "2", "--frontend-hang-s", "3"])
    try:
        # Ready to a client once one front end is; the watch starts when the engine process says all are.
        wait_for(lambda: "boundgen serve: ready" in "".join(server.output), 30, "every front end ready")
        victim = next(p for p in children(server.proc.pid) if "deploy.frontend" in _cmdline(p))
        os.kill(victim, signal.SIGSTOP)
        try:
            wait_for(lambda: "answered no ping" in "".join(server.output), 15, "the stopped front end's kill")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; the server said:\n{''.join(server.output)}") from None
        wait_for(lambda: _zombie(victim), 10, "the stopped front end's exit")
        wait_for(lambda: "restarting" in "".join(server.output), 10, "a restart line")
        wait_for(lambda: len([p for p in children(server.proc.pid) if not _zombie(p)]) == 2, 20,
                 "two live front ends")
        assert_serves_after_restart(server, engines)
        assert "answered no ping" not in "".join(server.output).split("restarting", 1)[1]  # the new one is not
    finally:
        if server.proc.poll() is None:
            assert server.stop() == 0


def test_a_front_end_that_cannot_start_stops_serve(launch, eager_models, tiny_qwen3_dir, tmp_path):
    """Its model's files gone (the tokenizer a front end reads at start), a front end that exits is restarted,
    fails before it is ready, and again: after MAX_FAILED_STARTS such starts in a row serve says why and
    stops, exit 1, draining the front end that still serves, instead of restarting the other for ever."""
    checkpoint = shutil.copytree(tiny_qwen3_dir, tmp_path / "checkpoint")
    spec = json.loads((eager_models["score"] / "eager.json").read_text())["spec"]
    server = launch([write_eager_artifact(tmp_path / "gone", checkpoint, spec, "gone")], args=["--frontends", "2"])
    wait_for(lambda: "boundgen serve: ready" in "".join(server.output), 30, "every front end ready")
    shutil.rmtree(checkpoint)
    os.kill(next(p for p in children(server.proc.pid) if "deploy.frontend" in _cmdline(p)), signal.SIGKILL)
    try:
        code = server.proc.wait(120)
    except subprocess.TimeoutExpired:
        raise AssertionError("serve kept restarting a front end that cannot start:\n" + "".join(server.output))
    said = "".join(server.output)
    assert code == 1, said
    assert f"failed {MAX_FAILED_STARTS} starts in a row" in said, said
    assert "has no tokenizer.json" in said and "Traceback" not in said, said  # each failed start: one line
    assert said.count("restarting it in") == MAX_FAILED_STARTS  # the killed one, then four failed starts


def test_sigterm_says_which_front_end_did_not_drain(launch, eager_models):
    """A stopped front end (the watch off here) does not drain: killed after the drain timeout plus 5 s, and
    serve says which, and that the requests it held went with it."""
    server = launch([eager_models["score"]], args=["--frontends", "2", "--frontend-hang-s", "0",
                                                   "--drain-timeout-s", "1"])
    wait_for(lambda: "boundgen serve: ready" in "".join(server.output), 30, "every front end ready")
    os.kill(next(p for p in children(server.proc.pid) if "deploy.frontend" in _cmdline(p)), signal.SIGSTOP)
    assert server.stop() == 0
    assert "had not drained 6 s after SIGTERM (stopped or stuck); killed it" in "".join(server.output)


def test_a_front_end_that_dies_while_draining_fails_the_stop(launch, eager_models):
    """A front end killed while it drains (here SIGKILL from outside, as the OOM killer would) may take
    requests with it: serve names it and exits 1 (before, its exit code was not looked at: exit 0)."""
    server = launch([eager_models["score"]], args=["--frontends", "2", "--frontend-hang-s", "0",
                                                   "--drain-timeout-s", "20"])
    wait_for(lambda: "boundgen serve: ready" in "".join(server.output), 30, "every front end ready")
    stopped = next(p for p in children(server.proc.pid) if "deploy.frontend" in _cmdline(p))
    os.kill(stopped, signal.SIGSTOP)  # so that it is still draining when it is killed
    server.proc.send_signal(signal.SIGTERM)
    wait_for(lambda: "boundgen serve: draining" in "".join(server.output), 30, "the drain")
    os.kill(stopped, signal.SIGKILL)
    assert server.stop() == 1
    said = "".join(server.output)
    assert f"(pid {stopped}) was killed by SIGKILL while draining" in said, said
    assert "had not drained" not in said, said


def test_sigterm_while_a_model_loads_exits_at_once(launch, tmp_path):
    """A SIGTERM while the engine process loads or warms up a model exits 0 at once, as one process does
    (before, the load ran on its main thread, and the stop waited for the load and its warm-up: here a
    warm-up that never ends, so it hung)."""
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC, gate=tmp_path / "never")],
                    args=["--frontends", "2"], wait_ready=False)
    wait_for(lambda: "boundgen serve: loading" in "".join(server.output), 30, "the load")
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(10) == 0


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_sigterm_drains_every_process(launch, eager_models, stop):
    """SIGTERM, and SIGHUP (a closed terminal: it killed serve undrained, its socket folder left behind)."""
    server = launch([eager_models["score"]], args=["--frontends", "2"])
    front = children(server.proc.pid)
    server.proc.send_signal(stop)
    assert server.proc.wait(60) == 0
    for pid in front:
        wait_for(lambda pid=pid: not os.path.exists(f"/proc/{pid}") or _zombie(pid), 10, f"front end {pid} exit")


def test_engine_process_death_stops_the_front_ends(launch, eager_models):
    server = launch([eager_models["score"]], args=["--frontends", "2"])
    front = children(server.proc.pid)
    server.proc.kill()
    server.proc.wait()
    for pid in front:
        wait_for(lambda pid=pid: not os.path.exists(f"/proc/{pid}") or _zombie(pid), 10, f"front end {pid} exit")


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"
    except OSError:
        return True


def test_single_process_features_refuse_several_front_ends(eager_models, tmp_path):
    from tests.server.conftest import FAKE_SERVE, REPO

    done = subprocess.run([*FAKE_SERVE, str(eager_models["score"]), "--frontends", "2", "--allow-client-shm",
                           "--http-port", "0", "--grpc-port", "0"], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "--frontends 2 cannot be combined with --allow-client-shm" in done.stderr


def test_answers_carry_the_server_timings_when_asked(frontends_server):
    """The bench's gRPC target asks for the server's stage timings (boundgen_timings): each stage,
    the link to the engine process, and the whole handling come back; a plain client gets none."""
    from boundgen.bench.grpc_client import GrpcTarget
    from boundgen.bench.workloads import Request

    target = GrpcTarget(frontends_server.grpc_url, "escore", "score")
    answered = []
    parse = target.parse
    target.parse = lambda response: parse(answered.append(response) or response)
    try:
        timings = target(Request(0, tuple(TEXTS), (0,) * len(TEXTS))).timings
    finally:
        target.close()
    assert {"pre", "queue", "model", "post", "link", "handler", "batch_requests", "input_tokens"} <= set(timings)
    assert timings["batch_requests"] == 1
    # counts travel as counts (timing_input_tokens_ms was once the count x 1000)
    wire = answered[0].parameters["timing_input_tokens_ms"].double_param
    assert wire == timings["input_tokens"] and len(TEXTS) <= wire <= sum(len(t) for t in TEXTS)
    assert 0 < timings["model"] < timings["handler"]
    answer = infer("grpc", frontends_server, "escore", TEXTS).get_response()
    assert not any(key.startswith("timing_") for key in answer.parameters)


def test_token_ids_travel_through_a_front_end(frontends_server, engines):
    """/v1/score's token-id form runs through a front end's LinkedEngine as in process."""

    ids = [[9707, 1879, 25], [23, 7, 1052, 11]]
    labels = list(engines["score"].spec.program.label_token_ids)
    status, answer = post_json(frontends_server, "/v1/score", {"query": [40], "items": ids,
                                                               "label_token_ids": labels, "apply_softmax": True})
    assert status == 200, answer
    expected = engines["score"].score_ids([[40] + i for i in ids]).scores
    np.testing.assert_allclose(answer["scores"], expected / expected.sum(axis=1, keepdims=True), rtol=1e-5)


# ---- a constrained beam model: the catalogue in the engine process, allow-lists over the link ----

@pytest.fixture(scope="module")
def constrained_server(launch, constrained_build):
    server = launch([constrained_build["artifact"]], command=constrained.SERVE,
                    args=["--catalogue", f"cbeam={constrained_build['catalogue']}", "--frontends", "2",
                          *constrained.SLOW_CPU])
    yield server
    if server.proc.poll() is None:
        assert server.stop() == 0


@pytest.fixture(scope="module")
def constrained_engine(constrained_build):
    """The same model and catalogue in this process: what one process answers."""
    return boundgen.load(constrained_build["artifact"], catalogue=constrained_build["catalogue"])


def test_a_catalogue_is_served_through_front_end_processes(constrained_server):
    assert "frontends=2" in "".join(constrained_server.output)
    assert len(children(constrained_server.proc.pid)) == 2


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_constrained_outputs_equal_one_process(constrained_server, constrained_engine, protocol):
    for allow in (None, [11, 16], [17], [14, 12, 14]):
        expected = constrained_engine.beam(constrained.PROMPT, allow_items=allow)
        for _ in range(2):  # new connections land on either front end
            result = constrained.infer(protocol, constrained_server, allow)
            assert result.as_numpy("ITEM_IDS").dtype == np.int64
            np.testing.assert_array_equal(result.as_numpy("ITEM_IDS"), expected.item_ids)
            np.testing.assert_array_equal(result.as_numpy("TOKEN_IDS"), expected.token_ids)
            np.testing.assert_allclose(result.as_numpy("SCORES"), expected.scores, rtol=1e-5, atol=1e-6)
            assert [t.decode() for t in result.as_numpy("TEXT_OUT")] == expected.texts
    assert set(expected.item_ids.tolist()) <= {12, 14, -1}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_named_subsets_through_front_ends_equal_one_process(constrained_server, constrained_engine, protocol):
    for allow, subset in ((None, "shoes"), ([12, 13, 17], "sale")):
        expected = constrained_engine.beam(constrained.PROMPT, allow_items=allow, allow_subset=subset)
        constrained.assert_same_result(constrained.infer(protocol, constrained_server, allow, subset), expected)
    with pytest.raises(InferenceServerException) as err:
        constrained.infer(protocol, constrained_server, None, "hats")
    assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert err.value.message() == one_process_refusal(constrained_engine, None, "hats")


def one_process_refusal(engine, allow, subset=None) -> str:
    with pytest.raises(InvalidInput) as refused:
        engine.beam(constrained.PROMPT, allow_items=allow, allow_subset=subset)
    return str(refused.value)


BAD_ALLOW_LISTS = {"unknown": [11, 99], "longer-than-the-catalogue": [11] * 9}  # its 8 items


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("bad", BAD_ALLOW_LISTS)
def test_constrained_refusals_are_one_process_words(constrained_server, constrained_engine, protocol, bad):
    allow = BAD_ALLOW_LISTS[bad]
    with pytest.raises(InferenceServerException) as err:
        constrained.infer(protocol, constrained_server, allow)
    assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert err.value.message() == one_process_refusal(constrained_engine, allow)


def test_v1_beam_allow_items_and_item_ids_through_front_ends(constrained_server, constrained_engine):
    for allow in (None, [11, 16]):
        body = {"prompt": constrained.PROMPT, **({"allow_items": allow} if allow else {})}
        status, answer = post_json(constrained_server, "/v1/beam", body)
        assert status == 200, answer
        want = constrained_engine.beam(constrained.PROMPT, allow_items=allow).candidates()
        assert [(c["token_ids"], c["text"], c["item_id"]) for c in answer["candidates"]] == \
            [(c["token_ids"], c["text"], c["item_id"]) for c in want]
        np.testing.assert_allclose([c["score"] if c["score"] is not None else -np.inf for c in answer["candidates"]],
                                   [c["score"] if c["score"] is not None else -np.inf for c in want], rtol=1e-5)
    status, answer = post_json(constrained_server, "/v1/beam", {"prompt": constrained.PROMPT, "allow_items": [99]})
    assert status == 400 and answer["error"] == one_process_refusal(constrained_engine, [99]), answer

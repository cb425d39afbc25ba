"""ModelStreamInfer through unmodified tritonclient (start_stream / async_stream_infer /
stop_stream): answers in request order, equal to ModelInfer's; failed requests are answers with
an error message, never the end of the stream; the stream's requests go through the same
admission (queue full, deadline, cancel)."""

from __future__ import annotations

import queue
import uuid

import numpy as np
import tritonclient.grpc as tgrpc

from tests.server.conftest import BEAM_SPEC, INFLIGHT, QUEUED, SCORE_SPEC, metric, wait_metric
from tests.server.fake_engine import FakeEngine, read_log
from tests.server.test_endpoints import text_input


class Stream:
    """A tritonclient stream whose callback's (result, error) pairs arrive on a queue."""

    def __init__(self, server, **kwargs):
        self.client = tgrpc.InferenceServerClient(server.grpc_url)
        self.answers: queue.Queue = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.answers.put((result, error)), **kwargs)

    def send(self, model, texts, request_id, **kwargs):
        self.client.async_stream_infer(model, [text_input("grpc", texts)], request_id=request_id, **kwargs)

    def next(self, timeout_s: float = 30.0):
        return self.answers.get(timeout=timeout_s)

    def stop(self, cancel_requests: bool = False):
        self.client.stop_stream(cancel_requests=cancel_requests)
        self.client.close()


def test_answers_in_request_order_with_errors_in_place(fake_server):
    stream = Stream(fake_server)
    texts = ["slow one sleep=0.3", "fast two"]
    stream.send("fscore", texts[:1], "a")  # still running when "b" is done: "b" waits its turn
    stream.send("fscore", texts[1:], "b")
    stream.send("fscore", [], "c")  # an empty batch: 400 for ModelInfer
    stream.send("nope", ["x"], "d")  # an unknown model
    stream.send("fbeam", ["a prompt"], "e")
    answers = [stream.next() for _ in range(5)]
    stream.stop()

    ids = [result.get_response().id if error is None else None for result, error in answers]
    assert ids == ["a", "b", None, None, "e"]
    for (result, error), text in zip(answers[:2], texts):
        assert error is None
        np.testing.assert_array_equal(result.as_numpy("SCORES"), FakeEngine(SCORE_SPEC).score([text]).scores)
    assert "empty" in answers[2][1].message()
    assert "unknown model 'nope'" in answers[3][1].message()
    beam = FakeEngine(BEAM_SPEC).beam("a prompt")
    np.testing.assert_array_equal(answers[4][0].as_numpy("TOKEN_IDS"), beam.token_ids)
    assert [t.decode() for t in answers[4][0].as_numpy("TEXT_OUT")] == beam.texts


def test_a_deadline_applies_per_request(fake_server):
    stream = Stream(fake_server)
    stream.send("fscore", ["late sleep=0.3"], "late", timeout=50_000)  # microseconds, as ModelInfer's
    stream.send("fscore", ["on time"], "ok")
    (late, late_error), (ok, ok_error) = stream.next(), stream.next()
    stream.stop()
    assert late is None and "deadline" in late_error.message()
    assert ok_error is None and ok.get_response().id == "ok"


def test_an_answer_held_behind_a_slower_one_is_not_sent_after_its_deadline(fake_server):
    """Answers go out in request order: a fast request with a 100 ms timeout behind a 1 s one was
    answered OK ~900 ms after its deadline; it gets its deadline error now, in its place."""
    late = 'boundgen_requests_total{model="fscore",outcome="deadline_exceeded",protocol="grpc"}'
    before = metric(fake_server, late)
    stream = Stream(fake_server)
    stream.send("fscore", ["slow sleep=0.6"], "slow")
    stream.send("fscore", ["fast"], "fast", timeout=100_000)
    (slow, slow_error), (fast, fast_error) = stream.next(), stream.next()
    stream.stop()
    assert slow_error is None and slow.get_response().id == "slow"
    assert fast is None and "deadline" in fast_error.message(), fast_error
    assert metric(fake_server, late) == before + 1


REJECTED = 'boundgen_requests_total{model="fscore",outcome="rejected",protocol="grpc"}'


def _hold_and_queue(server, queued_text: str):
    """A stream whose first request holds the one slot (until `release` is touched) and whose
    second waits in the one queue place: (stream, release)."""
    release = server.root / f"release-{uuid.uuid4().hex}"
    stream = Stream(server)
    stream.send("fscore", [f"hold={release}"], "running")
    wait_metric(server, INFLIGHT, 1)
    stream.send("fscore", [queued_text], "queued")
    wait_metric(server, QUEUED, 1)
    return stream, release


def test_same_admission_as_model_infer(one_slot):
    """One slot and one queue place: the third request of a stream is refused as ModelInfer's would be."""
    stream, release = _hold_and_queue(one_slot, "queued")
    refusals = metric(one_slot, REJECTED)
    stream.send("fscore", ["refused"], "refused")
    wait_metric(one_slot, REJECTED, refusals + 1)  # refused while the slot is held, not after its release
    release.touch()
    answers = [stream.next() for _ in range(3)]
    stream.stop()
    assert [a[0].get_response().id for a in answers[:2]] == ["running", "queued"]
    assert answers[2][0] is None and "at capacity" in answers[2][1].message()
    assert not any("refused" in call["texts"] for call in read_log(one_slot.log))


def test_cancelling_the_stream_frees_its_queue_place(one_slot):
    stream, release = _hold_and_queue(one_slot, "never runs")
    stream.stop(cancel_requests=True)
    wait_metric(one_slot, QUEUED, 0)  # left the queue at once, while the first still runs
    release.touch()
    wait_metric(one_slot, INFLIGHT, 0)
    assert not any("never runs" in call["texts"] for call in read_log(one_slot.log))


def test_a_stream_that_is_never_read_holds_at_most_its_window(launch, tmp_path):
    """A client that writes requests as fast as it can and reads no answer: once its receive window is
    full, the server stops taking its requests after STREAM_WINDOW more (the client's writes then wait).
    Before, the server read and ran every request and held every answer (memory up ~4 MB/s for ever).
    Cancelling the stream then ends it without a traceback in the log (gRPC logged a failed send)."""
    import threading
    import time

    import grpc

    from boundgen.server.kserve import pb
    from boundgen.server.kserve.grpc_api import STREAM_WINDOW
    from tests.server.fake_engine import write_fake_artifact

    log = tmp_path / "calls.jsonl"
    server = launch([write_fake_artifact(tmp_path / "fscore", SCORE_SPEC, log=log)], args=["--max-queue", "1000"])
    request = pb.ModelInferRequest(model_name="fscore")
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1]).contents.bytes_contents.append(b"hello")
    message, stop = request.SerializeToString(), threading.Event()

    def requests():
        while not stop.is_set():
            yield message

    channel = grpc.insecure_channel(server.grpc_url, options=[("grpc.http2.bdp_probe", 0)])  # a 64 KiB window
    call = channel.stream_stream(f"/{pb.SERVICE}/ModelStreamInfer", request_serializer=lambda b: b,
                                 response_deserializer=lambda b: b)(requests())
    try:
        counts = []
        for _ in range(3):
            time.sleep(2.0)
            counts.append(len(read_log(log)))
        assert counts[0] > STREAM_WINDOW, counts  # it ran until the client's window was full
        assert counts[2] - counts[1] <= 1, counts  # and then stopped taking requests
    finally:
        stop.set()
        call.cancel()
        channel.close()
    assert server.stop() == 0
    said = "".join(server.output)
    assert "Traceback" not in said and "ExecuteBatchError" not in said, said[-2000:]

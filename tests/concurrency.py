"""Calling an engine from several threads at once (batching tests)."""

import threading

import numpy as np


def call_together(fn, inputs: list, timeout: float = 60.0) -> list:
    """fn(x) for every x in `inputs`, each on its own thread, all released at once by a barrier
    (so that they queue together); returns the results in input order."""
    results = [None] * len(inputs)
    errors = []
    barrier = threading.Barrier(len(inputs))

    def call(i):
        barrier.wait()
        try:
            results[i] = fn(inputs[i])
        except BaseException as exc:  # re-raised below, in the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    if errors:
        raise errors[0]
    return results


def assert_batched_beams_equal_single(single, batched, prompts: list, most: int) -> None:
    """Each prompt run on `batched` together with the others gets the candidates `single` gives
    it alone (scores to rounding), and no call held more than `most` requests; closes `batched`."""
    expected = [single.beam(p) for p in prompts]
    results = call_together(batched.beam, prompts)
    batched.close()
    for exp, res in zip(expected, results):
        assert res.token_ids.tolist() == exp.token_ids.tolist() and res.texts == exp.texts
        np.testing.assert_allclose(res.scores, exp.scores, rtol=0, atol=1e-5)
    assert max(r.timings["batch_requests"] for r in results) <= most

"""Calling an engine from several threads at once (batching tests)."""

import threading


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

"""A front end's EngineLink (server/deploy/linked_engine.py): answers whose caller has gone."""

from __future__ import annotations

import asyncio
import gc

from boundgen.server.deploy import link
from boundgen.server.deploy.linked_engine import EngineLink


def test_an_error_for_a_caller_that_is_gone_is_not_logged_as_never_retrieved():
    """An ERROR frame (here a 429) for a request still pending whose caller will never await it (its task
    dropped as the loop stops), and the link closing with another one pending: neither exception may be
    logged as "never retrieved" (under overload a front end logged one such line per refused request)."""
    unretrieved = []

    async def main():
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(lambda loop, context: unretrieved.append(context.get("message", "")))
        engine_link = EngineLink("unused", 0)
        engine_link._changed, engine_link.closed = asyncio.Event(), asyncio.Event()
        engine_link._pending = {7: loop.create_future(), 8: loop.create_future()}
        reader = asyncio.StreamReader()
        body = link.frame({"op": link.ERROR, "id": 7, "kind": "overloaded", "message": "model m is at capacity"})
        reader.feed_data(body)
        reader.feed_eof()  # then the link closes: request 8 fails Unavailable
        await engine_link._read(reader)
        # ._exception, not .exception(), which would mark them seen
        errors = [type(f._exception).__name__ for f in engine_link._pending.values()]
        assert errors == ["Overloaded", "Unavailable"]
        engine_link._pending.clear()
        gc.collect()
        await asyncio.sleep(0)

    asyncio.run(main())
    gc.collect()
    assert not [m for m in unretrieved if "never retrieved" in m], unretrieved

"""One Ray Serve replica of `boundgen serve --ray`: the artifacts loaded once, served by the
same ModelSet, admission and KServe v2 handlers as plain `boundgen serve` (app.py).

    HTTP client -> Ray Serve's HTTP proxy -> Replica.__call__(starlette Request)
                     -> kserve/http_api.HttpFrontend's aiohttp application (routes, API key, JSON errors)
    gRPC client -> Ray Serve's gRPC proxy -> Replica.ModelInfer(request, grpc_context), one method
                     per kserve/grpc_service.METHODS entry -> GrpcFrontend's handler of that method
                 -> ModelSet -> Admission -> engine

Nothing of the protocol is restated here: an HTTP request is handed to the aiohttp application
as aiohttp's own server would hand it (`HttpFrontend.dispatch`), and a gRPC call to GrpcFrontend
with a context that gives it the client's metadata and turns `abort()` into the status Ray's
proxy answers (`_GrpcContext`).

Across the hop: a client that goes away (HTTP disconnect, gRPC cancel or deadline) makes Ray's
proxy cancel the call to the replica, which cancels the handler here like a client of plain
serve: a request waiting in admission or in the engine is not run. The deadline is the
request's `timeout` parameter or --default-timeout-ms, counted from its arrival at the replica
(Ray's proxy does not pass a gRPC client's deadline on; it cancels the call when it passes).

Metrics: each replica keeps boundgen's Prometheus registry (metrics.py) and copies every sample
to a Ray Serve gauge every METRICS_PERIOD_S (`ray.serve.metrics`, which adds the deployment,
replica and application tags), so that one scrape of Ray's metrics port on each node returns
Ray Serve's metrics and boundgen's per replica (named ray_boundgen_*; docs/serving.md).

This module imports ray: only the --ray code path imports it (ray_serve.py), so that plain
`boundgen serve` never loads Ray.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from pathlib import Path
from typing import Sequence

from aiohttp.streams import StreamReader
from aiohttp.test_utils import make_mocked_request
from ray.serve import metrics as ray_metrics
from starlette.requests import Request
from starlette.responses import Response

from boundgen.server import logs
from boundgen.server.app import EngineFactory
from boundgen.server.config import ServerConfig
from boundgen.server.kserve.grpc_api import GrpcFrontend
from boundgen.server.kserve.grpc_service import METHODS
from boundgen.server.kserve.http_api import HttpFrontend
from boundgen.server.metrics import ServerMetrics
from boundgen.server.models import ModelSet

log = logging.getLogger("boundgen.server")
METRICS_PERIOD_S = 5.0
_DROPPED_HEADERS = frozenset({"content-length", "transfer-encoding", "connection"})  # the proxy sets its own


class GrpcAbort(Exception):
    """Raised by `_GrpcContext.abort`: the status is on the Ray gRPC context, which Ray's proxy sends."""


class _NoMessage:
    """The answer of a gRPC call that failed: Ray's proxy sends the status set on the context instead."""

    @staticmethod
    def SerializeToString() -> bytes:
        return b""


class _GrpcContext:
    """What GrpcFrontend's handlers use of a grpc.aio context, over Ray Serve's RayServegRPCContext."""

    def __init__(self, ray_context):
        self._ray = ray_context

    def invocation_metadata(self):
        return self._ray.invocation_metadata()

    def time_remaining(self):
        return None  # Ray's proxy keeps the client's deadline; it cancels the call when it passes

    async def abort(self, code, details: str):
        self._ray.set_code(code)
        self._ray.set_details(details)
        raise GrpcAbort(details)


class _Body:
    """The flow-control side of an aiohttp StreamReader holding a body that arrived whole."""

    _reading_paused = False

    def pause_reading(self) -> None:
        pass

    def resume_reading(self, resume_parser: bool = True) -> None:
        pass


class Replica:
    """The class Ray Serve runs as each replica (ray_serve.deployment wraps it)."""

    def __init__(self, artifact_dirs: Sequence[str], config: ServerConfig, engine_factory: EngineFactory):
        logs.configure(config.log_format, config.log_level)
        self.config = config
        self.metrics = ServerMetrics(on_request=logs.access if config.access_log else None)
        self.models = ModelSet(config, self.metrics)
        for path in artifact_dirs:  # the loader checks the manifest's hashes on this node
            engine = engine_factory(Path(path))
            model = self.models.add(engine, str(path))
            engine.warmup()
            log.info("model %s (%s) loaded and warmed up from %s, max in flight %d, queue %d", engine.spec.name,
                     engine.spec.task, path, model.admission.max_inflight, model.admission.max_queue)
        self.models.set_ready()
        self.http = HttpFrontend(self.models, config)
        self.app = self.http.app()
        self.app.freeze()  # as aiohttp's server does before its first request: routes and middlewares fixed
        self.grpc = GrpcFrontend(self.models, config)
        self._gauges: dict[str, ray_metrics.Gauge] = {}
        self._stop = threading.Event()
        threading.Thread(target=self._mirror_metrics, name="boundgen-metrics", daemon=True).start()

    async def __call__(self, request: Request) -> Response:
        """One HTTP request from Ray Serve's proxy, answered by the KServe v2 HTTP application."""
        body = await request.body()
        path = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        payload = StreamReader(_Body(), max(len(body), 1 << 16), loop=asyncio.get_running_loop())
        payload.feed_data(body)
        payload.feed_eof()
        aio_request = make_mocked_request(request.method, path, headers=list(request.headers.items()), app=self.app,
                                          payload=payload, client_max_size=self.config.max_body_bytes)
        answer = await self.http.dispatch(self.app, aio_request)
        headers = {k: v for k, v in answer.headers.items() if k.lower() not in _DROPPED_HEADERS}
        return Response(content=answer.body or b"", status_code=answer.status, headers=headers)

    async def _grpc_call(self, method: str, request, grpc_context):
        if method == "ModelInfer":
            request = self.grpc.refuse_oversized(request)
        try:
            return await getattr(self.grpc, METHODS[method][0])(request, _GrpcContext(grpc_context))
        except GrpcAbort:  # returned, not raised: Ray would log a raised one as a replica failure
            return _NoMessage()

    def __del__(self):
        """Ray Serve stops a replica once its requests have finished (--drain-timeout-s at most)."""
        self._stop.set()
        self.models.start_draining()
        self.models.close()

    def _mirror_metrics(self) -> None:
        """Copy boundgen's samples to Ray Serve gauges, every METRICS_PERIOD_S (see the docstring)."""
        while not self._stop.wait(METRICS_PERIOD_S):
            try:
                for family in self.metrics.registry.collect():
                    for sample in family.samples:
                        if sample.name.endswith("_created"):  # creation timestamps: not worth a series
                            continue
                        gauge = self._gauges.get(sample.name)
                        if gauge is None:
                            gauge = self._gauges[sample.name] = ray_metrics.Gauge(
                                sample.name, description=family.documentation, tag_keys=tuple(sorted(sample.labels)))
                        gauge.set(sample.value, tags=dict(sample.labels))
            except Exception:  # noqa: BLE001 - metrics must never take a replica down
                log.warning("could not copy boundgen's metrics to Ray", exc_info=True)


def _grpc_method(method: str):
    async def call(self, request, grpc_context):
        return await self._grpc_call(method, request, grpc_context)

    call.__name__ = call.__qualname__ = method
    call.__doc__ = f"gRPC {method} from Ray Serve's gRPC proxy (kserve/grpc_api.GrpcFrontend)."
    return call


for _method in METHODS:  # Ray's gRPC proxy calls the replica's method named as the gRPC method
    setattr(Replica, _method, _grpc_method(_method))

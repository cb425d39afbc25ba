"""KServe v2 over HTTP (aiohttp): the application, its routes, middlewares and handlers.

    GET  /v2/health/live                      200 {"live": true} while the process runs (no API key)
    GET  /v2/health/ready                     200 {"ready": true} once loaded and warmed up, else
                                              503 {"ready": false} (no API key)
    GET  /v2                                  server metadata
    GET  /v2/models/{m}[/versions/1]          model metadata: inputs, outputs, shape bounds
    GET  /v2/models/{m}[/versions/1]/ready    200 ready, 503 not ready, 400 unknown model
    POST /v2/models/{m}[/versions/1]/infer    inference
    GET  /v2/models/{m}[/versions/1]/config   Triton's extensions (triton_extensions.py): model config,
    GET  /v2/models[/{m}[/versions/1]]/stats  statistics, repository index; load / unload: repository.py
    POST /v2/repository/index
    POST /v2/repository/models/{m}/load|unload
    GET|POST /v2[/models/{m}]/trace/setting   trace and log settings (triton_extensions.py)
    GET|POST /v2/logging
    GET  /v2/systemsharedmemory[/region/{r}]/status       shared memory (shared_memory.py): system
    POST /v2/systemsharedmemory/region/{r}/register       regions with --allow-client-shm; CUDA:
    POST /v2/systemsharedmemory[/region/{r}]/unregister   none, register refused
         /v2/cudasharedmemory/...                         likewise
    POST /v1/score, /v1/beam                  JSON routes for score and beam models (score_api.py, beam_api.py)
    POST /v1/rerank, /rerank, /score          the routes reranking clients call, on score models, and
    GET  /v1/models                           OpenAI's model list (rerank_api.py)
    GET  /metrics                             Prometheus text format

Every answer carries the request's id in the header `X-Request-ID` (the client's own when it
sent one, else a new one: request_ids.py), which the access log records too.

Deadlines count from a request's arrival: the time its head was parsed, which the connection's
protocol notes (server/connections.py `head_time`) and the outermost middleware records (`ARRIVED`)
before anything of its body is read, and a success encoded after the
model returned is checked against the deadline once more before it is sent (504 if late).

Inference bodies (the JSON body, the binary tensor extension, shared memory references):
http_messages.py; reading a body within the limits, and errors as `{"error": "..."}` with the
status of status.py: server/http_bodies.py. aiohttp's own answers (404 unknown route, 405 wrong
method, 413) are JSON errors too; protocol-level errors as well (server/connections.py). Every
error is typed exactly `application/json`, which KServe's Python SDK needs to show its message
(`_plain_json_type`).
"""

from __future__ import annotations

import functools
import re
import time

from aiohttp import web

from boundgen.errors import InvalidInput
from boundgen.server import beam_api, json_values, request_ids, rerank_api, score_api
from boundgen.server.auth import check_api_key
from boundgen.server.config import ServerConfig
from boundgen.server.connections import ARRIVED, LimitedRequestHandler, arrived
from boundgen.server.http_bodies import (JSON_WORKER, UNREAD, error_response, loads, read_body, read_json,
                                        read_options)
from boundgen.server.json_worker import JsonWorker
from boundgen.server.logs import LogSettings
from boundgen.server.metrics import CONTENT_TYPE
from boundgen.server.models import DRAINING, ModelSet
from boundgen.server.status import check_deadline, status_of
from boundgen.server.kserve import inference
from boundgen.server.kserve import shared_memory as shm
from boundgen.server.kserve.http_messages import (HEADER_LENGTH, encode_infer_response, parse_infer_body,
                                                  split_infer_body)
from boundgen.server.kserve.local_user import http_user
from boundgen.server.kserve.repository import Repository, control
from boundgen.server.kserve.shared_memory import SharedMemory
from boundgen.server.kserve.triton_extensions import (log_settings, model_config, model_statistics, repository_index,
                                                      trace_settings, update_log_settings)
from boundgen.version import __version__

PUBLIC_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
# Inference routes besides /infer: counted in boundgen_requests_total whatever their end, a 401 too
JSON_INFERENCE_ROUTES = frozenset({score_api.ROUTE, beam_api.ROUTE, *rerank_api.RERANK_ROUTES, rerank_api.PAIRS_ROUTE})
EXTENSIONS = ("binary_tensor_data",)
MODEL_PREFIXES = ("/v2/models/{model}", "/v2/models/{model}/versions/{version}")  # each model route under both
# The /infer routes as patterns, group 1 the model: for a request the router never saw (count_unanswered)
INFER_PATHS = tuple(re.compile(re.sub(r"\\\{\w+\\\}", "([^/]+)", re.escape(prefix + "/infer")))
                    for prefix in MODEL_PREFIXES)


def extensions(shared_memory: SharedMemory) -> list[str]:
    """What server metadata lists: Triton's names of the extensions clients look for."""
    return [*EXTENSIONS, *(["system_shared_memory"] if shared_memory.allowed else [])]


def shape_check(models: ModelSet, name: str, version: str):
    """`check_shape(input, datatype, shape)` for parse_infer_body / parse_infer_request: model
    `name`'s sample bound on TEXT, applied to the shape before the data is converted (which, for
    a million strings, would hold the event loop for most of a second before the same 400); None
    when the model is not known here (the request then fails later with its own error)."""
    try:
        signature = models.get(name, version).signature
    except Exception:  # noqa: BLE001 - unknown model, loading: answered where they were
        return None

    def check(input_name: str, datatype: str, shape: tuple) -> None:
        if input_name == "TEXT" and datatype == "BYTES":
            signature.check_text_shape(shape)  # the same check, and message, as inference.engine_call

    return check


def _answering_errors(handler):
    """A handler whose errors are answered by `error_response` (their status, a JSON body)."""
    @functools.wraps(handler)
    async def answer(self, request: web.Request) -> web.Response:
        try:
            return await handler(self, request)
        except Exception as exc:
            return error_response(exc)

    return answer


@web.middleware
async def _plain_json_type(request: web.Request, handler):
    """Error bodies typed `application/json`, without aiohttp's `; charset=utf-8`: KServe's Python
    SDK shows an error's message only when the Content-Type is exactly that (JSON is UTF-8 anyway)."""
    response = await handler(request)
    if response.status >= 400 and response.content_type == "application/json":
        response.charset = None
    return response


def _identified(client_key: str):
    """The middleware that tags a request with its id (request_ids.py; its client by `client_key`,
    serve --client-key) and echoes it in every answer's X-Request-ID, errors included. Inside
    `_arrival`, which may send the answer itself (headers are final then)."""
    @web.middleware
    async def identified(request: web.Request, handler):
        source = request.remote or ""
        client = request_ids.client_key(request.headers.get(request_ids.CLIENT_HEADER), source, client_key)
        tag = request_ids.begin(request.headers.get(request_ids.HEADER), f"{request.method} {request.path}", "http",
                                client, source)
        try:
            response = await handler(request)
        except web.HTTPException as exc:  # one `_json_errors` lets through (below 400): identified all the same
            exc.headers[request_ids.HEADER] = tag.id
            raise
        response.headers[request_ids.HEADER] = tag.id
        return response

    return identified


class HttpFrontend:
    def __init__(self, models: ModelSet, config: ServerConfig, repository: Repository | None = None,
                 shared_memory: SharedMemory | None = None, log_settings: LogSettings | None = None):
        """repository: what load answers with (--model-repository); None refuses it. shared_memory:
        the server's regions (shared with gRPC; None: none, registering refused). log_settings: the
        server's logging, which /v2/logging changes (None: refused)."""
        self.models, self.config, self.repository = models, config, repository
        self.shared_memory, self.logs = shared_memory or SharedMemory(), log_settings

    def count_unanswered(self, method: str, path: str) -> None:
        """A request whose head was parsed and that was never handled, its connection closed first (a
        pipelined request behind one whose client left; connections.LimitedRequestHandler): an
        inference request is counted `cancelled`, as one whose client left mid-way is."""
        infer = next((match for pattern in INFER_PATHS if (match := pattern.fullmatch(path))), None)
        if method != "POST" or infer is None and path not in JSON_INFERENCE_ROUTES:
            return
        name = infer.group(1) if infer is not None else ""  # a JSON route's model: in its body, unread
        self.models.metrics.observe_request(name if name in self.models.models else "", "http", "cancelled", 0.0)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes,
                              middlewares=[self._arrival, _identified(self.config.client_key), _plain_json_type,
                                           self._json_errors, self._auth])
        app[JSON_WORKER] = JsonWorker()  # large bodies are parsed there (http_bodies.loads), started when needed
        app.on_cleanup.append(app[JSON_WORKER].close)
        app.router.add_get("/v2/health/live", self.live)
        app.router.add_get("/v2/health/ready", self.ready)
        app.router.add_get("/v2", self.server_metadata)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v2/models/stats", self.statistics)  # before /v2/models/{model} takes "stats"
        for prefix in MODEL_PREFIXES:
            app.router.add_get(prefix, self.model_metadata)
            app.router.add_get(prefix + "/ready", self.model_ready)
            app.router.add_post(prefix + "/infer", self.infer)
            app.router.add_get(prefix + "/config", self.model_config)
            app.router.add_get(prefix + "/stats", self.statistics)
        app.router.add_post("/v2/repository/index", self.repository_index)
        app.router.add_post(score_api.ROUTE, self.score)
        app.router.add_post(beam_api.ROUTE, self.beam)
        rerank_api.add_routes(app, self.models, self.config)
        for action in ("load", "unload"):
            app.router.add_post(f"/v2/repository/models/{{model}}/{action}", self.repository_control)
        for path in ("/v2/trace/setting", "/v2/models/{model}/trace/setting"):
            app.router.add_get(path, self.trace_setting)
            app.router.add_post(path, self.trace_setting)
        app.router.add_get("/v2/logging", self.logging)
        app.router.add_post("/v2/logging", self.logging)
        for kind, handler in (("system", self.system_shared_memory), ("cuda", self.cuda_shared_memory)):
            for prefix in (f"/v2/{kind}sharedmemory", f"/v2/{kind}sharedmemory/region/{{region}}"):
                app.router.add_get(prefix + "/status", handler)
                app.router.add_post(prefix + "/unregister", handler)
            app.router.add_post(f"/v2/{kind}sharedmemory/region/{{region}}/register", handler)
        return app

    async def dispatch(self, app: web.Application, request: web.Request) -> web.StreamResponse:
        """Answer `request` through `app` (routes, middlewares, handlers) as aiohttp's server does,
        for a request that reached this process another way (Ray Serve's proxy: ray_replica.py).
        `app` must be frozen (app.freeze()), as the server does before its first request.
        aiohttp's server calls the same method; it has no public name."""
        return await app._handle(request)

    @web.middleware
    async def _arrival(self, request: web.Request, handler):
        """Note when the request arrived (its head read, its body not yet), where deadlines count from;
        close the connection after an answer that left part of the body unread (http_bodies.UNREAD),
        and after every answer once the server drains (`Connection: close`: a keep-alive client's next
        request would otherwise go on a connection about to close, sent and never answered)."""
        protocol = getattr(request, "protocol", None)
        # A request that reached this process another way (Ray Serve's proxy: a stand-in protocol) has no head time.
        parsed = protocol.head_time(request.message) if isinstance(protocol, LimitedRequestHandler) else None
        request[ARRIVED] = parsed if parsed is not None else time.monotonic()
        response = await handler(request)
        if self.models.state == DRAINING and not response.prepared:
            response.force_close()
        if response.get(UNREAD) and hasattr(protocol, "force_close"):
            await response.prepare(request)
            await response.write_eof()  # the answer is in the transport's buffer, which closing flushes
            protocol.force_close()  # no lingering read of the rest: aiohttp would inflate it all
        return response

    @web.middleware
    async def _json_errors(self, request: web.Request, handler):
        """aiohttp's own error answers (404, 405, 413, ...) as JSON `{"error": ...}`, as ours are."""
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = web.json_response({"error": f"{exc.reason}: {request.method} {request.path}"}, status=exc.status)
            for key in ("Allow",):
                if key in exc.headers:
                    response.headers[key] = exc.headers[key]
            return response

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if request.path not in PUBLIC_PATHS:
            try:
                check_api_key(self.config.api_key, request.headers.getall("Authorization", []))
            except Exception as exc:
                inference = getattr(request.match_info.route, "handler", None) == self.infer
                if inference or request.path in JSON_INFERENCE_ROUTES:  # an inference request: counted
                    name = request.match_info.get("model", "")  # a JSON route's: in its body, unread ("")
                    self.models.metrics.observe_request(name if name in self.models.models else "", "http",
                                                        status_of(exc).outcome, 0.0)
                return error_response(exc)
        return await handler(request)

    async def live(self, request: web.Request) -> web.Response:
        return web.json_response({"live": True})

    async def ready(self, request: web.Request) -> web.Response:
        """The Open Inference Protocol's body (kserve's SDK reads it), with Triton's status codes."""
        ready = self.models.ready
        return web.json_response({"ready": ready}, status=200 if ready else 503)

    async def server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response({"name": "boundgen", "version": __version__,
                                  "extensions": extensions(self.shared_memory)})

    async def metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=self.models.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    @_answering_errors
    async def model_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(self.models.get(request.match_info["model"],
                                                 request.match_info.get("version", "")).metadata())

    @_answering_errors
    async def model_config(self, request: web.Request) -> web.Response:
        return web.json_response(model_config(self.models.get(request.match_info["model"],
                                                              request.match_info.get("version", ""))))

    @_answering_errors
    async def statistics(self, request: web.Request) -> web.Response:
        return web.json_response(model_statistics(self.models, request.match_info.get("model", ""),
                                                  request.match_info.get("version", "")))

    @_answering_errors
    async def repository_index(self, request: web.Request) -> web.Response:
        """Body: optional JSON {"ready": bool} (tritonclient sends none)."""
        options = await read_options(request, self.config, "the repository index request", '{"ready": true}')
        if not isinstance(options.get("ready", False), bool):
            raise InvalidInput('the repository index request must be a JSON object like {"ready": true}')
        loadable = self.repository.loadable() if self.repository is not None else ()
        return web.json_response(repository_index(self.models, options.get("ready", False), loadable))

    @_answering_errors
    async def repository_control(self, request: web.Request) -> web.Response:
        """Load (a rolling replace, repository.py) or unload (refused). Body: none or Triton's
        {"parameters": {...}}. Answers 200 with an empty body once done, as Triton."""
        options = await read_options(request, self.config, "the repository request", '{"parameters": {}}')
        parameters = options.get("parameters")
        if not isinstance(parameters or {}, dict):
            raise InvalidInput('a repository request body is a JSON object like {"parameters": {}}')
        await control(self.models, self.repository, request.path.rsplit("/", 1)[1], request.match_info["model"],
                      parameters)
        return web.Response(status=200)

    @_answering_errors
    async def trace_setting(self, request: web.Request) -> web.Response:
        """GET: the trace settings (a model's are the global ones); POST: update them (refused
        unless it changes nothing: triton_extensions.trace_settings)."""
        if "model" in request.match_info:
            self.models.get(request.match_info["model"])
        update = None
        if request.method == "POST":
            update = await read_options(request, self.config, "the trace settings", '{"trace_level": ["OFF"]}')
        return web.json_response(trace_settings(update))

    @_answering_errors
    async def logging(self, request: web.Request) -> web.Response:
        """GET: the log settings; POST: update them (body: the settings to change); both answer all of them."""
        if request.method == "GET":
            return web.json_response(log_settings(self.logs))
        update = await read_options(request, self.config, "the log settings", '{"log_info": true}')
        return web.json_response(update_log_settings(self.logs, update))

    def _regions(self, request: web.Request) -> shm.ClientRegions:
        """The shared memory regions of the request's client (its local user's: shared_memory.py)."""
        return self.shared_memory.client(lambda: http_user(request))

    @_answering_errors
    async def system_shared_memory(self, request: web.Request) -> web.Response:
        """status (JSON list of regions), register (body {"key", "offset", "byte_size"}), unregister."""
        action, region = request.path.rsplit("/", 1)[1], request.match_info.get("region", "")
        regions = self._regions(request)
        if action == "status":
            return web.json_response(regions.status(region))
        if action == "register":
            options = await read_options(request, self.config, "the register request",
                                         '{"key": "/input0", "offset": 0, "byte_size": 64}')
            regions.register(region, options.get("key"), options.get("offset"), options.get("byte_size"),
                             self.config.shm_prefix)
        else:
            regions.unregister(region)
        return web.Response(status=200)

    @_answering_errors
    async def cuda_shared_memory(self, request: web.Request) -> web.Response:
        """status: no regions; register: refused (shared_memory.py); unregister: nothing to do."""
        action, region = request.path.rsplit("/", 1)[1], request.match_info.get("region", "")
        if action == "status":
            return web.json_response(shm.cuda_status(region))
        if action == "register":
            shm.cuda_register(region)
        return web.Response(status=200)

    @_answering_errors
    async def model_ready(self, request: web.Request) -> web.Response:
        self.models.get(request.match_info["model"], request.match_info.get("version", ""))
        return web.Response(status=200 if self.models.ready else 503)

    async def infer(self, request: web.Request) -> web.Response:
        arrival = arrived(request)
        name, version = request.match_info["model"], request.match_info.get("version", "")
        try:
            with self.models.observe("http", name):
                header_length = request.headers.get(HEADER_LENGTH)
                body = await read_body(request, self.config, json_values.budget(self.models, name),
                                       f"model {name[:80]}", header_length)
                head = await loads(request, split_infer_body(body, header_length)[0], "the request body")
                parsed = parse_infer_body(body, header_length, self._regions(request), self.config.max_body_bytes,
                                          shape_check(self.models, name, version), head)
                deadline = self.models.deadline(arrival, parsed.parameters.get("timeout"))
                answer = await inference.infer(self.models, name, version, parsed.tensors, parsed.outputs,
                                               deadline)
                response = encode_infer_response(name, parsed, answer.outputs)
                check_deadline(deadline, name)
                return response
        except Exception as exc:
            return error_response(exc)

    async def score(self, request: web.Request) -> web.Response:
        """SGLang's score request on a score model (server/score_api.py), through the same admission."""
        try:
            with self.models.observe("http") as seen:  # counted whatever its end, a bad body too
                budget = json_values.budget(self.models, task="score")
                parsed = score_api.parse(await read_json(request, self.config, budget))
                name = seen.name = score_api.pick_model(self.models, parsed["model"])
                deadline = self.models.deadline(arrived(request), None)
                response = web.json_response(await score_api.run(self.models, name, parsed, deadline))
                check_deadline(deadline, name)
                return response
        except Exception as exc:
            return score_api.error_response(exc)  # SGLang's error body

    async def beam(self, request: web.Request) -> web.Response:
        """A JSON beam request on a beam model (server/beam_api.py), each prompt a KServe request."""
        try:
            with self.models.observe("http") as seen:  # counted whatever its end, a bad body too
                budget = json_values.budget(self.models, task="beam")
                parsed = beam_api.parse(await read_json(request, self.config, budget))
                name = seen.name = beam_api.pick_model(self.models, parsed["model"])
                deadline = self.models.deadline(arrived(request), None)
                results = await beam_api.run(self.models, name, parsed["prompts"], deadline, parsed["allow_items"],
                                             parsed["allow_subset"])
                response = web.json_response(beam_api.response(name, results, parsed["single"]))
                check_deadline(deadline, name)
                return response
        except Exception as exc:
            return error_response(exc)

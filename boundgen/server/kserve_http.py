"""KServe v2 over HTTP (aiohttp): routes, the JSON body and the binary tensor extension.

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
    GET  /metrics                             Prometheus text format

Binary extension: the header `Inference-Header-Content-Length: N` says the body is N bytes of
JSON followed by raw tensor data; each input with `parameters.binary_data_size` takes its bytes
from there in order. Outputs come back binary when requested (`parameters.binary_data` per
output, or request-level `parameters.binary_data_output`), JSON otherwise. Errors are
`{"error": "..."}` with the status of status.py, aiohttp's own answers (404 unknown route, 405
wrong method, 413) included; protocol-level errors too (connections.py).
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from aiohttp import web

from boundgen.version import __version__
from boundgen.errors import InvalidInput
from boundgen.server import beam_api, score_api
from boundgen.server import shared_memory as shm
from boundgen.server.auth import check_api_key
from boundgen.server.config import ServerConfig
from boundgen.server.logs import LogSettings
from boundgen.server.metrics import CONTENT_TYPE
from boundgen.server.models import ModelSet
from boundgen.server.served import VERSION
from boundgen.server.shared_memory import SharedMemory, Slice, tensor_ref
from boundgen.server.status import ReadTimeout, status_of
from boundgen.server.tensors import Tensor, check_header, from_json, from_raw, to_json, to_raw
from boundgen.server.repository import Repository, control
from boundgen.server.triton_extensions import (log_settings, model_config, model_statistics, repository_index,
                                               trace_settings, update_log_settings)

log = logging.getLogger("boundgen.server")

HEADER_LENGTH = "Inference-Header-Content-Length"
PUBLIC_PATHS = frozenset({"/v2/health/live", "/v2/health/ready"})
EXTENSIONS = ("binary_tensor_data",)


def extensions(shared_memory: SharedMemory) -> list[str]:
    """What server metadata lists: Triton's names of the extensions clients look for."""
    return [*EXTENSIONS, *(["system_shared_memory"] if shared_memory.allowed else [])]


@dataclass
class HttpInferRequest:
    id: str | None
    tensors: list[Tensor]
    outputs: list[str] | None  # requested names; None: all
    binary: dict[str, bool] = field(default_factory=dict)  # per requested output: raw bytes, not JSON?
    binary_default: bool = False  # for outputs not in `binary`
    parameters: dict[str, Any] = field(default_factory=dict)
    shared_memory: dict[str, Slice] = field(default_factory=dict)  # outputs to write to shared memory


def _params(obj: dict, where: str) -> dict:
    params = obj.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidInput(f"{where}: 'parameters' must be a JSON object")
    return params


def parse_infer_body(body: bytes, header_length: str | None, shared_memory: SharedMemory | None = None) -> HttpInferRequest:
    """An inference request from an HTTP body (JSON, or JSON + binary tensor data), its tensors
    in shared memory read from `shared_memory`'s regions."""
    shared_memory = shared_memory or SharedMemory()
    binary = memoryview(b"")
    if header_length is not None:
        try:
            n = int(header_length)
        except ValueError:
            raise InvalidInput(f"header {HEADER_LENGTH} must be an integer, got {header_length!r}") from None
        if not 0 <= n <= len(body):
            raise InvalidInput(f"header {HEADER_LENGTH} says {n} bytes of JSON, the body has {len(body)}")
        body, binary = body[:n], memoryview(body)[n:]
    try:
        obj = json.loads(body)
    except UnicodeDecodeError:
        raise InvalidInput("the request's JSON is not valid UTF-8") from None
    except (ValueError, RecursionError) as exc:
        raise InvalidInput(f"the request body is not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise InvalidInput("the request body must be a JSON object with 'inputs'")
    inputs = obj.get("inputs")
    if not isinstance(inputs, list):
        raise InvalidInput("the request needs 'inputs', a list of tensors")
    tensors, offset = [], 0
    for i, inp in enumerate(inputs):
        if not isinstance(inp, dict):
            raise InvalidInput(f"inputs[{i}] must be a JSON object")
        name, datatype, shape = check_header(inp.get("name"), inp.get("datatype"), inp.get("shape"))
        params = _params(inp, f"input {name}")
        size, ref = params.get("binary_data_size"), tensor_ref(name, params)
        if ref is not None:
            if size is not None or "data" in inp:
                raise InvalidInput(f"input {name} has shared_memory_region and also "
                                   f"{'data' if 'data' in inp else 'binary_data_size'}; send one")
            tensors.append(shared_memory.slice(name, ref).read_tensor(name, datatype, shape))
        elif size is not None:
            if not isinstance(size, int) or isinstance(size, bool) or size < 0:
                raise InvalidInput(f"input {name}: binary_data_size must be a non-negative integer, got {size!r}")
            if "data" in inp:
                raise InvalidInput(f"input {name} has both 'data' and binary_data_size; send one")
            if offset + size > len(binary):
                raise InvalidInput(f"input {name}: binary_data_size {size} runs past the end of the binary data "
                                   f"({len(binary) - offset} bytes left)")
            tensors.append(from_raw(name, datatype, shape, binary[offset:offset + size]))
            offset += size
        elif "data" in inp:
            tensors.append(from_json(name, datatype, shape, inp["data"]))
        else:
            raise InvalidInput(f"input {name} has none of 'data', parameters.binary_data_size, "
                               "parameters.shared_memory_region")
    if offset != len(binary):
        raise InvalidInput(f"{len(binary) - offset} bytes of binary data are not claimed by any input")
    parameters = _params(obj, "request")
    default_binary = parameters.get("binary_data_output", False) is True
    outputs, flags, slices = None, {}, {}
    if obj.get("outputs") is not None:
        if not isinstance(obj["outputs"], list):
            raise InvalidInput("'outputs' must be a list of {\"name\": ...} objects")
        outputs = []
        for i, out in enumerate(obj["outputs"]):
            if not isinstance(out, dict) or not isinstance(out.get("name"), str):
                raise InvalidInput(f"outputs[{i}] must be an object with a string 'name'")
            out_params = _params(out, f"output {out['name']}")
            if "classification" in out_params:
                raise InvalidInput(f"output {out['name']}: the classification extension is not supported")
            outputs.append(out["name"])
            ref = tensor_ref(out["name"], out_params)
            if ref is not None:
                if out_params.get("binary_data") is True:
                    raise InvalidInput(f"output {out['name']} asks for shared memory and binary_data; ask for one")
                slices[out["name"]] = shared_memory.slice(out["name"], ref)
            flags[out["name"]] = out_params.get("binary_data", default_binary) is True
    request_id = obj.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidInput("'id' must be a string")
    return HttpInferRequest(request_id, tensors, outputs, flags, default_binary, parameters, slices)


def encode_infer_response(model: str, request: HttpInferRequest, outputs: list[Tensor]) -> web.Response:
    entries, chunks = [], []
    for t in outputs:
        entry = {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}
        if t.name in request.shared_memory:
            entry["parameters"] = request.shared_memory[t.name].write_tensor(t)
        elif request.binary.get(t.name, request.binary_default):
            raw = to_raw(t)
            entry["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            entry["data"] = to_json(t)
        entries.append(entry)
    head = {"model_name": model, "model_version": VERSION, "outputs": entries}
    if request.id is not None:
        head["id"] = request.id
    head_bytes = json.dumps(head, separators=(",", ":")).encode()
    if not chunks:
        return web.Response(body=head_bytes, content_type="application/json")
    return web.Response(body=head_bytes + b"".join(chunks), content_type="application/octet-stream",
                        headers={HEADER_LENGTH: str(len(head_bytes))})


def error_response(exc: BaseException) -> web.Response:
    status = status_of(exc)
    if status.outcome == "internal_error":
        log.error("internal error", exc_info=exc)
    headers = {"WWW-Authenticate": "Bearer"} if status.http == 401 else None
    response = web.json_response({"error": status.message}, status=status.http, headers=headers)
    if status.outcome == "read_timeout":  # part of the body is unread: the connection cannot carry another request
        response.force_close()
    return response


def _answering_errors(handler):
    """A handler whose errors are answered by `error_response` (their status, a JSON body)."""
    @functools.wraps(handler)
    async def answer(self, request: web.Request) -> web.Response:
        try:
            return await handler(self, request)
        except Exception as exc:
            return error_response(exc)

    return answer


class HttpFrontend:
    def __init__(self, models: ModelSet, config: ServerConfig, repository: Repository | None = None,
                 shared_memory: SharedMemory | None = None, log_settings: LogSettings | None = None):
        """repository: what load answers with (--model-repository); None refuses it. shared_memory:
        the server's regions (shared with gRPC; None: none, registering refused). log_settings: the
        server's logging, which /v2/logging changes (None: refused)."""
        self.models, self.config, self.repository = models, config, repository
        self.shared_memory, self.logs = shared_memory or SharedMemory(), log_settings

    def app(self) -> web.Application:
        app = web.Application(client_max_size=self.config.max_body_bytes, middlewares=[self._json_errors, self._auth])
        app.router.add_get("/v2/health/live", self.live)
        app.router.add_get("/v2/health/ready", self.ready)
        app.router.add_get("/v2", self.server_metadata)
        app.router.add_get("/metrics", self.metrics)
        app.router.add_get("/v2/models/stats", self.statistics)  # before /v2/models/{model} takes "stats"
        for prefix in ("/v2/models/{model}", "/v2/models/{model}/versions/{version}"):
            app.router.add_get(prefix, self.model_metadata)
            app.router.add_get(prefix + "/ready", self.model_ready)
            app.router.add_post(prefix + "/infer", self.infer)
            app.router.add_get(prefix + "/config", self.model_config)
            app.router.add_get(prefix + "/stats", self.statistics)
        app.router.add_post("/v2/repository/index", self.repository_index)
        app.router.add_post(score_api.ROUTE, self.score)
        app.router.add_post(beam_api.ROUTE, self.beam)
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
                if getattr(request.match_info.route, "handler", None) == self.infer:  # an inference request: counted
                    name = request.match_info.get("model", "")
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
        options = await self._read_options(request, "the repository index request", '{"ready": true}')
        if not isinstance(options.get("ready", False), bool):
            raise InvalidInput('the repository index request must be a JSON object like {"ready": true}')
        loadable = self.repository.loadable() if self.repository is not None else ()
        return web.json_response(repository_index(self.models, options.get("ready", False), loadable))

    @_answering_errors
    async def repository_control(self, request: web.Request) -> web.Response:
        """Load (a rolling replace, repository.py) or unload (refused). Body: none or Triton's
        {"parameters": {...}}. Answers 200 with an empty body once done, as Triton."""
        options = await self._read_options(request, "the repository request", '{"parameters": {}}')
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
            update = await self._read_options(request, "the trace settings", '{"trace_level": ["OFF"]}')
        return web.json_response(trace_settings(update))

    @_answering_errors
    async def logging(self, request: web.Request) -> web.Response:
        """GET: the log settings; POST: update them (body: the settings to change); both answer all of them."""
        if request.method == "GET":
            return web.json_response(log_settings(self.logs))
        update = await self._read_options(request, "the log settings", '{"log_info": true}')
        return web.json_response(update_log_settings(self.logs, update))

    @_answering_errors
    async def system_shared_memory(self, request: web.Request) -> web.Response:
        """status (JSON list of regions), register (body {"key", "offset", "byte_size"}), unregister."""
        action, region = request.path.rsplit("/", 1)[1], request.match_info.get("region", "")
        if action == "status":
            return web.json_response(self.shared_memory.status(region))
        if action == "register":
            options = await self._read_options(request, "the register request",
                                               '{"key": "/input0", "offset": 0, "byte_size": 64}')
            self.shared_memory.register(region, options.get("key"), options.get("offset"), options.get("byte_size"))
        else:
            self.shared_memory.unregister(region)
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
        arrived = time.monotonic()
        name, version = request.match_info["model"], request.match_info.get("version", "")
        try:
            with self.models.observe("http", name):
                body = await self._read_body(request)
                parsed = parse_infer_body(body, request.headers.get(HEADER_LENGTH), self.shared_memory)
                deadline = self.models.deadline(arrived, parsed.parameters.get("timeout"))
                outputs = await self.models.infer(name, version, parsed.tensors, parsed.outputs, deadline)
                return encode_infer_response(name, parsed, outputs)
        except Exception as exc:
            return error_response(exc)

    async def score(self, request: web.Request) -> web.Response:
        """SGLang's score request on a score model (server/score_api.py), through the same admission."""
        arrived = time.monotonic()
        try:
            parsed = score_api.parse(await self._read_json(request))
            name = score_api.pick_model(self.models, parsed["model"])
            with self.models.observe("http", name):
                deadline = self.models.deadline(arrived, None)
                model = self.models.get(name, "")  # the one infer runs on: no await between (repository.py)
                (probs,) = await self.models.infer(name, "", [score_api.text_tensor(parsed["texts"])], ["SCORES"],
                                                   deadline)
                values = score_api.scores(np.asarray(probs.data, dtype=np.float32).reshape(probs.shape),
                                          list(model.engine.spec.program.label_token_ids), parsed["label_token_ids"])
                return web.json_response(score_api.response(name, values))
        except Exception as exc:
            return error_response(exc)

    async def beam(self, request: web.Request) -> web.Response:
        """A JSON beam request on a beam model (server/beam_api.py), each prompt a KServe request."""
        arrived = time.monotonic()
        try:
            parsed = beam_api.parse(await self._read_json(request))
            name = beam_api.pick_model(self.models, parsed["model"])
            with self.models.observe("http", name):
                results = await beam_api.run(self.models, name, parsed["prompts"], self.models.deadline(arrived, None))
                return web.json_response(beam_api.response(name, results, parsed["single"]))
        except Exception as exc:
            return error_response(exc)

    async def _read_options(self, request: web.Request, what: str, example: str) -> dict:
        """An optional JSON object body (none: {}), else InvalidInput naming `what` with an `example`."""
        body = await self._read_body(request)
        try:
            options = json.loads(body) if body.strip() else {}
        except (ValueError, RecursionError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"{what} is not valid JSON: {exc}") from None
        if not isinstance(options, dict):
            raise InvalidInput(f"{what} must be a JSON object like {example}")
        return options

    async def _read_json(self, request: web.Request):
        """The body (within the limits of `_read_body`) as JSON, or InvalidInput saying why not."""
        body = await self._read_body(request)
        try:
            return json.loads(body)
        except (ValueError, RecursionError, UnicodeDecodeError) as exc:
            raise InvalidInput(f"the request body is not valid JSON: {exc}") from None

    async def _read_body(self, request: web.Request) -> bytes:
        limit = self.config.max_body_bytes
        if request.content_length is not None and request.content_length > limit:
            raise InvalidInput(f"the request body is {request.content_length} bytes, over the server's limit "
                               f"of {limit} (--max-body-bytes)")
        try:  # the whole body within --read-timeout-s: a stalled or endless one must not hold the connection
            return await asyncio.wait_for(request.read(), self.config.read_timeout_s)
        except asyncio.TimeoutError:
            raise ReadTimeout(f"the request body did not arrive in full within {self.config.read_timeout_s:g} s "
                              "(--read-timeout-s)") from None
        except web.HTTPRequestEntityTooLarge:
            raise InvalidInput(f"the request body is over the server's limit of {limit} bytes "
                               "(--max-body-bytes)") from None

"""KServe v2 over gRPC (grpc.aio): `inference.GRPCInferenceService`, as unmodified tritonclient calls it.

Implemented: ServerLive, ServerReady (no API key), ModelReady, ServerMetadata, ModelMetadata,
ModelInfer, ModelStreamInfer, and Triton's ModelConfig, ModelStatistics, RepositoryIndex,
TraceSetting, LogSettings (triton_extensions.py), RepositoryModelLoad (a rolling replace with
--model-repository, else UNAVAILABLE), RepositoryModelUnload (UNAVAILABLE, refused:
repository.py), SystemSharedMemory* and CudaSharedMemory* (shared_memory.py). Inputs come in
`raw_input_contents` (tritonclient's default; one entry per input not in shared memory, in
order), typed `contents` or shared memory; outputs go back in `raw_output_contents` (an empty
entry for one written to shared memory, as Triton answers). The request deadline is the gRPC
deadline, tightened by a `timeout` parameter (microseconds). A client that cancels, or whose
deadline passes, has its handler cancelled, which frees its queue place (admission.py). An
oversized message is INVALID_ARGUMENT, like HTTP's 400.

ModelStreamInfer: each request of the stream runs as a ModelInfer call would (same admission,
deadline, errors), as soon as it arrives, so that several are in flight at once; the answers go
back in request order. A request that fails is answered with `error_message` (and its id in
`infer_response.id`) and the stream goes on. The stream's gRPC deadline bounds every request
of it; cancelling the stream cancels its requests still waiting. At most STREAM_WINDOW of a stream's
requests are read and not yet answered: a client that does not read its answers waits to write.

Every method decodes its own message: one that is not a valid message of its type is answered
INVALID_ARGUMENT (UNAUTHENTICATED first when a key is required and missing), never INTERNAL.
Every ModelInfer call is counted in the request metrics, also one whose deadline passes (or that
is cancelled) after gRPC looked up its method but before its handler ran, which gRPC then never
calls: those count as deadline_exceeded. (A call gRPC drops before it looks the method up is never
seen here.) A success is checked against its deadline once more after its response is built.

Every call's trailing metadata carries its request id, `x-request-id` (the client's own metadata
of that name when valid, else a new one: request_ids.py), on success and error alike; the access
log records it. The requests of a ModelStreamInfer stream are logged as the stream's id, a dot
and their place in the stream (1, 2, ...).

Messages to and from tensors and plain values: grpc_messages.py; the method table, request ids in
trailers, arrivals and message limits every method shares: grpc_service.py; this module is what
each method answers (the servicer).
"""

from __future__ import annotations

import asyncio
import functools
import time
from dataclasses import dataclass

import grpc

from boundgen.errors import InvalidInput
from boundgen.runtime.results import TIMING_COUNTS
from boundgen.server import request_ids
from boundgen.server.auth import check_api_key
from boundgen.server.config import ServerConfig
from boundgen.server.logs import LogSettings
from boundgen.server.models import LOADING, ModelSet
from boundgen.server.status import answer_status, check_deadline
from boundgen.server.kserve import inference, pb
from boundgen.server.kserve import shared_memory as shm
from boundgen.server.kserve.grpc_service import (METHODS, PUBLIC_METHODS, Arrivals, current_task, ended_by_deadline,
                                                 expired, identified, identify, route, serialize, short)
from boundgen.server.kserve.grpc_messages import (Undecodable, decoder, infer_response, param_value, params,
                                                  parse_infer_request, set_param)
from boundgen.server.kserve.http_api import extensions, shape_check
from boundgen.server.kserve.local_user import grpc_user, listening_end
from boundgen.server.kserve.repository import Repository, control
from boundgen.server.kserve.shared_memory import SharedMemory
from boundgen.server.kserve.triton_extensions import (log_settings, model_config, model_statistics, repository_index,
                                                      to_message, trace_settings, update_log_settings)
from boundgen.version import __version__


STREAM_WINDOW = 64  # a ModelStreamInfer stream's requests read and not yet answered, at most
try:  # what gRPC raises for a message its transport could not send (the call broken: its client gone)
    from grpc._cython.cygrpc import ExecuteBatchError as SendFailed
except ImportError:  # pragma: no cover - a grpcio without it: such a failure is raised (and gRPC logs it)
    SendFailed = ()


@dataclass
class _Unseen:
    """A ModelInfer call gRPC has looked up whose handler has not run yet."""
    tag: request_ids.RequestTag  # its request id
    arrived: float  # time.monotonic() of the lookup: the call's arrival
    model: str = ""  # the model it names, once its message is decoded


class GrpcFrontend:
    def __init__(self, models: ModelSet, config: ServerConfig, repository: Repository | None = None,
                 shared_memory: SharedMemory | None = None, log_settings: LogSettings | None = None):
        """repository: what RepositoryModelLoad answers with (--model-repository); None refuses it.
        shared_memory, log_settings: as HttpFrontend's (the same objects, in one server)."""
        self.models, self.config, self.repository = models, config, repository
        self.shared_memory, self.logs = shared_memory or SharedMemory(), log_settings
        self._unseen: dict[asyncio.Task, _Unseen] = {}  # ModelInfer calls whose handler has not run
        self.port = 0  # the port it listens on, once bound (app.py): with config.host, a call's server end
        self.looked_up = 0  # calls whose method gRPC has looked up (Arrivals)

    def handler(self) -> grpc.GenericRpcHandler:
        """Every method: ModelInfer and ModelStreamInfer decoded within the body limit, the others
        through `_decoder` and `_refusing_undecodable`."""
        handlers = {}
        for method, (attr, request_cls) in METHODS.items():
            behaviour, decode = getattr(self, attr), decoder(request_cls)
            if method == "ModelInfer":
                decode = self._decode_infer
            else:
                behaviour = self._refusing_undecodable(method, behaviour)
            handlers[method] = grpc.unary_unary_rpc_method_handler(
                identified(method, behaviour, self.config.client_key), request_deserializer=decode,
                response_serializer=serialize)
        handlers["ModelStreamInfer"] = grpc.stream_stream_rpc_method_handler(
            self.model_stream_infer, request_deserializer=self._decode_infer, response_serializer=serialize)
        return Arrivals(self, grpc.method_handlers_generic_handler(pb.SERVICE, handlers))

    async def intake_settled(self, quiet_s: float = 0.05, quiet_turns: int = 10, bound_s: float = 2.0) -> None:
        """Until no call has been looked up for `quiet_s` and `quiet_turns` turns of the event loop (at most
        `bound_s`): before gRPC stops, the calls its core took in and has not yet handed over (grpc.aio hands
        them to Python one a turn of the event loop: a burst on one connection waits there) reach their
        handlers and are answered UNAVAILABLE while the server drains. gRPC's stop cancelled them:
        CANCELLED, which a client's retry policy takes for its own cancel, and which the server never logged
        or counted. The turns as well as the time: on a starved host (2 cores, a test suite beside it) one
        turn can take longer than `quiet_s`; a test run there had 299 of a 300-call burst cancelled with a
        quiet measured in time alone (not reproduced since, so not proven to be this)."""
        end = time.monotonic() + bound_s
        seen, since, turns = self.looked_up, time.monotonic(), 0
        while time.monotonic() < end and (turns < quiet_turns or time.monotonic() - since < quiet_s):
            await asyncio.sleep(quiet_s / quiet_turns)
            if self.looked_up != seen:
                seen, since, turns = self.looked_up, time.monotonic(), 0
            else:
                turns += 1

    def _refusing_undecodable(self, method: str, behaviour):
        """`behaviour`, except that an undecodable message is answered INVALID_ARGUMENT (after the
        API key check, on every method that needs the key)."""
        @functools.wraps(behaviour)
        async def call(request, context):
            if isinstance(request, Undecodable):
                try:
                    if method not in PUBLIC_METHODS:
                        self._check_key(context)
                    raise InvalidInput(f"{method}: {request.reason}")
                except Exception as exc:
                    await self._abort(context, exc)
            return await behaviour(request, context)

        return call

    def arriving(self, metadata=()) -> None:
        """A ModelInfer call was looked up, on its own task: count it when that task ends unless
        its handler ran (which counts it itself). `metadata`: the call's, for its request id."""
        task = current_task()
        if task is not None:
            tag = request_ids.RequestTag(request_ids.request_id(request_ids.from_metadata(metadata)),
                                         route("ModelInfer"), "grpc")
            self._unseen[task] = _Unseen(tag, time.monotonic())
            task.add_done_callback(self._count_unseen)

    def _count_unseen(self, task: asyncio.Task) -> None:
        """A call that ended before its handler ran: counted `deadline_exceeded`. Its task ends the same
        way (not cancelled, no exception, its message not decoded) whether its deadline fired, its client
        cancelled it or gRPC refused its message or metadata as too large (RESOURCE_EXHAUSTED)."""
        unseen = self._unseen.pop(task, None)
        if unseen is not None:
            request_ids.enter(unseen.tag)  # this callback runs in a copy of the task's context: the tag stays here
            label = unseen.model if unseen.model in self.models.models else ""
            self.models.metrics.observe_request(label, "grpc", "deadline_exceeded", 0.0)

    def options(self) -> list[tuple[str, int]]:
        """Channel options: let messages somewhat over the limit through, so that ModelInfer can
        answer INVALID_ARGUMENT itself; beyond that gRPC refuses them with RESOURCE_EXHAUSTED."""
        limit = self.config.max_body_bytes
        return [("grpc.max_receive_message_length", max(2 * limit, limit + (1 << 20))),
                ("grpc.max_send_message_length", -1),
                # An idle connection (no call open) is closed after --idle-timeout-s, as HTTP's is.
                ("grpc.max_connection_idle_ms", int(self.config.idle_timeout_s * 1000))]

    def _decode_infer(self, data: bytes):
        request = self._decode_infer_message(data)
        task = current_task()
        if task in self._unseen:  # decoded on the call's task, before its handler: note the model
            self._unseen[task].model = request.model_name
        return request

    def _decode_infer_message(self, data: bytes):
        if len(data) > self.config.max_body_bytes:
            return Undecodable(f"the request is {len(data)} bytes, over the server's limit of "
                                f"{self.config.max_body_bytes} (--max-body-bytes)")
        try:
            return pb.ModelInferRequest.FromString(data)
        except Exception as exc:  # protobuf's DecodeError
            return Undecodable(f"the request is not a valid ModelInferRequest: {exc}")

    def refuse_oversized(self, request):
        """A ModelInferRequest decoded elsewhere (Ray Serve's proxy), refused as `_decode_infer` does when too big."""
        size = request.ByteSize()
        if size > self.config.max_body_bytes:
            return Undecodable(f"the request is {size} bytes, over the server's limit of "
                                f"{self.config.max_body_bytes} (--max-body-bytes)")
        return request

    async def _abort(self, context, exc: BaseException):
        status = answer_status(exc)
        if expired(context):  # the client's deadline has ended the call: gRPC could send nothing (and would log it)
            raise asyncio.CancelledError(status.message)
        tag = request_ids.current()
        if tag is None:  # not a call of ours (Ray Serve's proxy): its context, its metadata
            await context.abort(status.grpc, short(status.message))
        else:  # abort replaces the trailing metadata set so far: the id again
            await context.abort(status.grpc, short(status.message),
                                trailing_metadata=((request_ids.METADATA_KEY, tag.id),))

    def _check_key(self, context) -> None:
        values = [value for key, value in context.invocation_metadata() or () if key == "authorization"]
        check_api_key(self.config.api_key, values)

    async def server_live(self, request, context):
        return pb.ServerLiveResponse(live=True)

    async def server_ready(self, request, context):
        return pb.ServerReadyResponse(ready=self.models.ready)

    async def _call(self, context, answer):
        """`answer()` for a caller with the API key, or the call aborted with the error's status."""
        try:
            self._check_key(context)
            return answer()
        except Exception as exc:
            await self._abort(context, exc)

    async def server_metadata(self, request, context):
        await self._call(context, lambda: None)
        return pb.ServerMetadataResponse(name="boundgen", version=__version__, extensions=extensions(self.shared_memory))

    async def model_ready(self, request, context):
        try:
            self._check_key(context)
            if self.models.state == LOADING:  # names are known only once loaded
                return pb.ModelReadyResponse(ready=False)
            self.models.get(request.name, request.version)
        except Exception as exc:
            await self._abort(context, exc)
        return pb.ModelReadyResponse(ready=self.models.ready)

    async def model_metadata(self, request, context):
        meta = await self._call(context, lambda: self.models.get(request.name, request.version).metadata())
        response = pb.ModelMetadataResponse(name=meta["name"], versions=meta["versions"], platform=meta["platform"])
        for specs, field in ((meta["inputs"], response.inputs), (meta["outputs"], response.outputs)):
            for t in specs:
                field.add(name=t["name"], datatype=t["datatype"], shape=t["shape"])
        for key, value in meta["parameters"].items():
            set_param(response.parameters[key], value)
        return response

    async def model_config(self, request, context):
        config = await self._call(context, lambda: model_config(self.models.get(request.name, request.version)))
        return to_message({"config": config}, pb.ModelConfigResponse())

    async def model_statistics(self, request, context):
        stats = await self._call(context, lambda: model_statistics(self.models, request.name, request.version))
        return to_message(stats, pb.ModelStatisticsResponse())

    async def repository_index(self, request, context):
        await self._call(context, lambda: None)
        loadable = self.repository.loadable() if self.repository is not None else ()
        return to_message({"models": repository_index(self.models, request.ready, loadable)},
                          pb.RepositoryIndexResponse())

    async def repository_control(self, request, context):
        load = isinstance(request, pb.RepositoryModelLoadRequest)
        try:
            self._check_key(context)
            parameters = params(request.parameters)
            await control(self.models, self.repository, "load" if load else "unload", request.model_name, parameters)
        except Exception as exc:
            await self._abort(context, exc)
        return pb.RepositoryModelLoadResponse() if load else pb.RepositoryModelUnloadResponse()

    def _regions(self, context) -> shm.ClientRegions:
        """The shared memory regions of the call's client (its local user's: shared_memory.py)."""
        return self.shared_memory.client(lambda: grpc_user(context, listening_end(self.config.host, self.port)))

    async def system_shared_memory_status(self, request, context):
        regions = await self._call(context, lambda: self._regions(context).status(request.name))
        return to_message({"regions": {r["name"]: r for r in regions}}, pb.SystemSharedMemoryStatusResponse())

    async def system_shared_memory_register(self, request, context):
        await self._call(context, lambda: self._regions(context).register(request.name, request.key, request.offset,
                                                                        request.byte_size, self.config.shm_prefix))
        return pb.SystemSharedMemoryRegisterResponse()

    async def system_shared_memory_unregister(self, request, context):
        await self._call(context, lambda: self._regions(context).unregister(request.name))
        return pb.SystemSharedMemoryUnregisterResponse()

    async def cuda_shared_memory_status(self, request, context):
        regions = await self._call(context, lambda: shm.cuda_status(request.name))
        return to_message({"regions": {r["name"]: r for r in regions}}, pb.CudaSharedMemoryStatusResponse())

    async def cuda_shared_memory_register(self, request, context):
        await self._call(context, lambda: shm.cuda_register(request.name))  # refused
        return pb.CudaSharedMemoryRegisterResponse()

    async def cuda_shared_memory_unregister(self, request, context):
        await self._call(context, lambda: None)  # nothing is registered
        return pb.CudaSharedMemoryUnregisterResponse()

    async def trace_setting(self, request, context):
        def answer():
            if request.model_name:
                self.models.get(request.model_name)
            return trace_settings({key: list(value.value) for key, value in request.settings.items()})

        settings = await self._call(context, answer)
        response = pb.TraceSettingResponse()
        for key, value in settings.items():
            response.settings[key].value.extend(value if isinstance(value, list) else [value])
        return response

    async def log_settings(self, request, context):
        def answer():
            update = params(request.settings)
            return update_log_settings(self.logs, update) if update else log_settings(self.logs)

        settings = await self._call(context, answer)
        response = pb.LogSettingsResponse()
        for key, value in settings.items():
            kind = "bool_param" if isinstance(value, bool) else "uint32_param" if isinstance(value, int) else "string_param"
            setattr(response.settings[key], kind, value)
        return response

    async def model_infer(self, request, context):
        # Counted by observe() below. Deadlines count from the arrival: under load the handler
        # starts well after gRPC took the call.
        unseen = self._unseen.pop(current_task(), None)
        arrived = time.monotonic() if unseen is None else unseen.arrived
        try:
            with self.models.observe("grpc", request.model_name, lambda: ended_by_deadline(context)):
                return await self._infer(request, context, arrived)
        except Exception as exc:
            await self._abort(context, exc)

    async def model_stream_infer(self, requests, context) -> None:
        """ModelStreamInfer (see the module docstring): a task per request as it arrives, answers
        in request order, at most STREAM_WINDOW requests of the stream read and not yet answered (a
        client that writes and never reads held every answer in memory: 4 MB/s, unbounded). Written
        with `context.write`, so that a send that fails because the client left ends the call
        quietly (as a generator's answer, gRPC logged a traceback for it)."""
        stream = identify(context, "ModelStreamInfer", self.config.client_key)
        await self._call(context, lambda: None)
        order: asyncio.Queue = asyncio.Queue()  # each request's task, in arrival order; None ends
        tasks: set[asyncio.Task] = set()
        window = asyncio.Semaphore(STREAM_WINDOW)  # a place per request read and not yet answered

        async def read() -> None:
            try:
                count, previous = 0, None
                async for request in requests:
                    count += 1
                    tag = request_ids.RequestTag(f"{stream.id}.{count}", stream.route, "grpc", stream.client,
                                                 stream.source)
                    task = asyncio.ensure_future(self._stream_one(request, context, tag, previous))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    order.put_nowait(task)
                    previous = task
                    # Before the next read (each request read has its task, so it is answered and counted
                    # whatever happens next): a full window stops reading, and the client's writes wait.
                    await window.acquire()
            finally:
                order.put_nowait(None)

        reader = asyncio.ensure_future(read())
        try:
            while (task := await order.get()) is not None:
                answer = await task
                try:
                    await context.write(answer)
                except SendFailed:  # the client went away (cancelled, closed) while its answer was sent
                    return
                window.release()
            await reader  # a broken request stream ends the call with its error
        finally:
            reader.cancel()
            for task in list(tasks):  # the client went away: its requests still waiting give up their place
                task.cancel()

    async def _stream_one(self, request, context, tag: request_ids.RequestTag, previous: asyncio.Task | None):
        """One request of a stream (`tag`: its request id), answered as ModelInfer answers it; an
        error is the answer's error_message. Answers go out in request order: its deadline is checked
        once more when the request before it (`previous`) has ended, its answer's turn, so that an
        answer held behind a slower one is not sent as a success after its deadline."""
        arrived = time.monotonic()
        request_ids.enter(tag)  # this task's own context
        try:
            with self.models.observe("grpc", request.model_name, lambda: ended_by_deadline(context)):
                return pb.ModelStreamInferResponse(infer_response=await self._infer(request, context, arrived,
                                                                                    previous))
        except Exception as exc:
            return pb.ModelStreamInferResponse(error_message=answer_status(exc).message,
                                               infer_response=pb.ModelInferResponse(id=getattr(request, "id", "")))

    async def _infer(self, request, context, arrived: float, turn: asyncio.Future | None = None):
        """One inference request's answer; `turn`: what the answer waits for before its last deadline
        check (a stream's previous request)."""
        self._check_key(context)
        if isinstance(request, Undecodable):
            raise InvalidInput(request.reason)
        tensors, slices = parse_infer_request(request, self._regions(context), self.config.max_body_bytes,
                                              shape_check(self.models, request.model_name, request.model_version))
        timeout = request.parameters["timeout"] if "timeout" in request.parameters else None
        deadline = self.models.deadline(arrived, None if timeout is None else param_value(timeout),
                                        context.time_remaining())
        requested = [o.name for o in request.outputs] or None
        answer = await inference.infer(self.models, request.model_name, request.model_version, tensors, requested,
                                       deadline)
        response = infer_response(request, answer.outputs, slices)
        if pb.TIMINGS_PARAMETER in request.parameters and param_value(request.parameters[pb.TIMINGS_PARAMETER]) is True:
            for stage, value in answer.timings.items():
                response.parameters[f"timing_{stage}_ms"].double_param = value * (1 if stage in TIMING_COUNTS else 1e3)
            response.parameters["timing_handler_ms"].double_param = (time.monotonic() - arrived) * 1e3
        if turn is not None:
            await asyncio.wait([turn])  # ended, whatever its end
        check_deadline(deadline, request.model_name)
        return response

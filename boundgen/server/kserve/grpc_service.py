"""KServe v2's gRPC service (`inference.GRPCInferenceService`): what every method shares.

- METHODS, the one list of what the service answers: each method's servicer method and request
  message; `method_handlers` registers them on a servicer (Ray Serve's proxy learns the service
  from it: `add_GRPCInferenceServiceServicer_to_server`);
- each call tagged with its request id (request_ids.py), echoed in its trailing metadata
  (`identify`, `identified`);
- ModelInfer calls noted as gRPC looks up their method, on the call's own task (`Arrivals`), so
  that a call ended before its handler ran is still counted;
- an error message cut to what trailing metadata carries (`short`).

What each method answers: grpc_api.py (GrpcFrontend); messages to and from tensors: grpc_messages.py.
"""

from __future__ import annotations

import asyncio
import functools

import grpc

from boundgen.server import request_ids
from boundgen.server.kserve import pb


PUBLIC_METHODS = frozenset({"ServerLive", "ServerReady"})


def current_task() -> asyncio.Task | None:
    """The task running now; None outside one (or outside an event loop)."""
    try:
        return asyncio.current_task()
    except RuntimeError:
        return None


MAX_MESSAGE_BYTES = 2048  # of an error message's UTF-8, sent as grpc-message (trailing metadata)


def short(message: str) -> str:
    """`message` cut to MAX_MESSAGE_BYTES: grpc-message travels in the trailers, percent-encoded
    (a non-ASCII byte takes 3), and a client refuses trailers over 8 KiB (16 KiB hard) with
    RESOURCE_EXHAUSTED in place of the status sent (a message echoing a shape of 40,000
    dimensions was 120 KB)."""
    data = message.encode("utf-8", "replace")
    if len(data) <= MAX_MESSAGE_BYTES:
        return message
    return data[:MAX_MESSAGE_BYTES].decode("utf-8", "ignore") + f"... ({len(data)} bytes, cut)"


def route(method: str) -> str:
    return f"/{pb.SERVICE}/{method}"


def identify(context, method: str, client_key: str = request_ids.DEFAULT_CLIENT_KEY) -> request_ids.RequestTag:
    """Tag the call being handled with its request id and echo it in its trailing metadata;
    `client_key`: serve --client-key (request_ids.client_key)."""
    metadata = context.invocation_metadata()
    source = request_ids.grpc_peer_host(context.peer())
    client = request_ids.client_key(request_ids.from_metadata(metadata, request_ids.CLIENT_METADATA_KEY), source,
                                    client_key)
    tag = request_ids.begin(request_ids.from_metadata(metadata), route(method), "grpc", client, source)
    context.set_trailing_metadata(((request_ids.METADATA_KEY, tag.id),))
    return tag


def identified(method: str, behaviour, client_key: str = request_ids.DEFAULT_CLIENT_KEY):
    """`behaviour` with the call tagged and its id echoed first (`identify`)."""
    @functools.wraps(behaviour)
    async def call(request, context):
        identify(context, method, client_key)
        return await behaviour(request, context)

    return call


# A client's deadline ends its call on the client first: gRPC sends the remaining time, which the
# server counts from the call's arrival, so the server's deadline is later by the time the call
# took to arrive (tens of ms on a loaded host), and the call is cancelled before it. A call
# cancelled this close to its deadline was ended by the deadline.
DEADLINE_SLACK_S = 0.05


def expired(context, slack_s: float = 0.0) -> bool:
    """Whether the call's gRPC deadline has passed (within `slack_s` of it)."""
    remaining = context.time_remaining()
    return remaining is not None and remaining <= slack_s


def ended_by_deadline(context) -> bool:
    """For a call cancelled under us: whether its deadline ended it (DEADLINE_SLACK_S), not its client."""
    return expired(context, DEADLINE_SLACK_S)


# Method -> (GrpcFrontend method, request message); the one list of what the service answers.
METHODS = {
    "ServerLive": ("server_live", pb.ServerLiveRequest),
    "ServerReady": ("server_ready", pb.ServerReadyRequest),
    "ModelReady": ("model_ready", pb.ModelReadyRequest),
    "ServerMetadata": ("server_metadata", pb.ServerMetadataRequest),
    "ModelMetadata": ("model_metadata", pb.ModelMetadataRequest),
    "ModelInfer": ("model_infer", pb.ModelInferRequest),
    "ModelConfig": ("model_config", pb.ModelConfigRequest),
    "ModelStatistics": ("model_statistics", pb.ModelStatisticsRequest),
    "RepositoryIndex": ("repository_index", pb.RepositoryIndexRequest),
    "RepositoryModelLoad": ("repository_control", pb.RepositoryModelLoadRequest),
    "RepositoryModelUnload": ("repository_control", pb.RepositoryModelUnloadRequest),
    "SystemSharedMemoryStatus": ("system_shared_memory_status", pb.SystemSharedMemoryStatusRequest),
    "SystemSharedMemoryRegister": ("system_shared_memory_register", pb.SystemSharedMemoryRegisterRequest),
    "SystemSharedMemoryUnregister": ("system_shared_memory_unregister", pb.SystemSharedMemoryUnregisterRequest),
    "CudaSharedMemoryStatus": ("cuda_shared_memory_status", pb.CudaSharedMemoryStatusRequest),
    "CudaSharedMemoryRegister": ("cuda_shared_memory_register", pb.CudaSharedMemoryRegisterRequest),
    "CudaSharedMemoryUnregister": ("cuda_shared_memory_unregister", pb.CudaSharedMemoryUnregisterRequest),
    "TraceSetting": ("trace_setting", pb.TraceSettingRequest),
    "LogSettings": ("log_settings", pb.LogSettingsRequest),
}


def serialize(message) -> bytes:
    return message.SerializeToString()


def method_handlers(servicer) -> grpc.GenericRpcHandler:
    """The unary methods of METHODS, calling `servicer`'s methods of those names (Ray Serve's
    proxy learns the service's methods and messages from it)."""
    handlers = {method: grpc.unary_unary_rpc_method_handler(getattr(servicer, attr),
                                                            request_deserializer=request_cls.FromString,
                                                            response_serializer=serialize)
                for method, (attr, request_cls) in METHODS.items()}
    return grpc.method_handlers_generic_handler(pb.SERVICE, handlers)


class Arrivals(grpc.GenericRpcHandler):
    """The service's handlers; notes each ModelInfer call as gRPC looks up its method, on the
    call's own task, so that a call ended before its handler ran is still counted (GrpcFrontend)."""

    def __init__(self, frontend, handlers: grpc.GenericRpcHandler):
        """frontend: what is told of each arrival, `frontend.arriving(metadata)` (grpc_api.GrpcFrontend)."""
        self.frontend, self.handlers = frontend, handlers

    def service(self, handler_call_details):
        self.frontend.looked_up += 1  # any method's: the server's stop waits for a quiet intake
        handler = self.handlers.service(handler_call_details)
        if handler is not None and handler_call_details.method == route("ModelInfer"):
            self.frontend.arriving(handler_call_details.invocation_metadata)
        return handler


def add_GRPCInferenceServiceServicer_to_server(servicer, server) -> None:
    """Register the service on `server`, as grpcio-tools' generated function of this name does.
    Ray Serve's gRPC proxy takes it by import path (gRPCOptions.grpc_servicer_functions) to learn
    the methods and their message types; it then sends each call to a replica's method of the
    same name (ray_replica.py). ModelStreamInfer is left out: Ray's proxy carries no client stream."""
    server.add_generic_rpc_handlers((method_handlers(servicer),))

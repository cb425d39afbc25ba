"""`boundgen serve ART... --ray [ADDRESS]`: boundgen as a Ray Serve application.

    --ray               start a local Ray instance (this host's CPUs and GPUs) and serve on it
    --ray auto          join the Ray cluster this host belongs to (`ray start --head` / `--address`)
    --ray ray://H:10001 join a cluster through Ray Client

This process is the driver: it starts Serve's proxies (HTTP on --host:--http-port, gRPC on
--grpc-port, on every node, answering KServe v2 as plain `boundgen serve` does), deploys the
application APP_NAME at route "/" whose replicas (ray_replica.Replica) each load every artifact
once (from a path every node can read; the loader checks the manifest's hashes on each node),
prints the same "listening" and "ready" lines as plain serve, and waits for SIGTERM / SIGINT:
then Serve stops the replicas once their requests finish (--drain-timeout-s at most) and the
driver exits 0.

Admission across the hop: each replica keeps plain serve's admission (--max-inflight running,
--max-queue waiting, per model) and tells Ray's router what it holds (`max_ongoing_requests`:
their sum over its models), so the router sends a request only to a replica with room. Requests
that find every replica full wait in Ray's router, at most --max-queue per replica (of
--replicas, or --max-replicas when autoscaling) per proxy (`max_queued_requests`); more are
refused at once with 429 / RESOURCE_EXHAUSTED. (Ray counts a request as queued while it is being
placed too, so a bound of 1 refused concurrent requests that had replicas to go to.) A
request's deadline counts from its arrival at the replica, where admission and the engine
enforce it; a gRPC client's own deadline cancels the call wherever it is (Ray's proxy cancels
the replica's handler).

Faults: Ray restarts a replica that dies (its process exits, or its health check fails);
requests in flight on it get an error from Ray's proxy, the other replicas keep serving.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from boundgen.artifact.manifest import RuntimeConfig, read_manifest
from boundgen.errors import ArtifactError, BoundgenError, ConfigError
from boundgen.server import logs
from boundgen.server.app import LISTENING, EngineFactory
from boundgen.server.config import ServerConfig

APP_NAME = "boundgen"
GRPC_SERVICER = "boundgen.server.kserve.grpc_service.add_GRPCInferenceServiceServicer_to_server"
INSTALL_HINT = "pip install boundgen[ray]"
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"  # read by Ray's HTTP proxy where it starts
PROXY_CALLBACK = "boundgen.server.deploy.ray_proxy.middlewares"


@dataclass(frozen=True)
class RayOptions:
    """How `--ray` deploys: where, how many replicas, what each takes of a node."""

    address: str | None = None  # None: start a local Ray instance; "auto" or "ray://...": join a cluster
    replicas: int = 1  # fixed count, or the initial count when autoscaling
    min_replicas: int | None = None  # both set: autoscale on ongoing requests between them
    max_replicas: int | None = None
    target_ongoing_requests: float | None = None  # per replica; None: what its models run at once
    gpus_per_replica: float | None = None  # None: 1 for artifacts built for CUDA, else 0
    cpus_per_replica: float = 1.0

    def __post_init__(self):
        if self.replicas < 1:
            raise ConfigError(f"--replicas must be >= 1, got {self.replicas}")
        if (self.min_replicas is None) != (self.max_replicas is None):
            raise ConfigError("autoscaling needs both --min-replicas and --max-replicas")
        if self.min_replicas is not None and not 1 <= self.min_replicas <= self.max_replicas:
            raise ConfigError(f"need 1 <= --min-replicas <= --max-replicas, got {self.min_replicas} and "
                              f"{self.max_replicas}")
        if self.target_ongoing_requests is not None and self.target_ongoing_requests <= 0:
            raise ConfigError(f"--target-ongoing-requests must be > 0, got {self.target_ongoing_requests}")
        if self.gpus_per_replica is not None and self.gpus_per_replica < 0:
            raise ConfigError(f"--gpus-per-replica must be >= 0, got {self.gpus_per_replica}")
        if self.cpus_per_replica < 0:
            raise ConfigError(f"--cpus-per-replica must be >= 0, got {self.cpus_per_replica}")

    @property
    def autoscaling(self) -> bool:
        return self.min_replicas is not None


def import_ray():
    """Ray and Ray Serve, or a one-line error saying how to install them. Imported here, on the
    --ray path only: Ray is a large optional dependency that plain `boundgen serve` never needs."""
    try:
        import ray
        from ray import serve
    except ImportError as exc:
        raise BoundgenError(f"--ray needs Ray Serve, which is not installed ({exc}); {INSTALL_HINT}") from None
    return ray, serve


def models_inflight(artifact_dirs: Sequence[str | Path], config: ServerConfig, runtime: dict) -> list[int]:
    """Per artifact, the requests a replica runs at once: --max-inflight, else its request
    contexts (the manifest's RuntimeConfig with `runtime`, serve's runtime flags, over it; the
    defaults when a directory has no manifest)."""
    if config.max_inflight is not None:
        return [config.max_inflight] * len(artifact_dirs)
    out = []
    for path in artifact_dirs:
        try:
            built = read_manifest(Path(path)).runtime
        except (ArtifactError, OSError):
            built = RuntimeConfig()
        out.append(built.replace(**runtime).contexts)
    return out


def default_gpus(artifact_dirs: Sequence[str | Path]) -> float:
    """1 when any artifact was built for CUDA, else 0."""
    for path in artifact_dirs:
        try:
            if str(read_manifest(Path(path)).compile.device).startswith("cuda"):
                return 1.0
        except (ArtifactError, OSError):
            pass
    return 0.0


def deployment_options(artifact_dirs: Sequence[str | Path], config: ServerConfig, options: RayOptions,
                       runtime: dict | None = None) -> dict:
    """`serve.deployment` options: replicas, resources, and Ray's bounds derived from admission's."""
    from ray.serve.config import BackpressureConfig  # --ray path only (import_ray has checked it)

    inflight = models_inflight(artifact_dirs, config, runtime or {})
    capacity = sum(n + config.max_queue for n in inflight)
    gpus = default_gpus(artifact_dirs) if options.gpus_per_replica is None else options.gpus_per_replica
    replicas = options.max_replicas if options.autoscaling else options.replicas
    out = {"max_ongoing_requests": capacity,
           "max_queued_requests": max(1, config.max_queue * replicas),
           "backpressure_config": BackpressureConfig(status_code=429),
           "graceful_shutdown_timeout_s": config.drain_timeout_s,
           "ray_actor_options": {"num_cpus": options.cpus_per_replica, "num_gpus": gpus}}
    if options.autoscaling:
        out["autoscaling_config"] = {"min_replicas": options.min_replicas, "max_replicas": options.max_replicas,
                                     "initial_replicas": min(max(options.replicas, options.min_replicas),
                                                             options.max_replicas),
                                     "target_ongoing_requests": options.target_ongoing_requests or sum(inflight)}
    else:
        out["num_replicas"] = options.replicas
    return out


def serve_on_ray(artifact_dirs: Sequence[str | Path], config: ServerConfig, options: RayOptions,
                 engine_factory: EngineFactory, runtime: dict | None = None, out=sys.stdout) -> int:
    """Deploy on Ray and serve until SIGTERM / SIGINT; the exit code (0 after a clean stop).
    runtime: the RuntimeConfig fields given as serve's flags (they size Ray's bounds; the engine
    factory applies them)."""
    ray, serve = import_ray()
    from ray.serve.config import HTTPOptions, gRPCOptions  # --ray path only

    from boundgen.server.deploy.ray_replica import Replica  # imports ray: --ray path only

    logs.configure(config.log_format, config.log_level)
    if config.http_port == 0 or config.grpc_port == 0:
        raise ConfigError("--ray needs fixed ports: Ray Serve's proxies listen on --http-port and --grpc-port "
                          "on every node (0, any free port, is not supported)")

    def say(message: str) -> None:
        out.write(logs.status_line(message, config.log_format) + "\n")
        out.flush()

    deploy = deployment_options(artifact_dirs, config, options, runtime)
    local = options.address is None
    if local:  # Ray's own HTTP errors as JSON too; its proxy reads this where it starts (ray_proxy.py)
        os.environ.setdefault(PROXY_CALLBACK_ENV, PROXY_CALLBACK)
    init = {"num_cpus": _local_cpus(options)} if local else {"address": options.address}
    say(f"boundgen serve: {'starting a local Ray instance' if local else f'joining Ray at {options.address}'}")
    ray.init(**init, namespace=APP_NAME)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):  # after ray.init, which sets a SIGTERM handler that exits at once
        signal.signal(sig, lambda *_: stop.set())
    try:
        serve.start(http_options=HTTPOptions(host=config.host, port=config.http_port,
                                             keep_alive_timeout_s=max(1, int(config.idle_timeout_s))),
                    grpc_options=gRPCOptions(port=config.grpc_port, grpc_servicer_functions=[GRPC_SERVICER]))
        say(f"{LISTENING} http={config.host}:{config.http_port} grpc={config.host}:{config.grpc_port}")
        replicas = (f"{options.min_replicas}..{options.max_replicas} replicas (autoscaling)" if options.autoscaling
                    else f"{options.replicas} replicas")
        say(f"boundgen serve: deploying {replicas} on Ray, each with {deploy['ray_actor_options']}, "
            f"max ongoing requests {deploy['max_ongoing_requests']}")
        app = serve.deployment(name="Replica", **deploy)(Replica).bind(
            [str(Path(d).resolve()) for d in artifact_dirs], config, engine_factory)
        try:
            serve.run(app, name=APP_NAME, route_prefix="/", blocking=False)
        except Exception as exc:  # Ray's deploy failure; the replicas' own error is in the deployment's status
            raise BoundgenError(f"Ray Serve could not start the replicas: {_replica_error(serve) or exc}") from None
        say(f"boundgen serve: ready on Ray, application {APP_NAME!r}")
        while not stop.wait(1.0):
            pass
        say("boundgen serve: stopping (replicas finish their requests first)")
        serve.delete(APP_NAME)
        serve.shutdown()
        return 0
    finally:
        ray.shutdown()
        say("boundgen serve: stopped")


def _replica_error(serve) -> str:
    """The last line of the traceback Ray keeps for a replica that failed to start (the
    exception's type and message, e.g. a load's ArtifactError), or "" when it has none."""
    try:
        message = serve.status().applications[APP_NAME].deployments["Replica"].message
    except Exception:  # noqa: BLE001 - only a better error message is lost
        return ""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _local_cpus(options: RayOptions) -> int:
    """Logical CPUs of a local instance: this host's, or enough for every replica (Ray schedules by
    these counts, so a small host can still hold the replicas it is asked for)."""
    replicas = options.max_replicas if options.autoscaling else options.replicas
    return max(os.cpu_count() or 1, int(replicas * options.cpus_per_replica + 0.999))

"""`boundgen serve`: KServe v2 over HTTP and gRPC for one or more built artifacts."""

from __future__ import annotations

import argparse
import functools
import os

from boundgen.cli.common import add_runtime_flags, positive_int, runtime_overrides
from boundgen.errors import ConfigError
from boundgen.server.config import API_KEY_ENV, CLIENT_KEYS, DEFAULT_CLIENT_KEY, ServerConfig  # torch-free: --help stays fast

DESCRIPTION = """\
Serves built artifacts with the KServe v2 / Open Inference Protocol over HTTP and gRPC
(tritonclient works unmodified). Model name = artifact name. Each model admits at most
--max-inflight requests at once and queues at most --max-queue more; a full queue answers
429 / RESOURCE_EXHAUSTED, a deadline that passes in the queue 504 / DEADLINE_EXCEEDED.
A request's deadline is its gRPC deadline or its `timeout` parameter (microseconds, as
Triton), else --default-timeout-ms. /v2/health/ready answers 200 once every artifact is
loaded and warmed up. SIGTERM: stop admitting (503 / UNAVAILABLE), finish admitted
requests, exit 0. Prometheus metrics at GET /metrics. --replicas / --gpus: worker processes
behind one front end on this host; --ray: Ray Serve replicas, on one host or a cluster.
See docs/serving.md."""


def register(sub):
    p = sub.add_parser("serve", help="serve artifacts over KServe v2 HTTP and gRPC", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("artifacts", nargs="+", metavar="ARTIFACT_DIR", help="artifact directories built by `boundgen build`")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    p.add_argument("--http-port", type=int, default=8000, help="HTTP port (default 8000; 0 picks a free one)")
    p.add_argument("--grpc-port", type=int, default=8001, help="gRPC port (default 8001; 0 picks a free one)")
    p.add_argument("--max-inflight", type=int, default=None, metavar="N",
                   help="requests running at once per model (default: the artifact's engine concurrency)")
    p.add_argument("--max-queue", type=int, default=32, metavar="N",
                   help="requests waiting per model beyond those; more get 429 at once (default 32)")
    p.add_argument("--refusal-hold-ms", type=float, default=100.0, metavar="MS",
                   help="a full queue's 429 to a client that already has requests waiting in it, or from an "
                        "address refused 8 times within the last MS, is sent MS later, within the request's "
                        "deadline, so that a greedy client's retries do not take the CPU other clients need "
                        "(0: at once; default 100)")
    p.add_argument("--client-key", choices=CLIENT_KEYS, default=DEFAULT_CLIENT_KEY,
                   help="who a request's client is, for the queue's turns: address-id, its X-Client-ID header / "
                        "x-client-id metadata when it sends one, as one of its address's clients, else its "
                        "address: the hosts take turns, then each host's clients (default; clients behind one "
                        "proxy name themselves, and a host that sends many ids gets one turn among the hosts); "
                        "id, the id alone (each id a turn among all); address, its address alone")
    p.add_argument("--default-timeout-ms", type=float, default=1000.0, metavar="MS",
                   help="deadline of a request that brings none (default 1000)")
    p.add_argument("--max-body-bytes", type=int, default=4 << 20, metavar="B",
                   help="largest HTTP body / gRPC message; larger ones get 400 (default 4194304)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' (HTTP header, gRPC metadata 'authorization') on "
                        "every route except /v2/health/live and /v2/health/ready (gRPC ServerLive, ServerReady); "
                        "default: the environment variable BOUNDGEN_API_KEY, else no key")
    p.add_argument("--drain-timeout-s", type=float, default=30.0, metavar="S",
                   help="on SIGTERM, longest wait for admitted requests before exiting (default 30)")
    p.add_argument("--idle-timeout-s", type=float, default=30.0, metavar="S",
                   help="close a connection that has not sent a whole request head for S seconds: idle, "
                        "between requests, or stalled in its headers (HTTP; gRPC: no call open) (default 30)")
    p.add_argument("--read-timeout-s", type=float, default=10.0, metavar="S",
                   help="an HTTP inference body must arrive in full within S seconds, else 408 and the "
                        "connection is closed (default 10)")
    p.add_argument("--max-connections", type=int, default=1024, metavar="N",
                   help="HTTP connections open at once; one more is answered 503 and closed (default 1024)")
    p.add_argument("--log-format", choices=["text", "json"], default="text",
                   help="server log lines as text (default) or one JSON object a line: status lines on stdout, "
                        "log records on stderr (docs/serving.md)")
    p.add_argument("--log-level", choices=["debug", "info", "warning", "error"], default="info",
                   help="least severe log record written to stderr (default info; status lines are always written)")
    p.add_argument("--access-log", action="store_true",
                   help="log one line per inference request: route, status, model, outcome, milliseconds and its "
                        "request id (X-Request-ID / x-request-id, taken from the client or made up, echoed back)")
    p.add_argument("--trust-key", default=None, metavar="KEY",
                   help="Ed25519 public key (PEM, `boundgen keygen`'s OUT.pub): serve only artifacts whose "
                        "manifest.sig is its signature of their manifest.json, checked before anything else is "
                        "read (default: no signature check)")
    p.add_argument("--model-repository", default=None, metavar="DIR",
                   help="allow the repository API's load (HTTP POST /v2/repository/models/NAME/load, gRPC "
                        "RepositoryModelLoad) to serve DIR/NAME, replacing the served NAME without a restart or a "
                        "dropped request; only children of DIR, named as their artifact (default: load refused)")
    p.add_argument("--allow-client-shm", action="store_true",
                   help="let clients on this host register system shared memory regions and pass tensors through "
                        "them (Triton's flag; off: the server never reads a client's memory; docs/serving.md)")
    p.add_argument("--shm-prefix", default="/boundgen", metavar="P",
                   help="with --allow-client-shm: register only shared memory objects whose key starts with P "
                        "('/' allows any; default /boundgen)")
    p.add_argument("--catalogue", action="append", default=None, metavar="NAME=CAT_DIR",
                   help="the catalogue (`boundgen catalogue build`) model NAME, built with --constrained, returns "
                        "items of; required for every such model, refused for any other (repeat per model)")
    p.add_argument("--frontends", type=positive_int, default=None, metavar="N",
                   help="front-end processes that handle the protocols, tokenizing and result encoding around "
                        "one engine process (sharing the ports); 1: everything in this process (default: one per "
                        "four usable cores, 1 to 8, and 1 below four cores or with --model-repository, "
                        "--allow-client-shm, --replicas, --gpus or --ray)")
    p.add_argument("--tokenize-threads", type=positive_int, default=ServerConfig.tokenize_threads, metavar="N",
                   help="with --frontends > 1: each front-end process encodes a request's texts on N threads "
                        "(a score request's ~15 samples at once; default %(default)s)")
    p.add_argument("--frontend-hang-s", type=float, default=ServerConfig.frontend_hang_s, metavar="S",
                   help="with --frontends > 1: a ready front-end process whose event loop has not turned for S "
                        "seconds (it answers the engine process's pings from it; stopped or stuck) is killed and "
                        "restarted, so that its share of new connections does not hang; 0: never, else at "
                        "least 3 (default %(default)g)")
    add_runtime_flags(p, "runtime (override the artifact's manifest without a rebuild; default: as built)")
    group = p.add_mutually_exclusive_group()
    group.add_argument("--replicas", type=int, default=None, metavar="N",
                       help="serve through N worker processes (CPU) behind this front end; each request goes to "
                            "the worker with the fewest in flight. With --ray: N Ray Serve replicas")
    group.add_argument("--gpus", default=None, metavar="all|N|0,2,...",
                       help="one worker process per GPU (CUDA_VISIBLE_DEVICES set to it) behind this front end")
    ray = p.add_argument_group("Ray Serve (--ray; needs `pip install boundgen[ray]`; docs/serving.md)")
    ray.add_argument("--ray", nargs="?", const=LOCAL_RAY, default=None, metavar="ADDRESS",
                     help="serve as a Ray Serve application: --replicas N replicas behind Ray's HTTP and gRPC "
                          "proxies on --http-port / --grpc-port (same KServe v2 protocol). ADDRESS omitted: start "
                          "a local Ray instance; 'auto' or 'ray://HOST:PORT': join that cluster")
    ray.add_argument("--gpus-per-replica", type=float, default=None, metavar="G",
                     help="GPUs each replica takes (default 1 for artifacts built for CUDA, else 0)")
    ray.add_argument("--cpus-per-replica", type=float, default=1.0, metavar="C",
                     help="CPUs each replica takes (default 1)")
    ray.add_argument("--min-replicas", type=int, default=None, metavar="N",
                     help="with --max-replicas: autoscale between N and M replicas on ongoing requests "
                          "(--replicas is then the initial count)")
    ray.add_argument("--max-replicas", type=int, default=None, metavar="M", help="see --min-replicas")
    ray.add_argument("--target-ongoing-requests", type=float, default=None, metavar="R",
                     help="autoscaling: ongoing requests per replica to aim for (default: what its models run "
                          "at once, --max-inflight or the artifacts' contexts)")
    p.set_defaults(run=run)


LOCAL_RAY = ""  # `--ray` without an address: start a local Ray instance
RAY_ONLY_FLAGS = ("gpus_per_replica", "min_replicas", "max_replicas", "target_ongoing_requests")


def config_from_args(args):
    # Set, the environment's key is checked as the flag's is: an empty BOUNDGEN_API_KEY (a secret that failed
    # to be injected) must not serve with no key at all
    api_key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    try:
        return ServerConfig(host=args.host, http_port=args.http_port, grpc_port=args.grpc_port,
                            max_inflight=args.max_inflight, max_queue=args.max_queue,
                            refusal_hold_ms=args.refusal_hold_ms, client_key=args.client_key,
                            default_timeout_ms=args.default_timeout_ms, max_body_bytes=args.max_body_bytes,
                            api_key=api_key, drain_timeout_s=args.drain_timeout_s,
                            idle_timeout_s=args.idle_timeout_s, read_timeout_s=args.read_timeout_s,
                            max_connections=args.max_connections, log_format=args.log_format,
                            log_level=args.log_level,
                            access_log=args.access_log, model_repository=args.model_repository,
                            allow_client_shm=args.allow_client_shm, shm_prefix=args.shm_prefix,
                            tokenize_threads=args.tokenize_threads, frontend_hang_s=args.frontend_hang_s)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def worker_args(args) -> list[str]:
    """The flags of each worker behind a --replicas / --gpus front end. Workers have no default
    deadline of their own: each request brings the front end's remaining time (replica_engine.py).
    They listen on free loopback ports."""
    out = ["--max-queue", str(args.max_queue), "--refusal-hold-ms", str(args.refusal_hold_ms),
           "--max-body-bytes", str(args.max_body_bytes),
           "--drain-timeout-s", str(args.drain_timeout_s), "--default-timeout-ms", "600000"]
    if args.max_inflight is not None:
        out += ["--max-inflight", str(args.max_inflight)]
    if args.trust_key is not None:  # every worker checks the artifacts it loads too
        out += ["--trust-key", os.path.abspath(args.trust_key)]
    out += ["--idle-timeout-s", str(args.idle_timeout_s), "--read-timeout-s", str(args.read_timeout_s),
            "--log-format", args.log_format, "--log-level", args.log_level]  # --access-log: the front end's
    for name, value in runtime_overrides(args).items():  # every worker loads with the same overrides
        flag = "--" + name.replace("_", "-")
        out += [flag if value is True else "--no-" + flag[2:]] if isinstance(value, bool) else [flag, str(value)]
    return out


def run(args, engine_factory=None, worker_command=None):
    """Serve until SIGTERM / SIGINT; `engine_factory(path, **runtime) -> Engine` replaces `boundgen.load`
    (tests; `runtime`: the RuntimeConfig fields given as flags, `runtime_overrides`);
    `worker_command` replaces `python -m boundgen serve` for --replicas / --gpus workers (tests)."""
    import dataclasses

    from boundgen.server.app import default_engine_factory, serve

    for path in args.artifacts:
        if not os.path.isdir(path):
            raise ConfigError(f"{path} is not a directory (expected an artifact built by `boundgen build`)")
    if args.model_repository is not None:
        if not os.path.isdir(args.model_repository):
            raise ConfigError(f"--model-repository {args.model_repository} is not a directory")
        if args.replicas is not None or args.gpus is not None or args.ray is not None:
            raise ConfigError("--model-repository cannot be combined with --replicas / --gpus / --ray: a front end "
                              "does not load artifacts itself (its workers or Ray's replicas do)")
    if args.allow_client_shm and args.ray is not None:
        raise ConfigError("--allow-client-shm cannot be combined with --ray: a region registered through Ray's proxy "
                          "would be known to one replica only")
    config = config_from_args(args)
    factory = engine_factory or default_engine_factory
    overrides = runtime_overrides(args)
    if overrides:
        factory = functools.partial(factory, **overrides)
    catalogues = _catalogues(args)
    if catalogues:
        factory = functools.partial(_with_catalogue, factory, catalogues)
    if args.trust_key is not None:
        factory = _verified(factory, args.trust_key)
    if args.ray is not None:
        return _serve_on_ray(args, config, factory)
    used = [name for name in RAY_ONLY_FLAGS if getattr(args, name) is not None]
    if used or args.cpus_per_replica != 1.0:
        flag = "--" + (used[0] if used else "cpus_per_replica").replace("_", "-")
        raise ConfigError(f"{flag} applies to Ray Serve only; add --ray")
    from boundgen.server.deploy.replicas import exit_with_parent, parse_gpus, serve_replicas

    exit_with_parent()  # a --replicas / --gpus worker: exit with its front end
    if args.replicas is None and args.gpus is None:
        frontends = _frontends(args, engine_factory is None)
        if frontends > 1:
            from boundgen.server.deploy.frontends import serve_frontends

            return serve_frontends(args.artifacts, config, frontends, factory)
        return serve(args.artifacts, config, factory)
    if args.gpus is not None:
        gpus = parse_gpus(args.gpus, _cuda_device_count)
    elif args.replicas < 1:
        raise ConfigError(f"--replicas must be >= 1, got {args.replicas}")
    else:
        gpus = [None] * args.replicas
    # The front end admits (workers' in-flight limit) x (workers) per model, from the workers' own.
    config = dataclasses.replace(config, max_inflight=None)
    return serve_replicas(args.artifacts, config, gpus, worker_args(args), worker_command)


# Flags that need one process serving everything, and why (a --catalogue model is served by front
# ends like any other: its catalogue lives in the engine process, server/deploy/engine_host.py).
SINGLE_PROCESS_FLAGS = {
    "model_repository": "a repository load, of an artifact or of a constrained model's catalogue, replaces "
                        "the model in the process that serves it",
    "allow_client_shm": "a client's shared memory region is mapped by the process that serves it",
    "replicas": "its workers sit behind one front end", "gpus": "its workers sit behind one front end",
    "ray": "Ray Serve runs its own proxies",
}


def _catalogues(args) -> dict[str, str]:
    """--catalogue NAME=CAT_DIR as {model name: directory}, checked against the artifacts'
    manifests before anything loads: every NAME an artifact's, each of them built with
    --constrained, and every constrained artifact given one."""
    from boundgen.artifact.manifest import read_manifest  # torch-free
    from boundgen.artifact.tasks import task_of  # torch-free

    catalogues = {}
    for value in args.catalogue or ():
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise ConfigError(f"--catalogue takes NAME=CAT_DIR (a model name and a catalogue directory), got {value!r}")
        if not os.path.isdir(path):
            raise ConfigError(f"--catalogue {value}: {path} is not a directory (expected `boundgen catalogue build`'s)")
        if name in catalogues:
            raise ConfigError(f"--catalogue names model {name} twice")
        catalogues[name] = path
    constrained = {}
    for path in args.artifacts:
        try:
            manifest = read_manifest(path)
        except Exception:  # noqa: BLE001 - not an artifact: the load says so in its own words
            continue
        constrained[manifest.name] = task_of(manifest.program).constrained(manifest.program)
    for name in catalogues:
        if name not in constrained:
            raise ConfigError(f"--catalogue {name}=...: no artifact is named {name} (models: "
                              f"{', '.join(sorted(constrained)) or 'none'})")
        if not constrained[name]:
            raise ConfigError(f"--catalogue {name}=...: model {name} was not built with --constrained, so it takes "
                              "no catalogue (rebuild it with `boundgen build ... --task beam --constrained`)")
    missing = sorted(name for name, c in constrained.items() if c and name not in catalogues)
    if missing:
        raise ConfigError(f"model {missing[0]} was built with --constrained and has no catalogue: "
                          f"give --catalogue {missing[0]}=CAT_DIR")
    if catalogues and (args.replicas is not None or args.gpus is not None or args.ray is not None):
        raise ConfigError("--catalogue cannot be combined with --replicas / --gpus / --ray yet: serve a "
                          "constrained model from one process")
    return catalogues


def _with_catalogue(factory, catalogues: dict[str, str], path):
    """`factory(path)`, with the engine's catalogue loaded when --catalogue names its model."""
    engine = factory(path)
    if engine.spec.name in catalogues:
        engine.load_catalogue(catalogues[engine.spec.name])
    return engine


def _frontends(args, default_factory: bool) -> int:
    """Front-end processes: --frontends, else one per four cores (frontends.default_frontends), else 1
    where a feature needs everything in one process (SINGLE_PROCESS_FLAGS: a repository load, client
    shared memory). A --catalogue model needs none: its engine process loads the catalogue."""
    single = [name for name in SINGLE_PROCESS_FLAGS if getattr(args, name) not in (None, False)]
    if args.frontends is None:
        if single or not default_factory:
            return 1
        from boundgen.server.deploy.frontends import default_frontends

        return default_frontends()
    if args.frontends > 1 and single:
        raise ConfigError(f"--frontends {args.frontends} cannot be combined with --{single[0].replace('_', '-')} "
                          f"({SINGLE_PROCESS_FLAGS[single[0]]}); use --frontends 1")
    return args.frontends


def _serve_on_ray(args, config, factory):
    from boundgen.server.deploy.ray_serve import RayOptions, import_ray, serve_on_ray

    import_ray()  # not installed: one line saying how, before anything starts
    if args.gpus is not None:
        raise ConfigError("--gpus starts worker processes of this host; with --ray use --replicas N and "
                          "--gpus-per-replica G")
    options = RayOptions(address=args.ray or None, replicas=args.replicas or 1, min_replicas=args.min_replicas,
                         max_replicas=args.max_replicas, target_ongoing_requests=args.target_ongoing_requests,
                         gpus_per_replica=args.gpus_per_replica, cpus_per_replica=args.cpus_per_replica)
    return serve_on_ray(args.artifacts, config, options, factory, runtime=runtime_overrides(args))


def _verified(factory, trust_key: str):
    """`factory`, checking each artifact's signature with `trust_key` before it is loaded. A
    picklable partial: Ray sends it to replicas on other nodes, which read the key file there."""
    from boundgen.artifact.signing import load_public_key

    load_public_key(trust_key)  # a bad key file stops serve before it listens
    return functools.partial(_load_verified, factory, os.path.abspath(trust_key))


def _load_verified(factory, trust_key: str, path):
    from boundgen.artifact.signing import load_public_key, verify

    verify(path, load_public_key(trust_key))
    return factory(path)


def _cuda_device_count() -> int:
    import torch

    return torch.cuda.device_count()

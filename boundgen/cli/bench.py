"""`boundgen bench`: capacity sweep of a workload against boundgen (in process, over gRPC or HTTP) and
the HF transformers peers in the same run; JSON, PNG and markdown into --out.

Runs standalone too (no other subcommand needs to import): `python3 -m boundgen.cli.bench ...`.
This module parses and checks the flags; the run itself (boundgen, then each peer in its own
process, results after every level) is bench/orchestrate.py's.
"""

from __future__ import annotations

import argparse
import math
import shlex
import sys
from pathlib import Path

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.cli.common import DTYPES, add_runtime_flags, runtime_overrides
from boundgen.errors import BoundgenError, ConfigError

EPILOG = """examples:
  boundgen bench --workload W1 --artifact art/w1 --peer models/qwen3-0.6b --profile --diagnostic
  boundgen bench --workload W2,W3 --artifact art/beam --peer models/qwen2.5-0.5b --open-loop-rate auto
  boundgen bench --workload W1 --grpc localhost:8001 --model w1 --model-dir models/qwen3-0.6b
  boundgen bench --workload W2 --http localhost:8000 --model beam --model-dir models/qwen2.5-0.5b --client-procs 4
  boundgen bench --workload W2,W3 --peer models/qwen2.5-0.5b --peer-mode eager,compiled   (peers only)
--artifact also takes an HF model directory: the eager (uncompiled) engine is then measured."""


def register(sub) -> None:
    p = sub.add_parser("bench", help="load generator: capacity sweep vs the HF transformers peer",
                       description=__doc__.split("\n\n")[0], epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(p)
    p.set_defaults(run=run)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workload", required=True, help="W1, W2 or W3, or a comma list sharing one target (W2,W3)")
    target = p.add_mutually_exclusive_group()
    target.add_argument("--artifact", metavar="DIR", help="built artifact (or HF model dir: eager engine) in process")
    target.add_argument("--grpc", metavar="HOST:PORT", help="a running `boundgen serve`, over KServe v2 gRPC")
    target.add_argument("--http", metavar="HOST:PORT", help="a running `boundgen serve`, over KServe v2 HTTP")
    p.add_argument("--model", metavar="NAME", help="model name on the server (with --grpc or --http)")
    p.add_argument("--client-procs", type=int, default=None, metavar="N",
                   help="--grpc/--http: load-generating processes (default: half the cores this bench may use, "
                        "1 to 8)")
    p.add_argument("--check-clients", action=argparse.BooleanOptionalAction, default=None,
                   help="--grpc/--http: rerun the capacity level with twice the client processes and warn if QPS "
                        "moves by 3%% or more (default: on)")
    p.add_argument("--server-cores", metavar="LIST", help="the cores the server runs on (e.g. 0-15), recorded "
                   "with the host")
    p.add_argument("--model-dir", metavar="DIR", help="HF checkpoint for the tokenizer and the model shape "
                   "(default: --peer, else the artifact dir)")
    p.add_argument("--peer", metavar="MODEL_DIR", help="also measure HF transformers on this checkpoint")
    p.add_argument("--peer-mode", default="eager", help="eager, compiled (torch.compile) or both as a comma list, "
                   "each in its own process (default %(default)s)")
    p.add_argument("--peer-max-batch", type=int, default=4, help="requests the peer may put in one call "
                   "(default %(default)s; the compiled beam peer runs one)")
    p.add_argument("--peer-pads", default=None, help="score paddings the peer probes, comma list of bucket, "
                   "longest (default: eager both, compiled bucket)")
    p.add_argument("--peer-compile-mode", default="reduce-overhead", help="torch.compile mode of the compiled peer: "
                   "reduce-overhead (CUDA graphs) or max-autotune (also tunes kernels: minutes more) (default %(default)s)")
    p.add_argument("--concurrency", default="1,2,4,8,16,32,64", help="closed-loop levels, ascending (default %(default)s)")
    p.add_argument("--duration", type=float, default=5.0, help="measured seconds per level (default %(default)s)")
    p.add_argument("--warmup", type=float, default=1.0, help="unmeasured seconds per level (default %(default)s)")
    p.add_argument("--max-requests", type=int, default=20000, help="request cap per level (default %(default)s)")
    p.add_argument("--open-loop-rate", default=None, metavar="R",
                   help="also run open loop (Poisson) at R requests/s; 'auto' = 1.2 x best closed-loop QPS")
    p.add_argument("--pool", type=int, default=64, help="distinct requests per workload (default %(default)s)")
    p.add_argument("--allow-subset", metavar="NAME", help="--grpc, a constrained beam model: every request names "
                   "this subset of its catalogue (ALLOW_SUBSET)")
    p.add_argument("--allow-items", type=int, default=None, metavar="K",
                   help="--grpc, a constrained beam model: every request sends an allow-list of K random items "
                        "of --catalogue (ALLOW_ITEMS), each request of the pool its own")
    p.add_argument("--catalogue", metavar="CAT_DIR", help="with --allow-items: the catalogue the server serves")
    p.add_argument("--seed", type=int, default=0, help="workload seed (default %(default)s)")
    p.add_argument("--out", default="out/bench", help="output directory (default %(default)s)")
    p.add_argument("--profile", action="store_true", help="torch.profiler at the capacity point (boundgen)")
    p.add_argument("--profile-requests", type=int, default=30, help="requests under the profiler (default %(default)s)")
    p.add_argument("--diagnostic", action="store_true", help="W1: 1,024-token request, engine vs its program alone")
    p.add_argument("--fp8-groups", default=None, help="linear groups in FP8 for MFU (default: the engine's spec)")
    add_runtime_flags(p, "engine (in process: override the artifact's runtime settings; default: as built; the "
                         "eager engine: 4 contexts, no batching, no graphs)")
    p.add_argument("--tokenizer", choices=["fast", "fast-joined", "fast-text-by-text", "tokenizers"], default=None,
                   help="artifact only: encode with tiktoken and decode from a byte table where the vocabulary "
                        "allows (fast, the default: a request's texts in one tiktoken call, as fast-joined says; "
                        "fast-text-by-text: one call a text) or with `tokenizers` (same ids and texts; for an A/B)")
    p.add_argument("--lowering", action="append", default=[], metavar="OP=IMPL",
                   help="eager engine only: op lowering, repeatable (default on cuda: Triton attention)")
    p.add_argument("--device", default=None, help="device for the peer and an eager engine (default: cuda if present)")
    p.add_argument("--dtype", default=None, help="dtype for the peer and an eager engine (default: bf16 on cuda)")


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(t) for t in text.split(","))  # an empty level ("1,,2") is an error, not skipped
    except ValueError:
        raise ConfigError(f"--concurrency must be a comma list of integers, got {text!r}") from None
    if not levels or any(c <= 0 for c in levels) or list(levels) != sorted(set(levels)):
        raise ConfigError(f"--concurrency levels must be positive and ascending, got {text!r}")
    return levels


def _default_device(args) -> str:
    if args.device:
        return args.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def _engine(args, specs):
    """(engine, description): the artifact, or the eager engine over an HF model dir, sized for
    every workload in `specs`."""
    from boundgen.cli.common import is_artifact

    overrides = runtime_overrides(args)
    if args.tokenizer is not None:
        overrides["fast_tokenizer"] = args.tokenizer != "tokenizers"
        if args.tokenizer in ("fast-joined", "fast-text-by-text"):
            overrides["joined_tokenizing"] = args.tokenizer == "fast-joined"
    described = "".join(f" {k}={v}" for k, v in overrides.items())
    if is_artifact(args.artifact):
        import boundgen

        return boundgen.load(args.artifact, **overrides), f"boundgen artifact {args.artifact}{described}"
    from boundgen.bench.orchestrate import eager_engine

    device = _default_device(args)
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    lowering = _lowering(args.lowering, device)
    engine = eager_engine(args.artifact, specs, dtype, device, lowering, eager_runtime(args))
    chosen = lowering.describe()
    return engine, f"boundgen eager {args.artifact} {dtype} {device} lowering {chosen}{described}"


def eager_runtime(args):
    """The eager engine's settings: 4 contexts, no batching, no graphs, unless the flags say otherwise."""
    return RuntimeConfig(contexts=4).replace(**runtime_overrides(args))


def _lowering(pairs, device: str):
    from boundgen.ops.lowering import OpLowering

    chosen = {"packed_attention": "triton", "prefix_attention": "triton"} if device.startswith("cuda") else {}
    for pair in pairs:
        op, sep, impl = pair.partition("=")
        if not sep:
            raise ConfigError(f"--lowering takes OP=IMPL, got {pair!r}")
        chosen[op.strip()] = impl.strip()
    return OpLowering.from_dict(chosen)


def run(args) -> int:
    # bench/ is imported here, not at the top: `boundgen --help` and the other subcommands need none of it
    from boundgen.bench import orchestrate, runner
    from boundgen.bench.clients import default_client_procs
    from boundgen.bench.workloads import get_workload

    names = [w.strip() for w in args.workload.split(",") if w.strip()]
    if len(set(names)) != len(names):
        raise ConfigError(f"--workload names a workload twice: {args.workload!r}")
    try:
        specs = [get_workload(n) for n in names]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    _check_numbers(args)
    if len({s.task for s in specs}) != 1:
        raise ConfigError("workloads given together must share a task (one target serves them all)")
    remote = args.grpc or args.http
    if not (args.artifact or remote or args.peer):
        raise ConfigError("nothing to measure: give --artifact, --grpc or --http (boundgen), --peer, or both")
    modes = [m.strip() for m in args.peer_mode.split(",") if m.strip()]
    if not modes or any(m not in ("eager", "compiled") for m in modes):
        raise ConfigError(f"--peer-mode takes eager, compiled or both (eager,compiled), got {args.peer_mode!r}")
    if remote and not args.model:
        raise ConfigError(f"--{'grpc' if args.grpc else 'http'} needs --model NAME (the model's name on the server)")
    if (args.profile or args.diagnostic) and remote:
        raise ConfigError("--profile and --diagnostic measure the in-process engine: use --artifact")
    if not remote and (args.client_procs is not None or args.check_clients):
        raise ConfigError("--client-procs and --check-clients drive a server: use them with --grpc or --http")
    if args.client_procs is not None and args.client_procs < 1:
        raise ConfigError(f"--client-procs must be at least 1, got {args.client_procs}")
    procs = (args.client_procs or default_client_procs()) if remote else 1
    _check_target(args, specs)
    filters = _filters(args, specs)
    cfg = runner.BenchConfig(concurrencies=parse_levels(args.concurrency), duration_s=args.duration,
                             warmup_s=args.warmup, max_requests=args.max_requests,
                             open_loop_rate=args.open_loop_rate, seed=args.seed)
    tok_dir = args.model_dir or args.peer or args.artifact
    if not tok_dir:
        raise ConfigError("with --grpc or --http, pass --model-dir (or --peer) for the tokenizer that sizes the "
                          "workloads")
    command = "boundgen bench " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:])
    plan = orchestrate.Plan(specs=tuple(specs), config=cfg, out=Path(args.out), tokenizer_dir=tok_dir,
                            client_procs=procs, peer_modes=tuple(modes), command=command, filters=filters)
    return orchestrate.run(args, plan, load_engine=_engine)


def _check_target(args, specs) -> None:
    """What the flags say of the engine, checked before anything loads: a device and dtype it can take,
    an artifact of the workloads' task (each was found only once loaded, and recorded as a system that
    failed: exit 1 and a results file saying "not measured")."""
    from boundgen.artifact.manifest import read_manifest
    from boundgen.artifact.tasks import task_of
    from boundgen.cli.common import check_device, check_model_path, is_artifact

    if args.artifact:
        check_model_path(args.artifact)  # "has no tokenizer.json" said of a path that does not exist
    if args.device is not None:
        check_device(args.device)
    if args.dtype is not None and args.dtype not in DTYPES:
        raise ConfigError(f"--dtype must be one of {', '.join(DTYPES)}, got {args.dtype!r}")
    if args.artifact and is_artifact(args.artifact):
        built = task_of(read_manifest(Path(args.artifact)).program)
        if built is not task_of(specs[0]):
            raise ConfigError(f"workload {specs[0].name} is a {specs[0].task} workload, and {args.artifact} is a "
                              f"{built.name} artifact")


def _check_numbers(args) -> None:
    """The sweep's numbers, before anything is loaded or measured (a bad open-loop rate was found
    only after the whole closed-loop sweep)."""
    if not (math.isfinite(args.duration) and args.duration > 0):
        raise ConfigError(f"--duration must be a positive number of seconds, got {args.duration}")
    if not (math.isfinite(args.warmup) and args.warmup >= 0):
        raise ConfigError(f"--warmup must be zero or more seconds, got {args.warmup}")
    for flag, value in (("--max-requests", args.max_requests), ("--pool", args.pool)):
        if value < 1:
            raise ConfigError(f"{flag} must be at least 1, got {value}")
    rate = args.open_loop_rate
    if rate is not None and rate != "auto":
        try:
            number = float(rate)
        except ValueError:
            number = math.nan
        if not (math.isfinite(number) and number > 0):
            raise ConfigError(f"--open-loop-rate takes a positive number of requests/s or 'auto', got {rate!r}")


def _filters(args, specs) -> dict | None:
    """A constrained model's filters for every request (--allow-subset, --allow-items), checked."""
    from boundgen.artifact.tasks import task_named
    from boundgen.bench import runner

    if args.allow_subset is None and args.allow_items is None:
        if args.catalogue is not None:
            raise ConfigError("--catalogue is for --allow-items")
        return None
    if not args.grpc or not task_named(specs[0].task).takes_catalogue:
        raise ConfigError("--allow-subset and --allow-items filter a constrained beam model served over --grpc")
    filters = {}
    if args.allow_subset is not None:
        filters["allow_subset"] = args.allow_subset
    if args.allow_items is not None:
        if args.allow_items < 1 or not args.catalogue:
            raise ConfigError("--allow-items K needs K >= 1 and --catalogue CAT_DIR (the served catalogue)")
        filters["allow_lists"] = runner.allow_lists(args.catalogue, args.allow_items, args.pool, args.seed)
    return filters


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m boundgen.cli.bench", description=__doc__.splitlines()[0],
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    if argv is None:  # a real process: as `boundgen` does, preload libstdc++ where AOTI loads need it
        from boundgen.runtime.libstdcxx import reexec_with_preload

        reexec_with_preload()
    args = parser.parse_args(argv)
    try:
        return int(run(args) or 0)
    except BoundgenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    from boundgen.bench.orchestrate import abandon_stuck_threads

    exit_code = main()
    abandon_stuck_threads(exit_code)
    sys.exit(exit_code)

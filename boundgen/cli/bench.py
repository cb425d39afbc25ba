"""`boundgen bench`: capacity sweep of a workload against boundgen (in process, over gRPC or HTTP) and
the HF transformers peers in the same run; JSON, PNG and markdown into --out.

Runs standalone too (no other subcommand needs to import): `python3 -m boundgen.cli.bench ...`.
Order: boundgen on every workload given (profile, diagnostic), engine closed, then each peer mode
(`--peer-mode eager,compiled`) in its own process on the same workloads (bench/peer_process.py:
every shape warmed, its best padding and requests per call), so boundgen and a peer never share
the device or the process. With `--peer` and none of `--artifact`, `--grpc`, `--http`, only the peers
run. Results are written after every level, so an interrupted run keeps what finished.
A server (--grpc, --http) is driven from --client-procs processes (bench/clients.py), which then
check themselves at the capacity point; every result records its host (bench/host.py).
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from boundgen.cli.common import add_runtime_flags, runtime_overrides
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
    p.add_argument("--seed", type=int, default=0, help="workload seed (default %(default)s)")
    p.add_argument("--out", default="out/bench", help="output directory (default %(default)s)")
    p.add_argument("--profile", action="store_true", help="torch.profiler at the capacity point (boundgen)")
    p.add_argument("--profile-requests", type=int, default=30, help="requests under the profiler (default %(default)s)")
    p.add_argument("--diagnostic", action="store_true", help="W1: 1,024-token request, engine vs model node alone")
    p.add_argument("--fp8-groups", default=None, help="linear groups in FP8 for MFU (default: the engine's spec)")
    add_runtime_flags(p, "engine (in process: override the artifact's runtime settings; default: as built; the "
                         "eager engine: 4 contexts, no batching, no graphs)")
    p.add_argument("--tokenizer", choices=["fast", "fast-joined", "tokenizers"], default=None,
                   help="artifact only: encode with tiktoken and decode from a byte table where the vocabulary "
                        "allows (fast, the default; fast-joined: a request's texts in one call) or with `tokenizers` "
                        "(same ids and texts; for an A/B)")
    p.add_argument("--lowering", action="append", default=[], metavar="OP=IMPL",
                   help="eager engine only: op lowering, repeatable (default on cuda: Triton attention)")
    p.add_argument("--device", default=None, help="device for the peer and an eager engine (default: cuda if present)")
    p.add_argument("--dtype", default=None, help="dtype for the peer and an eager engine (default: bf16 on cuda)")


def parse_levels(text: str) -> tuple[int, ...]:
    try:
        levels = tuple(int(t) for t in text.split(",") if t.strip())
    except ValueError:
        raise ConfigError(f"--concurrency must be a comma list of integers, got {text!r}") from None
    if not levels or any(c <= 0 for c in levels) or list(levels) != sorted(set(levels)):
        raise ConfigError(f"--concurrency levels must be positive and ascending, got {text!r}")
    return levels


def _progress(line: str) -> None:
    print(f"[bench] {line}", file=sys.stderr, flush=True)


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
        if args.tokenizer == "fast-joined":
            overrides["joined_tokenizing"] = True
    described = "".join(f" {k}={v}" for k, v in overrides.items())
    if is_artifact(args.artifact):
        import boundgen

        return boundgen.load(args.artifact, **overrides), f"boundgen artifact {args.artifact}{described}"
    from boundgen.programs.eager import eager_engine

    device = _default_device(args)
    dtype = args.dtype or ("bfloat16" if device.startswith("cuda") else "float32")
    spec, max_tokens = specs[0], max(s.max_tokens for s in specs)
    pspec = _PROGRAM_SPECS[spec.task](spec, args.artifact, max_tokens, bool(args.batching))
    lowering = _lowering(args.lowering, device)
    engine = eager_engine(args.artifact, pspec, dtype, device, contexts=args.contexts or 4,
                          cuda_graphs=bool(args.cuda_graphs), lowering=lowering, batching=bool(args.batching))
    chosen = lowering.describe()
    return engine, f"boundgen eager {args.artifact} {dtype} {device} lowering {chosen}{described}"


def _score_program_spec(spec, model_dir: str, max_tokens: int, batching: bool):
    """The eager engine's score program for workload `spec`."""
    from boundgen.artifact.program import ScoreSpec
    from boundgen.text.tokenizer import Tokenizer

    ids = Tokenizer.from_dir(model_dir).label_token_ids(spec.labels)
    calls = 4 if batching else 1  # requests one model call may hold
    return ScoreSpec(labels=spec.labels, label_token_ids=ids, max_samples=calls * spec.samples,
                     max_tokens_per_sample=max_tokens, max_total_tokens=calls * spec.samples * max_tokens)


def _beam_program_spec(spec, model_dir: str, max_tokens: int, batching: bool):
    """The eager engine's beam program for workload `spec`."""
    from boundgen.artifact.program import BeamSpec
    from boundgen.model.loader import default_stop_tokens

    return BeamSpec(width=spec.width, steps=spec.steps, stop_token_ids=default_stop_tokens(model_dir),
                    min_new_tokens=spec.steps, max_prompt_tokens=max_tokens, max_requests=8 if batching else 1)


_PROGRAM_SPECS = {"score": _score_program_spec, "beam": _beam_program_spec}  # by task name (artifact/tasks.py)


def _lowering(pairs, device: str):
    from boundgen.errors import ConfigError
    from boundgen.ops.lowering import OpLowering

    chosen = {"packed_attention": "triton", "prefix_attention": "triton"} if device.startswith("cuda") else {}
    for pair in pairs:
        op, sep, impl = pair.partition("=")
        if not sep:
            raise ConfigError(f"--lowering takes OP=IMPL, got {pair!r}")
        chosen[op.strip()] = impl.strip()
    return OpLowering.from_dict(chosen)


def _check_engine_matches(engine, spec) -> None:
    from boundgen.artifact.tasks import task_of
    from boundgen.bench.tasks import bench_task

    es = engine.spec.program
    if task_of(es) is not task_of(spec):
        raise ConfigError(f"workload {spec.name} is a {spec.task} workload but the engine is a {es.task} model")
    differs = bench_task(spec.task).mismatch(es, spec)
    if differs:
        _progress(f"WARNING: {differs}")


def run(args) -> int:
    from boundgen.bench import report, runner
    from boundgen.bench.clients import default_client_procs
    from boundgen.bench.host import host_record
    from boundgen.bench.workloads import get_workload, load_tokenizer, make_requests

    names = [w.strip() for w in args.workload.split(",") if w.strip()]
    try:
        specs = [get_workload(n) for n in names]
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
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
    cfg = runner.BenchConfig(concurrencies=parse_levels(args.concurrency), duration_s=args.duration,
                             warmup_s=args.warmup, max_requests=args.max_requests,
                             open_loop_rate=args.open_loop_rate, seed=args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok_dir = args.model_dir or args.peer or args.artifact
    if not tok_dir:
        raise ConfigError("with --grpc or --http, pass --model-dir (or --peer) for the tokenizer that sizes the "
                          "workloads")
    tokenizer = load_tokenizer(tok_dir)
    command = "boundgen bench " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:])
    results = {}
    for spec in specs:
        _progress(f"{spec.name}: generating {args.pool} requests (seed {args.seed}) with the tokenizer of {tok_dir}")
        requests = make_requests(spec, tokenizer, args.pool, args.seed)
        shape, source = runner.model_shape(spec, [args.model_dir, args.peer, args.artifact])
        results[spec.name] = {
            "workload": runner.workload_header(spec, requests, shape, args.seed, source), "date": runner.now_utc(),
            "env": runner.environment(), "host": host_record(procs, args.server_cores).to_dict(),
            "command": command, "systems": {}, "diagnostic": None, "profiles": {},
            "_requests": requests, "_shape": shape}

    def save(name, plot=False):
        r = {k: v for k, v in results[name].items() if not k.startswith("_")}
        report.write_json(out / f"bench_{name}.json", r)
        (out / f"summary_{name}.md").write_text(report.markdown_workload(r))
        if plot:
            report.plot_latency([r], out / f"latency_{name}.png")

    for spec in specs:
        save(spec.name)
    try:
        if args.artifact or remote:
            _run_boundgen(args, specs, cfg, results, out, save, tokenizer, procs)
        for mode in modes if args.peer else ():
            _run_peer(args, mode, tok_dir, specs, results, out, save)
    except KeyboardInterrupt:
        for spec in specs:
            save(spec.name, plot=True)
        _progress(f"interrupted: what finished is in {out}")
        abandon_stuck_threads(130)
        raise
    for spec in specs:
        save(spec.name, plot=True)
    final = [{k: v for k, v in results[s.name].items() if not k.startswith("_")} for s in specs]
    print(report.markdown_summary(final))
    _progress(f"wrote {', '.join(f'bench_{s.name}.json' for s in specs)} and plots to {out}")
    abandon_stuck_threads(0)
    return 0


def _run_boundgen(args, specs, cfg, results, out, save, tokenizer, procs: int) -> None:
    from boundgen.bench import mfu, runner
    from boundgen.bench.clients import ClientSetup
    from boundgen.bench.tasks import bench_task

    remote = args.grpc or args.http
    engine, target, fp8, clients = None, None, (), None
    try:
        if remote:
            target_spec, target = runner.remote_target(specs[0].task, grpc=args.grpc, http=args.http, model=args.model)
            clients = ClientSetup(target_spec, procs, check=args.check_clients is not False)
            engine = target_spec.build()  # this process's own, for the warm-up calls
        else:
            _progress(f"loading {args.artifact}")
            engine, target = _engine(args, specs)
            _check_engine_matches(engine, specs[0])
            engine.warmup()
            fp8 = tuple(engine.spec.fp8_groups)
    except Exception as exc:
        for spec in specs:
            results[spec.name]["systems"]["boundgen"] = {"target": target if remote else args.artifact,
                                                         "error": f"{type(exc).__name__}: {exc}"}
            save(spec.name)
        _progress(f"boundgen could not start: {type(exc).__name__}: {exc}")
        return
    if args.fp8_groups is not None:
        fp8 = tuple(g for g in args.fp8_groups.split(",") if g)
    for spec in specs:
        res = results[spec.name]
        call = engine if remote else runner.engine_call(engine, spec)
        device = runner.device_name(None if remote else engine)
        work = runner.work_function(spec, res["_shape"], fp8, mfu.peaks_for(device))
        if work is None:
            _progress(f"{spec.name}: no effective MFU: the peak of {device or 'this device'} is not known")
        _progress(f"{spec.name}: boundgen ({target})")
        system = runner.run_system(call, res["_requests"], cfg, target=target, work_of=work, progress=_progress,
                                   on_update=_saver(res, "boundgen", save, spec.name, fp8_groups=list(fp8)),
                                   client_setup=clients)
        if args.profile and not system.get("error"):
            _profile(spec, res, call, system, out, save, args.profile_requests)
        if args.diagnostic and bench_task(spec.task).diagnostic:
            _diagnostic(engine, tokenizer, res, save, spec)
    close = getattr(engine, "close", None)
    if close:
        close()


def _saver(res, system_name, save, workload, **extra):
    def on_update(partial):
        res["systems"][system_name] = {**partial, **extra}
        save(workload)

    return on_update


def _profile(spec, res, call, system, out, save, n_requests: int) -> None:
    from boundgen.bench.profile import profile_markdown, profile_requests

    cap = (system.get("sweep") or {}).get("capacity")
    c = cap["concurrency"] if cap else 1
    _progress(f"{spec.name}: profiling {n_requests} requests at concurrency {c}")
    try:
        summary = profile_requests(call, res["_requests"], concurrency=c, n_requests=n_requests,
                                   trace_path=out / f"trace_{spec.name}_boundgen.json.gz")
        name = f"profile_{spec.name}_boundgen.md"
        (out / name).write_text(profile_markdown(f"{spec.name} boundgen at c={c}", summary))
        res["profiles"]["boundgen"] = name
        res["profile_summary"] = {k: v for k, v in summary.items() if k != "top_cpu_ops"}
    except Exception as exc:
        res["profiles"]["boundgen"] = f"failed: {type(exc).__name__}: {exc}"
    save(spec.name)


def _diagnostic(engine, tokenizer, res, save, spec) -> None:
    from boundgen.bench.diagnostic import fixed_request, run_diagnostic

    _progress(f"{spec.name}: diagnostic, fixed 1,024-token request, engine vs model node")
    try:
        res["diagnostic"] = run_diagnostic(engine, fixed_request(tokenizer))
    except Exception as exc:
        res["diagnostic"] = {"error": f"{type(exc).__name__}: {exc}"}
    save(spec.name)


def _run_peer(args, mode, tok_dir, specs, results, out, save) -> None:
    from boundgen.bench.peer_process import run_in_subprocess

    _progress(f"{','.join(s.name for s in specs)}: peer {mode} from {args.peer}, in its own process")
    argv = ["--peer", args.peer, "--mode", mode, "--workload", ",".join(s.name for s in specs),
            "--tokenizer", str(tok_dir), "--pool", str(args.pool), "--seed", str(args.seed),
            "--concurrency", args.concurrency, "--duration", str(args.duration), "--warmup", str(args.warmup),
            "--max-requests", str(args.max_requests), "--max-batch", str(args.peer_max_batch),
            "--compile-mode", args.peer_compile_mode]
    for flag, value in (("--open-loop-rate", args.open_loop_rate), ("--device", args.device),
                        ("--dtype", args.dtype), ("--pads", args.peer_pads)):
        if value is not None:
            argv += [flag, str(value)]
    data = run_in_subprocess(argv, out / f"peer_{mode}_{'_'.join(s.name for s in specs)}.json")
    for spec in specs:
        system = data["workloads"].get(spec.name) or {"target": args.peer, "error": data.get("error")
                                                      or "the peer process ended before this workload"}
        if data.get("interrupted"):
            system = {**system, "error": data["error"]}
        results[spec.name]["systems"][f"peer_{mode}"] = {**system, "process": data["command"]}
        save(spec.name)
    if data.get("interrupted"):
        raise KeyboardInterrupt


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


def abandon_stuck_threads(code: int) -> None:
    """If a load-generator thread is still inside the target (a hung request, an interrupt), exit
    now with `code`, skipping interpreter teardown, which would abort in native code under that
    thread. Results are on disk by then. Returns when no such thread is alive."""
    import os
    import threading

    if any(t.name.startswith("bench-") and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


if __name__ == "__main__":
    exit_code = main()
    abandon_stuck_threads(exit_code)
    sys.exit(exit_code)

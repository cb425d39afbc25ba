"""One `boundgen bench` run: every workload given, boundgen first, then each peer; results into --out.

Order: boundgen on every workload given (profile, diagnostic), engine closed, then each peer mode
(`--peer-mode eager,compiled`) in its own process on the same workloads (bench/peer_process.py:
every shape warmed, its best padding and requests per call), so boundgen and a peer never share
the device or the process. With `--peer` and none of `--artifact`, `--grpc`, `--http`, only the peers
run. Results are written after every level, so an interrupted run keeps what finished.
A server (--grpc, --http) is driven from --client-procs processes (bench/clients.py), which then
check themselves at the capacity point; every result records its host (bench/host.py).

cli/bench.py parses and checks the flags and hands them here with what it derived from them
(`Plan`); one system under one workload is bench/runner.py's.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.artifact.tasks import task_of
from boundgen.bench import mfu, report, runner, workloads
from boundgen.bench.clients import ClientSetup
from boundgen.bench.host import host_record
from boundgen.bench.peer_process import run_in_subprocess
from boundgen.bench.tasks import bench_task
from boundgen.bench.workloads import WorkloadSpec
from boundgen.errors import ConfigError


@dataclass(frozen=True)
class Plan:
    """What the flags decided: the workloads (one task), the sweep, where results go, how many
    client processes drive a server (1 in process) and which peer modes follow."""
    specs: tuple[WorkloadSpec, ...]
    config: runner.BenchConfig
    out: Path
    tokenizer_dir: str
    client_procs: int
    peer_modes: tuple[str, ...]
    command: str  # the command line, recorded with every result
    filters: dict | None = None  # a constrained model's filters sent with every request (runner.remote_target)


def progress(line: str) -> None:
    print(f"[bench] {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, plan: Plan, load_engine: Callable) -> int:
    """args: the bench's flags (cli/bench.py); load_engine(args, specs) -> (engine, description)."""
    specs, out, remote = plan.specs, plan.out, args.grpc or args.http
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = workloads.load_tokenizer(plan.tokenizer_dir)
    results = {}
    for spec in specs:
        progress(f"{spec.name}: generating {args.pool} requests (seed {args.seed}) with the tokenizer of "
                 f"{plan.tokenizer_dir}")
        requests = workloads.make_requests(spec, tokenizer, args.pool, args.seed)
        shape, source = runner.model_shape(spec, [args.model_dir, args.peer, args.artifact])
        results[spec.name] = {
            "workload": runner.workload_header(spec, requests, shape, args.seed, source), "date": runner.now_utc(),
            "env": runner.environment(), "host": host_record(plan.client_procs, args.server_cores).to_dict(),
            "command": plan.command, "systems": {}, "diagnostic": None, "profiles": {},
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
            _run_boundgen(args, plan, results, save, tokenizer, load_engine)
        for mode in plan.peer_modes if args.peer else ():
            _run_peer(args, mode, plan, results, save)
    except KeyboardInterrupt:
        for spec in specs:
            save(spec.name, plot=True)
        progress(f"interrupted: what finished is in {out}")
        abandon_stuck_threads(130)
        raise
    for spec in specs:
        save(spec.name, plot=True)
    final = [{k: v for k, v in results[s.name].items() if not k.startswith("_")} for s in specs]
    print(report.markdown_summary(final))
    progress(f"wrote {', '.join(f'bench_{s.name}.json' for s in specs)} and plots to {out}")
    # A system that failed before measuring anything fails the run (exit 1), whatever the JSON holds
    failed = [f"{spec.name} {system}: {entry['error']}" for spec, r in zip(specs, final)
              for system, entry in r["systems"].items() if entry.get("error") and not entry.get("sweep")]
    status = 1 if failed or not any(r["systems"] for r in final) else 0
    if status:
        progress("not measured: " + ("; ".join(failed) or "no system ran"))
    abandon_stuck_threads(status)
    return status


def _run_boundgen(args, plan: Plan, results, save, tokenizer, load_engine: Callable) -> None:
    specs, remote = plan.specs, args.grpc or args.http
    engine, target, fp8, clients = None, None, (), None
    try:
        if remote:
            target_spec, target = runner.remote_target(specs[0].task, grpc=args.grpc, http=args.http, model=args.model,
                                                       filters=plan.filters)
            clients = ClientSetup(target_spec, plan.client_procs, check=args.check_clients is not False)
            engine = target_spec.build()  # this process's own, for the warm-up calls
        else:
            progress(f"loading {args.artifact}")
            engine, target = load_engine(args, specs)
            check_engine_matches(engine, specs[0])
            engine.warmup()
            fp8 = tuple(engine.spec.fp8_groups)
    except Exception as exc:
        for spec in specs:
            results[spec.name]["systems"]["boundgen"] = {"target": target if remote else args.artifact,
                                                         "error": f"{type(exc).__name__}: {exc}"}
            save(spec.name)
        progress(f"boundgen could not start: {type(exc).__name__}: {exc}")
        return
    if args.fp8_groups is not None:
        fp8 = tuple(g for g in args.fp8_groups.split(",") if g)
    for spec in specs:
        res = results[spec.name]
        call = engine if remote else runner.engine_call(engine, spec)
        device = runner.device_name(None if remote else engine)
        work = runner.work_function(spec, res["_shape"], fp8, mfu.peaks_for(device))
        if work is None:
            progress(f"{spec.name}: no effective MFU: the peak of {device or 'this device'} is not known")
        progress(f"{spec.name}: boundgen ({target})")
        system = runner.run_system(call, res["_requests"], plan.config, target=target, work_of=work,
                                   progress=progress,
                                   on_update=_saver(res, "boundgen", save, spec.name, fp8_groups=list(fp8)),
                                   client_setup=clients)
        if args.profile and not system.get("error"):
            _profile(spec, res, call, system, plan.out, save, args.profile_requests)
        if args.diagnostic and bench_task(spec.task).diagnostic:
            _diagnostic(engine, tokenizer, res, save, spec)
    close = getattr(engine, "close", None)
    if close:
        close()


def eager_engine(model_dir: str, specs: Sequence[WorkloadSpec], dtype: str, device: str, lowering,
                 runtime: RuntimeConfig):
    """The eager (uncompiled) engine over an HF model dir, sized for every workload in `specs`,
    with the engine settings `runtime`."""
    # torch and the model: imported only when an eager engine is asked for
    from boundgen.programs import eager

    spec, max_tokens = specs[0], max(s.max_tokens for s in specs)
    pspec = _PROGRAM_SPECS[spec.task](spec, model_dir, max_tokens, runtime.batching)
    return eager.eager_engine(model_dir, pspec, dtype, device, lowering=lowering, runtime=runtime)


def _score_program_spec(spec: WorkloadSpec, model_dir: str, max_tokens: int, batching: bool):
    """The eager engine's score program for workload `spec`."""
    from boundgen.artifact.program import ScoreSpec
    from boundgen.text.tokenizer import Tokenizer  # torch: only when an eager engine is asked for

    ids = Tokenizer.from_dir(model_dir).label_token_ids(spec.labels)
    calls = 4 if batching else 1  # requests one model call may hold
    return ScoreSpec(labels=spec.labels, label_token_ids=ids, max_samples=calls * spec.samples,
                     max_tokens_per_sample=max_tokens, max_total_tokens=calls * spec.samples * max_tokens)


def _beam_program_spec(spec: WorkloadSpec, model_dir: str, max_tokens: int, batching: bool):
    """The eager engine's beam program for workload `spec`."""
    from boundgen.artifact.program import BeamSpec
    from boundgen.model.loader import default_stop_tokens  # torch: only when an eager engine is asked for

    return BeamSpec(width=spec.width, steps=spec.steps, stop_token_ids=default_stop_tokens(model_dir),
                    min_new_tokens=spec.steps, max_prompt_tokens=max_tokens, max_requests=8 if batching else 1)


_PROGRAM_SPECS = {"score": _score_program_spec, "beam": _beam_program_spec}  # by task name (artifact/tasks.py)


def check_engine_matches(engine, spec: WorkloadSpec) -> None:
    es = engine.spec.program
    if task_of(es) is not task_of(spec):
        raise ConfigError(f"workload {spec.name} is a {spec.task} workload but the engine is a {es.task} model")
    differs = bench_task(spec.task).mismatch(es, spec)
    if differs:
        progress(f"WARNING: {differs}")


def _saver(res, system_name, save, workload, **extra):
    def on_update(partial):
        res["systems"][system_name] = {**partial, **extra}
        save(workload)

    return on_update


def _profile(spec, res, call, system, out: Path, save, n_requests: int) -> None:
    from boundgen.bench.profile import profile_markdown, profile_requests  # torch.profiler: only when asked

    cap = (system.get("sweep") or {}).get("capacity")
    c = cap["concurrency"] if cap else 1
    progress(f"{spec.name}: profiling {n_requests} requests at concurrency {c}")
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

    progress(f"{spec.name}: diagnostic, fixed 1,024-token request, engine vs its program alone")
    try:
        res["diagnostic"] = run_diagnostic(engine, fixed_request(tokenizer))
    except Exception as exc:
        res["diagnostic"] = {"error": f"{type(exc).__name__}: {exc}"}
    save(spec.name)


def _run_peer(args, mode: str, plan: Plan, results, save) -> None:
    specs, names = plan.specs, ",".join(s.name for s in plan.specs)
    progress(f"{names}: peer {mode} from {args.peer}, in its own process")
    argv = ["--peer", args.peer, "--mode", mode, "--workload", names,
            "--tokenizer", str(plan.tokenizer_dir), "--pool", str(args.pool), "--seed", str(args.seed),
            "--concurrency", args.concurrency, "--duration", str(args.duration), "--warmup", str(args.warmup),
            "--max-requests", str(args.max_requests), "--max-batch", str(args.peer_max_batch),
            "--compile-mode", args.peer_compile_mode]
    for flag, value in (("--open-loop-rate", args.open_loop_rate), ("--device", args.device),
                        ("--dtype", args.dtype), ("--pads", args.peer_pads)):
        if value is not None:
            argv += [flag, str(value)]
    data = run_in_subprocess(argv, plan.out / f"peer_{mode}_{'_'.join(s.name for s in specs)}.json")
    for spec in specs:
        system = data["workloads"].get(spec.name) or {"target": args.peer, "error": data.get("error")
                                                      or "the peer process ended before this workload"}
        if data.get("interrupted"):
            system = {**system, "error": data["error"]}
        results[spec.name]["systems"][f"peer_{mode}"] = {**system, "process": data["command"]}
        save(spec.name)
    if data.get("interrupted"):
        raise KeyboardInterrupt


def abandon_stuck_threads(code: int) -> None:
    """If a load-generator thread is still inside the target (a hung request, an interrupt), exit
    now with `code`, skipping interpreter teardown, which would abort in native code under that
    thread. Results are on disk by then. Returns when no such thread is alive."""
    if any(t.name.startswith("bench-") and t.is_alive() for t in threading.enumerate()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

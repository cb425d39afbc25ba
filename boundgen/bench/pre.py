"""What `pre` costs on this host's CPU: a workload's requests tokenized and packed, stage by stage.

`pre` is the engine's first stage (runtime/local_engine.py): `RequestPacker.encode` on the
caller's thread, before a request queues for the GPU. Its stages, each timed over the same pool
of the workload's requests (bench/workloads.py), best and median of `rounds` passes:

    check      texts are strings with content                    Tokenizer.check_texts
    template   the artifact's template around each text          Template.render (W1: none)
    ids        token ids into one array (the tiktoken calls)     Tokenizer.token_array
    ids, lists the same through a Python list a text             Tokenizer.reference_token_array
    pack       positions and cu_seqlens around the ids           tokenizer._packed
    pre        all of it, bounds included                        RequestPacker.encode

for each encoder mode: text by text (one tiktoken call a text) and joined (a request's texts in
one call, the engines' default). Then `pre` as the engine sees it under load, a mean a request:
C threads encoding back to back (C callers in process), one thread beside a thread that runs
Python without pause (a server's event loop): tiktoken lets go of the GIL during each call, and
getting it back waits behind such a thread (up to sys.getswitchinterval()), and one thread whose
caches another pass has just emptied (`--evict-mb` copied before each request): what a request
costs after a model call, not in a loop of encodes. tiktoken looks every piece up in a hash map
of the ~150k-token vocabulary; a loop keeps it in cache, a served request rarely finds it there
(on a 2-core AMD EPYC 0.51 ms a W1 request hot, 1.37 ms after a 64 MB copy).

    python -m boundgen.bench.pre [--artifact ART | --tokenizer DIR] [--workload W1] [--threads N] [--json OUT]

Without --artifact, a score spec with the workload's labels and no template; without a
tokenizer directory, the real Qwen vocabulary (text/vocab.py, needs the `bench` extra).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from boundgen.artifact.manifest import read_manifest
from boundgen.artifact.program import ScoreSpec
from boundgen.artifact.tasks import task_named
from boundgen.bench.host import host_record
from boundgen.bench.loadgen import nearest_rank
from boundgen.bench.workloads import get_workload, make_requests
from boundgen.runtime.requests import RequestPacker
from boundgen.text.template import Template
from boundgen.text.tokenizer import Tokenizer, pack_arrays

MODES = {"text by text": False, "joined": True}


def stage_times(packer: RequestPacker, pool: Sequence[list[str]], rounds: int = 20) -> dict[str, dict]:
    """{stage: {"ms": best, "median_ms", "cpu_ms": best CPU time of this thread}} a request, over `pool`
    (with a tokenizer of several threads their work is not in this thread's CPU time)."""
    tok, spec = packer.tokenizer, packer.bounds
    template = Template(spec.template)
    names = [f"sample {i}" for i in range(max(len(t) for t in pool))]
    rendered = [t if template.is_identity else [template.render(x) for x in t] for t in pool]
    arrays = [tok.token_array(list(t)) for t in rendered]
    stages: dict[str, Callable[[int], object]] = {
        "check": lambda i: tok.check_texts(pool[i], names),
        "template": lambda i: pool[i] if template.is_identity else [template.render(x) for x in pool[i]],
        "ids": lambda i: tok.token_array(rendered[i]),
        "ids, lists": lambda i: tok.reference_token_array(rendered[i]),
        "pack": lambda i: pack_arrays(*arrays[i]),
        "pre": lambda i: packer.encode(pool[i]),
    }
    wall = {name: [] for name in stages}
    cpu = {name: [] for name in stages}
    for _ in range(rounds):  # stages interleaved, so that a noisy moment costs each alike
        for name, run in stages.items():
            w0, c0 = time.perf_counter(), time.thread_time()
            for i in range(len(pool)):
                run(i)
            cpu[name].append((time.thread_time() - c0) / len(pool) * 1e3)
            wall[name].append((time.perf_counter() - w0) / len(pool) * 1e3)
    return {name: {"ms": min(wall[name]), "median_ms": statistics.median(wall[name]), "cpu_ms": min(cpu[name])}
            for name in stages}


def loaded_pre(packer: RequestPacker, pool: Sequence[list[str]], threads: int, busy: bool = False,
               per_thread: int = 200) -> dict:
    """`pre` (RequestPacker.encode, wall time) with `threads` threads encoding back to back,
    `busy`: beside one more thread running Python without pause. Mean and P99 ms a request."""
    times: list[float] = []
    lock, stop = threading.Lock(), threading.Event()

    def caller(k: int) -> None:
        mine = []
        for j in range(per_thread):
            texts = pool[(k * per_thread + j) % len(pool)]
            t0 = time.perf_counter()
            packer.encode(texts)
            mine.append((time.perf_counter() - t0) * 1e3)
        with lock:
            times.extend(mine)

    def spin() -> None:
        n = 0
        while not stop.is_set():
            n += 1

    spinner = threading.Thread(target=spin, daemon=True) if busy else None
    if spinner:
        spinner.start()
    callers = [threading.Thread(target=caller, args=(k,)) for k in range(threads)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    stop.set()
    if spinner:
        spinner.join()
    times.sort()
    return {"threads": threads, "busy_thread": busy, "mean_ms": statistics.fmean(times),
            "p99_ms": nearest_rank(times, 99)}


def cold_pre(packer: RequestPacker, pool: Sequence[list[str]], evict_mb: int = 64, requests: int = 100) -> dict:
    """`pre` (wall time) of one thread right after `evict_mb` MB were copied through the caches, as a
    request meets them after a model call: mean and P99 ms a request."""
    src = np.ones(evict_mb << 20, np.uint8)
    dst = np.empty_like(src)
    times = []
    for j in range(requests):
        np.copyto(dst, src)
        t0 = time.perf_counter()
        packer.encode(pool[j % len(pool)])
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return {"evict_mb": evict_mb, "mean_ms": statistics.fmean(times), "p99_ms": nearest_rank(times, 99)}


def measure(source: Path | None, artifact: bool, workload: str = "W1", requests: int = 64, rounds: int = 20,
            concurrency: Sequence[int] = (1, 2, 4, 8), threads: int = 1, evict_mb: int = 64) -> dict:
    """Stage times and loaded `pre` of `workload`'s requests for each encoder mode; `threads`: a
    request's texts encoded on that many threads (`serve --tokenize-threads`)."""
    work = get_workload(workload)
    if not artifact and task_named(work.task).one_prompt:
        raise ValueError(f"{workload} is a {work.task} workload: give its artifact (--artifact), whose spec says "
                         "the bounds a prompt is packed to")
    if source is None:
        source = _qwen_tokenizer_dir()
    result = {"workload": workload, "host": host_record().to_dict(), "source": str(source), "threads": threads,
              "modes": {}}
    for mode, joined in MODES.items():
        tok = Tokenizer.from_dir(source, joined=joined, threads=threads)
        spec = read_manifest(source).program if artifact else ScoreSpec(
            labels=work.labels, label_token_ids=tok.label_token_ids(work.labels), max_samples=work.samples)
        pool = [list(r.texts) for r in make_requests(work, tok, requests)]
        packer = RequestPacker(tok, spec)
        for texts in pool[:8]:  # warm: the first calls build tiktoken's thread-local state
            packer.encode(texts)
        result["tokens_a_request"] = statistics.fmean(sum(len(x) for x in tok.ids(t)) for t in pool)
        result["modes"][mode] = {
            "encoder": tok.encoder_name, "stages": stage_times(packer, pool, rounds),
            "loaded": [loaded_pre(packer, pool, c) for c in concurrency] + [loaded_pre(packer, pool, 1, busy=True)],
            "cold": cold_pre(packer, pool, evict_mb) if evict_mb > 0 else None,
        }
    return result


def _qwen_tokenizer_dir() -> Path:
    from boundgen.text.vocab import write_qwen_tokenizer  # needs transformers + qwen-tokenizer (the bench extra)

    out = Path(tempfile.mkdtemp(prefix="boundgen-pre-"))
    write_qwen_tokenizer(out)
    return out


def report(result: dict) -> str:
    host = result["host"]
    lines = [f"# pre of {result['workload']} ({result['tokens_a_request']:.0f} tokens a request), "
             f"{host['cpu_model']}, {host['bench_core_count']} cores, {result['threads']} tokenizing "
             f"thread{'s' if result['threads'] > 1 else ''} a request", ""]
    for mode, m in result["modes"].items():
        lines += [f"## {mode} ({m['encoder']})", "", "| stage | best ms | median ms | CPU ms (this thread) |",
                  "|---|---:|---:|---:|"]
        lines += [f"| {name} | {s['ms']:.3f} | {s['median_ms']:.3f} | {s['cpu_ms']:.3f} |"
                  for name, s in m["stages"].items()]
        lines += ["", "| pre under load | mean ms | P99 ms |", "|---|---:|---:|"]
        lines += [f"| {x['threads']} thread{'s' if x['threads'] > 1 else ''}"
                  f"{' beside a busy Python thread' if x['busy_thread'] else ''} | {x['mean_ms']:.3f} "
                  f"| {x['p99_ms']:.3f} |" for x in m["loaded"]]
        if m.get("cold"):
            lines.append(f"| 1 thread, caches emptied first ({m['cold']['evict_mb']} MB copied) "
                         f"| {m['cold']['mean_ms']:.3f} | {m['cold']['p99_ms']:.3f} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m boundgen.bench.pre", description=__doc__.split("\n\n")[0])
    where = p.add_mutually_exclusive_group()
    where.add_argument("--artifact", type=Path, help="a score artifact: its tokenizer, template and bounds")
    where.add_argument("--tokenizer", type=Path, help="a directory with a tokenizer.json (a checkpoint)")
    p.add_argument("--workload", default="W1")
    p.add_argument("--requests", type=int, default=64, help="distinct requests in the pool")
    p.add_argument("--rounds", type=int, default=20, help="passes over the pool a stage (best and median)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8], help="threads for pre under load")
    p.add_argument("--threads", type=int, default=1, help="threads a request's texts are encoded on "
                   "(serve --tokenize-threads; in process: 1)")
    p.add_argument("--evict-mb", type=int, default=64, help="MB copied before each request of the cold-cache "
                   "row (0: no such row)")
    p.add_argument("--json", type=Path, help="also write the result here")
    args = p.parse_args(argv)
    result = measure(args.artifact or args.tokenizer, args.artifact is not None, args.workload, args.requests,
                     args.rounds, args.concurrency, args.threads, args.evict_mb)
    print(report(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

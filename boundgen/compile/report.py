"""`python -m boundgen.compile.report ARTIFACT_DIR [...]`: what a build produced and how it loads.

Per artifact, one markdown table row: task, device and GPU, dtype, lowering, weights mode,
build seconds (export / compile / total), size, load seconds in this process (manifest and
hash checks included), first and warm request latency, and validation's worst error per
output. Used by scripts/gpu_served.sh (REPORT=1) and to fill docs/build.md. Re-executes itself with the
system libstdc++ preloaded where loading would crash (runtime/libstdcxx.py), like the CLI.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from boundgen.artifact.tasks import task_of
from boundgen.ops.lowering import describe

HEADER = ("| artifact | task | target | dtype | lowering | weights | export s | compile s | build s | size MiB "
          "| load s | first call ms | warm call ms | validation (worst error per output) |")


def worst_errors(validation: dict) -> str:
    """"probs 3.0e-08" per float output (max over cases), "token_ids 100% identical rows" per id
    output, "token_ids 97% same candidates" (min over cases)."""
    errors: dict[str, float] = {}
    rows: dict[str, float] = {}
    overlap: dict[str, float] = {}
    for case in validation["cases"]:
        for name, out in case["outputs"].items():
            if "max_abs_err" in out:
                err = float(out["max_abs_err"])  # "nan" / "inf" are recorded as strings
                if not err <= errors.get(name, 0.0):
                    errors[name] = err
            elif "identical_rows" in out:
                rows[name] = min(rows.get(name, 1.0), out["identical_rows"])
            if "candidate_overlap" in out:
                overlap[name] = min(overlap.get(name, 1.0), out["candidate_overlap"])
    parts = ([f"{k} {v:.1e}" for k, v in errors.items()] + [f"{k} {v:.0%} identical rows" for k, v in rows.items()]
             + [f"{k} {v:.0%} same candidates" for k, v in overlap.items()])
    return ("passed: " if validation["passed"] else "FAILED: ") + ", ".join(parts)


def measure(artifact: Path, requests: int = 5) -> dict:
    # Lazy: main() re-executes the process with libstdc++ preloaded before torch may load.
    import torch

    import boundgen

    manifest = json.loads((artifact / "manifest.json").read_text())
    cuda = str(manifest["compile"]["device"]).startswith("cuda")
    if cuda:
        torch.cuda.init()  # CUDA context creation is not the artifact's load time
    start = time.perf_counter()
    engine = boundgen.load(artifact)
    load_s = time.perf_counter() - start
    program = engine.spec.program
    task = task_of(program)
    texts = task.sample_texts(program)
    times = []
    for _ in range(requests):
        start = time.perf_counter()
        task.call(engine, texts)
        if cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    compiled = manifest["compile"]
    lowering = describe(compiled["lowering"])
    size = sum(p.stat().st_size for p in artifact.rglob("*") if p.is_file())
    seconds = compiled["seconds"]
    target = compiled["device"] + (f" ({compiled['gpu_name']})" if compiled.get("gpu_name") else "")
    return {"artifact": artifact.name, "task": manifest["task"], "target": target, "dtype": compiled["dtype"],
            "lowering": lowering, "weights": compiled["weights"], "export_s": seconds.get("export"),
            "compile_s": seconds.get("compile"), "build_s": seconds.get("total"), "size_mib": round(size / 2**20, 1),
            "load_s": round(load_s, 2), "first_call_ms": round(times[0] * 1e3, 2),
            "warm_call_ms": round(min(times[1:] or times) * 1e3, 2),
            "validation": worst_errors(manifest["validation"])}


def main(argv=None) -> int:
    from boundgen.runtime.libstdcxx import reexec_with_preload

    if argv is None:
        reexec_with_preload()
    parser = argparse.ArgumentParser(prog="python -m boundgen.compile.report", description=__doc__.split("\n")[0])
    parser.add_argument("artifacts", nargs="+", metavar="ARTIFACT_DIR")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    args = parser.parse_args(argv)
    rows = [measure(Path(a)) for a in args.artifacts]
    print(HEADER)
    print("|" + " --- |" * HEADER.count(" | ") + " --- |")
    for r in rows:
        print("| " + " | ".join(str(v) for v in r.values()) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

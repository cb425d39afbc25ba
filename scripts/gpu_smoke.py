"""Survey on the GPU, one request at a time: the eager engine (torch vs Triton attention, with and
without CUDA graphs), built artifacts found under ART_DIR (with and without graphs), and the HF
peer. Usage: PYTHONPATH=. python3 scripts/gpu_smoke.py OUT_DIR [MODELS_DIR [ART_DIR]]"""

import json
import sys
import time
from pathlib import Path

import torch

import boundgen

from boundgen.bench.peer import HFPeer, peer_call
from boundgen.bench.workloads import get_workload, load_tokenizer, make_requests
from boundgen.model.demo import write_demo_checkpoint
from boundgen.ops.lowering import OpLowering
from boundgen.artifact.program import BeamSpec, ScoreSpec
from boundgen.programs.eager import eager_engine
from boundgen.model.loader import default_stop_tokens

out_dir = Path(sys.argv[1])
models = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/models")
art_root = Path(sys.argv[3]) if len(sys.argv) > 3 else None
results = {}


def log(*a):
    print(f"[{time.strftime('%H:%M:%S')}]", *a, flush=True)


def timed(call, requests, reps):
    for r in requests[:3]:
        call(r)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for i in range(reps):
        call(requests[i % len(requests)])
    return (time.perf_counter() - t0) / reps * 1e3


for preset in ("qwen3-0.6b", "qwen2.5-0.5b"):
    if not (models / preset / "config.json").is_file():
        t0 = time.perf_counter()
        write_demo_checkpoint(models / preset, preset, seed=0)
        log("demo", preset, f"{time.perf_counter() - t0:.1f}s")

for wl in ("W1", "W2", "W3"):
    spec_w = get_workload(wl)
    model_dir = models / spec_w.preset
    tok = load_tokenizer(model_dir)
    reqs = make_requests(spec_w, tok, 16, seed=0)
    if spec_w.task == "score":
        spec = ScoreSpec(labels=spec_w.labels, label_token_ids=tok.label_token_ids(spec_w.labels), max_samples=16,
                         max_tokens_per_sample=512, max_total_tokens=4096)
        call_of = lambda e: (lambda r: e.score(r.texts))
    else:
        spec = BeamSpec(width=spec_w.width, steps=spec_w.steps, stop_token_ids=default_stop_tokens(model_dir),
                        min_new_tokens=spec_w.steps, max_prompt_tokens=512)
        call_of = lambda e: (lambda r: e.beam(r.texts[0]))
    ref = None
    for attn in ("torch", "triton"):
        for graphs in (False, True):
            key = f"{wl} boundgen-eager attn={attn} graphs={graphs}"
            try:
                lowering = OpLowering(packed_attention=attn, prefix_attention=attn)
                eng = eager_engine(str(model_dir), spec, "bfloat16", "cuda", lowering=lowering, cuda_graphs=graphs)
                call = call_of(eng)
                ms = timed(call, reqs, 30)
                r0 = call(reqs[0])
                vals = r0.scores
                if ref is None:
                    ref = vals
                diff = float(abs(vals - ref).max())
                results[key] = {"ms": ms, "max_diff_vs_first": diff}
                log(key, f"{ms:.2f} ms/request", f"diff {diff:.3g}", r0.timings)
                del eng
                torch.cuda.empty_cache()
            except Exception as exc:  # keep going: this is a survey
                results[key] = {"error": repr(exc)[:500]}
                log(key, "FAILED", repr(exc)[:500])
    for art in sorted(art_root.glob("*")) if art_root else []:
        if not (art / "manifest.json").is_file() or json.loads((art / "manifest.json").read_text())["program"]["task"] != spec_w.task:
            continue
        for graphs in (False, True):
            key = f"{wl} artifact={art.name} graphs={graphs}"
            try:
                t0 = time.perf_counter()
                eng = boundgen.load(str(art), cuda_graphs=graphs)
                load_s = time.perf_counter() - t0
                call = call_of(eng)
                ms = timed(call, reqs, 30)
                r0 = call(reqs[0])
                diff = float(abs(r0.scores - ref).max()) if ref is not None else float("nan")
                results[key] = {"ms": ms, "max_diff_vs_first": diff, "load_s": load_s}
                log(key, f"{ms:.2f} ms/request", f"diff {diff:.3g}", f"load {load_s:.1f}s", r0.timings)
                eng.close()
                del eng
                torch.cuda.empty_cache()
            except Exception as exc:
                results[key] = {"error": repr(exc)[:500]}
                log(key, "FAILED", repr(exc)[:500])
    peer = HFPeer(str(model_dir))
    ms = timed(peer_call(peer, spec_w), reqs, 10)
    results[f"{wl} HF peer"] = {"ms": ms}
    log(wl, "HF peer", f"{ms:.2f} ms/request")
    peer.close()

(out_dir / "smoke.json").write_text(json.dumps(results, indent=1))

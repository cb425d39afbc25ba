"""`boundgen demo`: the README's first command. On CPU, end to end: write a tiny random-weight
Qwen3 checkpoint (real vocabulary), build a score, a beam and a constrained beam artifact and a
small catalogue of items for the last, serve all three, query them with tritonclient over HTTP
and gRPC, print results and latencies, stop the server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from boundgen.errors import BoundgenError, ConfigError

SCORE_TEXTS = ["query: running shoes | item: lightweight trail running shoe", "query: running shoes | item: desk lamp",
               "query: 咖啡 | item: 拿铁咖啡"]
BEAM_PROMPT = "query: running shoes -> item id:"
# The catalogue of the constrained model: items by title, tokenized when the catalogue is built.
ITEMS = {101: "trail running shoe", 102: "running shoe", 103: "desk lamp", 104: "coffee mug", 105: "yoga mat",
         106: "water bottle", 107: "rain jacket", 108: "latte"}
ALLOW = [101, 103, 105]  # a per-request allow-list (ALLOW_ITEMS)
SUBSETS = {"shoes": [101, 102], "home": [103, 104, 106]}  # registered with the catalogue (ALLOW_SUBSET)


def register(sub):
    p = sub.add_parser("demo", help="build, serve and query a tiny demo model on CPU (the README's first command)",
                       description=__doc__)
    p.add_argument("--out", default="out/demo", help="working directory (default out/demo)")
    p.add_argument("--requests", type=int, default=20, help="requests per protocol for the latency lines")
    p.set_defaults(run=run)


def _step(msg):
    print(f"[demo] {msg}", flush=True)


def _boundgen(*args):
    cmd = [sys.executable, "-m", "boundgen", *args]
    _step("$ boundgen " + " ".join(f'"{a}"' if " " in a or not a else a for a in args))
    if subprocess.run(cmd).returncode != 0:
        raise BoundgenError(f"`boundgen {args[0]}` failed (see its output above)")


def _wait_ready(proc, http_port, timeout_s=300):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise BoundgenError(f"the server exited with status {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/v2/health/ready", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise BoundgenError(f"the server was not ready within {timeout_s} s")


def run(args):
    from boundgen.server.deploy.launch import free_port  # lazy: `boundgen --help` must not import the server

    if args.requests < 1:  # before the builds, which take minutes
        raise ConfigError(f"--requests must be at least 1, got {args.requests}")
    out = Path(args.out)
    model, score_art, beam_art = out / "tiny-qwen3", out / "score-art", out / "beam-art"
    if not (model / "config.json").is_file():
        _boundgen("demo-model", str(model), "--preset", "tiny-qwen3", "--seed", "0")
    if not (score_art / "manifest.json").is_file():
        _boundgen("build", str(model), "--task", "score", "--labels", " yes", " no", "--name", "demo-score",
                  "--max-samples", "16", "--max-tokens-per-sample", "128", "--max-total-tokens", "512",
                  "--out", str(score_art))
    if not (beam_art / "manifest.json").is_file():
        _boundgen("build", str(model), "--task", "beam", "--width", "8", "--steps", "4", "--name", "demo-beam",
                  "--max-prompt-tokens", "128", "--out", str(beam_art))
    cbeam_art, catalogue = out / "cbeam-art", out / "catalogue"
    if not (cbeam_art / "manifest.json").is_file():
        _boundgen("build", str(model), "--task", "beam", "--constrained", "--width", "4", "--steps", "4",
                  "--name", "demo-cbeam", "--max-prompt-tokens", "128", "--out", str(cbeam_art))
    meta = catalogue / "catalogue.json"
    if not meta.is_file() or "subsets" not in json.loads(meta.read_text()):  # absent, or an earlier demo's
        items = out / "items.jsonl"
        items.write_text("".join(json.dumps({"item_id": i, "text": t, "subsets": _subsets_of(i)}) + "\n"
                                 for i, t in ITEMS.items()))
        _boundgen("catalogue", "build", str(items), "--tokenizer", str(cbeam_art), "--max-depth", "4",
                  "--out", str(catalogue), "--force")
    http_port, grpc_port = free_port(), free_port()
    cmd = [sys.executable, "-m", "boundgen", "serve", str(score_art), str(beam_art), str(cbeam_art),
           "--catalogue", f"demo-cbeam={catalogue}", "--http-port", str(http_port), "--grpc-port", str(grpc_port)]
    _step(f"starting the server: HTTP :{http_port}, gRPC :{grpc_port}")
    proc = subprocess.Popen(cmd, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        _wait_ready(proc, http_port)
        _step("server ready")
        _query(http_port, grpc_port, args.requests)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
        _step(f"server stopped (exit status {proc.returncode})")
    return 0


def _query(http_port, grpc_port, n):
    import numpy as np
    import tritonclient.grpc as grpcclient
    import tritonclient.http as httpclient

    clients = {"HTTP": (httpclient, httpclient.InferenceServerClient(f"127.0.0.1:{http_port}")),
               "gRPC": (grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}"))}
    for proto, (mod, client) in clients.items():
        def infer(model, texts, outputs):
            inp = mod.InferInput("TEXT", [len(texts)], "BYTES")
            inp.set_data_from_numpy(np.array([t.encode() for t in texts], dtype=object))
            return client.infer(model, [inp], outputs=[mod.InferRequestedOutput(o) for o in outputs])

        res = infer("demo-score", SCORE_TEXTS, ["SCORES"])
        _step(f"{proto} score  (labels ' yes', ' no'):")
        for text, row in zip(SCORE_TEXTS, res.as_numpy("SCORES")):
            print(f"    [{', '.join(f'{p:.4f}' for p in row)}]  {text}")
        res = infer("demo-beam", [BEAM_PROMPT], ["TOKEN_IDS", "SCORES", "TEXT_OUT"])
        _step(f"{proto} beam   (W=8, N=4), best 3 of 8 for {BEAM_PROMPT!r}:")
        for ids, score, text in list(zip(res.as_numpy("TOKEN_IDS"), res.as_numpy("SCORES"),
                                         res.as_numpy("TEXT_OUT")))[:3]:
            print(f"    {score:9.4f}  {ids.tolist()}  {text.decode()!r}")
        for allow, subset in ((None, None), (ALLOW, None), (None, "shoes")):
            _constrained(mod, client, proto, allow, subset)
        for model, texts, outs in (("demo-score", SCORE_TEXTS, ["SCORES"]), ("demo-beam", [BEAM_PROMPT], ["SCORES"])):
            times = []
            for _ in range(n):
                t0 = time.perf_counter()
                infer(model, texts, outs)
                times.append((time.perf_counter() - t0) * 1e3)
            _step(f"{proto} {model}: {n} requests, mean {np.mean(times):.1f} ms, "
                  f"p50 {np.percentile(times, 50):.1f} ms, max {max(times):.1f} ms (CPU, tiny model)")


def _subsets_of(item: int) -> list[str]:
    return [name for name, members in SUBSETS.items() if item in members]


def _constrained(mod, client, proto, allow, subset):
    """The constrained model's candidates (each an item of the catalogue), with an allow-list, a
    named subset, or neither."""
    import numpy as np

    text = mod.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([BEAM_PROMPT.encode()], dtype=object))
    inputs = [text]
    if allow is not None:
        items = mod.InferInput("ALLOW_ITEMS", [len(allow)], "INT64")
        items.set_data_from_numpy(np.asarray(allow, dtype=np.int64))
        inputs.append(items)
    if subset is not None:
        named = mod.InferInput("ALLOW_SUBSET", [1], "BYTES")
        named.set_data_from_numpy(np.array([subset.encode()], dtype=object))
        inputs.append(named)
    res = client.infer("demo-cbeam", inputs)
    by_name = f", ALLOW_SUBSET {subset!r} {SUBSETS[subset]}" if subset else ""
    _step(f"{proto} constrained beam (W=4, N=4) over {len(ITEMS)} items{f', ALLOW_ITEMS {allow}' if allow else ''}"
          f"{by_name}:")
    for item, score, out in zip(res.as_numpy("ITEM_IDS"), res.as_numpy("SCORES"), res.as_numpy("TEXT_OUT")):
        print(f"    item {int(item):4d}  {score:9.4f}  {out.decode()!r}" if item >= 0 else "    (no more items)")

"""Constrained beam search end to end: what a catalogue costs a request, beside the plain search.

A constrained beam artifact (`boundgen build --task beam --constrained`) is loaded with its
catalogue in process, as `boundgen beam ARTIFACT --catalogue CAT_DIR` loads it; the catalogue's
load onto the device is timed on its own (and its device memory counted on CUDA; with CUDA
graphs that first load also allocates every context's trie buffers and captures the graphs,
runtime/local_engine.py). The prompts
are a workload's request pool (bench/workloads.py: W2 by default, 64-token prompts, made with
the artifact's tokenizer), sent one at a time (c = 1) after a warm-up, through `engine.beam`:
the user's in-process path (tokenize, the trie inputs of the request, the program, the results).

Rows (ms a request: mean, p50, p99 by nearest rank; `model`: the program call alone, mean; `pre`:
the engine's stage before the call, tokenizing and the request's trie inputs, so an allow-list's
derivation, mean):
- constrained: the whole catalogue;
- constrained, allow-list of K: a seeded random K items of the catalogue a request (the same
  list for every request, one int64 array as a served ALLOW_ITEMS arrives: a Python list of
  ids would add its conversion), derived into the request's trie inputs as serving does; the
  derivation alone is timed apart too (`derive_ms`: `ServedCatalogue.trie(ids)`, mean, after
  the device finished it, as a request waits for it);
- constrained, subset NAME of K: each named subset registered with the catalogue (ALLOW_SUBSET;
  its trie inputs derived at load, so a request derives nothing); a made catalogue registers
  one, `sampleK`, of the very ids of the allow-list row (`--subset-items`), so the two rows
  compare one filter sent as ids and as a name;
- where the artifact replays CUDA graphs (built with --cuda-graphs, on CUDA), both rows are named
  ", CUDA graphs" and followed by the same two loaded again with `cuda_graphs=False`
  (", no CUDA graphs"): the graphs' gain, told apart from the constraint's cost;
- plain (`--plain ARTIFACT`, an unconstrained beam artifact of the same checkpoint): the same
  prompts, so that one run shows the constraint's cost beside the search it restricts (with and
  without its CUDA graphs, likewise).

Every candidate is checked against the catalogue on the host, outside the timing: its token ids
(less a final stop token) must lead to the trie node of the item_id it carries, and under an
allow-list that item must be in the list. Slots with item -1 (fewer items reachable than W) are
counted apart. For the plain rows the column says how many candidates happen to spell an item.

`--make-catalogue DIR --items N --model-dir MODEL` writes a random catalogue instead (no data
needed): N distinct codes of `--code-length` tokens drawn from token ids [0, --code-vocab)
(bench/catalogue.py's generator: 4-token codes over a 32k-token code vocabulary), item i the
i-th code, recorded with MODEL's tokenizer so that its artifacts accept it, with the subset
`sampleK` (K = --subset-items, 0: none); with
`--titles`, sequences shaped like titles cut to --code-length tokens instead (Zipf-distributed
tokens: nodes of thousands of children, as a real-vocabulary title catalogue has; a tenth of
them shorter, ended by the artifact's stop token), e.g. `--titles --code-vocab 151643 --code-length
5` over Qwen's ordinary tokens.

    python -m boundgen.bench.constrained --make-catalogue CAT_DIR --items 1000000 --model-dir MODEL
    python -m boundgen.bench.constrained ART_CONSTRAINED --catalogue CAT_DIR --plain ART_BEAM \
        [--requests 64] [--allow-items 10000] [--json OUT.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

import boundgen
from boundgen.bench.catalogue import random_codes, title_codes
from boundgen.bench.loadgen import nearest_rank
from boundgen.bench.workloads import get_workload, load_tokenizer, make_requests
from boundgen.errors import BoundgenError
from boundgen.text.catalogue import Catalogue
from boundgen.text.catalogue_items import tokenizer_identity
from boundgen.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class Row:
    """One search over the request pool: latencies and what its candidates were."""

    search: str
    latencies_ms: list[float]
    model_ms: list[float]
    candidates: int
    missing: int  # slots with item -1 (constrained); 0 for the plain search
    items_ok: int  # constrained: candidates whose tokens name their item (within the allow-list);
    # plain: candidates whose tokens spell some catalogue item
    pre_ms: list[float] = dataclasses.field(default_factory=list)  # the engine's `pre`: tokenize, trie inputs

    @property
    def valid(self) -> int:
        return self.candidates - self.missing

    def to_dict(self) -> dict:
        ms = sorted(self.latencies_ms)
        return {"search": self.search, "requests": len(ms), "mean_ms": statistics.fmean(ms),
                "p50_ms": nearest_rank(ms, 50), "p99_ms": nearest_rank(ms, 99),
                "model_mean_ms": statistics.fmean(self.model_ms),
                "pre_mean_ms": statistics.fmean(self.pre_ms) if self.pre_ms else float("nan"),
                "candidates": self.candidates,
                "missing": self.missing, "items_ok": self.items_ok,
                "items_fraction": self.items_ok / self.valid if self.valid else float("nan")}


# -- a random catalogue ----------------------------------------------------------------------

def make_catalogue(out_dir: str | Path, items: int, model_dir: str | Path, code_length: int = 4,
                   code_vocab: int = 32768, seed: int = 0, titles: bool = False, subset_items: int = 0) -> dict:
    """Write a catalogue of `items` random distinct codes (item i: the i-th) for MODEL's tokenizer;
    returns its metadata (catalogue.json) with the seconds it took. titles: sequences shaped like
    titles instead (bench/catalogue.py `title_codes`: Zipf-distributed tokens, some shorter);
    subset_items K: register the subset `sampleK`, random_allow_list(K) of the same seed."""
    start = time.perf_counter()
    tokenizer = Tokenizer.from_dir(model_dir)
    if code_vocab > tokenizer.vocab_size:
        raise ValueError(f"--code-vocab {code_vocab} exceeds {model_dir}'s vocabulary of {tokenizer.vocab_size} tokens")
    codes = (title_codes(items, code_length, code_vocab, seed) if titles
             else random_codes(items, code_length, code_vocab, seed).tolist())
    cat = Catalogue.from_sequences(np.arange(items), codes, tokenizer_identity(tokenizer))
    if subset_items:
        cat = cat.with_subsets({f"sample{subset_items}": random_allow_list(cat, subset_items, seed)})
    meta = cat.save(out_dir)
    return {**meta, "seconds": round(time.perf_counter() - start, 3)}


# -- the searches ----------------------------------------------------------------------------

def random_allow_list(cat: Catalogue, count: int, seed: int = 0) -> list[int]:
    """`count` distinct item ids of the catalogue (all of them if it holds fewer), seeded."""
    items = cat.node_item[cat.node_item >= 0]
    rng = np.random.default_rng([seed, count])
    return sorted(rng.choice(items, size=min(count, len(items)), replace=False).tolist())


def run_requests(engine, texts: Sequence[str], warmup: int, allow_items: Sequence[int] | None = None,
                 allow_subset: str | None = None):
    """(results, wall ms, model ms) of the prompts one at a time, after `warmup` untimed ones (the
    first prompts again)."""
    for i in range(warmup):
        engine.beam(texts[i % len(texts)], allow_items=allow_items, allow_subset=allow_subset)
    results, wall, model = [], [], []
    for text in texts:
        start = time.perf_counter()
        result = engine.beam(text, allow_items=allow_items, allow_subset=allow_subset)
        wall.append((time.perf_counter() - start) * 1e3)
        model.append(result.timings["model"] * 1e3)
        results.append(result)
    return results, wall, model


def names_item(cat: Catalogue, tokens: list[int], stop_token_ids: Sequence[int]) -> int:
    """The item a candidate's tokens name (its code, or its code and a final stop token); -1: none."""
    for code in (tokens, tokens[:-1] if tokens and tokens[-1] in stop_token_ids else None):
        if code:
            node = cat.lookup(code)
            if node >= 0 and cat.node_item[node] >= 0:
                return int(cat.node_item[node])
    return -1


def check_row(search: str, results, wall, model, cat: Catalogue, stop_token_ids: Sequence[int],
              allow_items: Sequence[int] | None = None) -> Row:
    """Count the candidates: missing slots, and those whose tokens name their item (constrained,
    within the allow-list) or spell any item (plain: results without item ids)."""
    allowed = None if allow_items is None else set(allow_items)
    candidates = missing = items_ok = 0
    for result in results:
        for i, row in enumerate(result.token_ids):
            candidates += 1
            named = names_item(cat, [int(t) for t in row if t >= 0], stop_token_ids)
            if result.item_ids is None:
                items_ok += named >= 0
                continue
            item = int(result.item_ids[i])
            if item < 0:
                missing += 1
            elif named == item and (allowed is None or item in allowed):
                items_ok += 1
    pre = [r.timings["pre"] * 1e3 for r in results if "pre" in (r.timings or {})]
    return Row(search, wall, model, candidates, missing, items_ok, pre)


def bench(artifact: str | Path, cat_dir: str | Path, texts: Sequence[str], allow: int = 0, plain: str | Path | None = None,
          warmup: int = 3, seed: int = 0) -> dict:
    """The rows (dicts) and the catalogue's load figures (of the first load: as built); engines are
    closed before returning."""
    rows, load, derive_ms = [], None, None
    for cuda_graphs in (None, False):  # as built, then without graphs where it had them
        engine = boundgen.load(artifact, cuda_graphs=cuda_graphs)
        try:
            device = engine.contexts[0].device
            on_cuda = torch.device(device).type == "cuda"
            before = torch.cuda.memory_allocated(device) if on_cuda else 0
            start = time.perf_counter()
            engine.load_catalogue(cat_dir)  # what boundgen.load(artifact, catalogue=cat_dir) does last
            if on_cuda:
                torch.cuda.synchronize(device)
            load_s = time.perf_counter() - start
            device_mb = (torch.cuda.memory_allocated(device) - before) / 1e6 if on_cuda else None
            load = load or (load_s, device_mb, str(device))
            served = engine.catalogue  # its host arrays check the candidates; its metadata goes in the report
            cat, meta = served.catalogue, served.meta
            program = engine.spec.program
            if program.min_new_tokens > cat.depth:
                raise ValueError(f"{artifact} bars stop tokens before {program.min_new_tokens} tokens "
                                 f"(--min-new-tokens) and the catalogue's codes have at most {cat.depth}: no item "
                                 f"could end; build it with --min-new-tokens {cat.depth} or less")
            engine.warmup()
            graphs = engine.graph_shapes > 0
            name = "constrained" + (", CUDA graphs" if graphs else "" if cuda_graphs is None else ", no CUDA graphs")
            stops = [int(t) for t in program.stop_token_ids]
            rows.append(check_row(name, *run_requests(engine, texts, warmup), cat, stops))
            if allow:
                ids = random_allow_list(cat, allow, seed)
                array = np.asarray(ids, dtype=np.int64)  # as a served request's ALLOW_ITEMS arrives
                rows.append(check_row(f"{name}, allow-list of {len(ids):,}",
                                      *run_requests(engine, texts, warmup, array), cat, stops, ids))
                derive_ms = derive_ms or derivation_ms(served, array, device)
            for subset, members in sorted(cat.subsets.items()):
                rows.append(check_row(f"{name}, subset {subset} of {len(members):,}",
                                      *run_requests(engine, texts, warmup, allow_subset=subset), cat, stops,
                                      members.tolist()))
        finally:
            engine.close()
        if not graphs:
            break
    if plain is not None:
        rows += plain_rows(plain, texts, warmup, cat, stops)
    load_s, device_mb, device = load
    return {"artifact": str(artifact), "plain": None if plain is None else str(plain), "catalogue": str(cat_dir),
            "items": meta["items"], "nodes": meta["nodes"], "depth": meta["depth"], "load_s": load_s,
            "device_mb": device_mb, "device": device, "subsets": meta.get("subsets", {}), "derive_ms": derive_ms,
            "rows": [r.to_dict() for r in rows]}


def derivation_ms(served, ids: np.ndarray, device, repeats: int = 20) -> float:
    """Mean ms of deriving one allow-list's trie inputs (`ServedCatalogue.trie`), the device's
    work included (it returns once its one sync has waited for that work)."""
    served.trie(ids)  # warm: the first call's allocations
    start = time.perf_counter()
    for _ in range(repeats):
        served.trie(ids)
    return (time.perf_counter() - start) * 1e3 / repeats


def plain_rows(plain: str | Path, texts: Sequence[str], warmup: int, cat: Catalogue, stops: list[int]) -> list[Row]:
    """The unconstrained artifact's row; where it replays CUDA graphs, also its row without them, so
    that the constraint's cost and the graphs' gain are told apart."""
    rows = []
    for cuda_graphs in (None, False):  # as built, then without graphs
        engine = boundgen.load(plain, cuda_graphs=cuda_graphs)
        try:
            if engine.constrained:
                raise ValueError(f"--plain {plain} was built with --constrained: give an unconstrained beam artifact")
            engine.warmup()
            graphs = engine.graph_shapes > 0
            name = "plain" + (", CUDA graphs" if graphs else "" if cuda_graphs is None else ", no CUDA graphs")
            rows.append(check_row(name, *run_requests(engine, texts, warmup), cat, stops))
        finally:
            engine.close()
        if not graphs:
            break
    return rows


def markdown(report: dict, title: str) -> str:
    loaded = f"catalogue loaded in {report['load_s']:.2f} s"
    if report["device_mb"] is not None:
        loaded += f", {report['device_mb']:.0f} MB on the device"
    if report.get("derive_ms") is not None:
        loaded += f"; an allow-list's derivation alone {report['derive_ms']:.3f} ms"
    lines = [f"{title}: {report['items']:,} items, {report['nodes']:,} nodes, depth {report['depth']}; {loaded}", "",
             "| search | requests | mean ms | p50 ms | p99 ms | model ms (mean) | pre ms (mean) | candidates "
             "| item -1 | items among the others |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        lines.append(f"| {r['search']} | {r['requests']} | {r['mean_ms']:.2f} | {r['p50_ms']:.2f} | "
                     f"{r['p99_ms']:.2f} | {r['model_mean_ms']:.2f} | {r['pre_mean_ms']:.2f} | {r['candidates']:,} | "
                     f"{r['missing']:,} | "
                     f"{r['items_fraction']:.3f} ({r['items_ok']:,}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m boundgen.bench.constrained",
                                     description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", nargs="?", metavar="ARTIFACT", help="a beam artifact built with --constrained")
    parser.add_argument("--catalogue", metavar="CAT_DIR", help="the catalogue it serves")
    parser.add_argument("--plain", metavar="ARTIFACT", help="an unconstrained beam artifact: the same prompts through it")
    parser.add_argument("--workload", default="W2", help="whose prompts: W2 (64 tokens) or W3 (400)")
    parser.add_argument("--prompt-tokens", type=int, default=None, help="prompt length in place of the workload's")
    parser.add_argument("--requests", type=int, default=64, help="prompts timed a row (the pool)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed prompts before each row")
    parser.add_argument("--allow-items", type=int, default=10000, metavar="K",
                        help="items in the allow-list row (0: no such row)")
    parser.add_argument("--seed", type=int, default=0, help="of the prompts, the allow-list and a made catalogue")
    parser.add_argument("--json", metavar="PATH", help="also write the report here")
    parser.add_argument("--make-catalogue", metavar="DIR", help="write a random catalogue to DIR and exit")
    parser.add_argument("--items", type=int, default=1_000_000, help="--make-catalogue: items")
    parser.add_argument("--model-dir", metavar="MODEL", help="--make-catalogue: the checkpoint or artifact whose "
                                                             "tokenizer the catalogue is for")
    parser.add_argument("--code-length", type=int, default=4, help="--make-catalogue: tokens a code")
    parser.add_argument("--code-vocab", type=int, default=32768, help="--make-catalogue: codes use token ids below this")
    parser.add_argument("--subset-items", type=int, default=10000, metavar="K",
                        help="--make-catalogue: register the subset sampleK, the allow-list row's K ids (0: none)")
    parser.add_argument("--titles", action="store_true",
                        help="--make-catalogue: sequences shaped like titles cut to --code-length tokens (Zipf-"
                             "distributed tokens, some shorter), e.g. with --code-vocab 151643 for Qwen's words")
    args = parser.parse_args(argv)
    try:
        if args.make_catalogue:
            if not args.model_dir:
                parser.error("--make-catalogue needs --model-dir MODEL")
            meta = make_catalogue(args.make_catalogue, args.items, args.model_dir, args.code_length, args.code_vocab,
                                  args.seed, args.titles, min(args.subset_items, args.items))
            print(json.dumps({k: meta.get(k) for k in ("items", "nodes", "depth", "max_degree", "subsets",
                                                        "seconds")}))
            return 0
        if not args.artifact or not args.catalogue:
            parser.error("give ARTIFACT and --catalogue CAT_DIR (or --make-catalogue DIR)")
        spec = get_workload(args.workload)
        if args.prompt_tokens is not None:
            spec = dataclasses.replace(spec, min_tokens=args.prompt_tokens, max_tokens=args.prompt_tokens)
        requests = make_requests(spec, load_tokenizer(args.artifact), args.requests, seed=args.seed)
        texts = [r.texts[0] for r in requests]
        report = bench(args.artifact, args.catalogue, texts, args.allow_items, args.plain, args.warmup, args.seed)
    except (ValueError, BoundgenError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    report["workload"] = spec.name
    report["prompt_tokens"] = spec.max_tokens
    print(markdown(report, f"{spec.name} ({spec.max_tokens}-token prompts, c=1), {args.artifact}"))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    wrong = [r["search"] for r in report["rows"] if not r["search"].startswith("plain")
             and (r["items_ok"] != r["candidates"] - r["missing"] or r["missing"] == r["candidates"])]
    for search in wrong:  # a candidate that is no (allowed) item, or no candidate at all
        print(f"error: {search}: not every candidate is an item of the catalogue, or none came back", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

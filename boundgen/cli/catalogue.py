"""`boundgen catalogue build ITEMS.jsonl --tokenizer DIR --out CAT_DIR`: the trie constrained beam search walks."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from boundgen.artifact.program import MAX_STEPS
from boundgen.cli.common import positive_int, print_json
from boundgen.errors import ConfigError


def register(sub) -> None:
    p = sub.add_parser("catalogue", help="build a catalogue of items for constrained beam search",
                       description="Catalogues of items (token sequences) that `boundgen beam --catalogue` "
                                   "restricts its candidates to (docs/build.md, Catalogues).")
    cmds = p.add_subparsers(dest="catalogue_command", metavar="ACTION")
    cmds.required = True
    b = cmds.add_parser("build", help="index ITEMS.jsonl as a trie over token ids",
                        description='Reads one JSON object a line, {"item_id": INT, "token_ids": [INT, ...]} or '
                                    '{"item_id": INT, "text": "..."}, either with an optional "subsets": '
                                    '["NAME", ...] (named subsets a request can restrict itself to, ALLOW_SUBSET), '
                                    "and writes CAT_DIR/trie.npz, CAT_DIR/subsets.npz (if any) and "
                                    "CAT_DIR/catalogue.json; prints the catalogue's summary as JSON.")
    b.add_argument("items", metavar="ITEMS.jsonl", help="the items, one JSON object a line")
    b.add_argument("--tokenizer", required=True, metavar="DIR",
                   help="model or artifact directory whose tokenizer.json the ids (or texts) belong to")
    b.add_argument("--out", required=True, metavar="CAT_DIR", help="directory to write (must be empty or absent)")
    b.add_argument("--max-depth", type=positive_int, default=MAX_STEPS, metavar="N",
                   help=f"refuse sequences longer than N tokens, 1..{MAX_STEPS} (default {MAX_STEPS}: a beam program "
                        "generates at most that many; beam checks its own --steps)")
    b.add_argument("--force", action="store_true", help="replace an earlier catalogue in CAT_DIR")
    b.set_defaults(run=run_build)


def run_build(args) -> int:
    from boundgen.text.catalogue import META_FILE
    from boundgen.text.catalogue_items import build_catalogue
    from boundgen.text.tokenizer import Tokenizer  # lazy: imports torch

    items, out = Path(args.items), Path(args.out)
    if not items.exists() or items.is_dir():  # a pipe (/dev/stdin, <(...)) reads as a file does
        raise ConfigError(f"{args.items} is not a file")
    if args.max_depth > MAX_STEPS:
        raise ConfigError(f"--max-depth must be in [1, {MAX_STEPS}] (the most tokens a beam program generates), "
                          f"got {args.max_depth}")
    if not _nearest_existing(out).is_dir():
        raise ConfigError(f"--out {args.out}: a file is in the way of the directory to write")
    if out.exists() and any(out.iterdir()) and not (args.force and (out / META_FILE).is_file()):
        raise ConfigError(f"{args.out} is not empty" + ("" if args.force else " (--force replaces an earlier catalogue)"))
    start = time.perf_counter()

    def progress(line: str) -> None:
        print(f"[catalogue {time.perf_counter() - start:6.1f}s] {line}", file=sys.stderr, flush=True)

    tokenizer = Tokenizer.from_dir(args.tokenizer)
    cat = build_catalogue(items, tokenizer, args.max_depth, progress)
    meta = cat.save(out)
    progress(f"wrote {meta['items']:,} items, {meta['nodes']:,} nodes to {out}")
    print_json({**meta, "out": str(out), "seconds": round(time.perf_counter() - start, 3)})
    return 0


def _nearest_existing(path: Path) -> Path:
    """`path` or its nearest ancestor that exists (checked before the items are read, not after)."""
    path = path.absolute()
    while not path.exists() and path != path.parent:
        path = path.parent
    return path

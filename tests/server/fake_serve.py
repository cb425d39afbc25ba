"""Test-only entry: `python -m tests.server.fake_serve DIR [...] [boundgen serve flags]`.

The real `boundgen serve` (same flags, same server) with engines from FakeEngine.from_dir,
or, for a directory holding `eager.json`, a real eager engine over a checkpoint (see
tests/server/real.py), so server tests need no compiled artifact.
"""

import argparse
import json
import sys
from pathlib import Path

from boundgen.cli import serve
from boundgen.errors import BoundgenError
from tests.server.fake_engine import FakeEngine


FAKE_SERVE = [sys.executable, "-m", "tests.server.fake_serve"]  # --replicas workers: fake engines too


def engine_factory(path, **runtime):
    """`runtime`: serve's --contexts / --batching / --cuda-graphs / --token-bucket, as boundgen.load gets them."""
    path = Path(path)
    if (path / "eager.json").exists():
        from tests.server.real import eager_engine_from_config

        return eager_engine_from_config(json.loads((path / "eager.json").read_text()), **runtime)
    return FakeEngine.from_dir(path, **runtime)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="fake_serve")
    serve.register(parser.add_subparsers())
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    try:
        return serve.run(args, engine_factory=engine_factory, worker_command=FAKE_SERVE)
    except BoundgenError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

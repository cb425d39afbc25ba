"""`boundgen` command line: one module per subcommand, each exposing `register(subparsers)`.

Only the CLI and `server/` read flags and the environment; everything below takes arguments.
As a process entry point, `main` first re-executes itself with the system libstdc++ preloaded
where loading AOTInductor packages would otherwise crash (runtime/libstdcxx.py).
"""

import argparse
import atexit
import importlib
import os
import sys

from boundgen.errors import BoundgenError
from boundgen.runtime.libstdcxx import reexec_with_preload
from boundgen.version import __version__

# Subcommand modules, in the order `boundgen --help` lists them.
COMMANDS = (
    "boundgen.cli.demo_model",
    "boundgen.cli.score",
    "boundgen.cli.beam",
    "boundgen.cli.catalogue",
    "boundgen.cli.build",
    "boundgen.cli.serve",
    "boundgen.cli.bench",
    "boundgen.cli.demo",
    "boundgen.cli.keygen",
)


def make_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="boundgen",
        description="Bounded-generation inference for small Qwen2/Qwen3 models: score and fixed beam search.",
    )
    parser.add_argument("--version", action="version", version=f"boundgen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # subcommand not written yet
                continue
            raise
        module.register(sub)
    return parser


def main(argv=None) -> int:
    if argv is None:  # a real process: fix the AOTInductor load crash before torch is imported
        reexec_with_preload()
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except BoundgenError as exc:
        _say(f"error: {exc}")
        return 2
    except KeyboardInterrupt:
        _say("interrupted")
        if argv is None:  # a real process: leave now (below)
            _exit_now(130)
        return 130
    except (FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError, FileExistsError) as exc:
        if exc.filename is None:  # not about a path the user gave: an internal error (below)
            return _internal(exc)
        _say(f"error: {exc.filename}: {exc.strerror or exc}")  # a path that cannot be used as given
        return 2
    except Exception as exc:
        return _internal(exc)


def _exit_now(code: int) -> None:
    """End the process without the interpreter's shutdown. Interrupted mid-call, an eager `score` or
    `beam` still has worker threads inside torch, and finalising the interpreter under them aborted
    the process ("terminate called without an active exception", SIGABRT, a core dump) where it
    should exit 130; what a command must clean up (a build's temporary directory) it has by now, and
    the functions registered with `atexit` (the server's log writers' last flush) still run."""
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def _internal(exc: BaseException) -> int:
    """An internal error: said plainly, its traceback only on request."""
    if os.environ.get("BOUNDGEN_DEBUG"):
        raise exc
    _say(f"internal error: {type(exc).__name__}: {exc} (set BOUNDGEN_DEBUG=1 for a traceback)")
    return 1


def _say(line: str) -> None:
    """`line` on stderr. A reader that has gone (EPIPE) loses the line, not the exit status: the failed
    print used to raise out of `main` (exit 1, whatever the error); stderr then points at /dev/null, so
    that the interpreter's last flush has nowhere left to fail."""
    try:
        print(line, file=sys.stderr, flush=True)
    except OSError:
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stderr.fileno())
            os.close(devnull)
        except (OSError, ValueError):  # no descriptor behind sys.stderr (a test's capture)
            pass


if __name__ == "__main__":
    sys.exit(main())

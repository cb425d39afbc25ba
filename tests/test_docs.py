"""README.md's commands run as written and print what it shows.

Every ```bash block of the README runs, in order (later blocks use what earlier ones wrote),
unless the line before its fence is an HTML comment starting `<!-- no-test` (saying why: a GPU,
a long setup). In a block, each command line runs with `.venv/bin/boundgen` as this Python's
`-m boundgen` (this checkout's code), `.venv/bin/python` as this Python and `/tmp/` as a fresh
folder; the `# ...` lines after a command are what it prints, and its output must have their
shape: the same JSON keys, the same integer lists (label ids), as many candidates as the comment
says. A `serve` line runs until it says it is ready, answers `/v2/health/ready`, and exits 0 on
SIGTERM (its ports are picked free). The README's `boundgen build` compiles with AOTInductor,
about a minute on 2 cores, hence slow.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
NO_TEST = "<!-- no-test"
COMMAND_TIMEOUT_S = 240
READY_TIMEOUT_S = 120


def blocks(text: str) -> list[tuple[bool, str]]:
    """(runs, body) of each ```bash block, in order."""
    out = []
    for match in FENCE.finditer(text):
        before = text[:match.start()].rstrip().splitlines()
        out.append((not (before and before[-1].lstrip().startswith(NO_TEST)), match.group(1)))
    return out


def commands(body: str) -> list[tuple[str, list[str]]]:
    """(command line, the `# ` lines after it: what it prints) of a block."""
    out: list[tuple[str, list[str]]] = []
    for line in body.splitlines():
        if line.startswith("#"):
            if out:
                out[-1][1].append(line[1:].strip())
        elif line.strip():
            out.append((line, []))
    return out


def argv(line: str, tmp: Path) -> list[str]:
    """The command line as this checkout runs it (see the module docstring)."""
    words = shlex.split(line.replace("/tmp/", f"{tmp}/"), comments=True)
    if words[0] == ".venv/bin/boundgen":
        return [sys.executable, "-m", "boundgen", *words[1:]]
    if words[0] == ".venv/bin/python":
        return [sys.executable, *words[1:]]
    return words


def env() -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def keys(value) -> set[str]:
    """Every key of every object in a JSON value."""
    if isinstance(value, dict):
        return set(value) | set().union(*(keys(v) for v in value.values()))
    if isinstance(value, list):
        return set().union(*(keys(v) for v in value)) if value else set()
    return set()


def check_output(shown: list[str], printed: str, line: str) -> None:
    """`printed` has the shape of the README's `shown` lines (see the module docstring)."""
    text = " ".join(shown)
    if not text.startswith("{"):
        return
    answer = json.loads(printed.strip().splitlines()[-1])
    want = set(re.findall(r'"(\w+)":', text))
    assert want <= keys(answer), f"{line}: prints keys {sorted(keys(answer))}, the README shows {sorted(want)}"
    for key, listed in re.findall(r'"(\w+)": (\[[\d, ]+\])', text):
        if key in answer:
            assert answer[key] == json.loads(listed), f"{line}: {key} is {answer[key]}, the README shows {listed}"
    count = re.search(r"(\d+) candidates", text)
    if count:
        assert len(answer["candidates"]) == int(count.group(1)), line


def serve(words: list[str]) -> None:
    """Run a `serve` command line on free ports until ready, probe it, stop it with SIGTERM."""
    for flag in ("--http-port", "--grpc-port"):
        if flag in words:
            words[words.index(flag) + 1] = "0"
    proc = subprocess.Popen(words, cwd=REPO, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        end, seen, port = time.monotonic() + READY_TIMEOUT_S, [], None
        while time.monotonic() < end:
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            found = re.search(r"listening http=[^ ]*:(\d+)", line)
            port = int(found.group(1)) if found else port
            if "boundgen serve: ready" in line:
                break
        assert port and "boundgen serve: ready" in seen[-1], f"serve did not become ready:\n{''.join(seen)}"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{port}/v2/health/ready", timeout=10) as answer:
            assert json.loads(answer.read()) == {"ready": True}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_blocks_are_found_and_marked():
    found = blocks((REPO / "README.md").read_text())
    assert len(found) >= 2 and any(runs for runs, _ in found) and not all(runs for runs, _ in found)


@pytest.mark.slow
def test_readme_commands_print_what_the_readme_shows(tmp_path):
    for runs, body in blocks((REPO / "README.md").read_text()):
        if not runs:
            continue
        for line, shown in commands(body):
            words, start = argv(line, tmp_path), time.monotonic()
            if words[1:4] == ["-m", "boundgen", "serve"]:
                serve(words)
            else:
                done = subprocess.run(words, cwd=REPO, env=env(), capture_output=True, text=True,
                                      timeout=COMMAND_TIMEOUT_S)
                assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
                check_output(shown, done.stdout, line)
            print(f"{time.monotonic() - start:6.1f} s  {line}")  # shown with -s: where the time goes

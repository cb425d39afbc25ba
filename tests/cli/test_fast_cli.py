"""`boundgen --version` and every `--help` answer without importing torch (seconds of start-up
otherwise: each subcommand imports what it needs when it runs), and the help texts are whole
sentences. Each check runs in a fresh interpreter, since this test process has torch loaded."""

import json
import subprocess
import sys
from pathlib import Path

from boundgen.cli.main import COMMANDS
from boundgen.version import __version__

REPO = Path(__file__).resolve().parents[2]
SUBCOMMANDS = [name.rsplit(".", 1)[1].replace("_", "-") for name in COMMANDS]

# Imports boundgen's command line, asks for --help (top level and each subcommand) and --version,
# then prints the heavy modules that got imported.
PROBE = """
import contextlib, io, json, sys
from boundgen.cli.main import make_parser
for argv in [["--help"], ["--version"]] + [[c, "--help"] for c in json.loads(sys.argv[1])]:
    with contextlib.redirect_stdout(io.StringIO()):
        try:
            make_parser().parse_args(argv)
        except SystemExit:
            pass
print(json.dumps(sorted(m for m in ("torch", "transformers", "triton") if m in sys.modules)))
"""


def run(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def test_help_and_version_do_not_import_torch():
    assert json.loads(run("-c", PROBE, json.dumps(SUBCOMMANDS)).stdout) == []


def test_version_in_a_real_process():
    assert run("-m", "boundgen", "--version").stdout.strip() == f"boundgen {__version__}"


def test_every_help_description_is_whole_sentences():
    for command in SUBCOMMANDS:
        text = run("-m", "boundgen", command, "--help").stdout
        description = text.split("\n\n")[1]  # after the usage lines
        assert description.rstrip().endswith((".", ")")), f"{command} --help: {description!r}"

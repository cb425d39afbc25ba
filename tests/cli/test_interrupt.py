"""Ctrl-C while a command's worker threads are inside torch (an eager `score` or `beam` mid-call): the
process says `interrupted` and exits 130. It aborted instead ("terminate called without an active
exception", SIGABRT, a core dump where enabled): the interpreter's shutdown ran under the busy threads."""

from __future__ import annotations

import subprocess
import sys

from tests.server.conftest import REPO

# A command whose run starts a thread busy in torch, then is interrupted, through the CLI's own main()
SCRIPT = """
import sys, threading, time
import torch
from boundgen.cli import main as cli

def busy():
    x = torch.randn(256, 256)
    while True:
        x = (x @ x).tanh()

def run(args):
    threading.Thread(target=busy, daemon=True).start()
    time.sleep(0.3)
    raise KeyboardInterrupt

make_parser = cli.make_parser
def parser():
    p = make_parser()
    parse = p.parse_args
    def parse_args(argv=None):
        args = parse(argv)
        args.run = run
        return args
    p.parse_args = parse_args
    return p
cli.make_parser = parser
sys.argv = ["boundgen", "keygen", "unused"]
sys.exit(cli.main())
"""


def test_an_interrupt_with_threads_inside_torch_exits_130():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130, (proc.returncode, proc.stderr[-2000:])
    assert proc.stderr.strip() == "interrupted", proc.stderr[-2000:]

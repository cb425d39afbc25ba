"""scripts/adversarial.py, as docs/serving.md reports it ("Adversarial checks"): every malformed or
hostile case answered per contract by a real server that stays up (a case whose server died is
counted as not per contract)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

from tests.server.conftest import REPO


def test_every_case_is_answered_per_contract():
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "adversarial.py")], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=600)
    tally = re.search(r"(\d+) of (\d+) answered per contract", done.stdout)
    assert tally is not None, done.stdout[-3000:] + done.stderr[-3000:]
    good, total = map(int, tally.groups())
    assert done.returncode == 0 and good == total and total >= 29, done.stdout
    assert "server died" not in done.stdout, done.stdout

"""A real package: `pip install '.[serve]'` into a fresh virtual environment (no system site
packages, not this checkout's .venv) gives a working `boundgen`: `--version`, `serve --help`, and
a `boundgen serve` of an artifact built by this tree that answers a KServe v2 request with the
numbers of the in-process engine.

It lives beside the compile tests to serve the session's tiny score artifact (conftest.py) rather
than compile one more. The install resolves like a user's: pip's configured indexes, build
isolation, the project's declared dependencies and extras; requirements.txt is given only as
constraints (`-c`, its extras markers removed: pip refuses extras in constraints), so that torch
is the pinned 2.13.0 CPU wheel that built the artifact, not the newest CUDA build. It copies the
package's files (boundgen/, pyproject.toml, README.md) to a temporary folder first: building a
wheel writes build/ and *.egg-info into its source tree. About a minute on 2 cores, most of it
unpacking torch; the venv (~1.8 GB) is deleted afterwards.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import boundgen
from boundgen.server.deploy.launch import ServerProcess
from boundgen.version import __version__

pytestmark = pytest.mark.slow  # a pip install of torch into a new venv
REPO = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 900
TEXTS = ["query: running shoes | item: trail running shoe", "hi"]


def _clean_env() -> dict:
    """This process's environment without what would let the venv see this checkout or .venv."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if not p.startswith(str(REPO)))
    return env


def _run(argv, cwd, timeout_s=120) -> str:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=_clean_env(), capture_output=True, text=True,
                          timeout=timeout_s)
    assert proc.returncode == 0, f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def venv(tmp_path_factory):
    """A fresh venv with boundgen[serve] installed from a copy of this tree; its bin/ folder."""
    root = tmp_path_factory.mktemp("clean_install")
    source = root / "src"
    shutil.copytree(REPO / "boundgen", source / "boundgen", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    constraints = root / "constraints.txt"
    constraints.write_text(re.sub(r"\[[^\]]*\]", "", (REPO / "requirements.txt").read_text()))
    _run([sys.executable, "-m", "venv", root / "venv"], cwd=root)
    bin_dir = root / "venv" / "bin"
    try:
        _run([bin_dir / "python", "-m", "pip", "install", "--quiet", "-c", constraints, f"{source}[serve]"], cwd=root,
             timeout_s=INSTALL_TIMEOUT_S)
        yield bin_dir
    finally:
        shutil.rmtree(root, ignore_errors=True)  # ~1.8 GB: pytest would keep it with its last three runs


def test_installed_package_is_the_venv_own(venv):
    where = _run([venv / "python", "-c", "import boundgen, sys; print(boundgen.__file__); print(sys.prefix)"],
                 cwd=venv)
    module, prefix = where.split()
    assert Path(module).is_relative_to(Path(prefix)) and Path(prefix) == venv.parent, where
    assert _run([venv / "boundgen", "--version"], cwd=venv).strip() == f"boundgen {__version__}"
    help_text = _run([venv / "boundgen", "serve", "--help"], cwd=venv)
    assert "--http-port" in help_text and "--grpc-port" in help_text
    proto = _run([venv / "python", "-c", "import importlib.resources as r; "
                  "print(r.files('boundgen.server').joinpath('kserve.proto').is_file())"], cwd=venv)
    assert proto.strip() == "True"


def test_installed_serve_answers_kserve(venv, score_artifact):
    assert_serves_like_in_process(venv, score_artifact, _clean_env())


def assert_serves_like_in_process(venv_bin: Path, score_artifact, env: dict) -> None:
    """The venv's `boundgen serve` (venv_bin: its bin/) answers a KServe infer on the score artifact with
    the in-process engine's scores (a refused artifact, "built for another runtime", exits before ready)."""
    server = ServerProcess([score_artifact], command=[str(venv_bin / "boundgen"), "serve"], env=env,
                           cwd=venv_bin, ready_timeout_s=300)
    try:
        server.start()
        body = {"inputs": [{"name": "TEXT", "datatype": "BYTES", "shape": [len(TEXTS)], "data": TEXTS}]}
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
        request = urllib.request.Request(f"http://{server.http_url}/v2/models/tiny-score/infer",
                                         data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with opener.open(request, timeout=60) as answer:
            outputs = {o["name"]: o for o in json.loads(answer.read())["outputs"]}
        assert server.stop() == 0, server.tail()
    finally:
        server.kill()
    scores = np.array(outputs["SCORES"]["data"], dtype=np.float32).reshape(outputs["SCORES"]["shape"])
    np.testing.assert_allclose(scores, boundgen.load(score_artifact).score(TEXTS).scores, rtol=1e-5, atol=1e-7)

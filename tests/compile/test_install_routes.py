"""The install routes of docs/serving.md ("Installing"), each run as documented from a clean venv
with pip's configuration set aside (PIP_CONFIG_FILE=/dev/null, no PIP_* index variables), so that
pip sees only the indexes the command names, as on a user's machine:

- CPU: the documented command with PyTorch's CPU index (which CI cannot reach) replaced by a local
  PEP 503 index that the test writes: one page, simple/torch/, linking the torch CPU wheel that
  lies on this machine's disk where pip's configuration finds it. PyPI stays the extra index, as in
  the command. Installed for real, then: torch is the `+cpu` build, no nvidia-* package,
  `boundgen --version`, and the venv's `boundgen serve` accepts the session's tiny score artifact
  (built by this tree: the runtime check passes) and answers with the in-process engine's scores.
- GPU: resolution only (`pip install --dry-run --ignore-installed --report`) of the documented
  command against PyPI: torch is the lock's version, the CUDA build (nvidia-* dependencies) with
  the lock's triton. The mirror of PyPI reachable here serves no PEP 658 metadata files, so pip
  (upgraded in the venv: 23.2's dry run still downloads) reads each wheel's METADATA with HTTP
  range requests (`--use-feature=fast-deps`); the test checks that no wheel was downloaded.
- The lock with PyTorch's CPU index added (docs/serving.md's advice for CPU machines, the
  Dockerfile's command): resolution only, as the GPU route, with the local index standing in;
  torch is the `+cpu` build, no nvidia-* package.

The lock route's install and serve, with the machine's pip configuration, is
tests/compile/test_clean_install.py. These tests resolve against PyPI: where it
cannot be reached they skip and say so, except under CI (CI=true), which reaches PyPI and where a
skip would hide a broken route: there they fail.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from boundgen.artifact.manifest import check_versions
from boundgen.errors import ArtifactError
from boundgen.version import __version__
from tests.compile.test_clean_install import assert_serves_like_in_process

pytestmark = [pytest.mark.slow, pytest.mark.network]
REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs" / "serving.md"
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
PYPI = "https://pypi.org/simple"
INSTALL_TIMEOUT_S = 900
# pip's environment variables that name where packages come from; the rest (certificates, timeout) stay.
PIP_SOURCES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_NO_INDEX", "PIP_CONSTRAINT",
               "PIP_REQUIREMENT", "PIP_PRE", "PIP_ONLY_BINARY", "PIP_NO_BINARY", "PIP_CONFIG_FILE")


def _unavailable(reason: str):
    """Skip with the reason; under CI, fail: CI has what these tests need, and a skip would hide a route."""
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI has it: the install-route tests must run there)")
    pytest.skip(reason)


def lock_pin(name: str) -> str:
    match = re.search(rf"^{re.escape(name)}==(\S+)", (REPO / "requirements.txt").read_text(), re.M)
    assert match, f"requirements.txt pins no {name}"
    return match.group(1)


def documented_routes() -> dict[str, list[str]]:
    """{"cpu" | "gpu" | "lock": argv after `pip`} of the pip install lines of serving.md's "Installing"."""
    text = DOCS.read_text()
    section = text[text.index("## Installing"):]
    section = section[:section.index("\n## ", 1)]
    block = re.search(r"^```bash\n(.*?)^```", section, re.S | re.M).group(1)
    routes = {}
    for line in block.splitlines():
        if line.startswith("/opt/boundgen/bin/pip install"):
            words = shlex.split(line, comments=True)[1:]
            route = "lock" if "-c" in words else "cpu" if CPU_INDEX in words else "gpu"
            assert route not in routes, f"two {route} lines in docs/serving.md's install block"
            routes[route] = words
    return routes


def clean_env() -> dict:
    """This process's environment without what would let the venv see this checkout, .venv or
    pip's configured package sources."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", *PIP_SOURCES)}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if not p.startswith(str(REPO)))
    env["PIP_CONFIG_FILE"] = os.devnull  # no pip.conf at all: no find-links, extra indexes or constraints
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def run(argv, cwd, timeout_s=120, env=None) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(a) for a in argv], cwd=cwd, env=env or clean_env(), capture_output=True,
                          text=True, timeout=timeout_s)
    assert proc.returncode == 0, (f"{' '.join(map(str, argv))} failed ({proc.returncode}):\n"
                                  f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return proc


def require_pypi() -> None:
    try:
        opener = urllib.request.build_opener()
        with opener.open(f"{PYPI}/pip/", timeout=20) as answer:
            answer.read(1)
    except OSError as exc:
        _unavailable(f"PyPI ({PYPI}) is unreachable ({exc}): the install routes resolve against it")


def find_cpu_wheel(version: str) -> Path:
    """The torch `version`+cpu wheel for this Python where this machine's pip configuration finds
    it (find-links: PIP_FIND_LINKS or pip.conf), as `pip install torch==version` would."""
    places = os.environ.get("PIP_FIND_LINKS", "").split()
    listed = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    for match in re.finditer(r"find-links='([^']*)'", listed):
        places += match.group(1).split()
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().split("-")[-1]  # x86_64, aarch64
    for place in places:
        folder = Path(place.removeprefix("file://"))
        for wheel in sorted(folder.glob(f"torch-{version}+cpu-{tag}-{tag}-*{platform}.whl")) if folder.is_dir() else ():
            return wheel
    _unavailable(f"no torch {version}+cpu wheel for {tag} in pip's find-links ({places or 'none'}): the "
                 "CPU route stands in a local index for PyTorch's CPU index, which this machine cannot reach")


def local_cpu_index(root: Path, wheel: Path) -> str:
    """A PEP 503 simple index with one project, torch, linking `wheel`; its file:// URL."""
    page = root / "simple" / "torch" / "index.html"
    page.parent.mkdir(parents=True)
    digest = subprocess.run(["sha256sum", str(wheel)], capture_output=True, text=True, check=True).stdout.split()[0]
    page.write_text(f'<!DOCTYPE html><html><body><a href="{wheel.as_uri()}#sha256={digest}">{wheel.name}</a>'
                    "</body></html>\n")
    return (root / "simple").as_uri()


def copy_source(root: Path) -> Path:
    """The package's files in a folder of their own (building a wheel writes build/ and *.egg-info there)."""
    source = root / "src"
    shutil.copytree(REPO / "boundgen", source / "boundgen", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    return source


def pip_argv(words: list[str], source: Path, replace: dict[str, str] | None = None) -> list[str]:
    """A documented `pip install ...` with the checkout `'.[serve]'` pointing at `source`."""
    out = []
    for word in words:
        if word.startswith(".["):
            word = f"{source}{word[1:]}"
        out.append((replace or {}).get(word, word))
    return out


def test_documented_routes_pin_the_lock_torch():
    routes = documented_routes()
    assert set(routes) == {"cpu", "gpu", "lock"}, routes
    for route in ("cpu", "gpu"):
        assert f"torch=={lock_pin('torch')}" in routes[route], (route, routes[route])
    assert routes["cpu"][routes["cpu"].index("--index-url") + 1] == CPU_INDEX
    assert routes["cpu"][routes["cpu"].index("--extra-index-url") + 1] == PYPI
    assert not any(w.startswith("--") and "index" in w for w in routes["gpu"]), routes["gpu"]


def test_runtime_mismatch_names_the_cpu_route_torch():
    """A CPU artifact served by another torch (PyPI's CUDA build, say) is refused with a pip command
    that installs the torch of the CPU route: the same pin from the same index."""
    with pytest.raises(ArtifactError) as err:
        check_versions(SimpleNamespace(name="demo-score", versions={"torch": f"{lock_pin('torch')}+cpu", "cuda": None},
                                       compile=SimpleNamespace(device="cpu")), {"torch": "2.15.0+cu130", "cuda": "13.0"})
    words = shlex.split(re.search(r"\((pip install [^)]*)\)", str(err.value)).group(1))
    cpu = documented_routes()["cpu"]
    assert f"torch=={lock_pin('torch')}" in words and f"torch=={lock_pin('torch')}" in cpu, (words, cpu)
    assert words[words.index("--index-url") + 1] == cpu[cpu.index("--index-url") + 1] == CPU_INDEX


@pytest.fixture(scope="module")
def cpu_venv(tmp_path_factory):
    """A fresh venv where the CPU route's documented command ran; its bin/ folder."""
    require_pypi()
    wheel = find_cpu_wheel(lock_pin("torch"))
    root = tmp_path_factory.mktemp("cpu_route")
    try:
        index = local_cpu_index(root / "index", wheel)
        source = copy_source(root)
        run([sys.executable, "-m", "venv", root / "venv"], cwd=root)
        bin_dir = root / "venv" / "bin"
        argv = pip_argv(documented_routes()["cpu"], source, {CPU_INDEX: index})
        started = time.monotonic()
        run([bin_dir / "python", "-m", "pip", *argv], cwd=root, timeout_s=INSTALL_TIMEOUT_S)
        print(f"CPU route installed in {time.monotonic() - started:.0f} s: pip {' '.join(argv)}")
        yield bin_dir
    finally:
        shutil.rmtree(root, ignore_errors=True)  # ~1.5 GB: pytest would keep it with its last three runs


def test_cpu_route_installs_the_cpu_torch(cpu_venv):
    listed = json.loads(run([cpu_venv / "python", "-m", "pip", "list", "--format", "json"], cwd=cpu_venv).stdout)
    versions = {p["name"].lower(): p["version"] for p in listed}
    assert versions["torch"] == f"{lock_pin('torch')}+cpu", versions["torch"]
    assert not [name for name in versions if name.startswith("nvidia-")], sorted(versions)
    assert versions["boundgen"] == __version__
    assert run([cpu_venv / "boundgen", "--version"], cwd=cpu_venv).stdout.strip() == f"boundgen {__version__}"


def test_cpu_route_serves_this_tree_artifact(cpu_venv, score_artifact):
    env = {k: v for k, v in clean_env().items() if k != "PIP_CONFIG_FILE"}
    assert_serves_like_in_process(cpu_venv, score_artifact, env)


DOWNLOAD = re.compile(r"^\s*Downloading (\S+) \(([\d.]+) (kB|MB|GB)\)", re.M)
UNIT = {"kB": 1e3, "MB": 1e6, "GB": 1e9}


def resolve(tmp_path: Path, route: str, replace: dict[str, str] | None = None, extra: tuple = ()) -> dict:
    """{name: version} that the documented `route` resolves to in a fresh venv, without installing
    or downloading: `pip install --dry-run --report`, wheel metadata read with range requests."""
    require_pypi()
    source = copy_source(tmp_path)
    run([sys.executable, "-m", "venv", tmp_path / "venv"], cwd=tmp_path)
    python = tmp_path / "venv" / "bin" / "python"
    # pip 23.2's dry run still downloads the wheels whose metadata it read lazily; 26.3's does not.
    run([python, "-m", "pip", "install", "--quiet", "pip==26.3"], cwd=tmp_path)
    report = tmp_path / "report.json"
    argv = pip_argv(documented_routes()[route], source, replace) + list(extra)
    started = time.monotonic()
    log = run([python, "-m", "pip", *argv, "--dry-run", "--ignore-installed", "--no-cache-dir", "--report", report,
               "--use-feature=fast-deps"], cwd=tmp_path, timeout_s=INSTALL_TIMEOUT_S).stdout
    downloaded = {m.group(1): float(m.group(2)) * UNIT[m.group(3)] for m in DOWNLOAD.finditer(log)}
    print(f"{route} route resolved in {time.monotonic() - started:.0f} s, "
          f"{sum(downloaded.values()) / 1e6:.1f} MB of files downloaded")
    # Lazily read wheels show as "Obtaining dependency information"; a "Downloading" of torch or a
    # CUDA library would mean gigabytes. The build backend (setuptools) may come whole: small.
    assert not [n for n in downloaded if n.startswith(("torch-", "nvidia", "triton-"))], downloaded
    assert sum(downloaded.values()) < 50e6, downloaded
    chosen = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.loads(report.read_text())["install"]}
    assert chosen["boundgen"] == __version__
    assert chosen["triton"] == lock_pin("triton"), chosen["triton"]  # the one torch pins and the lock pins beside it
    return chosen


def test_gpu_route_resolves_pypi_cuda_torch(tmp_path):
    """The GPU route against PyPI: the lock's torch, PyPI's build of it (no +cpu), CUDA 13 libraries."""
    chosen = resolve(tmp_path, "gpu")
    assert chosen["torch"] == lock_pin("torch"), chosen["torch"]
    cuda = sorted(name for name in chosen if name.startswith("nvidia-"))
    assert {"nvidia-cublas", "nvidia-cuda-runtime", "nvidia-cudnn-cu13", "nvidia-nccl-cu13"} <= set(cuda), cuda


def test_lock_with_the_cpu_index_resolves_cpu_torch(tmp_path):
    """The lock on a CPU machine, with PyTorch's CPU index added as docs/serving.md and the Dockerfile
    say (stood in for by the local index): the CPU build wins over PyPI's CUDA build of the same version."""
    index = local_cpu_index(tmp_path / "index", find_cpu_wheel(lock_pin("torch")))
    constraints = tmp_path / "constraints.txt"
    constraints.write_text(re.sub(r"\[[^\]]*\]", "", (REPO / "requirements.txt").read_text()))  # the docs' sed
    chosen = resolve(tmp_path, "lock", {"/tmp/boundgen-constraints.txt": str(constraints)},
                     ("--extra-index-url", index))
    assert chosen["torch"] == f"{lock_pin('torch')}+cpu", chosen["torch"]
    assert not [name for name in chosen if name.startswith("nvidia-")], sorted(chosen)

"""The package: `boundgen --version`, the protocol file shipped as package data, and
pyproject.toml's dependency ranges agreeing with the pins of requirements.txt."""

import importlib.resources
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from boundgen.version import __version__

tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
REPO = Path(__file__).resolve().parents[2]


def test_version_flag():
    proc = subprocess.run([sys.executable, "-m", "boundgen", "--version"], capture_output=True, text=True,
                          timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == f"boundgen {__version__}"
    assert re.fullmatch(r"\d+\.\d+\.\d+", __version__)


def test_kserve_proto_is_package_data():
    proto = importlib.resources.files("boundgen.server").joinpath("kserve.proto")
    assert proto.is_file() and "service GRPCInferenceService" in proto.read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "kserve.proto" in project["tool"]["setuptools"]["package-data"]["boundgen.server"]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (REPO / "requirements.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            req = Requirement(line)
            (spec,) = req.specifier
            assert spec.operator == "==", f"requirements.txt must pin exactly: {line}"
            pins[req.name.lower()] = spec.version
    return pins


def test_dependency_ranges_hold_the_pins():
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = [Requirement(r) for r in project["dependencies"]]
    for extra in ("client", "sign", "test", "serve", "bench", "dev"):
        assert extra in project["optional-dependencies"], extra
    extras = [Requirement(r) for reqs in project["optional-dependencies"].values() for r in reqs]
    for req in extras:  # an extra naming the project itself (dev) may only gather other extras
        assert req.name != "boundgen" or req.extras <= set(project["optional-dependencies"]), req
    declared += [req for req in extras if req.name != "boundgen"]
    pins = _pins()
    for req in declared:
        assert req.name.lower() in pins, f"{req.name} is declared in pyproject.toml but not pinned in requirements.txt"
        assert req.specifier.contains(pins[req.name.lower()], prereleases=True), (
            f"{req.name}=={pins[req.name.lower()]} (requirements.txt) is outside {req} (pyproject.toml)")
    names = {r.name.lower() for r in declared}
    assert set(pins) <= names, f"pinned but not declared in pyproject.toml: {sorted(set(pins) - names)}"
    assert Requirement(next(r for r in project["dependencies"] if r.startswith("torch"))).specifier.contains("2.11.0")


def test_license_is_apache_2_as_an_spdx_expression():
    """pyproject's `license` is the SPDX string (PEP 639, which setuptools reads from 77 on, hence
    the build requirement) and LICENSE holds the license's full text."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0" and project["project"]["license-files"] == ["LICENSE"]
    (backend,) = [Requirement(r) for r in project["build-system"]["requires"]]
    assert backend.name == "setuptools" and backend.specifier.contains("77") and not backend.specifier.contains("76")
    text = (REPO / "LICENSE").read_text()
    assert "Apache License\n                           Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text

"""An artifact served with another torch (or CUDA major) is refused with what to install or rebuild."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from boundgen.artifact.manifest import check_versions
from boundgen.errors import ArtifactError


def manifest(torch: str, cuda: str | None, device: str):
    return SimpleNamespace(name="demo-score", versions={"torch": torch, "cuda": cuda},
                           compile=SimpleNamespace(device=device))


@pytest.mark.parametrize("built,device,here,install", [
    (("2.13.0+cpu", None), "cpu", {"torch": "2.12.1+cpu", "cuda": None},
     "pip install 'torch==2.13.0' --index-url https://download.pytorch.org/whl/cpu"),
    (("2.13.0", "12.8"), "cuda:0", {"torch": "2.13.0", "cuda": "13.0"},
     "pip install 'torch==2.13.0' --index-url https://download.pytorch.org/whl/cu128"),
    (("2.13.0+cu126", "12.6"), "cuda", {"torch": "2.12.0+cu126", "cuda": "12.6"},
     "pip install 'torch==2.13.0' --index-url https://download.pytorch.org/whl/cu126"),
])
def test_mismatch_says_what_to_install_or_rebuild(built, device, here, install):
    with pytest.raises(ArtifactError) as err:
        check_versions(manifest(*built, device), here)
    message = str(err.value)
    assert install in message and "rebuild the artifact with `boundgen build`" in message
    assert f"torch {here['torch']}" in message


def test_same_major_minor_is_accepted():
    check_versions(manifest("2.13.0+cpu", None, "cpu"), {"torch": "2.13.1+cpu", "cuda": None})

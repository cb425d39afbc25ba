"""One tiny score artifact and one tiny beam artifact per session (two AOTInductor compiles on CPU).

Tests must not modify them: a test that tampers with an artifact works on a copy (`artifact_copy`).
With a CUDA build of torch (the GPU image) the test process restarts itself once with the system
libstdc++ preloaded, as the CLI does, so that in-process `boundgen.load` may load packages.
"""

import io
import json
import shutil

import pytest

from boundgen.artifact.manifest import MANIFEST_FILE, Manifest
from boundgen.compile import config
from boundgen.compile.pipeline import Progress, build
from boundgen.runtime import libstdcxx


def pytest_configure(config):
    """Restart pytest with the preload where loading packages would crash (never with a CPU torch)."""
    if libstdcxx.reexec_needed() is not None:
        capture = config.pluginmanager.getplugin("capturemanager")
        if capture is not None:  # the restarted process must inherit the real stdout / stderr
            capture.stop_global_capturing()
        libstdcxx.reexec_with_preload()

SCORE_OPTIONS = {"task": "score", "name": "tiny-score", "labels": [" yes", " no"], "max_samples": 4,
                 "max_tokens_per_sample": 16, "max_total_tokens": 40, "contexts": 2}
BEAM_OPTIONS = {"task": "beam", "name": "tiny-beam", "width": 4, "steps": 3, "max_prompt_tokens": 32,
                "max_requests": 2, "batching": True}


def _build(model_dir, out, options):
    log = io.StringIO()
    written = build(config.resolve(model_dir, out, options), Progress(log))
    manifest = json.loads((out / MANIFEST_FILE).read_text())  # as users and loaders see it
    assert Manifest.from_dict(manifest) == written
    return out, manifest, log.getvalue()


@pytest.fixture(scope="session")
def score_build(tiny_qwen3_dir, tmp_path_factory):
    """(artifact dir, manifest, progress log) of a tiny Qwen3 score artifact."""
    return _build(tiny_qwen3_dir, tmp_path_factory.mktemp("artifacts") / "score", SCORE_OPTIONS)


@pytest.fixture(scope="session")
def beam_build(tiny_qwen2_dir, tmp_path_factory):
    """(artifact dir, manifest, progress log) of a tiny Qwen2 beam artifact (qkv bias, stop token)."""
    return _build(tiny_qwen2_dir, tmp_path_factory.mktemp("artifacts") / "beam", BEAM_OPTIONS)


@pytest.fixture(scope="session")
def score_artifact(score_build):
    return score_build[0]


@pytest.fixture(scope="session")
def beam_artifact(beam_build):
    return beam_build[0]


@pytest.fixture
def artifact_copy(tmp_path):
    """copy(artifact_dir) -> a private copy to modify."""
    def copy(src):
        dst = tmp_path / src.name
        shutil.copytree(src, dst)
        return dst
    return copy

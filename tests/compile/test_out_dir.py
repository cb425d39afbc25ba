"""`boundgen build --out DIR`: a non-empty DIR is refused unless --force, and the artifact reaches DIR
only by renames, so DIR never holds half of one (compile/pipeline.py's put_in_place). Nothing here
compiles: the checks run before the build's work, and the renames are tested on plain folders."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from boundgen.artifact.manifest import MANIFEST_FILE
from boundgen.compile import config, pipeline
from boundgen.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]
OPTIONS = {"task": "score", "labels": [" yes", " no"], "max_samples": 2, "max_tokens_per_sample": 8}


def artifact(path: Path, content: str) -> Path:
    path.mkdir(parents=True)
    (path / MANIFEST_FILE).write_text(content)
    return path


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir() if p.name != path.name)


def test_a_new_artifact_goes_to_a_new_or_empty_directory(tmp_path):
    pipeline.put_in_place(artifact(tmp_path / ".new", "1"), tmp_path / "out", force=False)
    assert (tmp_path / "out" / MANIFEST_FILE).read_text() == "1"
    (tmp_path / "empty").mkdir()
    pipeline.put_in_place(artifact(tmp_path / ".new2", "2"), tmp_path / "empty", force=False)
    assert (tmp_path / "empty" / MANIFEST_FILE).read_text() == "2"
    assert siblings(tmp_path / "out") == ["empty"]


def test_force_replaces_an_earlier_artifact_and_leaves_nothing_beside_it(tmp_path):
    out = artifact(tmp_path / "out", "old")
    (out / "weights.bin").write_text("old weights")
    with pytest.raises(ConfigError, match="holds an artifact already; give --force"):
        pipeline.put_in_place(artifact(tmp_path / ".new", "new"), out, force=False)
    assert (out / MANIFEST_FILE).read_text() == "old"
    pipeline.put_in_place(tmp_path / ".new", out, force=True)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST_FILE] and (out / MANIFEST_FILE).read_text() == "new"
    assert siblings(out) == []


def test_force_does_not_replace_a_directory_that_is_not_an_artifact(tmp_path):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "keep.txt").write_text("keep me")
    with pytest.raises(ConfigError, match="not a boundgen artifact; refusing to overwrite"):
        pipeline.put_in_place(artifact(tmp_path / ".new", "new"), out, force=True)
    assert (out / "keep.txt").read_text() == "keep me"


def test_a_failed_rename_puts_the_earlier_artifact_back(tmp_path, monkeypatch):
    out = artifact(tmp_path / "out", "old")
    new = artifact(tmp_path / ".new", "new")
    real_replace, calls = os.replace, []

    def replace(src, dst):  # the second rename (new -> out) fails, as on a full or read-only disk
        calls.append(src)
        if len(calls) == 2:
            raise OSError("no space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(pipeline.os, "replace", replace)
    with pytest.raises(OSError, match="no space"):
        pipeline.put_in_place(new, out, force=True)
    assert (out / MANIFEST_FILE).read_text() == "old" and (new / MANIFEST_FILE).read_text() == "new"


def test_build_refuses_an_existing_artifact_before_any_work(tiny_qwen3_dir, tmp_path, monkeypatch):
    out = artifact(tmp_path / "art", "old")
    monkeypatch.setattr(pipeline, "load_model", lambda *a, **k: pytest.fail("the build started"))
    with pytest.raises(ConfigError, match="give --force"):
        pipeline.build(config.resolve(tiny_qwen3_dir, out, OPTIONS))
    assert (out / MANIFEST_FILE).read_text() == "old" and siblings(out) == []


def test_a_forced_build_that_fails_leaves_the_earlier_artifact_whole(tiny_qwen3_dir, tmp_path, monkeypatch):
    out = artifact(tmp_path / "art", "old")

    def crash(*args, **kwargs):
        raise RuntimeError("the build failed half way")

    monkeypatch.setattr(pipeline, "load_model", crash)
    with pytest.raises(RuntimeError, match="half way"):
        pipeline.build(config.resolve(tiny_qwen3_dir, out, OPTIONS), pipeline.Progress(open(os.devnull, "w")),
                       force=True)
    assert sorted(p.name for p in out.iterdir()) == [MANIFEST_FILE] and (out / MANIFEST_FILE).read_text() == "old"
    assert siblings(out) == []  # the temporary sibling is gone too


def test_cli_says_to_give_force(tiny_qwen3_dir, tmp_path):
    out = artifact(tmp_path / "art", "old")
    proc = subprocess.run([sys.executable, "-m", "boundgen", "build", str(tiny_qwen3_dir), "--task", "score",
                           "--labels", " yes", " no", "--out", str(out)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "give --force to replace it" in proc.stderr, proc.stderr[-2000:]

"""`boundgen score|beam ARTIFACT_DIR` print the same JSON as the MODEL_DIR path (real processes)."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from boundgen.runtime import libstdcxx

pytestmark = pytest.mark.slow  # uses the session's built artifacts

REPO = Path(__file__).resolve().parents[2]
TEXTS = ["query: running shoes | item: trail running shoe", "hello"]
PROMPT = "query: running shoes -> item:"


def cli(*args, env=None):
    proc = subprocess.run([sys.executable, "-m", "boundgen", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


def text_args(texts):
    return [a for t in texts for a in ("--text", t)]


def test_score_artifact_prints_what_the_model_dir_prints(score_artifact, tiny_qwen3_dir):
    compiled = cli("score", score_artifact, *text_args(TEXTS))
    eager = cli("score", tiny_qwen3_dir, "--labels", " yes", " no", "--max-tokens", "16", *text_args(TEXTS))
    assert compiled["label_token_ids"] == eager["label_token_ids"]
    np.testing.assert_allclose(compiled["scores"], eager["scores"], rtol=0, atol=1e-5)


def test_beam_artifact_prints_what_the_model_dir_prints(beam_artifact, tiny_qwen2_dir):
    compiled = cli("beam", beam_artifact, "--text", PROMPT)
    eager = cli("beam", tiny_qwen2_dir, "--width", "4", "--steps", "3", "--text", PROMPT)
    assert [c["token_ids"] for c in compiled["candidates"]] == [c["token_ids"] for c in eager["candidates"]]
    assert [c["text"] for c in compiled["candidates"]] == [c["text"] for c in eager["candidates"]]
    np.testing.assert_allclose([c["score"] for c in compiled["candidates"]],
                               [c["score"] for c in eager["candidates"]], rtol=0, atol=1e-4)


@pytest.mark.skipif(libstdcxx.system_libstdcxx() is None, reason="no libstdc++ in the linker cache")
def test_cli_reexecutes_itself_with_the_preload(score_artifact):
    """Forced here (a CPU torch needs no preload); on the GPU image it happens by itself."""
    env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", libstdcxx.GUARD_ENV)}
    env[libstdcxx.SWITCH_ENV] = "1"
    forced = cli("score", score_artifact, *text_args(TEXTS), env=env)
    assert forced == cli("score", score_artifact, *text_args(TEXTS))


def test_build_flags_errors_are_clear(tiny_qwen3_dir, tmp_path):
    proc = subprocess.run([sys.executable, "-m", "boundgen", "build", str(tiny_qwen3_dir), "--task", "score",
                           "--out", str(tmp_path / "a"), "--width", "4"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and "do not apply to a score build" in proc.stderr and "Traceback" not in proc.stderr


def fails(*args):
    proc = subprocess.run([sys.executable, "-m", "boundgen", *map(str, args)], cwd=REPO, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr and "internal error" not in proc.stderr, proc.stderr
    return proc.stderr


def test_what_an_artifact_fixed_is_refused_not_ignored(score_artifact, beam_artifact):
    """Flags an artifact fixed at build, the other task's artifact, a prompt given twice: each an error
    line (they were ignored, answered with the artifact's own settings, or an AttributeError)."""
    assert "--template, --topk do not apply to artifact" in fails("score", score_artifact, "--text", "hi",
                                                                   "--template", "Q: {text}", "--topk", "3")
    assert "--length-penalty does not apply to artifact" in fails("beam", beam_artifact, "--text", "hi",
                                                                   "--length-penalty", "2")
    assert "is a beam artifact: use `boundgen beam`" in fails("score", beam_artifact, "--text", "hi")
    assert "is a score artifact: use `boundgen score`" in fails("beam", score_artifact, "--text", "hi")
    assert "--text was given 2 times" in fails("beam", beam_artifact, "--text", "hi", "--text", "ho")


def _sigint_as_in_a_terminal():
    """A job started in the background (as CI runs the tests) inherits SIGINT ignored; a terminal's does not."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_build_stopped_midway_leaves_no_half_built_folder(tiny_qwen3_dir, tmp_path, signum):
    """SIGTERM (a scheduler's stop) cleans up as Ctrl-C does: `interrupted`, exit 130, no
    `.NAME.building-PID` folder beside the artifact (SIGTERM left it, with its files)."""
    proc = subprocess.Popen([sys.executable, "-m", "boundgen", "build", str(tiny_qwen3_dir), "--task", "score",
                             "--labels", " yes", " no", "--out", str(tmp_path / "art")], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_sigint_as_in_a_terminal)
    for _ in range(600):  # until the staging folder exists: the build is under way
        if any(p.name.startswith(".art.building-") for p in tmp_path.iterdir()):
            break
        time.sleep(0.1)
    proc.send_signal(signum)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and err.rstrip().endswith("interrupted"), err[-2000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_a_score_artifact_of_one_sample_a_request_builds_and_scores(tiny_qwen3_dir, tmp_path):
    """--max-samples 1 passed the flag's check, then export failed ("Constraints violated (B + 1)!"): its
    sequence dim (the sample and a filler for CUDA graphs) spans [1, 2], which export pins to 2."""
    art = tmp_path / "one"
    cli("build", tiny_qwen3_dir, "--task", "score", "--labels", " yes", " no", "--max-samples", "1",
        "--max-tokens-per-sample", "8", "--out", art)
    assert len(cli("score", art, "--text", "hello")["scores"]) == 1
    proc = subprocess.run([sys.executable, "-m", "boundgen", "score", str(art), "--text", "one", "--text", "two"],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "this model accepts at most 1" in proc.stderr, proc.stderr[-2000:]

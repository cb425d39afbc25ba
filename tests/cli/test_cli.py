"""The CLI contract: JSON outputs equal HF transformers on a demo checkpoint; bad input is a clear error."""

import json
import subprocess
import sys

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from boundgen.cli.main import main
from boundgen.model.demo import write_demo_checkpoint


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "tiny-qwen3"
    write_demo_checkpoint(path, "tiny-qwen3", seed=3)
    return str(path)


def run_cli(*args):
    proc = subprocess.run([sys.executable, "-m", "boundgen", *args], capture_output=True, text=True, timeout=300)
    return proc.returncode, proc.stdout, proc.stderr


def test_score_matches_hf(model_dir):
    texts = ["Is this query relevant to the document?", "hello", "多语言 text ✓"]
    args = ["score", model_dir, "--labels", " yes", " no", "--dtype", "float32"]
    for t in texts:
        args += ["--text", t]
    code, out, err = run_cli(*args)
    assert code == 0, err
    got = json.loads(out)
    tok = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = [tok.encode(label, add_special_tokens=False)[0] for label in (" yes", " no")]
    assert got["label_token_ids"] == ids
    with torch.no_grad():
        for text, row in zip(texts, got["scores"]):
            logits = hf(torch.tensor([tok.encode(text)])).logits[0, -1]
            ref = torch.softmax(logits[ids].float(), -1)
            assert torch.allclose(torch.tensor(row), ref, rtol=1e-4, atol=1e-6)


def test_beam_matches_hf(model_dir):
    prompt = "Generative retrieval for: running shoes"
    code, out, err = run_cli("beam", model_dir, "--width", "8", "--steps", "4", "--text", prompt,
                             "--dtype", "float32")
    assert code == 0, err
    cands = json.loads(out)["candidates"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids = torch.tensor([tok.encode(prompt)])
    with torch.no_grad():
        ref = hf.generate(ids, num_beams=8, num_return_sequences=8, max_new_tokens=4, min_new_tokens=4,
                          length_penalty=0.0, do_sample=False, output_scores=True, return_dict_in_generate=True)
    assert [c["token_ids"] for c in cands] == ref.sequences[:, ids.shape[1]:].tolist()
    assert torch.allclose(torch.tensor([c["score"] for c in cands]), ref.sequences_scores, atol=1e-4)
    assert cands[0]["text"] == tok.decode(cands[0]["token_ids"])


@pytest.mark.parametrize("args,message", [
    (["score", "{m}", "--labels", " yes"], "no samples"),
    (["score", "{m}", "--labels", " yes", "--text", "ok", "--text", "   "], "sample 1 is empty or whitespace"),
    (["score", "{m}", "--labels", " yes", "--text", "one two three four five six", "--max-tokens", "3"],
     "sample 0 has 6 tokens"),
    (["score", "{m}", "--labels", " yes please", "--text", "x"], "exactly one token"),
    (["score", "{m}", "--labels", "", "--text", "x"], "label"),
    (["beam", "{m}", "--width", "0", "--steps", "2", "--text", "x"], "beam width must be an integer in [1, 400]"),
    (["beam", "{m}", "--width", "401", "--steps", "2", "--text", "x"], "beam width must be an integer in [1, 400]"),
    (["beam", "{m}", "--width", "4", "--steps", "6", "--text", "x"], "in [1, 5]"),
    (["beam", "{m}", "--width", "4", "--steps", "2", "--text", ""], "empty"),
    (["beam", "{m}", "--width", "4", "--steps", "2"], "no prompt"),
    (["beam", "{m}", "--width", "4", "--steps", "2", "--text", "x", "--length-penalty", "nan"], "must be a number in"),
    (["beam", "{m}", "--width", "4", "--steps", "2", "--text", "x", "--length-penalty", "1100"], "must be a number in"),
    (["beam", "{m}", "--width", "4", "--steps", "2", "--text", "x", "--stop-token-ids", "99999999"],
     "outside the model's vocabulary"),
    (["beam", "{m}", "--width", "4", "--steps", "2", "--text", "x", "--max-tokens", "0"], "--max-tokens must be"),
    (["beam", "{m}", "--width", "4", "--steps", "2", "--text", "x", "--stop-token-ids", ""],
     "or none, got an empty text"),  # an unset shell variable dropped the stop tokens without a word
    (["score", "{m}", "--labels", " yes", "--text", "x", "--template", "\udcff{text}"], "is not valid UTF-8 text"),
    (["score", "{m}", "--labels", " yes", "--text", "x", "--device", "tpu"], "--device must be cpu, cuda"),
    (["score", "{m}", "--labels", " yes", "--text", "x", "--topk", "10000000"], "topk must be in"),
    (["score", "{m}", "--labels", "\udcff", "--text", "x"], "is not valid UTF-8 text"),
    (["score", "/nonexistent/model", "--labels", " yes", "--text", "x"], "not a directory"),
])
def test_bad_input_is_a_clear_error(model_dir, capsys, args, message):
    code = main([a.replace("{m}", model_dir) for a in args])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("error: ") and message in err, err
    assert "Traceback" not in err


def test_error_exit_code_in_a_real_process(model_dir):
    code, out, err = run_cli("beam", model_dir, "--width", "4", "--steps", "9", "--text", "x")
    assert code == 2 and out == "" and "Traceback" not in err and "steps" in err


def test_an_error_keeps_its_exit_code_when_nobody_reads_stderr(model_dir):
    """The reader of stderr has gone (EPIPE on the error line): the exit status still says what
    happened (2), where the failed print raised out of main and exited 1 with a traceback."""
    import os

    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to the pipe meets EPIPE
    proc = subprocess.run([sys.executable, "-m", "boundgen", "beam", model_dir, "--width", "4", "--steps", "9",
                           "--text", "x"], stdout=subprocess.DEVNULL, stderr=write_end, timeout=300)
    os.close(write_end)
    assert proc.returncode == 2


@pytest.mark.parametrize("argv", [
    ["keygen", "/nonexistent-dir/k"],
    ["demo-model", "/proc/boundgen-demo", "--preset", "tiny-qwen3"],
])
def test_a_path_that_cannot_be_used_is_an_error_line_not_an_internal_error(argv, capsys):
    """A path the user gave that cannot be made or written: `error: PATH: why`, exit 2 (it was
    `internal error: FileNotFoundError ...`, exit 1)."""
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: /") and "internal error" not in err, err


def test_keygen_to_an_empty_path_is_an_error_naming_it(capsys):
    assert main(["keygen", ""]) == 2  # it said "'.' exists; refusing to overwrite a key"
    assert "the key's path is empty" in capsys.readouterr().err


@pytest.mark.parametrize("name,content,message", [
    ("config.json", "{not json", "config.json is not valid JSON"),
    ("config.json", "[1, 2]", "config.json must hold one JSON object, got list"),
    ("config.json", b"\xff\xfe{", "config.json is not UTF-8 text"),
    ("generation_config.json", "xx", "generation_config.json is not valid JSON"),
    ("generation_config.json", '{"eos_token_id": "abc"}', "eos_token_id must be a token id or a list of them"),
    ("generation_config.json", '{"eos_token_id": [5, -3]}', "eos_token_id must be a token id or a list of them"),
])
def test_a_corrupt_checkpoint_file_is_an_error_line(model_dir, tmp_path, capsys, name, content, message):
    """build, score and beam alike (build and beam raised JSONDecodeError, TypeError or ValueError)."""
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(model_dir, broken)
    (broken / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    runs = [["beam", str(broken), "--width", "2", "--steps", "2", "--text", "x"],
            ["build", str(broken), "--task", "beam", "--width", "2", "--steps", "2", "--out", str(tmp_path / "a")]]
    if name == "config.json":
        runs.append(["score", str(broken), "--labels", " yes", "--text", "x"])
    for argv in runs:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err, (argv, err)

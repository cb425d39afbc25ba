"""Constrained beam search against HF `generate(prefix_allowed_tokens_fn=...)` over the same trie
(FP32): the same candidates in the same order with the same scores, each naming its item.

HF's answer is well defined for its real candidates. Where fewer than W items can be reached, HF
fills its remaining rows with hypotheses of its initial beams 1 .. W-1 (score offset -1e9, equal
in FP32 and so in no defined order) or -inf; the program returns those rows as missing: token
ids -1, score -inf, item -1. The tests compare the real rows and check the missing ones."""

import dataclasses
import os
import random

import pytest
import torch

from boundgen.errors import ConfigError
from boundgen.model.loader import load_model
from boundgen.ops import trie_mask
from boundgen.ops.lowering import OpLowering
from boundgen.programs.beam import BeamProgram
from boundgen.programs.constraint import CatalogueConstraint
from boundgen.text import catalogue_search
from boundgen.text.catalogue import Catalogue
from tests.hf_reference import make_hf_model, save

PROMPT_LEN = 9
STOP = 3
INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
REAL = -1.0e8  # HF scores above this are real hypotheses (its initial beams 1 .. W-1 start at -1e9)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """family -> (HF model, ours masking the log-probs with the torch lowering and taking the top K
    over the vocabulary (`--lowering trie_topk=separate`), the same with the mask's Triton kernel,
    ours with the default lowering: a decode step's top K over the allowed tokens alone)."""
    out = {}
    for family, kw in (("qwen3", dict(tied=False, head_dim=16)), ("qwen2", dict())):
        hf = make_hf_model(family, seed=5, **kw)
        path = save(hf, tmp_path_factory.mktemp(family))
        out[family] = (hf, load_model(path, ops=OpLowering(trie_topk="separate").resolve()),
                       load_model(path, ops=kernel_ops()), load_model(path))
    return out


def kernel_ops():
    """`--lowering trie_mask=triton --lowering trie_topk=separate` (the mask at every step). On CPU
    the registered op runs its reference, so the kernel itself is swapped in through its launcher
    (under the interpreter; conftest.py)."""
    ops = OpLowering(trie_mask="triton", trie_topk="separate").resolve()
    assert ops.trie_mask is trie_mask.trie_mask
    return dataclasses.replace(ops, trie_mask=trie_mask.apply_launch) if INTERPRETED else ops


def allowed_fn(cat: Catalogue, stops, allow_items=None):
    """HF's prefix_allowed_tokens_fn over the trie: a node's reachable child tokens, plus the first
    stop token where an allowed item ends. Beams off the catalogue (HF's -inf beams) get token 0: their
    score stays -inf whatever they take (HF refuses an empty list)."""
    ends, reach = cat.reachable(allow_items)

    def fn(batch_id, input_ids):
        node = cat.lookup(input_ids[PROMPT_LEN:].tolist())
        if node < 0:
            return [0]
        lo = int(cat.row_ptr[node])
        tokens = [t for e, t in enumerate(cat.allowed(node), start=lo) if reach[e + 1]]
        tokens += list(stops[:1]) if ends[node] else []
        return tokens or [0]

    return fn


VARIANTS = ("mask", "kernel", "gather")  # the models fixture's programs, after HF's
SELECTIONS = ("mask", "gather")  # the parity tests': mask and top K over V, or the gathered top K


def run_both(models, family, cat, width, steps, stops=(), allow_items=None, seed=0, variant="gather", **kw):
    """Our program (variant: the torch mask, the mask's Triton kernel, or the gathered top K)
    and HF generate on one random prompt."""
    hf, *ours_models = models[family]
    model = ours_models[VARIANTS.index(variant)]
    prompt = torch.randint(0, 512, (PROMPT_LEN,), generator=torch.Generator().manual_seed(seed))
    constraint = CatalogueConstraint(cat, model.cfg.vocab_size, steps, stops, allow_items)
    prog = BeamProgram(model, width, steps, stop_token_ids=list(stops), constraint=constraint, **kw)
    with torch.no_grad():
        ours = prog(prompt, torch.arange(PROMPT_LEN), torch.tensor([0, PROMPT_LEN], dtype=torch.int32))
        eos = list(stops) or [STOP]
        theirs = hf.generate(prompt[None], num_beams=width, num_return_sequences=width, max_new_tokens=steps,
                             do_sample=False, output_scores=True, return_dict_in_generate=True, eos_token_id=eos,
                             pad_token_id=eos[0], length_penalty=0.0,
                             prefix_allowed_tokens_fn=allowed_fn(cat, stops, allow_items), **kw)
    return ours, theirs


def strip(row, stops):
    out = []
    for t in row:
        if t < 0:
            break
        out.append(int(t))
        if t in stops:
            break
    return out


def check_parity(cat, ours, theirs, stops=(), allow_items=None):
    """The real rows equal HF's; the rest are missing. Returns the real candidates' item ids."""
    seq, scores, finished, parents, items = ours
    hf_scores = theirs.sequences_scores
    real = int((hf_scores > REAL).sum())
    assert (hf_scores[:real] > REAL).all() and (scores[:real] > REAL).all()
    hf_seq = [strip(r, stops) for r in theirs.sequences[:real, PROMPT_LEN:].tolist()]
    assert [strip(r, stops) for r in seq[:real].tolist()] == hf_seq, "candidate sequences differ"
    torch.testing.assert_close(scores[:real], hf_scores[:real], rtol=0, atol=1e-5)
    for ours_bi, hf_bi, r in zip(parents[:real].tolist(), theirs.beam_indices[:real].tolist(), hf_seq):
        assert ours_bi[:len(r)] == hf_bi[:len(r)]
    assert (seq[real:] == -1).all() and torch.isneginf(scores[real:]).all() and (items[real:] == -1).all()
    assert not finished[real:].any()
    ends, _ = cat.reachable(allow_items)
    for r, item in zip(hf_seq, items[:real].tolist()):
        node = cat.lookup([t for t in r if t not in stops])
        assert node >= 0 and ends[node] and cat.node_item[node] == item
    assert finished[:real].tolist() == [r[-1] in stops for r in hf_seq]
    return items[:real].tolist(), real


def random_codes(rng, n, lengths, alphabet, first=None):
    codes = set()
    while len(codes) < n:
        length = rng.choice(lengths)
        head = [rng.choice(first)] if first else []
        codes.add(tuple(head + [rng.choice(alphabet) for _ in range(length - len(head))]))
    return [list(c) for c in codes]


ALPHABET = [t for t in range(512) if t != STOP]


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
@pytest.mark.parametrize("width", [2, 8])
@pytest.mark.parametrize("variant", SELECTIONS)
def test_one_token_codes(models, family, width, variant):
    rng = random.Random(width)
    codes = random_codes(rng, 40, [1], ALPHABET)
    cat = Catalogue.from_sequences(range(100, 140), codes)
    ours, theirs = run_both(models, family, cat, width, 1, variant=variant, seed=width)
    items, real = check_parity(cat, ours, theirs)
    assert real == width and len(set(items)) == width


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
@pytest.mark.parametrize("width, steps", [(4, 2), (8, 3), (16, 4)])
@pytest.mark.parametrize("variant", SELECTIONS)
def test_multi_token_codes_with_shared_prefixes(models, family, width, steps, variant):
    rng = random.Random(steps)
    # Few first tokens and a small alphabet: most codes share a prefix with others.
    codes = random_codes(rng, 30, [steps], ALPHABET[:12], first=[40, 41, 42])
    cat = Catalogue.from_sequences(range(len(codes)), codes)
    ours, theirs = run_both(models, family, cat, width, steps, variant=variant, seed=steps)
    items, real = check_parity(cat, ours, theirs)
    assert real == width and len(set(items)) == width


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
@pytest.mark.parametrize("width", [4, 12])
@pytest.mark.parametrize("variant", SELECTIONS)
def test_codes_of_several_lengths_end_with_a_stop_token(models, family, width, variant):
    """Items of 1-3 tokens, some a prefix of others, N = 3: a shorter item ends with the stop token."""
    rng = random.Random(width)
    codes = random_codes(rng, 60, [1, 2, 3], ALPHABET[:8])
    codes += [[20], [20, 21], [20, 21, 22]]
    codes = [list(c) for c in dict.fromkeys(map(tuple, codes))]
    cat = Catalogue.from_sequences(range(len(codes)), codes)
    seen_stop = 0
    for seed in range(3):
        ours, theirs = run_both(models, family, cat, width, 3, stops=(STOP,), variant=variant, seed=seed)
        items, real = check_parity(cat, ours, theirs, stops=(STOP,))
        assert real == width and len(set(items)) == width
        seen_stop += int(ours[2].sum())
    assert seen_stop > 0, "no candidate ended with the stop token: the test would prove nothing"


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
@pytest.mark.parametrize("steps", [1, 2, 3])
@pytest.mark.parametrize("variant", SELECTIONS)
def test_catalogue_smaller_than_the_width(models, family, steps, variant):
    codes = [[30 + i] * steps for i in range(3)]
    cat = Catalogue.from_sequences([7, 8, 9], codes)
    ours, theirs = run_both(models, family, cat, 8, steps, variant=variant, seed=steps)
    items, real = check_parity(cat, ours, theirs)
    assert real == 3 and sorted(items) == [7, 8, 9]


@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
@pytest.mark.parametrize("variant", SELECTIONS)
def test_allow_list_empties_a_branch(models, family, variant):
    """Items under first tokens 50 and 51; the allow-list keeps two items under 50: nothing of 51's
    branch (which the model may prefer) is generated, and only allowed items come back."""
    codes = [[50, 60], [50, 61], [50, 62], [51, 60], [51, 61], [51, 63], [52, 64]]
    cat = Catalogue.from_sequences(range(10, 17), codes)
    for allow in ([10, 12], [13], [16, 11]):
        ours, theirs = run_both(models, family, cat, 4, 2, allow_items=allow, variant=variant, seed=len(allow))
        items, real = check_parity(cat, ours, theirs, allow_items=allow)
        assert sorted(items) == sorted(allow) and real == len(allow)


@pytest.mark.parametrize("variant", SELECTIONS)
def test_allow_list_with_stop_tokens(models, variant):
    """An item that is a prefix of another, left out of the allow-list: its node lets the beam on
    but not end there."""
    codes = [[70], [70, 71], [70, 72], [73]]
    cat = Catalogue.from_sequences([1, 2, 3, 4], codes)
    ours, theirs = run_both(models, "qwen3", cat, 4, 2, stops=(STOP,), allow_items=[2, 3, 4], variant=variant,
                            seed=1)
    items, real = check_parity(cat, ours, theirs, stops=(STOP,), allow_items=[2, 3, 4])
    assert sorted(items) == [2, 3, 4]


@pytest.mark.parametrize("variant", SELECTIONS)
def test_several_stop_tokens_end_an_item_once(models, variant):
    codes = [[70], [70, 71], [72, 73], [74]]
    cat = Catalogue.from_sequences([1, 2, 3, 4], codes)
    ours, theirs = run_both(models, "qwen3", cat, 4, 3, stops=(STOP, 4), variant=variant, seed=3)
    items, real = check_parity(cat, ours, theirs, stops=(STOP, 4))
    assert sorted(items) == [1, 2, 3, 4]


@pytest.mark.parametrize("variant", SELECTIONS)
def test_min_new_tokens_bars_a_short_item_from_ending(models, variant):
    codes = [[70], [70, 71], [72, 73]]
    cat = Catalogue.from_sequences([1, 2, 3], codes)
    ours, theirs = run_both(models, "qwen3", cat, 4, 2, stops=(STOP,), variant=variant, seed=2, min_new_tokens=2)
    items, _ = check_parity(cat, ours, theirs, stops=(STOP,))
    assert sorted(items) == [2, 3]


def test_unconstrained_program_is_unchanged(models):
    """No constraint: the program is the plain search (no item output)."""
    _, model, *_ = models["qwen3"]
    prog = BeamProgram(model, 4, 2)
    prompt = torch.arange(5)
    with torch.no_grad():
        out = prog(prompt, torch.arange(5), torch.tensor([0, 5], dtype=torch.int32))
    assert len(out) == 4 and prog.constraint is None


def test_program_checks_the_catalogue(models):
    cat = Catalogue.from_sequences([1, 2], [[5, 6, 7], [5]])
    with pytest.raises(ConfigError, match="3 tokens; this beam search generates 2"):
        CatalogueConstraint(cat, 512, 2, (STOP,))
    with pytest.raises(ConfigError, match="shorter than --steps 3"):
        CatalogueConstraint(cat, 512, 3, ())
    with pytest.raises(ConfigError, match="contain a stop token"):
        CatalogueConstraint(cat, 512, 3, (6,))
    with pytest.raises(ConfigError, match="outside the model's vocabulary"):
        CatalogueConstraint(Catalogue.from_sequences([1], [[600]]), 512, 1)
    with pytest.raises(ConfigError, match="not in the catalogue"):
        CatalogueConstraint(cat, 512, 3, (STOP,), allow_items=[9])


@pytest.mark.skipif(not INTERPRETED, reason="the kernel under the interpreter, on the CPU programs HF runs beside "
                                          "(compiled on CUDA: tests/ops/test_trie_mask.py)")
@pytest.mark.parametrize("family", ["qwen3", "qwen2"])
def test_triton_mask_lowering_matches_hf_and_the_torch_lowering(models, family):
    """--lowering trie_mask=triton (with trie_topk=separate): the kernel masks the log-probs in place
    at every step (the root's at step 0): the same candidates, scores and items as HF and as the
    torch mask, over
    codes of several lengths with a stop token, shared prefixes and an allow-list."""
    rng = random.Random(11)
    codes = random_codes(rng, 40, [1, 2, 3], ALPHABET[:8], first=[40, 41, 42])
    codes = [list(c) for c in dict.fromkeys(map(tuple, codes + [[40], [40, 1], [40, 1, 2]]))]
    cat = Catalogue.from_sequences(range(len(codes)), codes)
    for allow in (None, list(range(0, len(codes), 3))):
        ours, theirs = run_both(models, family, cat, 6, 3, stops=(STOP,), allow_items=allow, seed=4, variant="kernel")
        check_parity(cat, ours, theirs, stops=(STOP,), allow_items=allow)
        torch_lowering, _ = run_both(models, family, cat, 6, 3, stops=(STOP,), allow_items=allow, seed=4,
                                     variant="mask")
        for got, want in zip(ours, torch_lowering):
            assert torch.equal(got, want)


def test_trie_mask_against_a_loop():
    rng = random.Random(0)
    codes = random_codes(rng, 80, [1, 2, 3], list(range(10)))
    cat = Catalogue.from_sequences(range(80), codes)
    ends, reach = cat.reachable(list(range(0, 80, 3)))
    arrays = catalogue_search.arrays(cat, 16, (reach, ends))  # the program's trie arrays, one length M
    nodes = torch.tensor(list(range(cat.num_nodes)) + [-1])
    trie = (torch.from_numpy(arrays[k]) for k in ("row_ptr", "child_token"))
    trie = (*trie, *(torch.from_numpy(arrays[k])[None] for k in ("reach", "ends")))  # one allow-list row
    bias = trie_mask.reference(nodes, *trie, torch.tensor([11, 12]), 16, max(cat.max_degree()))
    for n, row in zip(nodes.tolist(), bias):
        want = set()
        if n >= 0:
            lo = int(cat.row_ptr[n])
            want = {t for e, t in enumerate(cat.allowed(n), start=lo) if reach[e + 1]}
            want |= {11, 12} if ends[n] else set()
        assert set(torch.nonzero(row == 0).flatten().tolist()) == want
        assert torch.isneginf(row[[t for t in range(16) if t not in want]]).all()


def test_cli_beam_with_a_catalogue(tmp_path, tiny_qwen3_dir, capsys):
    """`boundgen beam --catalogue` on a checkpoint: candidates with item ids, an allow-list, a
    catalogue smaller than W (missing candidates: no tokens, null score, item -1)."""
    import json

    from boundgen.cli.main import main

    items = tmp_path / "items.jsonl"
    items.write_text('{"item_id": 1, "text": "running shoes"}\n{"item_id": 2, "token_ids": [5, 6]}\n'
                     '{"item_id": 3, "text": "running socks"}\n')
    cat = tmp_path / "cat"
    assert main(["catalogue", "build", str(items), "--tokenizer", str(tiny_qwen3_dir), "--out", str(cat)]) == 0
    capsys.readouterr()
    base = ["beam", str(tiny_qwen3_dir), "--width", "4", "--steps", "3", "--text", "query: running ->",
            "--catalogue", str(cat)]
    assert main(base) == 0
    cands = json.loads(capsys.readouterr().out)["candidates"]
    assert sorted(c["item_id"] for c in cands[:3]) == [1, 2, 3]
    assert cands[3] == {"token_ids": [], "text": "", "score": None, "item_id": -1}
    assert all(c["score"] is not None for c in cands[:3])
    assert main(base + ["--allow-items", "3"]) == 0
    cands = json.loads(capsys.readouterr().out)["candidates"]
    assert [c["item_id"] for c in cands] == [3, -1, -1, -1] and cands[0]["text"] == "running socks"
    assert main(base + ["--allow-items", "4"]) == 2
    assert "[4] are not in the catalogue" in capsys.readouterr().err
    assert main(base[:5] + ["1"] + base[6:]) == 2
    assert "generates 1 (--steps)" in capsys.readouterr().err

"""A request context's trie buffers (runtime/context.py), what a constrained beam artifact's CUDA
graphs read: padded past a catalogue's M to their fixed length they give the same search as the
catalogue's own arrays (torch mask and Triton kernel), a call copies only what changed, and the
engine sizes them at its first catalogue and refuses one that does not fit. On the CPU: graphs
are CUDA only, so the engine test runs the graph path's staging with the GraphRunner passing
through (tests/compile/test_constrained_graphs.py replays real graphs on a GPU)."""

import dataclasses
import os
import random

import pytest
import torch

from boundgen.artifact.manifest import RuntimeConfig
from boundgen.artifact.program import BeamSpec
from boundgen.artifact.tensors import FILTERS, TRIE, call_trie
from boundgen.errors import ConfigError, InvalidInput
from boundgen.model.loader import load_model
from boundgen.ops import trie_mask
from boundgen.ops.lowering import OpLowering
from boundgen.programs.beam import BeamProgram
from boundgen.programs.constraint import CatalogueConstraint
from boundgen.programs.eager import eager_engine
from boundgen.runtime import local_engine
from boundgen.runtime.catalogue import ServedCatalogue
from boundgen.runtime.context import RequestContext
from boundgen.runtime.graphs import GraphRunner
from boundgen.text import catalogue_search
from boundgen.text.catalogue import Catalogue
from tests.conftest import CONSTRAINED_ITEMS
from tests.hf_reference import make_hf_model, save

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
VOCAB, STOP, PROMPT_LEN = 512, 3, 9


def random_catalogue(seed: int, items: int, alphabet=range(4, 40)) -> Catalogue:
    """Distinct codes of 1 to 3 tokens (never STOP), item ids scattered."""
    rng = random.Random(seed)
    codes = set()
    while len(codes) < items:
        codes.add(tuple(rng.choice(alphabet) for _ in range(rng.choice((1, 2, 3)))))
    return Catalogue.from_sequences(rng.sample(range(10_000), items), [list(c) for c in sorted(codes)])


def context(length: int, rows: int = 2) -> RequestContext:
    ctx = RequestContext(16, rows, torch.device("cpu"))
    ctx.hold_trie(length, rows)
    return ctx


def padded_like_the_catalogue(cat: Catalogue, allow, length: int) -> dict:
    """The TRIE arrays as text/catalogue_search.py pads them, to `length` entries."""
    arrays = catalogue_search.arrays(cat, VOCAB, catalogue_search.allowed(cat, allow))
    pad = {"row_ptr": int(arrays["row_ptr"][-1]), **catalogue_search.PADDING}
    out = {}
    for name, array in arrays.items():
        array = torch.from_numpy(array)
        out[name] = torch.cat((array, torch.full((length - len(array),), pad[name], dtype=array.dtype)))
    return out


def test_staged_buffers_are_the_catalogue_padded_to_their_length():
    big, small = random_catalogue(0, 60), random_catalogue(1, 5)
    length = catalogue_search.length(big.num_nodes) + 7
    ctx = context(length)
    served = {name: ServedCatalogue.on_device(cat, VOCAB, "cpu") for name, cat in (("big", big), ("small", small))}
    allow = sorted(big.node_item[big.node_item >= 0][::4].tolist())
    # big, an allow-list of big, small (shorter: big's entries past its M must not stay), big again
    for name, cat, items in (("big", big, None), ("big", big, allow), ("small", small, None), ("big", big, None)):
        buffers = ctx.stage_trie([served[name].trie(items)])
        want = padded_like_the_catalogue(cat, items, length)
        for field in TRIE:
            got = getattr(buffers, field)
            if field in FILTERS:  # a row per request of the call: one here
                assert got.shape == (1, length)
                got = got[0]
            assert torch.equal(got, want[field]), (name, items is not None, field)
    assert (ctx.trie.reach[1] == catalogue_search.PADDING["reach"]).all()  # the unused row: padding only
    two = ctx.stage_trie([served["big"].trie(allow), served["big"].trie()])  # a call of two requests
    for row, items in enumerate((allow, None)):
        want = padded_like_the_catalogue(big, items, length)
        assert torch.equal(two.reach[row], want["reach"]) and torch.equal(two.ends[row], want["ends"])


def test_a_call_copies_only_what_changed(monkeypatch):
    cat, other = random_catalogue(2, 30), random_catalogue(3, 30)
    served, replaced = ServedCatalogue.on_device(cat, VOCAB, "cpu"), ServedCatalogue.on_device(other, VOCAB, "cpu")
    ctx = context(catalogue_search.length(max(cat.num_nodes, other.num_nodes)))
    copied = []
    copy = ctx._copy
    monkeypatch.setattr(ctx, "_copy", lambda name, buffer, tensor: (copied.append(name), copy(name, buffer, tensor)))

    def staged(*tries):
        copied.clear()
        ctx.stage_trie(list(tries))
        return list(copied)

    catalogue_arrays, pair = ["row_ptr", "child_token", "edge_keys", "node_item"], ["reach", "ends"]
    full = served.trie()
    assert staged(full) == catalogue_arrays + pair
    assert staged(full) == []  # the catalogue it holds, every item allowed: nothing to copy
    items = cat.node_item[cat.node_item >= 0][:3].tolist()
    assert staged(served.trie(items)) == pair  # an allow-list: its reach and ends only
    assert staged(served.trie(items)) == pair  # each request's allow-list is its own pair
    assert staged(full, full) == pair * 2  # row 0 back to the whole catalogue, row 1 its first use
    assert staged(full, served.trie(items)) == pair  # row 0 holds it: only row 1's allow-list
    assert staged(replaced.trie()) == catalogue_arrays + pair  # a replaced catalogue: everything
    assert staged(replaced.trie(), replaced.trie()) == pair  # row 1 too held the old catalogue's
    with pytest.raises(ValueError, match="does not fit"):
        context(catalogue_search.length(cat.num_nodes) - 1).stage_trie([full])
    with pytest.raises(ValueError, match="a call of 3 requests does not fit this context's 2 trie rows"):
        ctx.stage_trie([full] * 3)


@pytest.fixture(scope="module")
def small_model(tmp_path_factory):
    """(the torch lowering, the mask's Triton kernel) of one tiny Qwen2 with a 512-token vocabulary."""
    path = save(make_hf_model("qwen2", seed=5), tmp_path_factory.mktemp("qwen2"))
    ops = OpLowering(trie_mask="triton").resolve()
    if INTERPRETED:  # on CPU the registered op runs its reference: swap the kernel in through its launcher
        ops = dataclasses.replace(ops, trie_mask=trie_mask.apply_launch)
    return load_model(path), load_model(path, ops=ops)


@pytest.mark.parametrize("lowering", ["torch", pytest.param("triton", marks=pytest.mark.skipif(
    not INTERPRETED, reason="the kernel under the interpreter (compiled on CUDA: tests/ops/test_trie_mask.py)"))])
def test_padding_leaves_the_search_unchanged(small_model, lowering):
    """The constrained program with trie inputs (a compiled artifact's form): the catalogue's own
    arrays and a context's longer buffers give the same beams, scores and item ids, with and
    without an allow-list."""
    model = small_model[lowering == "triton"]
    cat = random_catalogue(4, 40, alphabet=range(4, 12))
    width, steps = 6, 3
    program = BeamProgram(model, width, steps, stop_token_ids=[STOP],
                          constraint=CatalogueConstraint.inputs(VOCAB, steps, [STOP], max(cat.max_degree()[1:])))
    prompt = torch.randint(0, VOCAB, (PROMPT_LEN,), generator=torch.Generator().manual_seed(0))
    packed = (prompt, torch.arange(PROMPT_LEN), torch.tensor([0, PROMPT_LEN], dtype=torch.int32))
    served = ServedCatalogue.on_device(cat, VOCAB, "cpu")
    ctx = context(3 * catalogue_search.length(cat.num_nodes))
    items = cat.node_item[cat.node_item >= 0][::3].tolist()
    for allow in (None, items):
        trie = served.trie(allow)
        with torch.no_grad():
            own = program(*packed, *call_trie([trie]))
            buffered = program(*packed, *ctx.stage_trie([trie]))
        assert (own[4] >= 0).sum() >= 2  # candidates that name items
        for got, want in zip(buffered, own):
            assert torch.equal(got, want)


# -- the engine: buffers sized at the first catalogue, later ones copied in or refused -------------

SPEC = BeamSpec(width=4, steps=3, stop_token_ids=(151643,), max_prompt_tokens=32, constrained=True)
PROMPTS = ["query: running shoes -> item:", "hello"]


def tiny_catalogue(items) -> Catalogue:
    return Catalogue.from_sequences([i for i, _ in items], [t for _, t in items])


@pytest.fixture(scope="module")
def engines(tiny_qwen2_dir):
    """(the eager engine with the graph path's staging: GraphRunner, padding, trie buffers; the
    same without), each serving CONSTRAINED_ITEMS. Settings in effect as on CUDA, here on the CPU,
    where the GraphRunner calls the program directly."""
    runtime = RuntimeConfig(cuda_graphs=True, contexts=2, token_bucket=16)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local_engine, "settings_in_effect", lambda runtime, spec, device: runtime)
        graphs = eager_engine(tiny_qwen2_dir, SPEC, runtime=runtime)
    plain = eager_engine(tiny_qwen2_dir, SPEC, runtime=runtime)
    assert isinstance(graphs.runner, GraphRunner) and not isinstance(plain.runner, GraphRunner)
    vocab = graphs.runner.runner.program.model.cfg.vocab_size
    for engine in (graphs, plain):
        engine.set_catalogue(ServedCatalogue.on_device(tiny_catalogue(CONSTRAINED_ITEMS), vocab, "cpu"))
        engine.warmup()
    yield graphs, plain, vocab
    graphs.close()
    plain.close()


def same_candidates(graphs, plain, allow=None):
    for prompt in PROMPTS:
        got, want = graphs.beam(prompt, allow_items=allow), plain.beam(prompt, allow_items=allow)
        assert got.token_ids.tolist() == want.token_ids.tolist() and got.item_ids.tolist() == want.item_ids.tolist()
        torch.testing.assert_close(torch.from_numpy(got.scores), torch.from_numpy(want.scores), rtol=0, atol=1e-4)
        assert (got.item_ids >= 0).any()


def test_engine_stages_every_catalogue_into_the_same_buffers(engines):
    graphs, plain, vocab = engines
    nodes = tiny_catalogue(CONSTRAINED_ITEMS).num_nodes
    assert graphs.catalogue_max_nodes == nodes + nodes // 4 and plain.catalogue_max_nodes == 0
    assert all(ctx.trie is None for ctx in plain.contexts)  # without graphs the trie is passed as it is
    buffers = [[t.data_ptr() for t in ctx.trie] for ctx in graphs.contexts]
    assert all(ctx.trie.row_ptr.shape[0] == catalogue_search.length(graphs.catalogue_max_nodes)
               for ctx in graphs.contexts)
    same_candidates(graphs, plain)
    same_candidates(graphs, plain, allow=[11, 16, 17])
    smaller = tiny_catalogue(CONSTRAINED_ITEMS[3:6])
    for engine in (graphs, plain):
        engine.set_catalogue(ServedCatalogue.on_device(smaller, vocab, "cpu"))
    same_candidates(graphs, plain)
    same_candidates(graphs, plain, allow=[15])
    larger = tiny_catalogue([(100 + i, [40 + i, 50 + i, 60 + i]) for i in range(12)])
    words = (rf"has {larger.num_nodes} trie nodes; .* at most {graphs.catalogue_max_nodes} .*"
             rf"--catalogue-max-nodes {larger.num_nodes} or more")
    with pytest.raises(ConfigError, match=words):
        graphs.set_catalogue(ServedCatalogue.on_device(larger, vocab, "cpu"))
    assert graphs.catalogue.catalogue is smaller  # the served catalogue stays
    plain.set_catalogue(ServedCatalogue.on_device(larger, vocab, "cpu"))  # no buffers to fit without graphs
    assert [[t.data_ptr() for t in ctx.trie] for ctx in graphs.contexts] == buffers  # never reallocated


def test_catalogue_max_nodes_sizes_the_buffers(tiny_qwen2_dir):
    runtime = RuntimeConfig(cuda_graphs=True, token_bucket=16, catalogue_max_nodes=500)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local_engine, "settings_in_effect", lambda runtime, spec, device: runtime)
        engine = eager_engine(tiny_qwen2_dir, SPEC, runtime=runtime)
    try:
        vocab = engine.runner.runner.program.model.cfg.vocab_size
        engine.set_catalogue(ServedCatalogue.on_device(tiny_catalogue(CONSTRAINED_ITEMS[:2]), vocab, "cpu"))
        assert engine.catalogue_max_nodes == 500
        assert engine.contexts[0].trie.row_ptr.shape[0] == catalogue_search.length(500)
    finally:
        engine.close()
    with pytest.raises(ConfigError, match="catalogue_max_nodes must be an integer >= 0"):
        RuntimeConfig(catalogue_max_nodes=-1)


# -- requests with different allow-lists in one call -----------------------------------------------

@pytest.mark.parametrize("graphs", [True, False], ids=["trie-buffers", "stacked"])
def test_a_call_of_different_allow_lists_equals_each_alone(tiny_qwen2_dir, graphs):
    """Three requests, each with its own allow-list (or a subset, or none), one catalogue: the
    batcher's rule lets them share a call, and the call gives each what it gets alone (the
    program reads request r's allow-list from row r); another catalogue never joins."""
    spec = dataclasses.replace(SPEC, max_requests=3)
    runtime = RuntimeConfig(cuda_graphs=graphs, contexts=1, token_bucket=16, batching=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(local_engine, "settings_in_effect", lambda runtime, spec, device: runtime)
        engine = eager_engine(tiny_qwen2_dir, spec, runtime=runtime)
    try:
        vocab = engine.runner.runner.program.model.cfg.vocab_size if graphs else None
        vocab = vocab or engine.runner.program.model.cfg.vocab_size
        cat = tiny_catalogue(CONSTRAINED_ITEMS).with_subsets({"sale": [12, 17, 18]})
        # the device's way of deriving allow-lists (tensor code, here on the CPU): checked after the call
        engine.set_catalogue(ServedCatalogue.on_device(cat, vocab, "cpu", reach_on_device=True))
        engine.warmup()
        filters = [dict(allow_items=[11, 16]), dict(allow_subset="sale"), dict(), dict(allow_items=[13])]
        alone = [engine.beam(PROMPTS[i % 2], **f) for i, f in enumerate(filters)]

        def queued(prompt, allow_items=None, allow_subset=None):
            return local_engine.Queued(engine.packer.encode([prompt]), 0.0, *engine._trie(allow_items, allow_subset))

        calls = [queued(PROMPTS[i % 2], **f) for i, f in enumerate(filters[:3])]
        assert engine._fits(calls[:1], calls[1]) and engine._fits(calls[:2], calls[2])
        shares = engine._run_batch(engine.contexts[0], calls)
        assert [share.requests_in_call for share in shares] == [3] * 3
        for share, want in zip(shares, alone):
            got = engine.builder.build(*share.rows)
            assert got.token_ids.tolist() == want.token_ids.tolist() and got.item_ids.tolist() == want.item_ids.tolist()
            torch.testing.assert_close(torch.from_numpy(got.scores), torch.from_numpy(want.scores), rtol=0, atol=1e-5)
        assert len({tuple(a.item_ids.tolist()) for a in alone[:3]}) == 3  # the lists make a difference
        assert set(alone[0].item_ids.tolist()) - {-1} <= {11, 16} and set(alone[1].item_ids.tolist()) - {-1} <= {12, 17, 18}
        # an unknown id, or a list with nothing in its subset: that request's error, the others' rows
        bad = [queued(PROMPTS[0], allow_items=[11, 999]), calls[0], queued(PROMPTS[1], [11], "sale")]
        got = engine._run_batch(engine.contexts[0], bad)
        assert isinstance(got[0], InvalidInput) and "allowed items [999] are not in the catalogue" in str(got[0])
        assert isinstance(got[2], InvalidInput) and "leaves no item of the catalogue to generate within subset 'sale'" in str(got[2])
        assert engine.builder.build(*got[1].rows).item_ids.tolist() == alone[0].item_ids.tolist()
        with pytest.raises(InvalidInput, match=r"allowed items \[999\] are not in the catalogue"):
            engine.beam(PROMPTS[0], allow_items=[999])
        other = ServedCatalogue.on_device(tiny_catalogue(CONSTRAINED_ITEMS[:4]), vocab, "cpu")
        assert not engine._fits(calls[:1], local_engine.Queued(calls[0].packed, 0.0, other.full))
    finally:
        engine.close()

"""A constrained beam artifact with CUDA graphs, on a GPU: the graphs read the trie from each
request context's buffers (runtime/context.py), so the candidates and item ids equal those of
the same artifact without graphs, for the whole catalogue, an allow-list, and after the catalogue
is replaced by a smaller one, with no graph captured while serving. A model loaded without a
catalogue captures its graphs when the first one is loaded; a catalogue larger than the buffers
is refused and the served one stays.

One AOTInductor build on CUDA in FP32 (padded and unpadded calls then agree far below the
candidates' score gaps; its validation asks for the eager program's token ids exactly), the
trie mask lowered to its Triton kernel, the other ops to their torch references."""

import numpy as np
import pytest
import torch

import boundgen
from boundgen.errors import ConfigError
from boundgen.runtime.graphs import GraphRunner
from boundgen.text.catalogue import Catalogue
from tests.compile.conftest import _build
from tests.conftest import CONSTRAINED_ITEMS

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

OPTIONS = {"task": "beam", "name": "cbeam-graphs", "device": "cuda", "dtype": "float32", "constrained": True,
           "width": 4, "steps": 3, "max_prompt_tokens": 32, "max_requests": 2, "batching": True, "contexts": 2,
           "cuda_graphs": True, "token_bucket": 16, "lowering": {"trie_mask": "triton"}}
PROMPTS = ["query: running shoes -> item:", "hello", "a longer query about socks for running in the rain ->"]
SMALLER = CONSTRAINED_ITEMS[3:6]  # (14, [41, 52, 63]), (15, [42, 53]), (16, [43])
LARGER = [(100 + i, [40 + i, 50 + i, 60 + i]) for i in range(16)]


def write_catalogue(path, items):
    Catalogue.from_sequences([i for i, _ in items], [t for _, t in items]).save(path)
    return path


@pytest.fixture(scope="module")
def built(tiny_qwen2_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("constrained_graphs")
    artifact = _build(tiny_qwen2_dir, root / "cbeam", OPTIONS)[0]
    catalogues = {name: write_catalogue(root / name, items)
                  for name, items in (("whole", CONSTRAINED_ITEMS), ("smaller", SMALLER), ("larger", LARGER))}
    return artifact, catalogues


@pytest.fixture(scope="module")
def engines(built):
    """{"graphs": loaded with its catalogue, then warmed up (as serve does); "later": warmed up
    without one, its catalogue loaded after (a model loaded through the repository); "plain": no
    graphs}."""
    artifact, catalogues = built
    graphs = boundgen.load(artifact, catalogue=catalogues["whole"])
    graphs.warmup()
    later = boundgen.load(artifact)
    later.warmup()
    assert later.graph_shapes == 0 and later.runner.num_graphs == 0  # nothing to capture without a catalogue
    later.load_catalogue(catalogues["whole"])
    later.warmup()
    plain = boundgen.load(artifact, catalogue=catalogues["whole"], cuda_graphs=False)
    plain.warmup()
    yield {"graphs": graphs, "later": later, "plain": plain}
    for engine in (graphs, later, plain):
        engine.close()


def captured(engine) -> int:
    return engine.runner.num_graphs


def candidates(engine, prompt, allow=None):
    result = engine.beam(prompt, allow_items=allow)
    return result.token_ids.tolist(), result.item_ids.tolist(), result.scores


def assert_same(engines, items, allow=None):
    """Every graphed engine's candidates equal the plain one's; each names an item of `items`."""
    for prompt in PROMPTS:
        want_ids, want_items, want_scores = candidates(engines["plain"], prompt, allow)
        assert any(i >= 0 for i in want_items)
        assert {i for i in want_items if i >= 0} <= set(allow if allow is not None else [i for i, _ in items])
        for name in ("graphs", "later"):
            ids, item_ids, scores = candidates(engines[name], prompt, allow)
            assert (ids, item_ids) == (want_ids, want_items), (name, prompt, allow)
            np.testing.assert_allclose(scores, want_scores, rtol=0, atol=1e-4)


def test_graphs_are_captured_before_serving(engines):
    for name in ("graphs", "later"):
        engine = engines[name]
        assert engine.spec.runtime.cuda_graphs and isinstance(engine.runner, GraphRunner)
        assert engine.graph_shapes > 0 and captured(engine) == engine.graph_shapes * engine.spec.runtime.contexts
        assert all(ctx.trie is not None for ctx in engine.contexts)
    assert not engines["plain"].spec.runtime.cuda_graphs and engines["plain"].contexts[0].trie is None


def test_candidates_equal_without_graphs(engines, built):
    counts = {name: captured(engines[name]) for name in ("graphs", "later")}
    assert_same(engines, CONSTRAINED_ITEMS)
    assert_same(engines, CONSTRAINED_ITEMS, allow=[11, 16, 17])
    assert_same(engines, CONSTRAINED_ITEMS, allow=[18])
    assert_same(engines, CONSTRAINED_ITEMS)  # the whole catalogue again, after the allow-lists
    assert {name: captured(engines[name]) for name in counts} == counts  # none captured while serving


def test_a_replaced_catalogue_is_served_by_the_same_graphs(engines, built):
    _, catalogues = built
    counts = {name: captured(engines[name]) for name in ("graphs", "later")}
    buffers = [ctx.trie.row_ptr.data_ptr() for ctx in engines["graphs"].contexts]
    for engine in engines.values():
        engine.load_catalogue(catalogues["smaller"])
    assert_same(engines, SMALLER)
    assert_same(engines, SMALLER, allow=[14, 16])
    with pytest.raises(ConfigError, match="--catalogue-max-nodes"):
        engines["graphs"].load_catalogue(catalogues["larger"])
    assert_same(engines, SMALLER)  # the served catalogue stays
    for engine in engines.values():
        engine.load_catalogue(catalogues["whole"])
    assert_same(engines, CONSTRAINED_ITEMS)
    assert [ctx.trie.row_ptr.data_ptr() for ctx in engines["graphs"].contexts] == buffers
    assert {name: captured(engines[name]) for name in counts} == counts

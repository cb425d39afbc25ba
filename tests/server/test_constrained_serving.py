"""`boundgen serve ART --catalogue NAME=CAT_DIR` over a constrained beam artifact (built once per
session): ITEM_IDS, ALLOW_ITEMS and ALLOW_SUBSET through tritonclient over HTTP and gRPC and
`allow_items` / `allow_subset` / `item_id` on /v1/beam equal the engine in this process; bad
allow-lists (unknown ids, empty, longer than the catalogue) and subsets (unknown, or nothing in
them) are 400 / INVALID_ARGUMENT naming the problem; serve refuses to start without a
catalogue, or with one for another model."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as tgrpc
import tritonclient.http as thttp
from tritonclient.utils import InferenceServerException

import boundgen
from boundgen.text.catalogue import Catalogue
from tests.conftest import CONSTRAINED_ITEMS, CONSTRAINED_SUBSETS
from tests.server.conftest import REPO, post_json

pytestmark = pytest.mark.slow  # one AOTInductor build

PROMPT = "query: running shoes -> item:"
SERVE = [sys.executable, "-m", "boundgen", "serve"]
SLOW_CPU = ["--default-timeout-ms", "60000"]  # a loaded 2-core test machine: no 504 for a slow call


@pytest.fixture(scope="module")
def server(launch, constrained_build):
    server = launch([constrained_build["artifact"]], command=SERVE,
                    args=["--catalogue", f"cbeam={constrained_build['catalogue']}", *SLOW_CPU])
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def engine(constrained_build):
    return boundgen.load(constrained_build["artifact"], catalogue=constrained_build["catalogue"])


def infer(protocol, server, allow=None, subset=None):
    mod = thttp if protocol == "http" else tgrpc
    client = mod.InferenceServerClient(server.http_url if protocol == "http" else server.grpc_url)
    text = mod.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([PROMPT.encode()], dtype=object))
    inputs = [text]
    if allow is not None:
        items = mod.InferInput("ALLOW_ITEMS", [len(allow)], "INT64")
        items.set_data_from_numpy(np.asarray(allow, dtype=np.int64))
        inputs.append(items)
    if subset is not None:
        named = mod.InferInput("ALLOW_SUBSET", [1], "BYTES")
        named.set_data_from_numpy(np.array([subset.encode()], dtype=object))
        inputs.append(named)
    return client.infer("cbeam", inputs)


def assert_same_result(result, expected):
    np.testing.assert_array_equal(result.as_numpy("ITEM_IDS"), expected.item_ids)
    np.testing.assert_array_equal(result.as_numpy("TOKEN_IDS"), expected.token_ids)
    np.testing.assert_allclose(result.as_numpy("SCORES"), expected.scores, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("allow", [None, [11, 16], [17]])
def test_item_ids_and_allow_items_equal_the_engine(server, engine, protocol, allow):
    result = infer(protocol, server, allow)
    expected = engine.beam(PROMPT, allow_items=allow)
    np.testing.assert_array_equal(result.as_numpy("ITEM_IDS"), expected.item_ids)
    assert result.as_numpy("ITEM_IDS").dtype == np.int64
    np.testing.assert_array_equal(result.as_numpy("TOKEN_IDS"), expected.token_ids)
    np.testing.assert_allclose(result.as_numpy("SCORES"), expected.scores, rtol=1e-5, atol=1e-6)
    if allow is not None:
        assert set(result.as_numpy("ITEM_IDS").tolist()) <= set(allow) | {-1}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("allow, subset", [(None, "shoes"), (None, "sale"), ([12, 13, 17, 18], "sale")])
def test_allow_subset_equals_the_engine_and_the_subsets_allow_list(server, engine, protocol, allow, subset):
    """ALLOW_SUBSET names a subset registered with the catalogue (tests/conftest.py); with
    ALLOW_ITEMS, the listed items within it."""
    result = infer(protocol, server, allow, subset)
    assert_same_result(result, engine.beam(PROMPT, allow_items=allow, allow_subset=subset))
    members = set(CONSTRAINED_SUBSETS[subset]) & (set(allow) if allow else set(CONSTRAINED_SUBSETS[subset]))
    assert_same_result(result, engine.beam(PROMPT, allow_items=sorted(members)))
    assert set(result.as_numpy("ITEM_IDS").tolist()) <= members | {-1}


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("allow, subset, words", [
    (None, "hats", "ALLOW_SUBSET: the catalogue has no subset 'hats' (its subsets: sale, shoes)"),
    ([11, 13], "sale", "leaves no item of the catalogue to generate within subset 'sale'"),
    ([99], "sale", "[99] are not in the catalogue"),
])
def test_bad_subsets_are_invalid_argument(server, protocol, allow, subset, words):
    with pytest.raises(InferenceServerException) as err:
        infer(protocol, server, allow, subset)
    assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert words in err.value.message(), err.value.message()


def test_the_load_generator_sends_subsets_and_allow_lists(server, engine, constrained_build):
    """`boundgen bench --grpc --allow-subset / --allow-items`: its gRPC target sends the filters,
    each request of the pool its own allow-list, and reads ITEM_IDS back."""
    from types import SimpleNamespace

    from boundgen.bench.grpc_client import GrpcTarget
    from boundgen.bench.runner import allow_lists

    def request(index):
        return SimpleNamespace(index=index, texts=(PROMPT,), samples=1)

    named = GrpcTarget(server.grpc_url, "cbeam", "beam", allow_subset="sale")(request(0))
    np.testing.assert_array_equal(named.item_ids, engine.beam(PROMPT, allow_subset="sale").item_ids)
    lists = allow_lists(str(constrained_build["catalogue"]), 2, lists=3, seed=1)
    assert len({raw for raw in lists}) > 1  # the requests' lists differ
    target = GrpcTarget(server.grpc_url, "cbeam", "beam", allow_lists=lists)
    for index in (0, 1, 4):
        ids = np.frombuffer(lists[index % 3], dtype="<i8").tolist()
        assert len(ids) == 2 and set(ids) <= {i for i, _ in CONSTRAINED_ITEMS}
        np.testing.assert_array_equal(target(request(index)).item_ids, engine.beam(PROMPT, allow_items=ids).item_ids)
    target.close()


def test_metadata_lists_allow_items_and_item_ids(server):
    meta = thttp.InferenceServerClient(server.http_url).get_model_metadata("cbeam")
    assert [(i["name"], i["datatype"]) for i in meta["inputs"]] == [("TEXT", "BYTES"), ("ALLOW_ITEMS", "INT64"),
                                                                    ("ALLOW_SUBSET", "BYTES")]
    assert ("ITEM_IDS", "INT64", [4]) in [(o["name"], o["datatype"], o["shape"]) for o in meta["outputs"]]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
@pytest.mark.parametrize("allow, words", [([11, 99], "[99] are not in the catalogue"), ([], "ALLOW_ITEMS is empty"),
                                          ([11] * 9, "ALLOW_ITEMS has 9 ids, more than the catalogue has items (8)")])
def test_bad_allow_lists_are_invalid_argument(server, protocol, allow, words):
    with pytest.raises(InferenceServerException) as err:
        infer(protocol, server, allow)
    assert err.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert words in err.value.message(), err.value.message()


def test_v1_beam_takes_allow_items_and_answers_item_ids(server, engine):
    status, answer = post_json(server, "/v1/beam", {"prompt": PROMPT, "allow_items": [11, 16]})
    assert status == 200, answer
    want = engine.beam(PROMPT, allow_items=[11, 16]).candidates()
    assert [(c["token_ids"], c["item_id"], c["score"] is None) for c in answer["candidates"]] == \
        [(c["token_ids"], c["item_id"], c["score"] is None) for c in want]
    status, answer = post_json(server, "/v1/beam", {"prompt": PROMPT, "allow_items": [99]})
    assert status == 400 and "not in the catalogue" in answer["error"]
    status, answer = post_json(server, "/v1/beam", {"prompt": PROMPT, "allow_subset": "shoes"})
    assert status == 200, answer
    want = engine.beam(PROMPT, allow_subset="shoes").candidates()
    assert [(c["token_ids"], c["item_id"]) for c in answer["candidates"]] == \
        [(c["token_ids"], c["item_id"]) for c in want]
    for bad, words in (("hats", "no subset 'hats'"), (3, "allow_subset must name a subset")):
        status, answer = post_json(server, "/v1/beam", {"prompt": PROMPT, "allow_subset": bad})
        assert status == 400 and words in answer["error"], answer


def serve_refuses(args, words):
    proc = subprocess.run([*SERVE, *map(str, args), "--http-port", "0", "--grpc-port", "0"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and words in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]


def test_serve_refuses_a_constrained_artifact_without_its_catalogue(constrained_build):
    serve_refuses([constrained_build["artifact"]], "--catalogue cbeam=CAT_DIR")


def test_serve_refuses_a_catalogue_for_an_unknown_model(constrained_build):
    serve_refuses([constrained_build["artifact"], "--catalogue", f"other={constrained_build['catalogue']}",
                   "--catalogue", f"cbeam={constrained_build['catalogue']}"], "no artifact is named other")


def load(server, catalogue: str | None) -> tuple[int, str]:
    """The repository load of cbeam with the parameter catalogue (None: of the model itself): (status, body;
    empty on success, as Triton's)."""
    body = {"parameters": {"catalogue": catalogue}} if catalogue is not None else {}
    request = urllib.request.Request(f"http://{server.http_url}/v2/repository/models/cbeam/load",
                                     data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    try:
        with urllib.request.build_opener(urllib.request.ProxyHandler({})).open(request, timeout=120) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_catalogue_replacement_through_the_repository_load_is_atomic(launch, constrained_build, tmp_path):
    """Requests run while the load replaces the catalogue: each answer's items are all of the old
    catalogue or all of the new one (disjoint ids), never a mix, and none fails."""
    new = {100: [45, 55, 65], 101: [45, 56], 102: [46]}
    Catalogue.from_sequences(list(new), list(new.values())).save(tmp_path / "cat2")
    server = launch([constrained_build["artifact"]], command=SERVE,
                    args=["--catalogue", f"cbeam={constrained_build['catalogue']}", "--model-repository", tmp_path,
                          *SLOW_CPU])
    answers, errors, stop = [], [], threading.Event()

    def client():
        while not stop.is_set():
            try:
                answers.append(set(infer("grpc", server).as_numpy("ITEM_IDS").tolist()) - {-1})
            except Exception as exc:  # noqa: BLE001 - collected, asserted below
                errors.append(exc)

    threads = [threading.Thread(target=client) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        status, answer = load(server, "cat2")
        assert status == 200, answer
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors[:3]
    old = {11, 12, 13, 14, 15, 16, 17, 18}
    assert all(a <= old or a <= set(new) for a in answers)
    assert set(infer("http", server).as_numpy("ITEM_IDS").tolist()) - {-1} <= set(new)
    status, answer = load(server, "none")
    assert status == 400 and "no directory 'none'" in answer, answer
    # The model loaded again keeps the catalogue loaded last (it brought back --catalogue's)
    (tmp_path / "cbeam").symlink_to(constrained_build["artifact"])
    status, answer = load(server, None)
    assert status == 200, answer
    assert set(infer("http", server).as_numpy("ITEM_IDS").tolist()) - {-1} <= set(new)
    assert server.stop() == 0
    assert any("the new cbeam keeps catalogue cat2" in line for line in server.output)

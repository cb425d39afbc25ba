"""scripts/starvation.py at CI sizes: every attack (a 20,000-string JSON body, a deflate body
inflating past the limit, /v1/score and /v1/beam over their counts, a gRPC shape of 40,000
dimensions, 30 dimensions of 10^4000, slowloris connections, a burst of valid requests, one under a
new client id a request) is answered as docs/serving.md promises, beside a victim's closed loop,
and the server stays ready and drains to exit 0; and the burst, which keeps the queue full, never
has the victim refused (429): the queue is fair across clients, and a full one refuses the burst's
newest request in its place.
The victim's latency ratios are reported, not asserted: on a 2-core CI machine they measure the
machine as much as the server."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.server.conftest import REPO


@pytest.fixture(scope="module")
def starvation():
    spec = importlib.util.spec_from_file_location("starvation", REPO / "scripts" / "starvation.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["starvation"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results(starvation):
    return starvation.run(frontends=1, engine="fake", seconds=1.0, sizes=starvation.SMALL, say=lambda s: None)


def test_every_attack_answered_per_contract(results, starvation):
    assert [a["attack"] for a in results["attacks"]] == list(starvation.ATTACKS)
    for attack in results["attacks"]:
        assert attack["per_contract"], (attack["attack"], attack["answers"], attack["note"])
        assert attack["server_ready_after"], attack["attack"]


def test_a_burst_under_many_client_ids_fills_the_queue_but_never_has_the_victim_refused(results):
    """Each request under a new id from another address: the queue fills (its requests get 429), and
    the default --client-key address-id makes its host one client among the hosts, so a full queue
    refuses the burst's newest, never the victim's (keyed by id alone, about half the victim's
    requests were refused). Whether the burst's refusals are held (by address) is a latency,
    asserted in test_admission and test_fairness, not here."""
    burst = next(a for a in results["attacks"] if a["attack"] == "burst_ids")
    assert "429" in burst["answers"], burst["answers"]
    for protocol in ("http", "grpc"):
        assert burst["under"][protocol]["n"] > 0
        assert burst["under"][protocol]["refused"] == 0, (protocol, burst["under"][protocol])


def test_victim_served_in_every_window(results):
    for attack in results["attacks"]:
        for window in ("alone", "under"):
            for protocol in ("http", "grpc"):
                assert attack[window][protocol]["n"] > 0, (attack["attack"], window, protocol)
        assert attack["alone"]["http"]["errors"] == attack["alone"]["grpc"]["errors"] == 0


def test_a_burst_that_fills_the_queue_never_has_the_victim_refused(results):
    burst = next(a for a in results["attacks"] if a["attack"] == "burst")
    assert "429" in burst["answers"], burst["answers"]  # the burst did fill the queue
    for protocol in ("http", "grpc"):
        assert burst["under"][protocol]["n"] > 0
        assert burst["under"][protocol]["refused"] == 0, (protocol, burst["under"][protocol])


def test_server_drains_to_exit_0(results):
    assert results["server_exit"] == 0


def test_table_has_a_row_per_attack_and_protocol(results, starvation):
    rows = [line for line in starvation.table(results).splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) == 1 + 2 * len(starvation.ATTACKS)

"""scripts/deadlines.py at CI sizes: every scenario is answered per contract (success, 429 or
504), the server stays ready and drains to exit 0, and no HTTP success nor gRPC success under a
gRPC deadline reaches its client later than its deadline plus a slack wide enough for a 2-core CI
machine (the issue's late successes were 100 ms to 1.1 s). The gRPC `timeout` parameter's late
count is reported, not asserted: its clock starts when the server's Python takes the call, and a
burst waits in gRPC's own intake before that (docs/serving.md, Deadlines under load)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.server.conftest import REPO

CI_SLACK_MS = 250.0


@pytest.fixture(scope="module")
def deadlines():
    for name in ("starvation", "deadlines"):
        spec = importlib.util.spec_from_file_location(f"scripts.{name}", REPO / "scripts" / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"scripts.{name}"] = module  # its dataclasses look their module up there
        spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def results(deadlines):
    return deadlines.run(frontends=1, engine="fake", sizes=deadlines.SMALL, slack_ms=CI_SLACK_MS, say=lambda s: None)


def test_every_scenario_runs_and_is_answered_per_contract(results, deadlines):
    assert [s["scenario"] for s in results["scenarios"]] == list(deadlines.SCENARIOS)
    for scenario in results["scenarios"]:
        assert scenario["per_contract"], scenario
        assert scenario["server_ready_after"], scenario
    assert results["server_exit"] == 0


@pytest.mark.parametrize("name", ["big_bodies", "grpc_deadline_burst", "open_loop_http"])
def test_no_late_success(results, name):
    scenario = next(s for s in results["scenarios"] if s["scenario"] == name)
    assert scenario["late"] == 0, scenario


def test_the_table_reports_every_scenario(results, deadlines):
    table = deadlines.table(results)
    assert all(s["title"] in table for s in results["scenarios"])


def test_the_grpc_bursts_report_the_bare_grpc_floor(results, deadlines):
    """Each gRPC burst is also sent to a bare server that answers at once: its latest answer is what gRPC
    alone adds to the burst's last call here; the other scenarios have none."""
    floors = {s["scenario"]: s["bare_grpc_latest_ms"] for s in results["scenarios"]}
    for name in ("grpc_burst", "grpc_deadline_burst"):
        assert 0 < floors[name] < 30_000, floors
    assert floors["big_bodies"] is None and floors["open_loop_http"] is None
    assert "bare gRPC server" in deadlines.table(results)

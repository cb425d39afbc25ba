"""The company wait (runtime/company.py): fixed, or learned from how long the company took to come back."""

import pytest

from boundgen.artifact.manifest import MAX_BATCH_WAIT_MS
from boundgen.runtime.company import MARGIN_S, MIN_SAMPLES, SPREAD, CompanyWait


def _calls(wait: CompanyWait, delays, requests: int = 1, took_s: float = 0.05, start: float = 100.0) -> float:
    """One call of `requests` a delay list entry, each followed by arrivals that many seconds after its end."""
    now = start
    for delay in delays:
        wait.call_ended(now, requests, took_s)
        for _ in range(requests):
            wait.arrived(now + delay)
        now += 1.0
    return now


def test_a_fixed_wait_is_the_same_whatever_arrives():
    wait = CompanyWait(0.005)
    _calls(wait, [0.012] * 20)
    assert wait.seconds() == 0.005


def test_a_learned_wait_follows_the_delays_once_it_has_enough():
    wait = CompanyWait(0.005, learned=True)
    _calls(wait, [0.012] * (MIN_SAMPLES - 1))
    assert wait.seconds() == 0.005  # too few delays yet: the fixed wait
    _calls(wait, [0.012])
    assert wait.seconds() == pytest.approx(0.012 + MARGIN_S)


def test_a_learned_wait_takes_a_high_quantile_of_the_recent_delays():
    wait = CompanyWait(0.0, learned=True)
    _calls(wait, [0.004] * 18 + [0.009] * 2, requests=1)  # 90% of the delays are 4 ms, the slowest 9 ms
    assert wait.seconds() == pytest.approx(0.009 + MARGIN_S)


def test_arrivals_at_their_own_pace_are_no_company_and_keep_the_fixed_wait():
    """An open loop: the first arrivals after a call come at the requests' own spacing (0.5 to 10 ms
    here), not together; waiting for the slowest of them would only add latency."""
    wait = CompanyWait(0.005, learned=True)
    _calls(wait, [0.0005 * (i + 1) for i in range(20)])
    assert wait.seconds() == 0.005
    together = CompanyWait(0.005, learned=True)  # the same count of delays, within SPREAD of each other
    _calls(together, [0.006 + 0.0001 * i for i in range(20)])
    assert 0.006 * SPREAD > together.seconds() > 0.006


def test_a_learned_wait_is_never_below_the_fixed_one_nor_above_the_last_call():
    short = CompanyWait(0.008, learned=True)
    _calls(short, [0.002] * 10)
    assert short.seconds() == 0.008
    long = CompanyWait(0.002, learned=True)
    _calls(long, [0.015] * 10, took_s=0.006)  # a call of 6 ms: waiting longer never pays
    assert long.seconds() == pytest.approx(0.006)


def test_only_the_calls_own_company_counts_and_late_arrivals_are_not_company():
    wait = CompanyWait(0.001, learned=True)
    now = 100.0
    for _ in range(10):
        wait.call_ended(now, 2, 0.05)
        wait.arrived(now + 0.003)
        wait.arrived(now + 0.004)
        wait.arrived(now + 0.019)  # a third arrival after a call of two: someone else, not its company
        now += 1.0
    assert wait.seconds() == pytest.approx(0.004 + MARGIN_S)
    late = CompanyWait(0.001, learned=True)
    _calls(late, [MAX_BATCH_WAIT_MS / 1e3 + 0.01] * 20)  # later than any wait could be
    assert late.seconds() == 0.001


def test_the_company_wait_script_prints_both_loops(capsys):
    """scripts/company_wait.py at CI size: a row per way back and wait, and per open-loop rate and wait."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "scripts" / "company_wait.py"
    spec = importlib.util.spec_from_file_location("company_wait_script", path)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    script.main(["--seconds", "0.3", "--back-ms", "4", "--waits", "5,learned", "--open-loop", "200"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split(" | ")[:2] for r in rows[1:3]] == [["| 4", "fixed 5 ms"], ["| 4", "learned (floor 5 ms)"]]
    assert [r.split(" | ")[:2] for r in rows[4:6]] == [["| 200", "fixed 5 ms"], ["| 200", "learned (floor 5 ms)"]]
    assert all(float(r.split(" | ")[2]) > 0 for r in rows[1:3] + rows[4:6])

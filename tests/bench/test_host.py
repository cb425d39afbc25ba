"""The host record every bench result carries (bench/host.py) and its line in the report."""

import os

from boundgen.bench import host, report


def test_cpu_model_from_cpuinfo_and_fallback(tmp_path, monkeypatch):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\n"
                    "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480C\n")
    assert host.cpu_model(info) == "Intel(R) Xeon(R) Platinum 8480C"
    monkeypatch.setattr(host.platform, "processor", lambda: "aarch64")
    assert host.cpu_model(tmp_path / "missing") == "aarch64"
    (tmp_path / "arm").write_text("processor\t: 0\nBogoMIPS\t: 50.00\n")
    assert host.cpu_model(tmp_path / "arm") == "aarch64"


def test_core_ranges():
    assert host.core_ranges({0, 1, 2, 3, 8, 10, 11}) == "0-3,8,10-11"
    assert host.core_ranges({5}) == "5"
    assert host.core_ranges(set()) == ""


def test_host_record_fields(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Test CPU\n")
    rec = host.host_record(client_procs=4, server_cores="0-15", cpuinfo=info).to_dict()
    assert set(rec) == {"cpu_model", "logical_cores", "bench_cores", "bench_core_count", "client_procs",
                        "server_cores"}
    assert rec["cpu_model"] == "Test CPU" and rec["logical_cores"] == os.cpu_count()
    assert rec["bench_core_count"] == len(os.sched_getaffinity(0))
    assert rec["bench_cores"] == host.core_ranges(os.sched_getaffinity(0))
    assert (rec["client_procs"], rec["server_cores"]) == (4, "0-15")
    assert host.host_record().server_cores is None


def test_host_line_in_every_workload_section():
    rec = {"cpu_model": "Test CPU", "logical_cores": 32, "bench_cores": "0-7", "bench_core_count": 8,
           "client_procs": 4, "server_cores": "8-31"}
    line = report.host_line(rec)
    assert line == ("Host: Test CPU, 32 logical cores; bench on 8 cores (0-7), 4 client processes; "
                    "server cores 8-31.")
    result = {"workload": {"name": "W2", "task": "beam"}, "host": rec, "systems": {}}
    assert line in report.markdown_workload(result)
    assert line in report.markdown_summary([result])
    assert report.host_line(None) is None
    assert "Host:" not in report.markdown_workload({"workload": {"name": "W2"}, "systems": {}})  # older results


def test_client_check_line():
    check = {"concurrency": 16, "procs": 4, "qps": 300.0, "procs_2x": 8, "qps_2x": 330.0, "change": 10.0,
             "ok": False}
    line = report.client_check_line(check)
    assert "WARNING: the load generator may be the bottleneck" in line and "+10.0%" in line
    ok = report.client_check_line({**check, "qps_2x": 303.0, "change": 1.0, "ok": True})
    assert "not the bottleneck" in ok
    assert "skipped" in report.client_check_line({"concurrency": 2, "procs": 2, "skipped": "c=2 leaves no room"})
    result = {"workload": {"name": "W2"}, "systems": {"boundgen": {"sweep": None, "client_check": check}}}
    assert "boundgen: client check at c=16" in report.markdown_workload(result)

"""The peer's own process: shapes it warms, its batch bound, what comes back when it is interrupted."""

import json
import subprocess

from boundgen.bench import peer_process
from boundgen.bench.peer import HFPeer, PeerOptions
from boundgen.bench.workloads import WORKLOADS, Request


def test_an_interrupted_peer_process_returns_what_it_wrote(tmp_path, monkeypatch):
    out = tmp_path / "peer.json"

    def interrupted_run(cmd):
        out.write_text(json.dumps({"mode": "eager", "workloads": {"W1": {"target": "HF", "sweep": None}}}))
        raise KeyboardInterrupt

    monkeypatch.setattr(subprocess, "run", interrupted_run)
    data = peer_process.run_in_subprocess(["--peer", "x"], out)
    assert data["interrupted"] and "interrupted" in data["error"] and data["workloads"]["W1"]["target"] == "HF"
    assert "boundgen.bench.peer_process --peer x --out" in data["command"]


def test_shape_groups_and_batch_bounds(tiny_qwen3_dir):
    peer = HFPeer(tiny_qwen3_dir, device="cpu", options=PeerOptions(bucket=64))
    requests = [Request(i, ("x",), counts) for i, counts in enumerate([(48, 100), (120, 3), (130,), (256, 1), (60,)])]
    assert list(peer_process.shape_groups(peer, WORKLOADS["W1"], requests)) == [64, 128, 192, 256]
    peer.with_options(pad="longest")
    assert list(peer_process.shape_groups(peer, WORKLOADS["W1"], requests)) == [60, 100, 120, 130, 256]
    assert peer_process.max_batch_for("compiled", "beam", 4) == 1
    assert peer_process.max_batch_for("compiled", "score", 4) == peer_process.max_batch_for("eager", "beam", 4) == 4

"""The CLI's re-exec with the system libstdc++ preloaded: when, with what, and never twice."""

import sys

import pytest

from boundgen.runtime import libstdcxx


class Exec(Exception):
    pass


@pytest.fixture
def execve(monkeypatch):
    calls = []

    def fake(path, argv, env):
        calls.append((path, argv, env))
        raise Exec
    monkeypatch.setattr(libstdcxx.os, "execve", fake)
    monkeypatch.setattr(libstdcxx, "system_libstdcxx", lambda: "/usr/lib/x86_64-linux-gnu/libstdc++.so.6")
    monkeypatch.setattr(libstdcxx.sys, "platform", "linux")
    for name in ("LD_PRELOAD", libstdcxx.GUARD_ENV, libstdcxx.SWITCH_ENV):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_reexec_when_needed(execve, monkeypatch):
    monkeypatch.setattr(libstdcxx, "torch_needs_preload", lambda: True)
    monkeypatch.setenv("LD_PRELOAD", "/opt/other.so")
    with pytest.raises(Exec):
        libstdcxx.reexec_with_preload()
    (path, argv, env), = execve
    assert path == sys.executable and argv[0] == sys.executable
    assert env["LD_PRELOAD"] == "/usr/lib/x86_64-linux-gnu/libstdc++.so.6 /opt/other.so"
    assert env[libstdcxx.GUARD_ENV] == "1"


@pytest.mark.parametrize("env", [
    {libstdcxx.GUARD_ENV: "1"},  # already re-executed once: never loop
    {libstdcxx.SWITCH_ENV: "0"},  # opted out
    {"LD_PRELOAD": "/lib/x86_64-linux-gnu/libstdc++.so.6"},  # already there
])
def test_no_reexec(execve, monkeypatch, env):
    monkeypatch.setattr(libstdcxx, "torch_needs_preload", lambda: True)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    libstdcxx.reexec_with_preload()
    assert execve == []


def test_cpu_torch_needs_no_reexec_unless_forced(execve, monkeypatch):
    monkeypatch.setattr(libstdcxx, "torch_needs_preload", lambda: False)
    libstdcxx.reexec_with_preload()
    assert execve == []
    monkeypatch.setenv(libstdcxx.SWITCH_ENV, "1")
    with pytest.raises(Exec):
        libstdcxx.reexec_with_preload()


def test_torch_build_decides():
    import torch

    if sys.platform.startswith("linux"):
        assert libstdcxx.torch_needs_preload() == (torch.version.cuda is not None)

"""Start and stop `boundgen serve` as a child process (demo, bench, tests).

    with ServerProcess(["art/score", "art/beam"]) as srv:      # ports 0: the server picks free ones
        client = tritonclient.grpc.InferenceServerClient(srv.grpc_url)
        ...
    # leaving the block sends SIGTERM (drain), then SIGKILL if it does not exit in time

`start()` waits for the server's "listening" line on stdout to learn its ports, then polls
/v2/health/ready until it answers 200, each step bounded by `ready_timeout_s`. The server's
output is collected in `output` (and echoed if `echo=True`).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Sequence

from boundgen.server.app import LISTENING
from boundgen.server.logs import status_text


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now, for a server that must be told its ports (Ray Serve's
    proxies; plain `boundgen serve` takes port 0 and says which it got)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class ServerProcess:
    def __init__(self, artifact_dirs: Sequence[str | Path], *, host: str = "127.0.0.1", http_port: int = 0,
                 grpc_port: int = 0, args: Sequence[str] = (), command: Sequence[str] | None = None,
                 env: dict | None = None, cwd: str | Path | None = None, ready_timeout_s: float = 300.0,
                 echo: bool = False, pass_fds: Sequence[int] = ()):
        """`args`: further `boundgen serve` flags (e.g. ["--max-inflight", "2"]); `command`: what
        to run in place of `python -m boundgen serve` (it gets the same arguments); `pass_fds`:
        file descriptors the child inherits (replicas.py's lifeline pipe)."""
        self.command = list(command or [sys.executable, "-m", "boundgen", "serve"])
        self.argv = self.command + [str(d) for d in artifact_dirs] + [
            "--host", host, "--http-port", str(http_port), "--grpc-port", str(grpc_port), *args]
        self.host, self.env, self.cwd = host, env, cwd
        self.ready_timeout_s, self.echo, self.pass_fds = ready_timeout_s, echo, tuple(pass_fds)
        self.proc: subprocess.Popen | None = None
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self.output: list[str] = []
        self._listening = threading.Event()
        self._reader: threading.Thread | None = None

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    def start(self, wait_ready: bool = True) -> "ServerProcess":
        """Start; return once it listens (ports known) and, with `wait_ready`, once it is ready."""
        env = dict(os.environ if self.env is None else self.env)
        env.setdefault("PYTHONUNBUFFERED", "1")
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     env=env, cwd=self.cwd, pass_fds=self.pass_fds)
        self._reader = threading.Thread(target=self._read_output, daemon=True)
        self._reader.start()
        try:
            self._wait_listening()
            if wait_ready:
                self.wait_ready(self.ready_timeout_s)
        except BaseException:
            self.kill()
            raise
        return self

    def wait_ready(self, timeout_s: float) -> None:
        url = f"http://{self.http_url}/v2/health/ready"
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # loopback: never via a proxy
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with code {self.proc.returncode} before it was ready:\n"
                                   + self.tail())
            try:
                with opener.open(url, timeout=2.0) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        raise TimeoutError(f"the server was not ready within {timeout_s} s:\n" + self.tail())

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (the server drains), then SIGKILL after `timeout_s`; the exit code."""
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        if self._reader is not None:
            self._reader.join(5.0)
        return self.proc.returncode

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10.0)

    def tail(self, lines: int = 40) -> str:
        return "".join(self.output[-lines:])

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _read_output(self) -> None:
        for line in self.proc.stdout:
            self.output.append(line)
            if self.echo:
                print(line, end="", flush=True)
            text = status_text(line)
            if text.startswith(LISTENING) and not self._listening.is_set():
                fields = dict(part.split("=", 1) for part in text.split()[3:] if "=" in part)
                self.http_port = int(fields["http"].rsplit(":", 1)[1])
                self.grpc_port = int(fields["grpc"].rsplit(":", 1)[1])
                self._listening.set()
        self._listening.set()  # output closed: the process is gone

    def _wait_listening(self) -> None:
        if not self._listening.wait(self.ready_timeout_s) or self.http_port is None:
            code = self.proc.poll()
            state = f"exited with code {code}" if code is not None else f"did not listen within {self.ready_timeout_s} s"
            raise RuntimeError(f"the server {state}:\n" + self.tail())

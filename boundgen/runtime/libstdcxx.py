"""The AOTInductor load crash on CUDA torch images, and its fix: preload the system libstdc++.

On the GPU image (torch 2.11+cu130; docs/build.md) `aoti_load_package` segfaults inside
the package's generated wrapper .so (`std::regex` in `parse_device_str`): the .so is linked
without libstdc++ and binds its C++ symbols to the wrong copy. Starting the process with
`LD_PRELOAD=<system libstdc++.so.6>` fixes it. CPU wheels of torch (CI: 2.13+cpu) load
packages fine without it.

Where the crash is expected: Linux with a non-CPU torch build (a `+cuXXX`/`+rocm` local
version, or a PyPI wheel without one, which on Linux is a CUDA build). The decision reads
package metadata only, so the CLI can take it before importing torch:
- the CLI (`boundgen.cli.main`) re-executes itself once with the preload set
  (`reexec_with_preload`), guarded by BOUNDGEN_LIBSTDCXX_REEXEC against loops;
  BOUNDGEN_LIBSTDCXX_PRELOAD=0 declares the system unaffected (no re-exec, no refusal),
  =1 forces the re-exec on any Linux system;
- the Python API (`boundgen.load`) cannot re-execute its caller: it refuses with an
  ArtifactError that says how to start the process (`missing_preload_message`).
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata

GUARD_ENV = "BOUNDGEN_LIBSTDCXX_REEXEC"
SWITCH_ENV = "BOUNDGEN_LIBSTDCXX_PRELOAD"
OFF = ("0", "off", "no", "false")
FORCE = ("1", "on", "yes", "true", "force")
_ARCH_TAGS = {"x86_64": "x86-64", "aarch64": "AArch64"}


def system_libstdcxx() -> str | None:
    """Path of the system's libstdc++.so.6 from the linker cache (`ldconfig -p`), or None."""
    for exe in ("ldconfig", "/sbin/ldconfig", "/usr/sbin/ldconfig"):
        try:
            out = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=10).stdout
            break
        except (OSError, subprocess.SubprocessError):
            continue
    else:
        return None
    entries = [line.strip() for line in out.splitlines() if line.strip().startswith("libstdc++.so.6 ")]
    tag = _ARCH_TAGS.get(platform.machine())
    preferred = [e for e in entries if tag and tag in e] or entries
    for entry in preferred:
        path = entry.rsplit("=>", 1)[-1].strip()
        if os.path.exists(path):
            return path
    return None


def is_preloaded(env=None) -> bool:
    env = os.environ if env is None else env
    return any(os.path.basename(p).startswith("libstdc++.so") for p in env.get("LD_PRELOAD", "").replace(":", " ").split())


def torch_needs_preload() -> bool:
    """True where the load crash is expected: Linux with a CUDA/ROCm torch build (see module docstring)."""
    if not sys.platform.startswith("linux"):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "version"):
        return torch.version.cuda is not None or getattr(torch.version, "hip", None) is not None
    try:
        version = metadata.version("torch")
    except metadata.PackageNotFoundError:
        return False
    return "+cpu" not in version


def missing_preload() -> str | None:
    """The libstdc++ to preload when this process needs it and lacks it, else None.
    BOUNDGEN_LIBSTDCXX_PRELOAD=0 declares the system unaffected (the CLI's opt-out)."""
    if _switch() in OFF or not torch_needs_preload() or is_preloaded():
        return None
    return system_libstdcxx()


def _switch() -> str:
    return os.environ.get(SWITCH_ENV, "auto").strip().lower()


def missing_preload_message(lib: str) -> str:
    return ("refusing to load an AOTInductor package in this process: with a CUDA build of torch on Linux "
            "(as on the GPU image) the package's wrapper .so can bind to the wrong libstdc++ and segfault "
            f"(docs/build.md). Start the process with the system libstdc++ preloaded, e.g. `LD_PRELOAD={lib} "
            "python3 your_app.py`, or use the `boundgen` CLI, which does this itself. If this system is not "
            "affected, pass libstdcxx_check=\"skip\" to boundgen.load (or set BOUNDGEN_LIBSTDCXX_PRELOAD=0).")


def reexec_needed() -> str | None:
    """The libstdc++ to preload if `reexec_with_preload` would re-execute this process, else None."""
    switch = _switch()
    if os.environ.get(GUARD_ENV) or switch in OFF or not sys.platform.startswith("linux"):
        return None
    if is_preloaded() or (switch not in FORCE and not torch_needs_preload()):
        return None
    return system_libstdcxx()


def reexec_with_preload(argv: list[str] | None = None) -> None:
    """CLI entry: exec this same command again with LD_PRELOAD set, when needed. Returns if not."""
    lib = reexec_needed()
    if lib is None:
        return
    env = dict(os.environ)
    env["LD_PRELOAD"] = f"{lib} {env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else lib
    env[GUARD_ENV] = "1"
    if argv is None:
        orig = getattr(sys, "orig_argv", None)  # the interpreter's own flags too (-m boundgen)
        argv = [sys.executable] + (list(orig[1:]) if orig else list(sys.argv))
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, argv, env)

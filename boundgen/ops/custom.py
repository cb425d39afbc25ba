"""The ops entry point for loading compiled packages.

A package compiled with an op lowered to a Triton kernel calls that op by name
(`boundgen::<op>`); the loading process must have registered it first, by importing its module.
Only ops lowered to something other than their torch reference need it: importing a
`triton_op` module pulls in torch._inductor (seconds), so nothing else is imported.
"""

from __future__ import annotations

import importlib


def import_custom_ops(ops) -> None:
    """Register the custom ops `ops` (names of modules in boundgen/ops/) for a package to call."""
    for op in ops:
        importlib.import_module(f"boundgen.ops.{op}")

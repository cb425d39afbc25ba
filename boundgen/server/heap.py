"""A serving process's heap and Python's cyclic garbage collector.

Python collects reference cycles in passes it starts itself as allocations pile up; a full pass
visits every object that can hold references, holding the GIL throughout. In a process that has
loaded a model (torch's modules, the engine, the tokenizer's tables: ~320k objects) a full pass
took ~0.2 s on a 2-core VM, and loading an artifact allocates enough to start several: each
stalled every request of the server (a repository load cost requests their deadline). Once its
models are loaded and warmed up, a process collects what loading left and freezes the rest
(`gc.freeze`): later passes skip those objects. What a frozen object holds is still freed when
its last reference goes (engines keep no cycle once closed: runtime/batcher.py close), only a
cycle among frozen objects is kept.
"""

from __future__ import annotations

import gc


def settle_heap() -> None:
    """Collect the garbage loading left, then exclude every object alive from later collections."""
    gc.collect()
    gc.freeze()

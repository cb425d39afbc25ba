"""A catalogue served with a constrained beam artifact: its trie on the device, per-request allow-lists.

    load_catalogue(cat_dir, artifact_dir, device)                -> ServedCatalogue (checked against the artifact)
    ServedCatalogue.trie(allow_items)                            -> Trie (artifact/tensors.py) of one request

A constrained artifact takes the trie as program inputs (programs/beam.py), so the engine holds
one `ServedCatalogue` and hands its tensors to every call (runtime/local_engine.py). Replacing the
catalogue is replacing that one reference: a request takes the catalogue of the moment it is
tokenized, with every tensor its call needs, so it runs on the old or the new catalogue whole,
never a mix, and the old one lives until its last request ends.

An allow-list keeps the trie's four arrays and replaces its `reach` and `ends` for that request
(text/catalogue_search.py `allowed`: reach derived on the host from the leaves, O(nodes) per
request); a request without one shares the catalogue's. Ids not in the catalogue, or a list
that leaves nothing to generate, are InvalidInput (400).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from boundgen.artifact.manifest import read_manifest
from boundgen.artifact.tasks import task_of
from boundgen.artifact.tensors import TRIE, Trie
from boundgen.errors import ConfigError, InvalidInput
from boundgen.text import catalogue_search
from boundgen.text.catalogue import Catalogue, check_tokenizer


@dataclass(frozen=True)
class ServedCatalogue:
    path: str
    meta: dict  # catalogue.json's counts and sha256
    catalogue: Catalogue  # the host arrays, for allow-lists
    full: Trie  # device tensors, every item allowed

    def trie(self, allow_items: Sequence[int] | None = None) -> Trie:
        """The program inputs of a request (allow_items None: every item)."""
        if allow_items is None:
            return self.full
        ids = _item_ids(allow_items)
        try:
            allow = catalogue_search.allowed(self.catalogue, ids)
        except ConfigError as exc:
            raise InvalidInput(f"ALLOW_ITEMS: {exc}") from None
        reach, ends = catalogue_search.padded(self.catalogue, allow)
        device = self.full.reach.device
        return self.full._replace(reach=torch.from_numpy(reach).to(device), ends=torch.from_numpy(ends).to(device))


def load_catalogue(cat_dir: str | Path, artifact_dir: str | Path, device: str | torch.device) -> ServedCatalogue:
    """Read CAT_DIR and check it against a constrained beam artifact (its tokenizer, N_gen, stop
    tokens, the model's vocabulary and the children bound): a ConfigError says what differs."""
    manifest = read_manifest(artifact_dir)
    spec, vocab = manifest.program, manifest.model["config"]["vocab_size"]
    if not task_of(spec).constrained(spec):
        raise ConfigError(f"a catalogue ({cat_dir}) was given for a model that was not built with --constrained")
    cat = Catalogue.load(cat_dir)
    check_tokenizer(cat, artifact_dir, cat_dir)
    catalogue_search.check(cat, vocab, spec.steps, spec.stop_token_ids, spec.catalogue_max_degree)
    arrays = catalogue_search.arrays(cat, vocab)
    full = Trie(*(torch.from_numpy(arrays[name]).to(device) for name in TRIE))
    return ServedCatalogue(str(cat_dir), cat.metadata(), cat, full)


def _item_ids(allow_items) -> np.ndarray:
    ids = np.asarray(allow_items)
    if ids.ndim != 1 or (ids.size and ids.dtype.kind not in "iu"):
        raise InvalidInput(f"ALLOW_ITEMS must be a list of integer item ids, got {np.asarray(allow_items).dtype} "
                           f"of shape {list(ids.shape)}")
    return ids.astype(np.int64)

"""`boundgen build`: checkpoint -> program -> export -> AOTInductor -> validated artifact directory.

Stages, each reported on stderr as `[build   12.3s] stage: ...` and timed in the manifest:
  load      checkpoint + tokenizer; the program for the spec, with the chosen op lowering
  export    torch.export with the spec's bounded dims (compile/export.py)
  compile   AOTInductor packages (score: one; beam: prefill, step, finish), weights beside them
            or inside (compile/aoti.py)
  validate  the package, loaded as a deployment loads it, against the eager reference program
            on representative and boundary inputs (compile/validate.py); a failure stops here
  write     tokenizer files, MLP head, manifest with hashes (artifact/manifest.py); not timed

The artifact is assembled in a temporary sibling directory and moved into place only when
everything passed, so an interrupted or failed build never leaves a half-written artifact. An
existing non-empty --out is refused unless `force` (then only an earlier artifact is replaced:
it is renamed aside, the new one renamed into place, then the old one removed).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import platform
import shutil
import sys
import time
from dataclasses import asdict
from importlib import metadata
from pathlib import Path

import numpy as np
import torch

from boundgen.artifact.manifest import MANIFEST_FILE, CompileRecord, Manifest, write_manifest
from boundgen.artifact.tasks import task_of
from boundgen.compile import aoti, export, memory, validate
from boundgen.compile.config import BuildConfig
from boundgen.errors import ConfigError
from boundgen.model import fp8
from boundgen.model.loader import load_model, parse_dtype, read_config
from boundgen.ops.lowering import REFERENCE
from boundgen.programs.constraint import CatalogueConstraint
from boundgen.programs.eager import EagerRunner
from boundgen.programs.factory import make_program
from boundgen.runtime.compiled import load_runner
from boundgen.text import catalogue_search
from boundgen.version import __version__

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
HEAD_FILE = "head.safetensors"


class Progress:
    def __init__(self, stream=None):
        self.stream = stream if stream is not None else sys.stderr
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self._stage, self._stage_start = None, self.start

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def __call__(self, message: str) -> None:
        print(f"[build {self.elapsed():6.1f}s] {message}", file=self.stream, flush=True)

    def stage(self, name: str, message: str) -> None:
        self._close()
        self._stage, self._stage_start = name, time.perf_counter()
        self(f"{name}: {message}")

    def _close(self) -> None:
        if self._stage is not None:
            self.seconds[self._stage] = round(time.perf_counter() - self._stage_start, 2)
            self._stage = None

    def done(self) -> dict:
        self._close()
        self.seconds["total"] = round(self.elapsed(), 2)
        return self.seconds


def build(cfg: BuildConfig, progress: Progress | None = None, force: bool = False) -> Manifest:
    """Build the artifact cfg describes into cfg.out; returns the manifest written. force: replace
    an artifact already in cfg.out (without it, a non-empty cfg.out is refused before any work)."""
    progress = progress or Progress()
    device = _check_device(cfg.device)
    _check_out(cfg.out, force)
    memory.check_fits(cfg)  # before anything is loaded or compiled (compile/memory.py)
    progress(f"building {cfg.summary()} -> {cfg.out}")
    tmp = cfg.out.parent / f".{cfg.out.name}.building-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        progress.stage("load", f"{cfg.model_dir} in {cfg.precision}, lowering {cfg.lowering.describe()}")
        dtype = parse_dtype(cfg.dtype)
        model = fp8.quantize(load_model(cfg.model_dir, dtype, device, cfg.lowering.resolve()), cfg.fp8)
        program = make_program(model, cfg.spec)
        vocab = model.cfg.vocab_size

        bounds = export.dim_bounds(cfg.spec)
        progress.stage("export", ", ".join(f"{k} in [{lo}, {hi}]" for k, (lo, hi) in bounds.items()))
        eps = export.export_programs(program, cfg.spec, device, vocab)

        progress.stage("compile", f"AOTInductor for {cfg.device}, weights {cfg.weights} (takes a while)")
        packages = {}
        custom_ops = sorted({op for ep in eps.values() for op in aoti.called_ops(ep)})
        for i, (name, ep) in enumerate(eps.items(), 1):
            if len(eps) > 1:
                progress(f"  package {i}/{len(eps)}: {aoti.package_file(name)}")
            packages[name] = aoti.compile_package(ep, tmp, cfg.device, cfg.weights, name).name
        weights = aoti.write_weights(list(eps.values()), tmp).name if cfg.weights == "external" else None
        del eps

        progress.stage("validate", "compiled package vs eager reference")
        compiled = load_runner(tmp, packages, weights, device, task_of(cfg.spec).steps(cfg.spec),
                               custom_ops=custom_ops)
        # The reference lowering, not the one under test; FP32 judges bf16 beams and FP8 builds.
        ref_model = model if cfg.lowering == REFERENCE else fp8.quantize(load_model(cfg.model_dir, dtype, device),
                                                                         cfg.fp8)
        judged_by_fp32 = cfg.dtype != "float32" and task_of(cfg.spec).judged_by(False, cfg.fp8 != "none") is not None
        fp32_model = load_model(cfg.model_dir, torch.float32, device) if judged_by_fp32 else None
        num_classes = program.num_classes
        report = None
        for suffix, allow_items, trie in _validation_catalogues(cfg.spec, vocab, device):
            part = validate.validate(compiled, _reference(ref_model, cfg.spec, allow_items), cfg.spec,
                                     task_of(cfg.spec).output_names(cfg.spec), cfg.dtype, cfg.device, vocab,
                                     cfg.tolerances, fp32_reference=_reference(fp32_model, cfg.spec, allow_items),
                                     token_bucket=cfg.runtime.token_bucket, fp8=cfg.fp8, trie=trie, suffix=suffix)
            report = part if report is None else validate.merge(report, part)
        for case in report["cases"]:
            worst = {k: o.get("max_abs_err", "identical" if o.get("identical") else "differs")
                     for k, o in case["outputs"].items()}
            if "labels" in case["outputs"]:  # an FP8 score build's gate (compile/validate.py)
                labels = case["outputs"]["labels"]
                worst["labels"] = f"argmax {labels['argmax_agree']}, spearman {labels['spearman']}"
            progress(f"  {case['name']}: {case['samples']} samples, {case['tokens']} tokens: "
                     f"{'ok' if case['passed'] else 'FAILED'} {worst}")
        if not report["passed"]:
            raise validate.ValidationFailed(validate.failure_message(report) + f"\n(build of {cfg.out} abandoned)")
        del compiled, program, model, ref_model, fp32_model

        seconds = progress.done()  # recorded in the manifest, so before writing it
        progress("write: tokenizer, manifest, hashes")
        for name in TOKENIZER_FILES:
            if (cfg.model_dir / name).is_file():
                shutil.copy2(cfg.model_dir / name, tmp / name)
        head = task_of(cfg.spec).head_path(cfg.spec)
        if head:
            shutil.copy2(head, tmp / HEAD_FILE)
        written = write_manifest(tmp, _manifest(cfg, asdict(read_config(cfg.model_dir)), num_classes, packages,
                                                weights, custom_ops, report, seconds))
        put_in_place(tmp, cfg.out, force)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    size = sum(p.stat().st_size for p in cfg.out.rglob("*") if p.is_file())
    progress(f"done: {cfg.out} ({size / 2**20:.1f} MiB)")
    return written


def versions() -> dict:
    """Versions of what the artifact depends on, in this process (recorded in the manifest)."""
    try:
        triton = metadata.version("triton")
    except metadata.PackageNotFoundError:
        triton = None
    return {"boundgen": __version__, "torch": torch.__version__, "triton": triton, "cuda": torch.version.cuda,
            "python": platform.python_version()}


def _manifest(cfg: BuildConfig, model_cfg: dict, num_classes: int, packages: dict[str, str], weights: str | None,
              custom_ops: list[str], report: dict, seconds: dict) -> Manifest:
    spec = cfg.spec
    if task_of(spec).head_path(spec):
        spec = dataclasses.replace(spec, head_path=HEAD_FILE)  # relative to the artifact
    gpu_name = gpu_capability = None
    if cfg.device.startswith("cuda"):
        dev = torch.device(cfg.device)
        gpu_name = torch.cuda.get_device_name(dev)
        gpu_capability = ".".join(map(str, torch.cuda.get_device_capability(dev)))
    return Manifest(
        name=cfg.name,
        created=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        model={"source": str(cfg.model_dir.resolve()), "family": model_cfg["family"], "config": model_cfg},
        program=spec,
        interface={"tensors": task_of(spec).tensor_interface(spec, num_classes),
                   "dims": {k: list(v) for k, v in export.dim_bounds(spec).items()}},
        runtime=cfg.runtime,
        compile=CompileRecord(device=cfg.device, dtype=cfg.dtype, lowering=cfg.lowering.to_dict(), weights=cfg.weights,
                              packages=packages, weights_file=weights, gpu_name=gpu_name,
                              gpu_capability=gpu_capability, inductor_configs=aoti.inductor_configs(cfg.weights),
                              decompose_custom_triton_ops=cfg.device != "cpu", seconds=seconds,
                              custom_ops=custom_ops, fp8=cfg.fp8),
        validation=report,
        versions=versions(),
    )


def _validation_catalogues(spec, vocab: int, device):
    """(case-name suffix, allow-list, TRIE inputs) to validate with: for a constrained beam
    artifact the example catalogue whole and under an allow-list of every third item; else one
    round without."""
    if not task_of(spec).constrained(spec):
        return [("", None, ())]
    cat = export.example_catalogue(spec, vocab)
    allow = [int(i) for i in np.unique(cat.node_item[cat.node_item >= 0])[::3]]
    rounds = []
    for suffix, items in (("", None), ("+allow_list", allow)):
        arrays = catalogue_search.arrays(cat, vocab, catalogue_search.allowed(cat, items))
        rounds.append((suffix, items, export.trie_tensors(arrays, device)))
    return rounds


def _reference(model, spec, allow_items) -> EagerRunner | None:
    """The eager program over `model` (None: none), constrained to the example catalogue a
    constrained build validates on (under `allow_items`)."""
    if model is None:
        return None
    constraint = None
    if task_of(spec).constrained(spec):
        vocab = model.cfg.vocab_size
        constraint = CatalogueConstraint(export.example_catalogue(spec, vocab), vocab, spec.steps,
                                         spec.stop_token_ids, allow_items)
    return EagerRunner(make_program(model, spec, constraint))


def _check_device(device: str) -> torch.device:
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"--device {device} was asked for, but this machine has no CUDA device")
    return dev


def _check_out(out: Path, force: bool) -> None:
    """A new or empty --out, or (with force) an earlier artifact; else ConfigError saying what to do."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ConfigError(f"--out {out} exists and is not a directory")
    if not any(out.iterdir()):
        return
    if not (out / MANIFEST_FILE).is_file():
        raise ConfigError(f"--out {out} is a non-empty directory that is not a boundgen artifact; "
                          "refusing to overwrite it (give a new or empty directory)")
    if not force:
        raise ConfigError(f"--out {out} holds an artifact already; give --force to replace it "
                          "(or a new or empty directory)")


def put_in_place(new: Path, out: Path, force: bool) -> None:
    """Rename the finished artifact `new` (a sibling of `out`) to `out`. An earlier artifact there
    (force) is renamed aside first and removed once the new one is in place, so `out` is at every
    moment the old artifact, the new one, or (between two renames) absent: never half of one."""
    _check_out(out, force)  # again: the build took a while, and something may have appeared there
    if not out.exists() or not any(out.iterdir()):
        os.replace(new, out)  # onto an empty directory too
        return
    old = out.parent / f".{out.name}.replaced-{os.getpid()}"
    shutil.rmtree(old, ignore_errors=True)
    os.replace(out, old)
    try:
        os.replace(new, out)
    except BaseException:
        os.replace(old, out)  # the earlier artifact back where it was
        raise
    shutil.rmtree(old, ignore_errors=True)

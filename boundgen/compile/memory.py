"""Host memory a CPU build needs, estimated before anything is compiled, so that a build that
cannot fit says so at once and names the bound to lower (instead of dying in validation).

    weights      params x dtype bytes x 3: the eager model, the reference program's (a second
                 model when the lowering under test is not the torch one; counted always), and
                 the compiled package's own copy loaded for validation
    activations  the largest validation case, T tokens (score: max_total_tokens; beam: the
                 prompt plus max_requests x W x steps decode rows): per layer FP32
                 T x (q + k + v + out + 3 x intermediate + 4 x hidden), x 2 (eager and compiled)
    attention    N_q x max_L^2 FP32 scores, x 3 (scores, masked, probs), x 2: the eager reference
                 and the compiled package both attend one sequence at a time (on CPU the package
                 calls the registered op, ops/packed_attention.py; before, it compiled SDPA under a
                 [T, T] mask into [N_q, T, T] FP32 scores: a 4-head tiny model at 64 x 512 tokens
                 was killed at 23 GB, 2026-11-30)
    logits       rows read x vocab FP32 (score: samples; beam: W rows per request)
    overhead     COMPILE_OVERHEAD_BYTES for Inductor and the process

An estimate, deliberately on the high side; plain arithmetic over config.json and the spec
(no torch).
"""

from __future__ import annotations

from pathlib import Path

from boundgen.artifact.tasks import task_of
from boundgen.errors import ConfigError

GIB = 1 << 30
COMPILE_OVERHEAD_BYTES = 3 * GIB
EAGER_OVERHEAD_BYTES = 1 * GIB  # the process and torch, without a compiler
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def estimate_bytes(model_config: dict, spec, dtype: str, eager: bool = False) -> dict[str, int]:
    """Bytes by part (weights, activations, attention, logits, overhead) of building `spec`; `eager`:
    of running it once on the eager program instead (one model, one program, no compiler)."""
    c = model_config
    hidden, inter, layers = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"]
    num_q, num_kv = c["num_attention_heads"], c.get("num_key_value_heads", c["num_attention_heads"])
    head_dim, vocab = c.get("head_dim") or hidden // num_q, c["vocab_size"]
    per_layer = hidden * head_dim * (2 * num_q + 2 * num_kv) + 3 * hidden * inter
    params = layers * per_layer + vocab * hidden * (1 if c.get("tie_word_embeddings", True) else 2)
    tokens, longest, rows = task_of(spec).memory_shape(spec)
    width = head_dim * (2 * num_q + 2 * num_kv) + 3 * inter + 4 * hidden
    copies = 1 if eager else 2  # the eager reference and the compiled package
    return {
        "weights": (1 if eager else 3) * params * DTYPE_BYTES.get(dtype, 4),
        "activations": copies * tokens * width * 4,
        "attention": copies * 3 * num_q * longest * longest * 4,
        "logits": copies * rows * vocab * 4,
        "overhead": EAGER_OVERHEAD_BYTES if eager else COMPILE_OVERHEAD_BYTES,
    }


def available_bytes() -> int | None:
    """MemAvailable from /proc/meminfo (Linux); None where it cannot be read."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _over(model_dir, spec, dtype: str, device: str, available: int | None, eager: bool):
    """(parts, need, available) when running or building `spec` on the CPU may not fit, else None (it fits,
    the device is a GPU, whose memory the runtime reports, or the host's memory cannot be read)."""
    if not str(device).startswith("cpu"):
        return None
    available = available_bytes() if available is None else available
    if available is None:
        return None
    from boundgen.model.config import ModelConfig
    from boundgen.model.loader import read_json_object  # torch: only when the memory is checked

    raw = read_json_object(Path(model_dir) / "config.json")
    ModelConfig.from_hf_dict(raw)  # its values checked (ConfigError) before the arithmetic below uses them
    parts = estimate_bytes(raw, spec, dtype, eager=eager)
    need = sum(parts.values())
    return (parts, need, available) if need > available else None


def _detail(parts: dict[str, int]) -> str:
    return ", ".join(f"{k} {v / GIB:.1f}" for k, v in parts.items())


def check_eager_fits(model_dir, spec, dtype: str, device: str, available: int | None = None) -> None:
    """Raise ConfigError, naming the flag to lower, if running `spec` eagerly on the CPU at its bounds
    could need more memory than is available (`boundgen score|beam MODEL_DIR`: a 25,000-token sample
    under --max-tokens 30000 was killed by the kernel at 23 GB, without a word)."""
    over = _over(model_dir, spec, dtype, device, available, eager=True)
    if over is not None:
        parts, need, available = over
        raise ConfigError(f"at its bounds this run could need about {need / GIB:.1f} GiB of memory "
                          f"({_detail(parts)} GiB), more than the {available / GIB:.1f} GiB available; "
                          "lower --max-tokens")


def check_fits(cfg, available: int | None = None) -> None:
    """Raise ConfigError, naming the bound to lower, if a CPU build of `cfg` needs more memory than is available."""
    over = _over(cfg.model_dir, cfg.spec, cfg.dtype, cfg.device, available, eager=False)
    if over is None:
        return
    parts, need, available = over
    if parts["weights"] + parts["overhead"] > available:  # no bound on requests can help
        lower = "--dtype bfloat16, or build on a machine with more memory"
    else:
        lower = task_of(cfg.spec).bounds_to_lower
    raise ConfigError(f"this build needs about {need / GIB:.1f} GiB of memory ({_detail(parts)} GiB), more than the "
                      f"{available / GIB:.1f} GiB available; lower {lower}")

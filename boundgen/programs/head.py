"""Optional MLP classification head over the last-token hidden state, run in FP32.

File format (`head.safetensors`), written by the user's training code:
- tensors `layers.0.weight` [C_1, H], `layers.0.bias` [C_1], ..., `layers.{n-1}.weight` [C, C_{n-1}],
  `layers.{n-1}.bias` [C] (biases optional), H the model's hidden size;
- metadata (safetensors `__metadata__`, all optional): `activation` between layers, one of
  relu (default), gelu, silu, tanh; `output` applied to the last layer, one of softmax (default),
  sigmoid, identity; `labels` a comma-separated list of C class names.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError, safe_open
from torch import nn

from boundgen.errors import ConfigError

ACTIVATIONS = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "tanh": torch.tanh}
OUTPUTS = {"softmax": lambda x: torch.softmax(x, dim=-1), "sigmoid": torch.sigmoid, "identity": lambda x: x}


class MLPHead(nn.Module):
    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None],
                 activation: str = "relu", output: str = "softmax", labels: list[str] | None = None):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ConfigError(f"MLP head activation {activation!r} unknown; expected {', '.join(ACTIVATIONS)}")
        if output not in OUTPUTS:
            raise ConfigError(f"MLP head output {output!r} unknown; expected {', '.join(OUTPUTS)}")
        for i, (w, b) in enumerate(zip(weights, biases)):
            if w.dim() != 2 or 0 in w.shape:
                raise ConfigError(f"MLP head layers.{i}.weight must be a matrix [outputs, inputs] of at least one "
                                  f"row and column, got shape {list(w.shape)}")
            if b is not None and list(b.shape) != [w.shape[0]]:
                raise ConfigError(f"MLP head layers.{i}.bias must have shape [{w.shape[0]}] (its weight's outputs), "
                                  f"got {list(b.shape)}")
            for name, t in ((f"layers.{i}.weight", w), (f"layers.{i}.bias", b)):
                if t is not None and not (t.is_floating_point() and torch.isfinite(t).all()):
                    raise ConfigError(f"MLP head {name} must hold finite floating-point values")
        for i in range(1, len(weights)):
            if weights[i].shape[1] != weights[i - 1].shape[0]:
                raise ConfigError(f"MLP head layers.{i}.weight has {weights[i].shape[1]} inputs, "
                                  f"layers.{i - 1} has {weights[i - 1].shape[0]} outputs")
        if labels is not None and len(labels) != weights[-1].shape[0]:
            raise ConfigError(f"MLP head names {len(labels)} labels for {weights[-1].shape[0]} classes")
        self.weights = nn.ParameterList(nn.Parameter(w.float(), requires_grad=False) for w in weights)
        self.biases = nn.ParameterList(
            nn.Parameter(b.float() if b is not None else torch.zeros(w.shape[0]), requires_grad=False)
            for w, b in zip(weights, biases))
        self.activation, self.output = activation, output
        self.labels = labels or [str(i) for i in range(weights[-1].shape[0])]

    @property
    def in_features(self) -> int:
        return self.weights[0].shape[1]

    @property
    def num_classes(self) -> int:
        return self.weights[-1].shape[0]

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        x = hidden.to(torch.float32)  # [B, H]
        n = len(self.weights)
        for i in range(n):
            x = F.linear(x, self.weights[i], self.biases[i])
            if i < n - 1:
                x = ACTIVATIONS[self.activation](x)
        return OUTPUTS[self.output](x)

    @classmethod
    def load(cls, path: str | Path, hidden_size: int) -> "MLPHead":
        path = Path(path)
        if not path.is_file():
            raise ConfigError(f"MLP head file {path} not found")
        try:
            with safe_open(str(path), framework="pt") as f:
                names = set(f.keys())
                meta = f.metadata() or {}
                weights, biases, i = [], [], 0
                while f"layers.{i}.weight" in names:
                    weights.append(f.get_tensor(f"layers.{i}.weight"))
                    b = f"layers.{i}.bias"
                    biases.append(f.get_tensor(b) if b in names else None)
                    names.discard(f"layers.{i}.weight")
                    names.discard(b)
                    i += 1
        except SafetensorError as exc:
            raise ConfigError(f"MLP head file {path} is not a valid safetensors file: {exc}") from None
        if not weights:
            raise ConfigError(f"MLP head file {path} has no layers.0.weight")
        if names:
            raise ConfigError(f"MLP head file {path} has unexpected tensors: {', '.join(sorted(names))}")
        labels = [s for s in meta.get("labels", "").split(",") if s] or None
        head = cls(weights, biases, meta.get("activation", "relu"), meta.get("output", "softmax"), labels)
        if head.in_features != hidden_size:
            raise ConfigError(f"MLP head expects hidden size {head.in_features}, the model has {hidden_size}")
        return head

"""SwiGLU activation on the fused gate/up projection: y = silu(gate) * up.

x [T, 2I] holds gate = x[:, :I] and up = x[:, I:] (the layout of `gate_up_proj`'s output);
y [T, I] in x's dtype. Bytes moved: read 2 T I, write T I elements. As in HF, silu and the
product are each rounded to the activation dtype.
"""

import torch
import torch.nn.functional as F


def reference(x: torch.Tensor) -> torch.Tensor:
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


# Lowerings by name; the build config picks one per op and records it in the manifest.
IMPLEMENTATIONS = {"torch": reference}

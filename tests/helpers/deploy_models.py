"""Replacements of the deploy tests (tests/test_deploy.py): an RMSNorm each, for the norms of
``grad_models.NormStack``, that runs eagerly and swaps in, and then compiles, or does not.

- :class:`TorchRMSNorm`: torch's fused ``F.rms_norm``: compiles and packages;
- :class:`CustomOpRMSNorm`: a kernel registered as a custom op (``gs_deploy::rms_norm``, with a
  fake kernel, so it exports and packages) without an autograd formula: torch.compile cannot
  build its training graph, the realistic way a fused kernel fails to compile;
- :class:`ItemGuardedRMSNorm`: reads a value with ``.item()`` into a Python ``if``, which the
  re-export refuses (data-dependent control flow).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


@torch.library.custom_op("gs_deploy::rms_norm", mutates_args=())
def rms_norm_kernel(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """A fused RMSNorm kernel as a custom op (here computed by torch)."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


@rms_norm_kernel.register_fake
def _(x, weight, eps):
    return torch.empty_like(x)


class _Norm(nn.Module):
    def __init__(self, norm: nn.Module):
        super().__init__()
        self.weight = nn.Parameter(norm.weight.detach().clone())
        self.eps = norm.variance_epsilon


class TorchRMSNorm(_Norm):
    """``F.rms_norm`` with the replaced norm's weight and epsilon."""

    def forward(self, x):
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class CustomOpRMSNorm(_Norm):
    """The custom op ``gs_deploy::rms_norm``, which has no autograd formula."""

    def forward(self, x):
        return torch.ops.gs_deploy.rms_norm(x, self.weight, self.eps)


class ItemGuardedRMSNorm(_Norm):
    """Scales down large inputs, deciding in Python from a value read with ``.item()``."""

    def forward(self, x):
        if x.abs().max().item() > 1e4:
            x = x / 1e4
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)

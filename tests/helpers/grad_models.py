"""Models of the gradient checks: RMSNorms with a hand-written backward (a
``torch.autograd.Function``), right and with planted bugs, in the variants the Llama family
uses (used by tests/test_verify.py, test_compare.py, test_bisect.py, test_overlay.py).

``FusedRMSNorm(norm, bug=None)`` takes any RMSNorm module (this file's :class:`RMSNorm`, or a
Hugging Face ``LlamaRMSNorm``, ``GemmaRMSNorm``, ``T5LayerNorm``, ...) and computes the same
thing with a backward written by hand. ``bug``:

- ``"weight factor"``: the weight's gradient is twice what it should be;
- ``"missing mean"``: the input's gradient leaves out the mean term of the normalization.

The replacements whose backward ``locate`` must name by its line stay in tests/test_compare.py.
"""

from __future__ import annotations

import torch
from torch import nn

BUGS = (None, "weight factor", "missing mean")


class RMSNorm(nn.Module):
    """Llama's RMSNorm: ``weight * x / sqrt(mean(x^2) + eps)``, computed in float32."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.variance_epsilon = eps

    def forward(self, x):
        dtype = x.dtype
        x = x.to(torch.float32)
        variance = x.pow(2).mean(-1, keepdim=True)
        x = x * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * x.to(dtype)


class RMSNormFunction(torch.autograd.Function):
    """``(offset + weight) * x * rstd`` with its backward by hand; ``bug`` plants one error."""

    @staticmethod
    def forward(ctx, x, weight, eps, offset, bug):
        dtype = x.dtype
        x32 = x.to(torch.float32)
        rstd = torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
        normed = x32 * rstd
        scale = weight.to(torch.float32) + offset
        ctx.save_for_backward(normed, scale, rstd)
        ctx.bug, ctx.dtype, ctx.weight_dtype = bug, dtype, weight.dtype
        return (normed * scale).to(dtype)

    @staticmethod
    def backward(ctx, grad):
        normed, scale, rstd = ctx.saved_tensors
        grad = grad.to(torch.float32)
        grad_weight = (grad * normed).reshape(-1, normed.shape[-1]).sum(0)
        if ctx.bug == "weight factor":
            grad_weight = grad_weight * 2
        grad_normed = grad * scale
        if ctx.bug == "missing mean":
            grad_x = grad_normed * rstd
        else:
            mean = (grad_normed * normed).mean(-1, keepdim=True)
            grad_x = (grad_normed - normed * mean) * rstd
        return grad_x.to(ctx.dtype), grad_weight.to(ctx.weight_dtype), None, None, None


def _epsilon(norm: nn.Module) -> float:
    for name in ("variance_epsilon", "eps", "epsilon"):
        value = getattr(norm, name, None)
        if isinstance(value, float):
            return value
    raise AttributeError(f"{type(norm).__name__} has no epsilon attribute")


class FusedRMSNorm(nn.Module):
    """The same RMSNorm as ``norm`` (its weight copied), with a hand-written backward.
    Gemma's norms scale by ``1 + weight``: ``offset`` says so."""

    def __init__(self, norm: nn.Module, bug: str | None = None):
        super().__init__()
        if bug not in BUGS:
            raise ValueError(f"bug={bug!r}: expected one of {BUGS}")
        self.weight = nn.Parameter(norm.weight.detach().clone())
        self.eps = _epsilon(norm)
        self.offset = 1.0 if "Gemma" in type(norm).__name__ else 0.0
        self.bug = bug

    def forward(self, x):
        return RMSNormFunction.apply(x, self.weight, self.eps, self.offset, self.bug)


class RenamedFusedRMSNorm(nn.Module):
    """:class:`FusedRMSNorm` with its weight named ``scale``: a replacement whose parameter
    the module it replaces names otherwise (``weight``), so no gradient pairs them by name."""

    def __init__(self, norm: nn.Module, bug: str | None = None):
        super().__init__()
        fused = FusedRMSNorm(norm, bug)
        self.scale = fused.weight
        self.eps, self.offset, self.bug = fused.eps, fused.offset, fused.bug

    def forward(self, x):
        return RMSNormFunction.apply(x, self.scale, self.eps, self.offset, self.bug)


class ArgmaxOf(nn.Module):
    """``inner(x).argmax(-1)``: a program whose only output is integers, so no gradient flows."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x).argmax(-1)


class RunningSum(nn.Module):
    """``lin(x) + total`` after adding the batch mean of ``x`` to its buffer ``total`` in
    place: run with autograd on, the buffer takes a history from ``x``."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.lin = nn.Linear(dim, dim)
        self.register_buffer("total", torch.zeros(dim))

    def forward(self, x):
        self.total.add_(x.mean(0))
        return self.lin(x) + self.total


class _FailingBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError("this backward is not written yet")


class FailsBackward(nn.Module):
    """``norm(x)`` whose gradient never comes back: its backward raises."""

    def __init__(self, norm: nn.Module):
        super().__init__()
        self.norm = FusedRMSNorm(norm)

    def forward(self, x):
        return _FailingBackward.apply(self.norm(x))


class NormBlock(nn.Module):
    """A pre-norm residual block: ``x + mlp(norm(x))``."""

    def __init__(self, dim: int):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.SiLU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class NormStack(nn.Module):
    """``layers`` pre-norm blocks and a final norm: the places a fused RMSNorm goes."""

    def __init__(self, dim: int = 8, layers: int = 6):
        super().__init__()
        self.layers = nn.ModuleList(NormBlock(dim) for _ in range(layers))
        self.norm = RMSNorm(dim)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.norm(x)


def fused_norms(model: nn.Module, bugs: dict[str, str] | None = None) -> dict[str, nn.Module]:
    """``{name: FusedRMSNorm}`` for every RMSNorm of ``model`` (any module whose class name
    ends in RMSNorm or is T5LayerNorm), ``bugs`` planting one bug per name given."""
    bugs = dict(bugs or {})
    found = {
        name: FusedRMSNorm(module, bugs.pop(name, None))
        for name, module in model.named_modules()
        if type(module).__name__.endswith("RMSNorm") or type(module).__name__ == "T5LayerNorm"
    }
    if bugs:
        raise KeyError(f"no RMSNorm named {sorted(bugs)}")
    return found


# the RMSNorms of the Llama family, as Hugging Face writes them: (module, class)
HF_NORMS = {
    "llama": ("llama", "LlamaRMSNorm"),
    "gemma": ("gemma", "GemmaRMSNorm"),
    "gemma3": ("gemma3", "Gemma3RMSNorm"),
    "qwen2": ("qwen2", "Qwen2RMSNorm"),
    "qwen3": ("qwen3", "Qwen3RMSNorm"),
    "mistral": ("mistral", "MistralRMSNorm"),
    "t5": ("t5", "T5LayerNorm"),
    "olmo2": ("olmo2", "Olmo2RMSNorm"),
    "phi3": ("phi3", "Phi3RMSNorm"),
}


def hf_norm(family: str, dim: int) -> nn.Module:
    """The RMSNorm of a Hugging Face family, its weight drawn at random (not its init of ones
    or zeros, which would hide a weight that is read wrongly)."""
    import importlib

    module, name = HF_NORMS[family]
    cls = getattr(importlib.import_module(f"transformers.models.{module}.modeling_{module}"), name)
    norm = cls(dim, eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.rand(dim) + 0.5)
    return norm


class ArgmaxReader(nn.Module):
    """``lin(x) + norm(x).argmax(-1)``: nothing downstream needs the norm's gradient (argmax
    has none), so no gradient reaches the norm's output."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.norm = RMSNorm(dim)
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return self.lin(x) + self.norm(x).argmax(-1, keepdim=True)


class ArgmaxOutput(nn.Module):
    """``norm(x).argmax(-1)``: an integer output, so no gradient flows back at all."""

    def __init__(self, dim: int = 8):
        super().__init__()
        self.norm = RMSNorm(dim)

    def forward(self, x):
        return self.norm(x).argmax(-1)

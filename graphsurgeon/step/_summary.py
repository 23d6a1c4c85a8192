"""What a value looks like: :class:`Summary` (shape, dtype, device, statistics, NaN/Inf
counts) and :func:`summary_table`, the one table of summaries the stepper, its panel and its
display write."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch._subclasses.fake_tensor import FakeTensor

__all__ = ["Summary", "has_data", "stepper_html", "summary_table", "tensor_leaves"]


class _TensorText:
    """Stands for a tensor inside a structure shown as text: ``Tensor[2, 4] float32``."""

    __slots__ = ("text",)

    def __init__(self, tensor: torch.Tensor):
        self.text = f"Tensor{list(tensor.shape)} {str(tensor.dtype).removeprefix('torch.')}"

    def __repr__(self) -> str:
        return self.text


_MAX_TEXT = 200  # characters of a value shown as text


def tensor_leaves(value: Any) -> list[torch.Tensor]:
    """The tensors of a value: itself, or the tensor leaves of a tuple, list or dict."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list, dict)):
        return [t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor)]
    return []


def has_data(t: torch.Tensor) -> bool:
    """Whether a tensor has values to look at (fake and meta tensors have a shape and a dtype
    only)."""
    return t.device.type != "meta" and not isinstance(t, FakeTensor)


@dataclass(frozen=True)
class Summary:
    """What a value looks like: for a tensor its shape, dtype, device, statistics and NaN/Inf
    counts; for anything else the value itself, as text (tensors inside shown by shape).

    ``min``, ``max``, ``mean`` and ``std`` (population, ``correction=0``) are over the finite
    elements, so one Inf does not hide the rest; ``nan`` and ``inf`` count the others. They are
    None when there is nothing to measure (no finite element, a meta tensor, a complex dtype).

    Example:
        >>> import torch
        >>> from graphsurgeon.step import Summary
        >>> print(Summary.of(torch.tensor([1.0, 3.0, float("nan")]), name="x"))
        x: Tensor[3] float32 cpu  min 1  max 3  mean 2  std 1  nan 1  inf 0
        >>> print(Summary.of((torch.zeros(2, 2), 4), name="pair"))
        pair: tuple (Tensor[2, 2] float32, 4)
    """

    name: str
    type: str
    op: str = ""
    module: str = ""
    shape: tuple[int, ...] | None = None
    dtype: str | None = None
    device: str | None = None
    numel: int | None = None
    min: float | None = None
    max: float | None = None
    mean: float | None = None
    std: float | None = None
    nan: int = 0
    inf: int = 0
    text: str = ""  # a tensor's: why its values were not looked at, when they were not
    measured: bool = True  # False: a tensor whose values were not looked at (meta, complex...)

    @property
    def is_tensor(self) -> bool:
        """Whether the value is a tensor (it has a shape); else ``text`` shows it."""
        return self.shape is not None

    @property
    def finite(self) -> bool:
        """No NaN and no Inf anywhere in the value."""
        return self.nan == 0 and self.inf == 0

    @classmethod
    def of(cls, value: Any, name: str = "", op: str = "", module: str = "") -> Summary:
        """Summarize a value now; the value itself is not kept.

        Args:
            value: a tensor, or anything else (a tuple of tensors, an int...).
            name: the node the value is of.
            op: the op that computed it (``"aten.relu.default"``).
            module: the module call it was computed in.

        Returns:
            The :class:`Summary`.
        """
        if isinstance(value, torch.Tensor):
            return _tensor_summary(value, name, op, module)
        tensors = tensor_leaves(value)
        nan = inf = 0
        for tensor in tensors:
            if has_data(tensor) and (tensor.is_floating_point() or tensor.is_complex()):
                nan += int(torch.isnan(tensor).sum())
                inf += int(torch.isinf(tensor).sum())
        shown = (
            pytree.tree_map(lambda v: _TensorText(v) if isinstance(v, torch.Tensor) else v, value)
            if tensors
            else value
        )
        text = repr(shown)
        if len(text) > _MAX_TEXT:
            text = text[: _MAX_TEXT - 3] + "..."
        return cls(
            name=name, type=type(value).__name__, op=op, module=module, nan=nan, inf=inf, text=text
        )

    def __str__(self) -> str:
        head = f"{self.name}: " if self.name else ""
        if not self.is_tensor:
            return f"{head}{self.type} {self.text}"
        parts = [f"{head}Tensor{list(self.shape)} {self.dtype} {self.device}"]
        if self.min is not None:
            parts.append(
                f"min {_g(self.min)}  max {_g(self.max)}  mean {_g(self.mean)}  std {_g(self.std)}"
            )
        if not self.measured:
            parts.append(
                self.text or ("no values" if self.device == "meta" else "values not measured")
            )
        elif self.numel:
            parts.append(f"nan {self.nan}  inf {self.inf}")
        return "  ".join(parts)

    def row(self) -> list[str]:
        """The cells of this summary in :func:`summary_table`.

        Returns:
            Seven texts: the name, the value (dtype, shape, device), min, max, mean, std, and
            the NaN / Inf counts.
        """
        if not self.is_tensor:
            return [self.name, f"{self.type} {self.text}", "", "", "", "", ""]
        value = f"{self.dtype}{list(self.shape)} {self.device}"
        counts = f"{self.nan} / {self.inf}" if self.numel and self.measured else ""
        if not self.measured:
            counts = self.text or ("no values" if self.device == "meta" else "not measured")
        return [self.name, value, _g(self.min), _g(self.max), _g(self.mean), _g(self.std), counts]

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict[str, str]:
        from .. import display

        return display.bundle(summary_table([self]), str(self), include, exclude)


def summary_table(summaries: list[Summary]) -> str:
    """Summaries as one HTML table; a value holding a NaN or an Inf is marked.

    Args:
        summaries: the :class:`Summary` objects, one row each, in this order.

    Returns:
        The HTML of the table, a header row and one row per summary (:meth:`Summary.row`).

    Example:
        >>> import torch
        >>> from graphsurgeon.step import Summary, summary_table
        >>> x = Summary.of(torch.tensor([1.0, float("inf")]), name="x")
        >>> x.row()
        ['x', 'float32[2] cpu', '1', '1', '1', '0', '0 / 1']
        >>> summary_table([x]).count("<tr>")
        2
    """
    from .. import display as d

    rows = []
    for summary in summaries:
        cells = [d.escape(c) for c in summary.row()]
        if not summary.finite:
            cells[-1] = d.badge(summary.row()[-1] or "nan/inf", "bad")
        rows.append(cells)
    headers = ["node", "value", "min", "max", "mean", "std", "nan / inf"]
    return d.table(headers, rows, numeric=(2, 3, 4, 5), raw=range(7))


def stepper_html(
    where: str,
    stack: tuple[str, ...],
    error: Exception | None,
    breakpoints: list[Any],
    summaries: list[Summary],
    title: str,
) -> str:
    """A stepper as HTML: where it is, the module calls around it, the error of the node it is
    stopped at, its breakpoints, and the summaries of the values at hand under ``title``."""
    from .. import display as d

    body = f'<div class="gs-title">Stepper <span class="gs-muted">{d.escape(where)}</span></div>'
    if stack:
        crumbs = " › ".join(f"<code>{d.escape(c)}</code>" for c in stack)
        body += f'<div><span class="gs-muted">in</span> {crumbs}</div>'
    if error is not None:
        body += f"<div>{d.badge('error', 'bad')} {d.escape(error)}</div>"
    if breakpoints:
        listed = "<br>".join(d.escape(b) for b in breakpoints)
        body += d.details(f"{len(breakpoints)} breakpoints", listed)
    if summaries:
        body += f'<div class="gs-muted">{title}</div>' + summary_table(summaries)
    return body


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.4g}"


def _tensor_summary(value: torch.Tensor, name: str, op: str, module: str) -> Summary:
    t = value.detach()
    n = t.numel()
    basics = {
        "name": name,
        "type": "Tensor",
        "op": op,
        "module": module,
        "shape": tuple(t.shape),
        "dtype": str(t.dtype).removeprefix("torch."),
        "device": str(t.device),
        "numel": n,
    }
    if n == 0:
        return Summary(**basics)
    if not has_data(t) or t.is_complex() or t.is_quantized or t.is_sparse:
        return Summary(**basics, measured=False)
    # Memory-light mode summarizes every value, so the common case is one pass of cheap
    # reductions in float64 and one sync: a finite sum, minimum and maximum mean no NaN and no
    # Inf anywhere. float64 keeps the sum of squares exact enough for the spread.
    flat = t.reshape(-1).double()
    low, high = torch.aminmax(flat)
    stats = torch.stack((flat.sum(), low, high, torch.dot(flat, flat))).tolist()
    nan = inf = 0
    count = n
    if not (math.isfinite(stats[0]) and math.isfinite(stats[1]) and math.isfinite(stats[2])):
        finite = torch.isfinite(flat)
        count = int(finite.sum())
        nan = int(torch.isnan(flat).sum())
        inf = n - count - nan
        if count == 0:
            return Summary(**basics, nan=nan, inf=inf)
        flat = flat[finite]
        low, high = torch.aminmax(flat)
        stats = torch.stack((flat.sum(), low, high, torch.dot(flat, flat))).tolist()
    total, low_value, high_value, squares = stats
    mean = total / count
    std = math.sqrt(max(squares / count - mean * mean, 0.0))
    return Summary(**basics, min=low_value, max=high_value, mean=mean, std=std, nan=nan, inf=inf)

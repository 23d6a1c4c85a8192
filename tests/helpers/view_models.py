"""Models of what users see: drawings, tables, pages, the Stepper, the widget and the command
line; names that are markup or strange, replacements that raise or differ (used by
tests/test_render.py, test_widget.py, test_display.py, test_report.py, test_step.py and
test_cli.py).

``Block`` and ``Model`` here are the command line's: their class names are in the output its
tests read (tests/helpers/export_models.py has the module tree's, of other shapes)."""

from __future__ import annotations

import torch
from torch import nn

# -- cli: the command line's models, read from a file (tests/test_cli.py) --------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = Block()
        self.head = nn.Linear(2, 2)

    def forward(self, x):
        return self.head(self.block(x))


class Everything(nn.Module):
    """What torch.export.save stores besides weights: buffers (one not persistent), a lifted
    tensor constant, example inputs with keyword and non-tensor values, a dynamic size."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.bn = nn.BatchNorm1d(4)
        self.register_buffer("scale", torch.full((4,), 2.0))
        self.register_buffer("shift", torch.ones(4), persistent=False)
        self.table = torch.arange(4.0)  # a plain tensor attribute: a constant of the program

    def forward(self, x, *, mask=None, flip=False, steps=2):
        y = self.bn(self.lin(x)) * self.scale + self.shift + self.table
        if mask is not None:
            y = y * mask
        return (-y if flip else y) * steps, {"rows": x.shape[0]}


# -- display: tables and pages of each object (tests/test_display.py) ------------------------------


class MarkupNamed(nn.Module):
    """A model whose module names are markup: they must show as text, never run."""

    NAMES = ("<img src=x onerror=alert(1)>", "</svg><script>alert(2)</script>")

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({name: nn.Linear(2, 2) for name in self.NAMES})

    def forward(self, x):
        for block in self.blocks.values():
            x = torch.relu(block(x))
        return x


class StrangelyNamedBlocks(nn.Module):
    """Modules whose names hold a NUL, a newline and 10,000 characters."""

    NAMES = ("a\x00b", "line\nbreak", "x" * 10_000)

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({name: nn.Linear(2, 2) for name in self.NAMES})

    def forward(self, x):
        for block in self.blocks.values():
            x = torch.relu(block(x))
        return x


class Wide(nn.Module):
    """x ──▶ 40 parallel Linear heads ──▶ stack: wider than a notebook fully open."""

    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(2, 2) for _ in range(40))

    def forward(self, x):
        return torch.stack([head(x).relu() for head in self.heads])


# -- report: the standalone page (tests/test_report.py) --------------------------------------------

MARKUP = ("<img src=x onerror=alert(1)>", "</svg><script>alert(2)</script>")


class MarkupNamedBlocks(nn.Module):
    """Module names that are markup, as a program of unknown origin may have."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({name: nn.Linear(2, 2) for name in MARKUP})

    def forward(self, x):
        for block in self.blocks.values():
            x = torch.relu(block(x))
        return x


# -- step: the Stepper, node by node (tests/test_step.py) ------------------------------------------


#   x ──▶ proj (Linear) ──▶ sqrt ──▶ log ──▶ + 1 ──▶ out
#   (proj makes negatives: sqrt turns them into NaN; log(0) gives -inf)
class Unstable(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(3, 3)
        with torch.no_grad():
            self.proj.weight.copy_(torch.eye(3))
            self.proj.bias.zero_()

    def forward(self, x):
        y = torch.sqrt(self.proj(x))
        return torch.log(y) + 1


class RaisesWhileBroken(nn.Module):
    """A ReLU replacement that raises while ``broken`` is set."""

    def __init__(self):
        super().__init__()
        self.broken = True

    def forward(self, x):
        if self.broken:
            raise RuntimeError("flaky replacement is broken")
        return torch.relu(x)


class DataDependent(nn.Module):
    """A replacement torch.export cannot trace: its branch depends on a value."""

    def forward(self, x):
        return x * 2 if x.sum() > 0 else x - 1


class CleanedLog(nn.Module):
    """A replacement for the ReLU that makes -inf (log of 0 and of negatives: NaN) and cleans
    it up again: what the program sees is finite."""

    def forward(self, x):
        logged = torch.log(torch.relu(x))
        scaled = logged * 0.5
        return torch.nan_to_num(scaled, nan=0.0, neginf=0.0)


class DataDependentLog(nn.Module):
    """CleanedLog behind a branch on a value: torch.export cannot trace it."""

    def forward(self, x):
        if x.sum() > 1e9:
            return x
        return torch.nan_to_num(torch.log(torch.relu(x)), neginf=0.0)


class Fusable(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = Unstable()

    def forward(self, x):
        return self.body(x) * 2


class WritesInputThenLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(2, 2)

    def forward(self, x):
        x.add_(1)
        return self.lin(x)


# -- widget: the session's actions and panels (tests/test_widget.py) -------------------------------


class Doubler(nn.Module):
    def forward(self, x):
        return 2 * x


class NeedsArgs(nn.Module):
    def __init__(self, width, depth):
        super().__init__()
        self.width, self.depth = width, depth

    def forward(self, x):
        return x


class TwoLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def forward(self, x):
        return self.b(self.a(x))


class OddlyNamed(nn.Module):
    """``x ──▶ <name> (a ──▶ b) ──▶ head ──▶ out``, with ``<name>`` any string."""

    def __init__(self, name: str):
        super().__init__()
        self.name = name
        self.add_module(name, TwoLinears())
        self.head = nn.Linear(2, 2)

    def forward(self, x):
        return self.head(getattr(self, self.name)(x))


class OffByOne(nn.Module):
    """An MLP replacement that is wrong by one everywhere: compare must find it."""

    def __init__(self, mlp):
        super().__init__()
        self.mlp = mlp

    def forward(self, x):
        return self.mlp(x) + 1


class Tempered(nn.Module):
    """A replacement for the softmax of an attention: softmax(x / 2)."""

    def forward(self, x):
        return torch.softmax(x / 2, dim=-1)


class GeluTwice(nn.Module):
    """Two blocks alike but for the GELU's approximation: a near-miss for each other."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(4, 4) for _ in range(4))

    def forward(self, x):
        x = x + self.b(nn.functional.gelu(self.a(x)))
        return x + self.d(nn.functional.gelu(self.c(x), approximate="tanh"))


class SiluBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x):
        h = self.linear(x)
        return h * torch.sigmoid(h)


class SiluBlocks(nn.Module):
    """Three blocks that compute the same (a Linear, then h * sigmoid(h)): each is a match of
    the others' region."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(SiluBlock(), SiluBlock(), SiluBlock())

    def forward(self, x):
        return self.blocks(x)


class NeverCalled(nn.Module):
    def __init__(self):
        super().__init__()
        self.used = nn.Linear(4, 4)
        self.spare = nn.ModuleList([nn.Linear(4, 4)])

    def forward(self, x):
        return self.used(x)


class MaskedInner(nn.Module):
    def forward(self, x, mask=None):
        return x if mask is None else x * mask


class PassesMaskOnlyWhenExported(nn.Module):
    """Eager calls ``inner`` with ``mask=None``; the exported program with the mask it made
    (as T5's decoder self-attention is called)."""

    def __init__(self):
        super().__init__()
        self.inner = MaskedInner()

    def forward(self, x):
        mask = torch.ones_like(x) * 0.5 if torch.compiler.is_exporting() else None
        return self.inner(x, mask) + 1


class MakesNaN(nn.Module):
    def forward(self, x):
        return x * float("nan")


class Later(nn.Module):  # defined in a new cell, after the widget
    def forward(self, x):
        return x


class Named(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleDict({"<img src=x onerror=alert(1)>": nn.Linear(2, 2)})

    def forward(self, x):
        for block in self.blocks.values():
            x = block(x)
        return x


# -- render: drawings of programs, before and after a swap (tests/test_render.py) ------------------


class SharedSplitCat(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x):
        y = self.lin(self.lin(x))
        a, b = y.split(2, dim=1)
        return torch.cat([b, a], 1) * self.scale + torch.tensor([1.0, 2.0, 3.0, 4.0])


class Fan(nn.Module):
    def __init__(self):
        super().__init__()
        self.heads = nn.ModuleList(nn.Linear(2, 2) for _ in range(10))

    def forward(self, x):
        return torch.stack([head(x) for head in self.heads])


class LayoutProbe(nn.Module):
    def __init__(self):
        super().__init__()
        self.layouts_cache_probe = nn.Linear(2, 2)

    def forward(self, x):
        return self.layouts_cache_probe(x).tanh()


class ConvBN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3)
        self.bn = nn.BatchNorm2d(4)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


class PatchEncoder(nn.Module):
    """A ViT-like encoder: patches ─▶ + class token, positions ─▶ nn.TransformerEncoder ─▶ head."""

    def __init__(self, dim: int = 32, layers: int = 4):
        super().__init__()
        self.patch = nn.Conv2d(3, dim, 4, 4)
        self.cls = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos = nn.Parameter(torch.zeros(1, 17, dim))
        layer = nn.TransformerEncoderLayer(dim, 2, 64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, 10)

    def forward(self, x):
        x = self.patch(x).flatten(2).transpose(1, 2)
        x = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], 1) + self.pos
        return self.head(self.norm(self.encoder(x))[:, 0])


class BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)
            )

    def forward(self, x):
        y = self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x)))))
        return torch.relu(y + (x if self.down is None else self.down(x)))


class SmallResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU()
        )
        self.layer1 = nn.Sequential(BasicBlock(8, 8), BasicBlock(8, 8))
        self.layer2 = nn.Sequential(BasicBlock(8, 16, 2), BasicBlock(16, 16))
        self.fc = nn.Linear(16, 10)

    def forward(self, x):
        return self.fc(self.layer2(self.layer1(self.stem(x))).mean((2, 3)))


class Positions(nn.Module):
    #   (arange ─▶ unsqueeze ─▶ float ─▶ mul: positions from nothing ─▶ add ◀── x) ─▶ lin
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        positions = torch.arange(x.shape[1]).unsqueeze(0).float() * 0.5
        return self.lin(x + positions)


class LinearThenInlineSilu(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        return h * torch.sigmoid(h)  # SiLU, written inline: no module's


# -- the stepper's default keeping: a program longer than its window of recent values (test_step.py) --


class LongResidualChain(nn.Module):
    """150 Linear+ReLU pairs, then a log that turns the negatives into NaN: a program longer
    than the window of recent values a stepper keeps by default."""

    def __init__(self, depth: int = 150):
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(3, 3), nn.ReLU()) for _ in range(depth))
        self.head = nn.Linear(3, 3)

    def forward(self, x):
        for block in self.blocks:
            x = block(x) + x
        return torch.log(self.head(x))


# -- the picker: calls of other shapes, replacements that fit one and not the other (test_widget.py) --


class GateCall(nn.Module):
    def forward(self, hidden_states, attention_mask):
        return hidden_states * attention_mask


class GatedOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.gate = GateCall()
        self.out = nn.Linear(4, 4)

    def forward(self, x, mask):
        return self.out(self.gate(x, mask))


class OneArgument(nn.Module):
    def forward(self, x):
        return x


class MaskedAlike(nn.Module):
    def forward(self, x, mask, *, scale=1.0):
        return x * mask * scale

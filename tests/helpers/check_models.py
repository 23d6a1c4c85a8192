"""Models of the checks: replacements that differ on purpose, state and caches a run writes,
outputs that cannot be compared, stacks to bisect, runs to overlay (used by
tests/test_compare.py, test_verify.py, test_bisect.py and test_overlay.py).

The replacements whose bug ``locate`` must name by its line stay in tests/test_compare.py:
that file and line are what those tests assert."""

from __future__ import annotations

import copy
import time

import torch
from torch import nn

# -- compare and locate: where a replacement first differs (tests/test_compare.py) -----------------


class ClampReLU(nn.Module):
    """ReLU written another way: equal everywhere."""

    def forward(self, x):
        return x.clamp(min=0)


class TimesFactor(nn.Module):
    def forward(self, x, factor):
        return x * factor


class Split(nn.Module):
    def forward(self, x):
        return x * 2, {"b": x + 1}


#   x ──▶ scaled(x, factor=2.5) ──▶ split ──▶ (a, {"b": b}) ──▶ a - b ──▶ out
#         (factor is a constant argument)   (two outputs, one inside a dict)
class TwoOutputs(nn.Module):
    def __init__(self):
        super().__init__()
        self.scaled = TimesFactor()
        self.split = Split()

    def forward(self, x):
        a, rest = self.split(self.scaled(x, factor=2.5))
        return a - rest["b"]


class Loose(nn.Module):
    """Split, but its dict output is off by 0.5."""

    def forward(self, x):
        return x * 2, {"b": x + 1.5}


class Dropping(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)
        self.d = nn.Dropout(0.5)
        self.o = nn.Linear(8, 8)

    def forward(self, x):
        return self.o(self.d(self.l(x)))


class DrawsFirst(nn.Module):
    """A faithful Linear that draws a random number it does not use: everything after it
    sees another random stream."""

    def __init__(self, linear: nn.Linear):
        super().__init__()
        self.linear = linear

    def forward(self, x):
        torch.rand(3)
        return self.linear(x)


class StaticKVCache(nn.Module):
    def __init__(self, row: int = 0):
        super().__init__()
        self.row = row
        self.register_buffer("k", torch.zeros(4, 8))

    def forward(self, x):
        self.k[self.row].copy_(x[0])
        return self.k  # a static KV cache: the output is the buffer the call wrote


class UsesCacheDoubled(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.cache = StaticKVCache()

    def forward(self, x):
        return self.cache(self.proj(x)) * 2


#   x ──▶ inp (Linear) ──▶ norm (LayerNorm, eps 0.01) ──▶ out (Linear) ──▶ y
class LayerNormed(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 8)
        self.norm = nn.LayerNorm(8, eps=1e-2)  # large enough for a misplaced eps to show
        self.out = nn.Linear(8, 8)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        return self.out(self.norm(self.inp(x)))


class Untraceable(nn.Module):
    """A norm whose forward branches on a value: torch.export cannot trace it."""

    def __init__(self, norm):
        super().__init__()
        self.norm = copy.deepcopy(norm)

    def forward(self, x):
        if x.sum() > 0:
            return self.norm(x) + 1
        return self.norm(x) - 1


class SwappedOutputs(nn.Module):
    def forward(self, x):
        return x + 1, {"b": x * 2}


class Counting(nn.Module):
    """Multiplies by how often it was called: its trace does not compute what it returned."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return x * self.calls


class UsesFirst(nn.Module):
    def __init__(self):
        super().__init__()
        self.split = Split()

    def forward(self, x):
        return self.split(x)[0]


class RaisesValueError(nn.Module):
    def forward(self, x):
        raise ValueError("no")


# -- verify: verdicts, tolerances and what cannot be compared (tests/test_verify.py) ---------------


class Returns(nn.Module):
    """Returns whatever ``make(x)`` builds: a way to get any output structure."""

    def __init__(self, make):
        super().__init__()
        self.make = make

    def forward(self, x):
        return self.make(x)


class WritesInput(nn.Module):
    def forward(self, x):
        x.mul_(10)
        return x


class Normalize(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.norm = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.norm(self.lin(x))


class Ema(nn.Module):
    """A forward that reassigns its buffer: ``self.ema`` is a new tensor after each call."""

    def __init__(self):
        super().__init__()
        self.register_buffer("ema", torch.zeros(3))

    def forward(self, x):
        self.ema = self.ema * 0.5 + x.mean(0)
        return x + self.ema


class Rebuilds(nn.Module):
    """A forward that adds a buffer, deletes one and puts a plain tensor over a third."""

    def __init__(self):
        super().__init__()
        self.register_buffer("scale", torch.ones(3))
        self.register_buffer("spare", torch.zeros(3), persistent=False)
        self.inner = Ema()

    def forward(self, x):
        self.register_buffer("seen", x.sum())
        del self.spare
        self.spare = x * 2  # now a plain attribute, not a buffer
        return self.inner(x) * self.scale


class Count(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("n", torch.zeros(()))

    def forward(self, x):
        self.n.add_(1)
        return self.n  # the buffer itself: 1.0 when returned


class UsesCache(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)
        self.cache = StaticKVCache()

    def forward(self, x):
        return self.cache(self.proj(x))


class Louder(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(8, 8)

    def forward(self, x):
        return self.l(x) * 100


class ReturnsValue(torch.nn.Module):
    def __init__(self, value):
        super().__init__()
        self.value = value

    def forward(self, x):
        return self.value


# -- bisect: which swap of a set breaks the output (tests/test_bisect.py) --------------------------

WIDTH = 8


class ResidualStack(nn.Module):
    """``n`` residual Linear layers in a row: a change anywhere reaches the output whole."""

    def __init__(self, n: int):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(WIDTH, WIDTH) for _ in range(n))

    def forward(self, x):
        for layer in self.layers:
            x = x + layer(torch.tanh(x))
        return x


class Shift(nn.Module):
    """x + shift: a module whose replacements are off by a known amount."""

    def __init__(self, shift: float = 0.0):
        super().__init__()
        self.shift = shift

    def forward(self, x):
        return x + self.shift


class Shifts(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.steps = nn.ModuleList(Shift() for _ in range(n))

    def forward(self, x):
        for step in self.steps:
            x = step(x)
        return x


class TwoDropouts(nn.Module):
    #   x -> a -> dropout -> b -> dropout -> c
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = (nn.Linear(WIDTH, WIDTH) for _ in range(3))
        self.drop1, self.drop2 = nn.Dropout(0.5), nn.Dropout(0.5)

    def forward(self, x):
        return self.c(self.drop2(self.b(self.drop1(self.a(x)))))


class LinearBatchNormLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.norm, self.b = (
            nn.Linear(WIDTH, WIDTH),
            nn.BatchNorm1d(WIDTH),
            nn.Linear(WIDTH, WIDTH),
        )

    def forward(self, x):
        return self.b(self.norm(self.a(x)))


class WrongEveryOtherCall(nn.Module):
    """An exact copy that is wrong on every other call (a replacement whose state changes)."""

    def __init__(self, original: nn.Module):
        super().__init__()
        self.inner = copy.deepcopy(original)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return self.inner(x) + (1.0 if self.calls % 2 else 0.0)


class Broken(nn.Module):
    def forward(self, x):
        raise RuntimeError("not implemented yet")


# -- overlay: the numbers of two runs side by side (tests/test_overlay.py) -------------------------


class DropoutAfterBatchNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(4, 4), nn.Dropout(0.5), nn.Linear(4, 4)
        self.norm = nn.BatchNorm1d(4)

    def forward(self, x):
        return self.b(self.drop(self.norm(self.a(x))))


class Slow(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        time.sleep(0.02)
        return self.inner(x)


class Fails(nn.Module):
    def forward(self, x):
        raise RuntimeError("boom")

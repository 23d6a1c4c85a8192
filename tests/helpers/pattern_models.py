"""Models of the patterns: activations written inline or as modules, chains and heads to find,
gated stacks to cut into regions (used by tests/test_find.py and test_region.py)."""

from __future__ import annotations

import math

import torch
from torch import nn

# -- find: patterns and the programs they are found in (tests/test_find.py) ------------------------


class Swish(nn.Module):
    def forward(self, x):
        return x * torch.sigmoid(x)


class LinearSwish(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.act = Swish()

    def forward(self, x):
        return self.act(self.lin(x))


class Blocks(nn.Module):
    #   x -> blocks[0] (lin, act: x * sigmoid(x)) -> blocks[1] -> blocks[2]
    def __init__(self, n: int = 3):
        super().__init__()
        self.blocks = nn.ModuleList(LinearSwish() for _ in range(n))

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return x


class TanhChain(nn.Module):
    def __init__(self, n: int):
        super().__init__()
        self.n = n

    def forward(self, x):
        for _ in range(self.n):
            x = torch.tanh(x)
        return x


def split_heads(x):
    batch, tokens, _ = x.shape
    return x.view(batch, tokens, -1, 8).transpose(1, 2)


class DoubledHeads(nn.Module):
    def forward(self, x):
        return split_heads(x) * 2


class ConvertThenScale(nn.Module):
    def forward(self, x):
        y = x.to(torch.float32)  # on a float32 x: x itself, and torch.export records y
        return y * 2 + y  # the add reads x, recorded as a read of the `to` node


class CastThenScale(nn.Module):
    def forward(self, x):
        return x.to(torch.float32) * 3  # torch.export checks x's dtype here, in this call


class SwishThenCast(nn.Module):
    def __init__(self):
        super().__init__()
        self.act, self.scale = Swish(), CastThenScale()

    def forward(self, x):
        return self.scale(self.act(x))


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x**3)))


class InlineGelu(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        return self.b(gelu_tanh(self.a(x)))


class OperandsEitherWayRound(nn.Module):
    def forward(self, x, y):
        a = torch.sigmoid(x) * x  # the pattern, with its operands the other way round
        b = x * torch.sigmoid(y)  # the pattern's input t would be x and y
        return a, b


class QuarterAndHalf(nn.Module):
    def forward(self, x):
        return x * 0.25 + 1, x * 0.5 + 1


class HeadsThenSwap(nn.Module):
    def forward(self, x):
        return split_heads(x).transpose(2, 3) * 2


class Scores(nn.Module):
    def forward(self, q, k):
        return attention_scores(q, k) * 3


class Views(nn.Module):
    def forward(self, x):
        return x.view(3, 3, -1), x.view(3, 2, -1)


class GateReadTwice(nn.Module):
    def forward(self, x):
        gate = torch.sigmoid(x)
        return x * gate + gate  # the pattern's sigmoid is read by the add too


class NotConvex(nn.Module):
    def forward(self, x):
        y = torch.sin(x)
        return y * (y + 1)  # b is y + 1: computed from the match, and read by it


class SwishTwoWays(nn.Module):
    def forward(self, x):
        return swish(x) * 0.5, x * torch.sigmoid(x + 1)


# -- region: regions between calls, and their replacements (tests/test_region.py) ------------------


def swish(t):
    return t * torch.sigmoid(t)


class Gated(nn.Module):
    """``lin``, then an inline gate (called through an attribute, so a reference can patch it)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.gate = swish

    def forward(self, x):
        return self.gate(self.lin(x)) + 1


class GatedStack(nn.Module):
    #   x -> blocks[0] (lin, gate) -> blocks[1] -> blocks[2] -> head
    def __init__(self, n: int = 3):
        super().__init__()
        self.blocks = nn.ModuleList(Gated() for _ in range(n))
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.head(x)


class ShiftedSiLU(nn.Module):
    def forward(self, h):
        return nn.functional.silu(h) * 0.5


class SharedWithGate(nn.Module):
    """One Linear called twice (calls ``sh`` and ``sh@1``) with a gate between the calls."""

    def __init__(self):
        super().__init__()
        self.sh = nn.Linear(4, 4)

    def forward(self, x):
        return self.sh(torch.tanh(self.sh(x)) * 2)


def attention_scores(q, k):
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)


class ScaleAndMask(nn.Module):
    def forward(self, scores, mask):
        return (scores / 4.0).masked_fill(mask, float("-inf"))


class TanhBetweenLinears(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)) * 2)

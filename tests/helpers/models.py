"""Small models the test modules share (drawn once here; each test module adds its own)."""

from __future__ import annotations

import torch
from torch import nn


#   x ──▶ first (Linear) ──▶ act (ReLU) ──▶ last (Linear) ──▶ out
class Chain(nn.Module):
    def __init__(self):
        super().__init__()
        self.first = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.last = nn.Linear(4, 4)

    def forward(self, x):
        return self.last(self.act(self.first(x)))


#   x ──▶ shared ──▶ mid ──▶ shared (again, "shared@1") ──▶ * scale ──▶ out
class Shared(nn.Module):
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.mid = nn.Tanh()

    def forward(self, x, *, scale=2.0):
        return self.shared(self.mid(self.shared(x))) * scale


class Scale(nn.Module):
    """x * factor: the simplest replacement that changes numbers."""

    def __init__(self, factor: float):
        super().__init__()
        self.factor = factor

    def forward(self, x):
        return x * self.factor


#   x ──▶ a (Linear) ──▶ relu ──▶ b (Linear) ──▶ out
class TwoLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))

"""Models of export and partition: calls and their arguments, containers, state, what an
export assumes of its inputs, weights that must come back untouched, Hugging Face parts
(used by tests/test_export.py, test_partition.py, test_guards.py, test_no_mutation.py and
test_hf.py).

``Block`` and ``Model`` here are the module tree's: their class names are what its tests
read (tests/helpers/view_models.py has the command line's, of other shapes)."""

from __future__ import annotations

import copy

import torch
from torch import nn

from helpers.models import TimesTwo

# -- export: what a program records of calls and arguments (tests/test_export.py) ------------------


class InnerWithScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, scale=None):
        y = self.lin(x)
        return y if scale is None else y * scale


class TwoStructures(nn.Module):
    #   x -> inner(x) -> inner(y, scale=2.0) -> out
    #   (one module called with two argument structures: torch cannot preserve it)
    def __init__(self):
        super().__init__()
        self.inner = InnerWithScale()
        self.tail = nn.Linear(4, 2)

    def forward(self, x):
        y = self.inner(x)
        return self.tail(self.inner(y, scale=2.0))


class Mode(nn.Module):
    def forward(self, x, mode="add"):
        return x + 1 if mode == "add" else x * 2


class UsesMode(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = Mode()

    def forward(self, x):
        return self.m(x, mode="mul")


class SizeOut(nn.Module):
    def forward(self, x):
        return x * 2, x.shape[0]


class UsesSize(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = SizeOut()

    def forward(self, x):
        y, n = self.m(x)
        return y * n


class NotExportable(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow
            return x
        return -x


class PlainRMSNorm(nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * self.weight


class GatedMLP(nn.Module):
    def __init__(self, hidden, inner):
        super().__init__()
        self.gate = nn.Linear(hidden, inner, bias=False)
        self.up = nn.Linear(hidden, inner, bias=False)
        self.down = nn.Linear(inner, hidden, bias=False)

    def forward(self, x):
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


class MetaDecoder(nn.Module):
    #   tokens -> embed -> layers x (norm -> mlp, residual) -> norm -> head
    def __init__(self, layers=2, hidden=1024, inner=4096, vocab=32000):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.norms = nn.ModuleList(PlainRMSNorm(hidden) for _ in range(layers))
        self.mlps = nn.ModuleList(GatedMLP(hidden, inner) for _ in range(layers))
        self.norm = PlainRMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for norm, mlp in zip(self.norms, self.mlps):
            x = x + mlp(norm(x))
        return self.head(self.norm(x))


class Plus(nn.Module):
    def forward(self, x):
        return x + 1


class PlusThenLinear(nn.Module):
    #   x -> a (x + 1) -> b (Linear)
    def __init__(self):
        super().__init__()
        self.a = Plus()
        self.b = nn.Linear(2, 2)

    def forward(self, x):
        return self.b(self.a(x))


# -- partition: the module tree, calls and state (tests/test_partition.py) -------------------------


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act = nn.ReLU()

    def forward(self, x):
        return self.act(self.lin(x))


class Model(nn.Module):
    #   x -> blocks[0] (lin, act) -> blocks[1] (lin, act) -> shared -> shared -> out
    #   blocks is a ModuleList (a container, never called itself)
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])
        self.shared = nn.Linear(4, 4)

    def forward(self, x):
        for block in self.blocks:
            x = block(x)
        return self.shared(self.shared(x))


class PassThrough(nn.Module):
    #   x -> ident (nn.Identity: no nodes) -> + 1
    def __init__(self):
        super().__init__()
        self.ident = nn.Identity()

    def forward(self, x):
        return self.ident(x) + 1


class Leaky(nn.Module):
    def forward(self, x):
        hidden = x * 2
        self.last_hidden = hidden  # read by the parent: a value that is not an output
        return hidden + 1


class ReadsLeak(nn.Module):
    #   x -> leaky -> y;  y + leaky.last_hidden   (a side output)
    def __init__(self):
        super().__init__()
        self.leaky = Leaky()

    def forward(self, x):
        y = self.leaky(x)
        return y + self.leaky.last_hidden


class RepeatedCallName(nn.Module):
    def __init__(self):
        super().__init__()
        self.blk = nn.Linear(4, 4)
        setattr(self, "blk@1", nn.Linear(4, 4))  # reads as the second call of blk

    def forward(self, x):
        return getattr(self, "blk@1")(self.blk(x))


class Branching(nn.Module):
    def __init__(self):
        super().__init__()
        self.inside = nn.Linear(4, 4)
        self.unused = nn.Linear(4, 4)

    def forward(self, x):
        return torch.cond(x.sum() > 0, lambda v: self.inside(v), lambda v: v * 2, (x,))


class Keywords(nn.Module):
    def __init__(self):
        super().__init__()
        self.d = nn.ModuleDict(
            {"in": nn.Linear(4, 4), "a'b": nn.Linear(4, 4), 'c"d\ne': nn.Linear(4, 4)}
        )

    def forward(self, x):
        return self.d['c"d\ne'](self.d["a'b"](self.d["in"](x)))


class InPlaceMeanCounter(nn.Module):
    """Adds its input's mean to a buffer in place, and reads it back."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        self.total.add_(x.mean(0))
        return self.lin(x) + self.total


class CountsTwice(nn.Module):
    #   x ──▶ counter (writes total) ──▶ counter again ("counter@1": reads what call 0 wrote)
    def __init__(self):
        super().__init__()
        self.counter = InPlaceMeanCounter()

    def forward(self, x):
        return self.counter(self.counter(x))


class SecondCallTo(nn.Module):
    """The eager meaning of swapping one call: the first goes to the original, the second to
    the replacement."""

    def __init__(self, original, replacement):
        super().__init__()
        self.original, self.replacement, self.calls = original, replacement, 0

    def forward(self, x):
        self.calls += 1
        return self.original(x) if self.calls == 1 else self.replacement(x)


class CalledTwice(nn.Module):
    #   x -> blk -> blk -> head
    def __init__(self):
        super().__init__()
        self.blk = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(self.blk(self.blk(x)))


class ReadsConvWeights(nn.Module):
    """Mamba's mixer: ``F.conv1d(x, self.conv1d.weight, ...)``, never calling ``conv1d``."""

    def __init__(self):
        super().__init__()
        self.conv1d = nn.Conv1d(4, 4, 3, groups=4, padding=2)
        self.out = nn.Linear(4, 4)

    def forward(self, x):
        conv = self.conv1d
        h = nn.functional.conv1d(x.transpose(1, 2), conv.weight, conv.bias, padding=2, groups=4)
        return self.out(h[..., : x.shape[1]].transpose(1, 2))


class HoldsMixer(nn.Module):
    def __init__(self):
        super().__init__()
        self.mixer = ReadsConvWeights()

    def forward(self, x):
        return self.mixer(x)


# -- guards: what an export assumes of its inputs (tests/test_guards.py) ---------------------------


class LinearTimesN(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x, n):
        return self.a(x) * n


class FromDict(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, d):
        return self.a(d["a"]) + d["b"]


class FromTuple(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, t):
        return self.a(t[0]) + t[1]


class Attend(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)
        self.fc = nn.Linear(8, 8)

    def forward(self, h):
        out, _ = self.attn(h, h, h, need_weights=False)
        return self.fc(out + h)


class ResidualLinear(nn.Module):
    def __init__(self):
        super().__init__()
        self.attn = nn.Linear(8, 8)

    def forward(self, x):
        return self.attn(x) + x


class OneTokenFewer(nn.Module):
    def forward(self, x):
        return x[:, :-1]


class OneArgument(nn.Module):
    def forward(self, x):
        return x


class NoInit(nn.Module):
    def __init__(self):  # forgets super().__init__()
        self.scale = 2

    def forward(self, q, k, v, need_weights=True):
        return q, None


class NoInitNoForward(nn.Module):
    def __init__(self):
        self.scale = 2


class RaisesTypeError(nn.Module):
    def forward(self, q, k, v, need_weights=True):
        raise TypeError("the replacement's own error")


# -- no mutation: weights and buffers that come back untouched (tests/test_no_mutation.py) ---------


class ConvBnFlattenNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(4 * 6 * 6, 5))

    def forward(self, x):
        return self.head(torch.relu(self.bn(self.conv(x))))


class Doubles(nn.Module):
    """A replacement that writes the parameter it is given, in place."""

    def forward(self, w):
        with torch.no_grad():
            return w.mul_(2)


class PassesItsWeight(nn.Module):
    #   w (a parameter) -> m -> * x;  w.t() -> n -> + (a view of the same weight)
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, 4))
        self.m, self.n = TimesTwo(), TimesTwo()

    def forward(self, x):
        return x @ self.m(self.w) + x @ self.n(self.w.t())


# -- Hugging Face: stand-ins and parts of the decoders (tests/test_hf.py) --------------------------


class FailsNamingACache(torch.nn.Module):
    """Fails to export with an error that names a cache class, as Hugging Face models do."""

    def __init__(self, config=None):
        super().__init__()
        if config is not None:
            self.config = config

    def forward(self, x):
        raise RuntimeError("got: StaticCache(layers=[])")


def rope(q, k, cos, sin, unsqueeze_dim=1):
    # the same arithmetic as apply_rotary_pos_emb, written another way
    cos, sin = cos.unsqueeze(unsqueeze_dim), sin.unsqueeze(unsqueeze_dim)

    def rotate(x):
        first, second = x.chunk(2, dim=-1)
        return torch.cat((-second, first), dim=-1)

    return q * cos + rotate(q) * sin, k * cos + rotate(k) * sin


def rope_scaled(q, k, cos, sin, unsqueeze_dim=1):
    # another function, so that a replace that is ignored cannot pass
    q_embed, k_embed = rope(q, k, cos, sin, unsqueeze_dim)
    return q_embed * 1.5, k_embed


class Rope(torch.nn.Module):
    def forward(self, q, k, cos, sin):
        return rope_scaled(q, k, cos, sin)


class SdpaT5Attention(nn.Module):
    """T5 attention on ``F.scaled_dot_product_attention`` (T5 does not scale q.k): right."""

    def __init__(self, original):
        super().__init__()
        self.inner = copy.deepcopy(original)
        self.heads, self.size = original.n_heads, original.key_value_proj_dim

    def forward(self, hidden_states, mask=None, key_value_states=None, position_bias=None, **kw):
        b, lq, _ = hidden_states.shape
        source = hidden_states if key_value_states is None else key_value_states

        def heads(t):
            return t.view(b, -1, self.heads, self.size).transpose(1, 2)

        q, k = heads(self.inner.q(hidden_states)), heads(self.inner.k(source))
        v = heads(self.inner.v(source))
        if position_bias is None:
            position_bias = self.inner.compute_bias(lq, k.shape[2], device=q.device)
        bias = position_bias
        if mask is not None:
            bias = (
                bias.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else bias + mask
            )
        out = nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1.0)
        out = self.inner.o(out.transpose(1, 2).reshape(b, lq, self.heads * self.size))
        return out, position_bias, None

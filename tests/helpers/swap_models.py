"""Models of swapping and fusing, and the replacements that go in them: argument and output
structures, modules called twice or in a loop, state written in place, nested inputs, a
Surgery's history (used by tests/test_swap.py, test_strict.py, test_surgery.py and
test_fuse.py)."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from helpers.models import Scale

# -- swap: replacements and the models they go in (tests/test_swap.py) -----------------------------


class Crossed(nn.Module):
    # builds b before a, returns (a, b): graph order and return order disagree
    def forward(self, x):
        b = x * 3
        a = x + 1
        return a, b


class UsesCrossed(nn.Module):
    #   x -> crossed -> (a, b) -> a - 2 * b
    def __init__(self):
        super().__init__()
        self.crossed = Crossed()

    def forward(self, x):
        a, b = self.crossed(x)
        return a - 2 * b


class CrossedReplacement(nn.Module):
    def forward(self, x):
        return x + 10, x * 30


class ThreeOutputs(nn.Module):
    def forward(self, x):
        return x.sin(), x.cos(), x.tanh()


class UsesLastOutput(nn.Module):
    #   x -> three -> (sin, cos, tanh) -> only tanh used
    def __init__(self):
        super().__init__()
        self.three = ThreeOutputs()

    def forward(self, x):
        _, _, last = self.three(x)
        return last + 1


class ThreeReplacement(nn.Module):
    def forward(self, x):
        return x, x * 2, x * 3


class ScaleFlipSlice(nn.Module):
    def forward(self, x, scale=1.0, flip=False, stop=None):
        y = x * scale
        y = -y if flip else y
        return y[:stop]


class CallsScaled(nn.Module):
    #   x -> scaled(x, scale=2.5, flip=True, stop=2)
    def __init__(self):
        super().__init__()
        self.scaled = ScaleFlipSlice()

    def forward(self, x):
        return self.scaled(x, scale=2.5, flip=True, stop=2)


class ScaledTwice(nn.Module):
    # uses every constant it is given: a None would crash, a wrong value would show
    def forward(self, x, scale=1.0, flip=False, stop=None):
        assert isinstance(scale, float) and isinstance(flip, bool) and isinstance(stop, int)
        y = x * scale * 2
        return (-y if flip else y)[:stop]


class PlusAndMinusOne(nn.Module):
    def forward(self, x):
        return x + 1, x - 1


class TakesTwo(nn.Module):
    def forward(self, p, q):
        return p * q


class TakesKeyword(nn.Module):
    def forward(self, x=None):
        return x * 2


class PairsAndKeywords(nn.Module):
    #   x -> foo -> (p, q) -> bar(p, q) -> r
    #   x -> one -> baz(x=one(x)) -> s;  return r + s
    def __init__(self):
        super().__init__()
        self.foo = PlusAndMinusOne()
        self.bar = TakesTwo()
        self.one = Scale(1.0)
        self.baz = TakesKeyword()

    def forward(self, x):
        p, q = self.foo(x)
        r = self.bar(p, q)
        s = self.baz(x=self.one(x))
        return r + s


class PairReplacement(nn.Module):
    def forward(self, x):
        return x * 2, x + 5


class TakesTwoReplacement(nn.Module):
    def forward(self, p, q):
        return p - q


class TakesKeywordReplacement(nn.Module):
    def forward(self, x=None):
        return x + 100


class ReturnsTuple(nn.Module):
    def forward(self, x):
        return (x + 1, x + 2)


class TakesTuple(nn.Module):
    def forward(self, pair):
        return pair[0] * pair[1]


class TupleChain(nn.Module):
    #   x -> make -> (a, b) -> use((a, b))
    def __init__(self):
        super().__init__()
        self.make = ReturnsTuple()
        self.use = TakesTuple()

    def forward(self, x):
        return self.use(self.make(x))


class TakesTupleReplacement(nn.Module):
    def forward(self, pair):
        return pair[0] + pair[1]


class LinearInside(nn.Module):
    #   x -> lin (Linear 4->4) -> relu
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x).relu()


class SharedTwice(nn.Module):
    #   x -> shared -> shared -> out   (one module, two calls: "shared", "shared@1")
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)

    def forward(self, x):
        return self.shared(torch.relu(self.shared(x)))


class LoopedSequential(nn.Module):
    #   x -> block -> block -> block   (a loop over one block)
    def __init__(self):
        super().__init__()
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def forward(self, x):
        for _ in range(3):
            x = self.block(x)
        return x


class NestedSequential(nn.Module):
    #   x -> outer(inner(x))
    def __init__(self):
        super().__init__()
        self.outer = nn.Sequential(nn.Linear(4, 4), nn.ReLU())

    def forward(self, x):
        return self.outer(x)


class AddsInPlace(nn.Module):
    def forward(self, x):
        x.add_(1)
        return x * 2


class MutatesInput(nn.Module):
    #   x -> inplace (writes x) -> y;  return y + x   (x seen after the write)
    def __init__(self):
        super().__init__()
        self.inplace = AddsInPlace()

    def forward(self, x):
        y = self.inplace(x)
        return y + x


class MultipliesInPlace(nn.Module):
    def forward(self, x):
        x.mul_(3)
        return x - 1


class CallCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(()))

    def forward(self, x):
        self.count.add_(1)
        return x + self.count


class UsesCounter(nn.Module):
    #   x -> counter (count += 1 in place) -> + 1
    def __init__(self):
        super().__init__()
        self.counter = CallCounter()

    def forward(self, x):
        return self.counter(x) + 1


class DoubleCounter(CallCounter):
    def forward(self, x):
        self.count.add_(2)
        return x + self.count


class ConvNet(nn.Module):
    #   x -> conv -> bn (train mode) -> relu -> pool -> flatten -> fc
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.act = nn.ReLU()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 5)

    def forward(self, x):
        return self.fc(self.pool(self.act(self.bn(self.conv(x)))).flatten(1))


class AttentionHolder(nn.Module):
    #   q, k, v -> mha(q, k, v, need_weights=True) -> (out, weights) -> out + weights.sum()
    def __init__(self):
        super().__init__()
        self.mha = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, q, k, v):
        out, weights = self.mha(q, k, v, need_weights=True)
        return out + weights.sum()


class WithIntInput(nn.Module):
    #   x, n -> body(x) * n   (n a dynamic int)
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)

    def forward(self, x, n: int):
        return self.body(x) * n


class Branchy(nn.Module):
    #   x -> cond(x.sum() > 0, true: branch_a, false: branch_b) -> head
    def __init__(self):
        super().__init__()
        self.branch_a = nn.Linear(4, 4)
        self.branch_b = nn.Linear(4, 4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        y = torch.cond(x.sum() > 0, lambda t: self.branch_a(t), lambda t: self.branch_b(t), (x,))
        return self.head(y)


class ResidualMLP(nn.Module):
    #   x -> a -> b -> + x
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.b = nn.Linear(4, 4)

    def forward(self, x):
        return self.b(torch.relu(self.a(x))) + x


@dataclasses.dataclass
class Batch:
    features: torch.Tensor
    bias: torch.Tensor


@dataclasses.dataclass
class Result:
    value: torch.Tensor
    aux: torch.Tensor


class DataclassModel(nn.Module):
    #   Batch(features, bias) -> body -> Result(value, aux);  also kwargs with defaults
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(4, 4)

    def forward(self, batch: Batch, extra: dict, scale: float = 1.0):
        value = self.body(batch.features) + batch.bias + extra["shift"]
        return Result(value=value * scale, aux=batch.features.sum())


class DictOut(nn.Module):
    #   x -> head -> {"logits": ..., "hidden": ...}
    def __init__(self):
        super().__init__()
        self.head = LogitsAndHidden()

    def forward(self, x):
        return self.head(x)


class LogitsAndHidden(nn.Module):
    def forward(self, x):
        return {"logits": x * 2, "hidden": x + 1}


class HeadsReplacement(nn.Module):
    def forward(self, x):
        return {"logits": x * 5, "hidden": x - 1}


class SequentialModel(nn.Module):
    #   x -> layers (Sequential of 3 Linear) -> out
    def __init__(self):
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))

    def forward(self, x):
        return self.layers(x)


class Tied(nn.Module):
    #   tokens -> embed -> head (weight tied to embed.weight)
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.embed(tokens))


class RecordsCaller(PairReplacement):
    """Remembers whether torch.fx.Interpreter was on the stack when it ran."""

    interpreted: bool | None = None

    def forward(self, x):
        import traceback

        frames = traceback.extract_stack()
        self.interpreted = any(f.filename.endswith("fx/interpreter.py") for f in frames)
        return super().forward(x)


class Encoder(nn.Module):
    def forward(self, batch):
        return batch["ids"] * 2 + batch["mask"]


class TakesDict(nn.Module):
    #   batch {"ids", "mask"} -> enc(batch) -> + 1
    def __init__(self):
        super().__init__()
        self.enc = Encoder()

    def forward(self, batch):
        return self.enc(batch) + 1


class EncoderReplacement(nn.Module):
    def forward(self, batch):
        return batch["ids"] - batch["mask"]


class ScalesBySize(nn.Module):
    def forward(self, x):
        return x * x.shape[0]


class SizeUser(nn.Module):
    #   x -> m (x * batch size, the size read outside m in strict mode) -> + 1
    def __init__(self):
        super().__init__()
        self.m = ScalesBySize()

    def forward(self, x):
        return self.m(x) + 1


class PassesOneThrough(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, y):
        return self.lin(x), y  # y comes back unchanged


class PassThroughUnread(nn.Module):
    #   x, y -> p -> (a, b);  head(a): nothing after the call reads b
    def __init__(self):
        super().__init__()
        self.p = PassesOneThrough()
        self.head = nn.Linear(4, 4)

    def forward(self, x, y):
        a, _ = self.p(x, y)
        return self.head(a)


class PassThroughRead(PassThroughUnread):
    #   ... head(a) + b: b, the passed-through output, is read after the call
    def forward(self, x, y):
        a, b = self.p(x, y)
        return self.head(a) + b


class MakesNewOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, y):
        return self.lin(x), y * 2


class Cast(nn.Module):
    def forward(self, x):
        return x.to(torch.float32)  # x is float32: returns x itself


class CastResidual(nn.Module):
    #   x -> cast -> lin;  x + lin(...)   (the residual reads x, not cast's result)
    def __init__(self):
        super().__init__()
        self.cast = Cast()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.lin(self.cast(x))


class Halve(nn.Module):
    def forward(self, x):
        return x.mul_(0.5)  # writes its input in place and returns it, as eager code may


class InPlaceBlock(nn.Module):
    #   x -> a -> h -> act (ReLU(inplace=True)) -> b;  b(...) + h   (h read again)
    def __init__(self, act=None):
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.act = act if act is not None else nn.ReLU(inplace=True)
        self.b = nn.Linear(8, 8)

    def forward(self, x):
        h = self.a(x)
        return self.b(self.act(h)) + h


class HfStyleRMSNorm(nn.Module):
    # as Hugging Face's LlamaRMSNorm: its first .to(float32) of a float32 input is the input
    def __init__(self, dim=8, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim) + 0.1 * torch.randn(dim))
        self.eps = eps

    def forward(self, h):
        dtype = h.dtype
        h = h.to(torch.float32)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(dtype)


class NormLayer(nn.Module):
    #   x -> norm -> mlp;  x + mlp(...)   (the residual reads the norm's internal .to)
    def __init__(self):
        super().__init__()
        self.norm = HfStyleRMSNorm()
        self.mlp = nn.Linear(8, 8)

    def forward(self, x):
        return x + self.mlp(self.norm(x))


class FusedRMSNorm(nn.Module):
    def __init__(self, norm):
        super().__init__()
        self.weight = nn.Parameter(norm.weight.detach().clone() * 2)
        self.eps = norm.eps

    def forward(self, h):
        return torch.nn.functional.rms_norm(h, (h.shape[-1],), self.weight, self.eps)


class ReturnsOwnParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(8))

    def forward(self, x):
        return self.w


class ScalesByParameter(nn.Module):
    def __init__(self):
        super().__init__()
        self.p = ReturnsOwnParameter()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x) * self.p(x)


class ConstantScale(nn.Module):
    def forward(self, x):
        return torch.full((8,), 3.0)


class ScaleAndFactor(nn.Module):
    def forward(self, x):
        return x * 2, 3


class UsesFactor(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = ScaleAndFactor()

    def forward(self, x):
        y, k = self.m(x)
        return y * k


class MaybeNone(nn.Module):
    def forward(self, x):
        return x * 2, None


class UsesNone(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = MaybeNone()

    def forward(self, x):
        h, n = self.m(x)
        return h if n is None else h + n


class KeyedOut(nn.Module):
    def forward(self, x):
        return {"a": x + 1, "b": x * 2}


class UsesKeyed(nn.Module):
    def __init__(self):
        super().__init__()
        self.d = KeyedOut()

    def forward(self, x):
        o = self.d(x)
        return o["a"] - o["b"]


class DictOtherOrder(nn.Module):
    def forward(self, x):
        return {"b": x * 3, "a": x - 1}


class BatchNormed(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.bn = nn.BatchNorm1d(8)
        self.out = nn.Linear(8, 8)

    def forward(self, x):
        return self.out(self.bn(self.lin(x)))


class HoldsScale(nn.Module):
    """x * s, with ``s`` a buffer (and ``inner.w`` a parameter of a submodule)."""

    def __init__(self, value: float, size: int = 4):
        super().__init__()
        self.register_buffer("s", torch.full((size,), value))
        self.inner = nn.Module()
        self.inner.w = nn.Parameter(torch.full((size,), value + 1))

    def forward(self, x):
        return x * self.s


class ReadsChild(nn.Module):
    #   x -> c -> + c.s (read by the parent) -> * c.inner.w (a grandchild's weight) -> out
    def __init__(self):
        super().__init__()
        self.c = HoldsScale(3.0)

    def forward(self, x):
        return (self.c(x) + self.c.s) * self.c.inner.w


class Counts(nn.Module):
    """Adds each batch's column sums into its buffer ``total`` (in place) and returns x * 2."""

    def __init__(self, step: float = 0.0):
        super().__init__()
        self.step = step
        self.register_buffer("total", torch.zeros(4))

    def forward(self, x):
        self.total.add_(x.sum(0) + self.step)
        return x * 2


class ReadsWrittenBuffer(nn.Module):
    #   x -> c (writes c.total in place) -> + c.total (read by the parent after the write) -> out
    def __init__(self):
        super().__init__()
        self.c = Counts()

    def forward(self, x):
        return self.c(x) + self.c.total


class NanOut(nn.Module):
    def forward(self, x):
        return x * 2, float("nan")


class UsesNan(nn.Module):
    def __init__(self):
        super().__init__()
        self.m = NanOut()

    def forward(self, x):
        y, _ = self.m(x)
        return y


class TiedEmbeddingHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        return self.head(self.emb(ids))


class Pair(nn.Module):
    def forward(self, x):
        return x + 1, None


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.pair = Pair()

    def forward(self, x):
        return self.pair(x)[0] * 2


class OnlyTensor(nn.Module):
    def forward(self, x):
        return x + 1


class Nested(nn.Module):
    def forward(self, t):
        return torch.nested.nested_tensor([t[0], t[1]])


# -- strict: one module called twice, loops, nested inputs (tests/test_strict.py) ------------------


class Parity(nn.Module):
    #   x -> a -> * 2 when the batch is even, - 100 when odd
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        y = self.a(x)
        if x.shape[0] % 2 == 0:
            return y * 2
        return y - 100


class Rows(nn.Module):
    #   x, k -> a(x)[:k]   (k a dynamic int; torch guards k != 1 and 4 * k >= 2)
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x, k: int):
        return self.a(x)[:k]


class NestedInputs(nn.Module):
    #   x, d={'a': ...}, lst=[., .], w= -> a(x) + sums, with a parity condition on each leaf
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x, d, lst, *, w):
        y = self.a(x) + d["a"].sum() + lst[1].sum() + w.sum()
        if d["a"].shape[0] % 3 == 0:
            y = y + 1
        if lst[1].shape[0] % 2 == 0:
            y = y * 2
        if w.shape[0] % 2 == 0:
            y = y - 1
        return y


class Varargs(nn.Module):
    #   x, *args -> a(x) + args[0].sum(), with a parity condition on args[0]
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x, *args):
        y = self.a(x) + args[0].sum()
        if args[0].shape[0] % 2 == 0:
            return y * 2
        return y


class LinearThenRelu(nn.Module):
    #   x -> lin -> relu
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return torch.relu(self.lin(x))


class Twice(nn.Module):
    #   x -> blk -> mid -> blk   (one module, two calls)
    def __init__(self):
        super().__init__()
        self.blk = nn.Linear(4, 4)
        self.mid = nn.Linear(4, 4)

    def forward(self, x):
        return self.blk(self.mid(self.blk(x)))


class Loop(nn.Module):
    #   x -> blk -> blk -> blk   (a loop over one block with a child)
    def __init__(self):
        super().__init__()
        self.blk = LinearThenRelu()

    def forward(self, x):
        for _ in range(3):
            x = self.blk(x)
        return x


class Containers(nn.Module):
    #   x -> layers.0 -> layers.1 -> seq(0, 1, relu) -> layers.0 -> seq.1
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([LinearThenRelu() for _ in range(2)])
        self.seq = nn.Sequential(nn.Linear(4, 4), LinearThenRelu(), nn.ReLU())

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        x = self.seq(x)
        x = self.layers[0](x)
        return self.seq[1](x)


NAMES = ("in", "x y", 'a"b', "e'f", "c\nd", "g\\h", "q]r", "u[v")


class Keys(nn.Module):
    #   x -> d[k] for each key (quotes, backslashes, newlines...) -> d['in'] -> d['a"b']
    def __init__(self):
        super().__init__()
        self.d = nn.ModuleDict({name: nn.Linear(4, 4) for name in NAMES})

    def forward(self, x):
        for name in NAMES:
            x = self.d[name](x)
        return self.d['a"b'](self.d["in"](x))


class Deep(nn.Module):
    #   x -> outer['p'][0] (a Loop) -> outer['p'][1] (a Twice) -> outer['p'][0]
    def __init__(self):
        super().__init__()
        self.outer = nn.ModuleDict({"p": nn.ModuleList([Loop(), Twice()])})

    def forward(self, x):
        x = self.outer["p"][0](x)
        x = self.outer["p"][1](x)
        return self.outer["p"][0](x)


class Spelled(nn.Module):
    #   one module reached by several spellings: layers[0], layers[-1], enumerate(layers),
    #   getattr(layers, '1'), d.items(), d['p']
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.d = nn.ModuleDict({"p": nn.Linear(4, 4), "q": nn.Linear(4, 4)})

    def forward(self, x):
        x = self.layers[0](x)
        x = self.layers[-1](x)
        for _, layer in enumerate(self.layers):
            x = layer(x)
        x = getattr(self.layers, "1")(x)
        x = self.layers[1](x)
        for _, module in self.d.items():
            x = module(x)
        return self.d["p"](x)


class _OnlyCall(nn.Module):
    """The eager reference of swapping one call: ``replacement`` at call ``index`` of the
    module, the module itself at every other (counted from the start of each forward)."""

    def __init__(self, original: nn.Module, replacement: nn.Module, index: int):
        super().__init__()
        self.original = original
        self.replacement = replacement
        self.index = index
        self.seen = 0

    def forward(self, *args, **kwargs):
        module = self.replacement if self.seen == self.index else self.original
        self.seen += 1
        return module(*args, **kwargs)


class Ambiguous(nn.Module):
    #   x -> blk -> 'blk@1' (a module registered under that name) -> blk
    def __init__(self):
        super().__init__()
        self.blk = nn.Linear(4, 4)
        self.add_module("blk@1", nn.Linear(4, 4))

    def forward(self, x):
        return self.blk(getattr(self, "blk@1")(self.blk(x)))


# -- surgery: a Surgery's swaps, exports and history (tests/test_surgery.py) -----------------------


class Net(nn.Module):
    #   x -> a (Linear) -> act (ReLU) -> b (Linear)
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.act = nn.ReLU()
        self.b = nn.Linear(4, 2)

    def forward(self, x):
        return self.b(self.act(self.a(x)))


class WithNorm(nn.Module):
    #   x -> lin -> bn -> relu -> block (Linear, BatchNorm)
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 6)
        self.bn = nn.BatchNorm1d(6)
        self.block = nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6, momentum=0.5))

    def forward(self, x):
        return self.block(torch.relu(self.bn(self.lin(x))))


class KeywordNames(nn.Module):
    #   x -> d["in"] -> d['a"b'] -> d["c\nd"] -> d["0"] -> head
    NAMES = ("in", 'a"b', "c\nd", "0")

    def __init__(self):
        super().__init__()
        self.d = nn.ModuleDict({name: nn.Linear(4, 4) for name in self.NAMES})
        self.head = nn.Linear(4, 4)

    def forward(self, x):
        for name in self.NAMES:
            x = self.d[name](x)
        return self.head(x)


class SharedAndLooped(nn.Module):
    #   x -> shared -> relu -> shared -> block -> block -> block   (repeated calls)
    def __init__(self):
        super().__init__()
        self.shared = nn.Linear(4, 4)
        self.block = nn.Sequential(nn.Linear(4, 4), nn.Tanh())

    def forward(self, x):
        x = self.shared(torch.relu(self.shared(x)))
        for _ in range(3):
            x = self.block(x)
        return x


class Fixed(nn.Module):
    # computes only at batch size 3: makes the dynamic batch size static
    def forward(self, x):
        return x.reshape(3, 4) * 2


class Borrows(nn.Module):
    # reads its owner's parameter through a reference that is not a submodule
    def __init__(self, owner):
        super().__init__()
        self.__dict__["owner"] = owner

    def forward(self, x):
        return x * self.owner.scale


class Lends(nn.Module):
    #   x -> borrows (x * self.scale) -> lin
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.randn(4))
        self.borrows = Borrows(self)
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(self.borrows(x))


class Cut(nn.Module):
    # reads a size its caller set on it: none of its arguments has it
    def __init__(self):
        super().__init__()
        self.n = None

    def forward(self, x):
        return x[:, : self.n] * 2


class SetsCut(nn.Module):
    #   x -> lin -> cut (keeps y.shape[1] + 1 columns) -> sum + y
    def __init__(self):
        super().__init__()
        self.cut = Cut()
        self.lin = nn.Linear(8, 8)

    def forward(self, x, y):
        self.cut.n = y.shape[1] + 1
        return self.cut(self.lin(x)).sum(-1, keepdim=True) + y


class MakesPair(nn.Module):
    def forward(self, x):
        return x + 1, x - 1


class UsesPair(nn.Module):
    #   x -> pair -> (p, q) -> p * q
    def __init__(self):
        super().__init__()
        self.pair = MakesPair()

    def forward(self, x):
        p, q = self.pair(x)
        return p * q


class CallsBlkTwice(nn.Module):
    #   x -> blk -> blk   (one module, two calls: blk, blk@1)
    def __init__(self):
        super().__init__()
        self.blk = nn.Linear(4, 4)

    def forward(self, x):
        return self.blk(self.blk(x))


class CastNorm(nn.Module):
    # as Llama's RMSNorm: its first .to(float32) of a float32 input is the input itself
    def __init__(self):
        super().__init__()
        self.weight = nn.Parameter(torch.rand(8) + 0.5)

    def forward(self, h):
        h = h.to(torch.float32)
        return self.weight * h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)


class NormResidual(nn.Module):
    #   x -> norm -> mlp;  x + mlp(...)   (the residual reads the norm's `to` node)
    def __init__(self):
        super().__init__()
        self.norm = CastNorm()
        self.mlp = nn.Linear(8, 8)
        self.act = nn.ReLU(inplace=True)

    def forward(self, x):
        h = x + self.mlp(self.norm(x))
        return self.act(h) + h


def silu(x):
    return x * torch.sigmoid(x)


def gelu(x):
    return torch.nn.functional.gelu(x)


class InlineAct(nn.Module):
    #   x -> lin -> act_fn(h) (written inline: a function, not a module) -> out
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.act_fn = silu
        self.out = nn.Linear(4, 4)

    def forward(self, x):
        return self.out(self.act_fn(self.lin(x)))


class TwoInline(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = InlineAct()
        self.b = InlineAct()

    def forward(self, x):
        return self.b(self.a(x) + x)


class Gelu(nn.Module):
    def forward(self, x):
        return gelu(x)


class OneLinearTwice(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(torch.relu(self.lin(x)))


class TakesNothing(nn.Module):
    def forward(self):
        return None


# -- fuse: patterns that fuse into one module (tests/test_fuse.py) ---------------------------------


class Reshaper(nn.Module):
    def forward(self, h):
        b, t, c = h.shape  # dynamic sizes: export reads them off the model's input x
        return h.reshape(b * t, c).reshape(b, t, c) * 2


class NormThenReshape(nn.Module):
    #   x ──▶ ln ──▶ r (reads its input's dynamic sizes) ──▶ out
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(4)
        self.r = Reshaper()

    def forward(self, x):
        return self.r(self.ln(x))


class SelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(8)
        self.attn = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        h = self.ln(x)
        return self.attn(h, h, h, need_weights=False)[0]

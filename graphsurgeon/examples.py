"""Small built-in models for the demo, the tutorials, the tests and the benchmarks.

``TinyGPT`` is a GPT-like decoder: token and position embeddings, ``n_layers`` blocks of
(LayerNorm, causal attention from Linear q/k/v/o and softmax-matmul, LayerNorm, MLP
Linear-GELU-Linear, residuals), a final LayerNorm and an output head.

Example:
    >>> import graphsurgeon as gs
    >>> from graphsurgeon.examples import TinyGPT
    >>> model = TinyGPT(n_layers=2)
    >>> tokens = model.example_input()
    >>> model(tokens).shape
    torch.Size([1, 16, 256])
"""

from __future__ import annotations

import math

import torch
from torch import nn

__all__ = ["MLP", "Attention", "Block", "FusedAttention", "GeluTanhMLP", "TinyGPT"]


class Attention(nn.Module):
    """Causal self-attention written out: q/k/v/o projections, softmax(q k^T / sqrt(d)) v."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.heads = heads
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, hidden)
        self.v = nn.Linear(hidden, hidden)
        self.o = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, hidden = x.shape
        head_dim = hidden // self.heads

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(batch, tokens, self.heads, head_dim).transpose(1, 2)

        q, k, v = split(self.q(x)), split(self.k(x)), split(self.v(x))
        scores = q @ k.transpose(-2, -1) / math.sqrt(head_dim)
        mask = torch.ones(tokens, tokens, dtype=torch.bool, device=x.device).triu(1)
        scores = scores.masked_fill(mask, float("-inf"))
        out = torch.softmax(scores, dim=-1) @ v
        return self.o(out.transpose(1, 2).reshape(batch, tokens, hidden))


class FusedAttention(nn.Module):
    """The same computation as :class:`Attention` through ``scaled_dot_product_attention``,
    reusing an existing Attention's weights: a typical eager replacement."""

    def __init__(self, original: Attention):
        super().__init__()
        self.heads = original.heads
        hidden = original.q.in_features
        self.qkv = nn.Linear(hidden, 3 * hidden)
        with torch.no_grad():
            self.qkv.weight.copy_(
                torch.cat([original.q.weight, original.k.weight, original.v.weight])
            )
            self.qkv.bias.copy_(torch.cat([original.q.bias, original.k.bias, original.v.bias]))
        self.o = nn.Linear(hidden, hidden)
        self.o.load_state_dict(original.o.state_dict())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, hidden = x.shape
        q, k, v = (
            self.qkv(x)
            .view(batch, tokens, 3, self.heads, hidden // self.heads)
            .permute(2, 0, 3, 1, 4)
        )
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o(out.transpose(1, 2).reshape(batch, tokens, hidden))


class MLP(nn.Module):
    """A transformer's feed-forward block: up-projection, GELU, down-projection."""

    def __init__(self, hidden: int):
        super().__init__()
        self.up = nn.Linear(hidden, 4 * hidden)
        self.act = nn.GELU()
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(self.act(self.up(x)))


class GeluTanhMLP(MLP):
    """An MLP replacement with the tanh approximation of GELU: close, but not equal."""

    def __init__(self, original: MLP):
        super().__init__(original.up.in_features)
        self.load_state_dict(original.state_dict())
        self.act = nn.GELU(approximate="tanh")


class Block(nn.Module):
    """One pre-norm transformer layer: attention and an MLP, each around a residual."""

    def __init__(self, hidden: int, heads: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)
        self.attn = Attention(hidden, heads)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = MLP(hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """A small decoder-only transformer (token and position embeddings, ``n_layers`` blocks,
    a final norm and a head): the model of the demo and the tutorials."""

    def __init__(
        self,
        n_layers: int = 4,
        hidden: int = 64,
        heads: int = 4,
        vocab: int = 256,
        max_tokens: int = 64,
    ):
        super().__init__()
        self.max_tokens = max_tokens
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_tokens, hidden)
        self.layers = nn.ModuleList(Block(hidden, heads) for _ in range(n_layers))
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.embed(tokens) + self.pos(positions)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.ln_f(x))

    def example_input(self, batch: int = 1, tokens: int = 16, seed: int = 0) -> torch.Tensor:
        """Random token ids of shape ``(batch, tokens)``, the same for the same ``seed``."""
        generator = torch.Generator().manual_seed(seed)
        return torch.randint(0, self.vocab, (batch, tokens), generator=generator)


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class GroupedQueryAttention(nn.Module):
    """Llama-style attention: grouped key/value heads, rotary position embedding, causal."""

    def __init__(self, hidden: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, heads * self.head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(heads * self.head_dim, hidden, bias=False)

    @staticmethod
    def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        first, second = x.chunk(2, dim=-1)
        return x * cos + torch.cat([-second, first], dim=-1) * sin

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q = self.q_proj(x).view(batch, tokens, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, tokens, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = self._rotate(q, cos, sin), self._rotate(k, cos, sin)
        repeat = self.heads // self.kv_heads
        k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        out = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(batch, tokens, -1))


class GatedMLP(nn.Module):
    def __init__(self, hidden: int, inner: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(nn.functional.silu(self.gate_proj(x)) * self.up_proj(x))


class LlamaLayer(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int, inner: int):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden)
        self.self_attn = GroupedQueryAttention(hidden, heads, kv_heads)
        self.post_attention_layernorm = RMSNorm(hidden)
        self.mlp = GatedMLP(hidden, inner)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class LlamaLike(nn.Module):
    """A Llama-3-shaped decoder. The defaults are Llama-3-70B's shapes (80 layers, hidden
    8192, 64 heads, 8 key/value heads, MLP 28672, vocabulary 128256): build it on the meta
    device to export the whole graph without allocating weights.

    Example:
        >>> import torch
        >>> with torch.device("meta"):
        ...     model = LlamaLike(n_layers=2, hidden=64, heads=4, kv_heads=2, inner=128, vocab=100)
        ...     tokens = torch.zeros(1, 8, dtype=torch.long)
        >>> model(tokens).shape
        torch.Size([1, 8, 100])
    """

    def __init__(
        self,
        n_layers: int = 80,
        hidden: int = 8192,
        heads: int = 64,
        kv_heads: int = 8,
        inner: int = 28672,
        vocab: int = 128256,
    ):
        super().__init__()
        self.head_dim = hidden // heads
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(
            LlamaLayer(hidden, heads, kv_heads, inner) for _ in range(n_layers)
        )
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device, dtype=torch.float32)
        inverse = 1.0 / (
            500000.0
            ** (torch.arange(0, self.head_dim, 2, device=tokens.device).float() / self.head_dim)
        )
        angles = torch.outer(positions, inverse)
        angles = torch.cat([angles, angles], dim=-1)
        cos, sin = angles.cos(), angles.sin()
        x = self.embed_tokens(tokens)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return self.lm_head(self.norm(x))

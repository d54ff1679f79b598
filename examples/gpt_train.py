"""A small character-level transformer trained on CPU, with no ThrottledJob code in it.

    python examples/gpt_train.py --iters 200
    throttledjob run --inject --cpu-peak 1 -- python examples/gpt_train.py

Causal self-attention blocks, AdamW, a fixed number of iterations on a synthetic corpus,
so wall times compare directly: a second shape of training loop beside torch_train.py's
MLP (attention and layer norms, smaller matrices, more operators per step).
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = nn.MultiheadAttention(width, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class Gpt(nn.Module):
    def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(layers))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)
        self.register_buffer("mask", torch.triu(torch.ones(context, context, dtype=torch.bool), 1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.tokens(idx) + self.positions(torch.arange(t))
        for block in self.blocks:
            x = block(x, self.mask[:t, :t])
        return self.head(self.norm(x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=300, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    args = parser.parse_args()

    torch.manual_seed(0)
    vocab = 65
    corpus = torch.randint(vocab, (200_000,))
    model = Gpt(vocab, args.context, args.width, args.layers, heads=4)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)

    started, loss = time.perf_counter(), torch.tensor(0.0)
    for _ in range(args.iters):
        starts = torch.randint(len(corpus) - args.context - 1, (args.batch,))
        x = torch.stack([corpus[s:s + args.context] for s in starts])
        y = torch.stack([corpus[s + 1:s + args.context + 1] for s in starts])
        loss = F.cross_entropy(model(x).view(-1, vocab), y.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    print(f"iters={args.iters} loss={loss.item():.4f} threads={torch.get_num_threads()} "
          f"seconds={time.perf_counter() - started:.2f}")


if __name__ == "__main__":
    main()

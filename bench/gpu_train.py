"""The GPU workload of bench/gpu_real.py: a small GPT trained on random tokens, no dataset.

    python bench/gpu_train.py --steps 1500 [--device cuda] [--out result.json]

Small-model training as it usually is on a large GPU: the Python side launching kernels
is the limit, so the GPU is about half busy. No ThrottledJob code: `throttledjob run
--inject` paces it at each optimizer step. `--duty D --pause-ms P [--sync]` hold it back
open-loop instead (pauses of P ms at step boundaries, a fraction D of the wall time,
after a device synchronize with --sync): what a pace point does to a real board.
The result (steps, seconds from the first step to the last) goes to `--out` as JSON.
"""

from __future__ import annotations

import argparse
import json
import time

import torch
from torch import nn
from torch.nn import functional as F


class Block(nn.Module):
    def __init__(self, width: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                 nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, w // self.heads) \
            .permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, t, w))
        return x + self.mlp(self.norm2(x))


class Gpt(nn.Module):
    def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.Sequential(*(Block(width, heads) for _ in range(layers)))
        self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.norm(self.blocks(self.tokens(idx) + self.positions(pos))))


class OpenLoopPause:
    """Hold the loop back a fraction `duty` of the wall time, in pauses of `pause` s."""

    def __init__(self, duty: float, pause: float, sync: bool) -> None:
        self.duty, self.pause, self.sync = duty, pause, sync
        self.ran_since = time.monotonic()

    def step(self) -> None:
        now = time.monotonic()
        owed = (now - self.ran_since) * self.duty / (1.0 - self.duty)
        if owed < self.pause:
            return
        if self.sync and torch.cuda.is_available():
            torch.cuda.synchronize()
        time.sleep(owed)
        self.ran_since = time.monotonic()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1500, help="optimizer steps")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--vocab", type=int, default=8192)
    parser.add_argument("--duty", type=float, default=0.0)
    parser.add_argument("--pause-ms", type=float, default=20.0)
    parser.add_argument("--sync", action="store_true")
    parser.add_argument("--out")
    args = parser.parse_args()

    torch.manual_seed(0)
    if args.device == "cpu":
        # The CPU stand-in (the suite's simulated board) feeds nothing: one thread, as a
        # GPU's feeder is; two OpenMP threads beside a busy core spun 20x slower.
        torch.set_num_threads(1)
    vocab = args.vocab
    model = Gpt(vocab, args.context, args.width, args.layers, heads=8).to(args.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    pacer = OpenLoopPause(args.duty, args.pause_ms / 1000, args.sync) if args.duty else None
    dtype = torch.bfloat16 if args.device.startswith("cuda") else torch.float32
    first = None
    for step in range(args.steps):
        x = torch.randint(vocab, (args.batch, args.context + 1), device=args.device)
        with torch.autocast(args.device.split(":")[0], dtype=dtype,
                            enabled=dtype is torch.bfloat16):
            logits = model(x[:, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, vocab), x[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step == 0:
            first = time.time()
        if pacer:
            pacer.step()
    final = loss.item()   # waits for the queue: the last step has run
    result = {"steps": args.steps, "first_step_time": first, "end_time": time.time(),
              "loss": round(final, 4), "device": args.device}
    result["seconds"] = round(result["end_time"] - first, 3)
    print(json.dumps(result))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()

"""A small CPU-only PyTorch training script, with no ThrottledJob code in it.

    python examples/torch_train.py --steps 300
    throttledjob run --inject --cpu-peak 1 -- python examples/torch_train.py

A fixed number of optimizer steps on synthetic data, so wall times compare directly.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--width", type=int, default=512)
    args = parser.parse_args()

    torch.manual_seed(0)
    x = torch.randn(args.batch * 16, 128)
    y = (x[:, :8].sum(dim=1, keepdim=True) > 0).float()
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch, shuffle=True)
    model = nn.Sequential(nn.Linear(128, args.width), nn.ReLU(),
                          nn.Linear(args.width, args.width), nn.ReLU(),
                          nn.Linear(args.width, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()

    started, steps, loss = time.perf_counter(), 0, torch.tensor(0.0)
    while steps < args.steps:
        for xb, yb in loader:
            optimizer.zero_grad()
            loss = loss_fn(model(xb), yb)
            loss.backward()
            optimizer.step()
            steps += 1
            if steps >= args.steps:
                break
    print(f"steps={steps} loss={loss.item():.4f} threads={torch.get_num_threads()} "
          f"seconds={time.perf_counter() - started:.2f}")


if __name__ == "__main__":
    main()

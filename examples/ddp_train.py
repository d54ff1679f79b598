"""A small CPU data-parallel PyTorch training script, with no ThrottledJob code in it.

    # two ranks on this machine
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=0 \\
        python examples/ddp_train.py --input-work 1=3 &
    MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 WORLD_SIZE=2 RANK=1 \\
        python examples/ddp_train.py --input-work 1=3
    # an Indexed Job's pods: RANK from JOB_COMPLETION_INDEX, MASTER_ADDR=<job>-0.<service>

`torch.distributed` with the gloo backend (env:// rendezvous: MASTER_ADDR, MASTER_PORT,
WORLD_SIZE, and RANK or else JOB_COMPLETION_INDEX) and DistributedDataParallel on an MLP,
on synthetic data. A fixed number of optimizer steps, so wall times compare directly;
every step ends in the gradients' allreduce, so the slowest rank sets the pace.
`--input-work RANK=FACTOR` gives a rank's input pipeline (a per-sample augmentation on
the CPU before the forward pass) FACTOR times the work: with the defaults, `1=3` makes
rank 1 cost about twice rank 0's CPU per step. Each rank prints one line at the end:
rank=R steps=N seconds=S cpu_per_step=C ... (C: the process's CPU seconds per step,
waiting in the allreduce included).
"""

from __future__ import annotations

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


def input_work(specs: list[str]) -> dict[int, float]:
    """`--input-work 1=3 --input-work 0=1,2=2` as {rank: factor}."""
    factors: dict[int, float] = {}
    for spec in specs:
        for item in filter(None, spec.split(",")):
            rank, _, factor = item.partition("=")
            factors[int(rank)] = float(factor)
    return factors


def augment(xb: torch.Tensor, rounds: int, gen: torch.Generator) -> torch.Tensor:
    """What a dataset's per-sample transform does on the CPU: jitter, random feature
    dropout, renormalisation, one sample at a time, `rounds` times over."""
    out = xb.clone()
    for _ in range(rounds):
        for i in range(out.shape[0]):
            sample = out[i] + 0.01 * torch.randn(out.shape[1], generator=gen)
            sample = sample * (torch.rand(out.shape[1], generator=gen) > 0.05)
            out[i] = (sample - sample.mean()) / (sample.std() + 1e-6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="optimizer steps")
    parser.add_argument("--batch", type=int, default=512, help="per rank")
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--augment-rounds", type=int, default=1,
                        help="rounds of the per-sample augmentation at factor 1")
    parser.add_argument("--input-work", action="append", default=[],
                        metavar="RANK=FACTOR", help="a rank's input work, times the "
                        "base (repeatable, or a comma list); 1 where not given")
    parser.add_argument("--timeout", type=float, default=300,
                        help="seconds to wait for the other ranks (and any collective)")
    args = parser.parse_args()

    rank = int(os.environ.get("RANK", os.environ.get("JOB_COMPLETION_INDEX", "0")))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    # One intra-op thread: the ranks share a 2-core node under limits below one core
    # each, where a second thread only adds contention (and torch would otherwise start
    # one per core it sees, not per core it may use).
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="env://", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.timeout))
    factor = input_work(args.input_work).get(rank, 1.0)
    rounds = max(0, round(args.augment_rounds * factor))

    torch.manual_seed(0)  # the same initial weights on every rank (DDP also broadcasts)
    gen = torch.Generator().manual_seed(1000 + rank)  # each rank its own shard
    x = torch.randn(args.batch * 16, 128, generator=gen)
    y = (x[:, :8].sum(dim=1, keepdim=True) > 0).float()
    model = DistributedDataParallel(nn.Sequential(
        nn.Linear(128, args.width), nn.ReLU(),
        nn.Linear(args.width, args.width), nn.ReLU(),
        nn.Linear(args.width, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    loss_fn = nn.BCEWithLogitsLoss()

    started, cpu_started = time.perf_counter(), time.process_time()
    loss = torch.tensor(0.0)
    for step in range(args.steps):
        at = (step * args.batch) % x.shape[0]
        xb = augment(x[at:at + args.batch], rounds, gen)
        optimizer.zero_grad()
        loss = loss_fn(model(xb), y[at:at + args.batch])
        loss.backward()  # DDP's allreduce of the gradients: every rank waits for all
        optimizer.step()
    seconds = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    print(f"rank={rank} steps={args.steps} seconds={seconds:.2f} "
          f"cpu_per_step={cpu / max(1, args.steps):.4f} world={world} "
          f"input_work={factor:g} loss={loss.item():.4f} threads={torch.get_num_threads()}",
          flush=True)
    # Every rank finishes every collective before any tears its pairs down; then leave
    # without the interpreter's finalization. torch's gloo worker threads drop their
    # last collective's state late, and a drop that lands after finalization has begun
    # takes the GIL and aborts a run that trained in full ("terminate called without an
    # active exception", 1 run in 15 to 40 here). The output is flushed above.
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)


if __name__ == "__main__":
    main()

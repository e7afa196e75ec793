"""A tiny DDP training loop for the Slurm examples (works with and without torchrun)."""

import argparse
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel


def main():
    """Train a linear model on random data and print per-epoch times."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    dist.init_process_group(backend="nccl")  # RCCL on ROCm
    rank, world = dist.get_rank(), dist.get_world_size()
    # ROCR_VISIBLE_DEVICES gives each task one GCD (runscript launch);
    # torchrun sets LOCAL_RANK for its workers.
    local = int(os.environ.get("LOCAL_RANK", 0)) % max(torch.cuda.device_count(), 1)
    torch.cuda.set_device(local)
    model = DistributedDataParallel(
        torch.nn.Linear(1024, 1024).cuda(), device_ids=[local]
    )
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    data = torch.randn(256, 1024, device="cuda")
    for epoch in range(args.epochs):
        t0 = time.time()
        for _ in range(100):
            opt.zero_grad()
            model(data).square().mean().backward()
            opt.step()
        torch.cuda.synchronize()
        if rank == 0:
            print(
                f"epoch {epoch}: {time.time() - t0:.2f} s on {world} GCDs", flush=True
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

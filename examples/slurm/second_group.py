"""torch.distributed across nodes with a second process group, under deadlines.

Two failures users hit on LUMI's AI Factory images
(lumi-ai-factory/laifs-container-recipes): #28, a multi-node NCCL (RCCL)
init that never completes, and #44, where the first collective on a group
made with ``new_group()`` blocks forever (13 of 17 runs on 4 nodes). This
script runs both steps with a timeout, so a hang ends as an error instead
of running until Slurm kills the job. One rank per GCD, started by the
image's runscript (it sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT):

    srun singularity exec "$SIF" conda-python-distributed second_group.py

Rank 0 prints one line per step and ``second_group: DONE`` at the end.
"""

import datetime
import os
import time

# NCCL errors and timeouts end the process instead of blocking (set before
# the process group starts its watchdog).
os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

TIMEOUT = datetime.timedelta(seconds=int(os.environ.get("PG_TIMEOUT_S", "180")))
GROUPS = int(os.environ.get("PG_GROUPS", "2"))


def device():
    """The GCD of this rank (the only one visible when the runscript set one per task)."""
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.device_count() == 1:
        local = 0
    return torch.device("cuda", local)


def say(rank, text):
    """One line of rank 0."""
    if rank == 0:
        print(f"second_group: {text}", flush=True)


def all_reduce(group, dev):
    """Sum ones over `group`; the sum must be the group's size."""
    ones = torch.ones(1024, device=dev)
    dist.all_reduce(ones, group=group)
    torch.cuda.synchronize(dev)
    if int(ones[0].item()) != dist.get_world_size(group):
        raise RuntimeError(f"all_reduce gave {ones[0].item()}, not the group size")


def main():
    """Init, then GROUPS new groups, each with its first all_reduce."""
    dev = device()
    torch.cuda.set_device(dev)
    start = time.monotonic()
    # device_id: NCCL initialises now (the step of laifs #28).
    dist.init_process_group("nccl", device_id=dev, timeout=TIMEOUT)
    rank = dist.get_rank()
    all_reduce(None, dev)
    say(rank, f"init and world all_reduce ok ({time.monotonic() - start:.1f} s)")
    for i in range(1, GROUPS + 1):
        start = time.monotonic()
        group = dist.new_group(timeout=TIMEOUT)
        all_reduce(group, dev)  # the first collective on it (laifs #44)
        say(rank, f"group {i}: all_reduce ok ({time.monotonic() - start:.1f} s)")
    dist.destroy_process_group()
    say(rank, "DONE")


if __name__ == "__main__":
    main()

"""OSU point-to-point bandwidth between two ranks, with mpi4py.

The algorithm of OSU's ``osu_bw`` (OSU Micro-Benchmarks, ``mpi/pt2pt``):
rank 0 sends a window of 64 non-blocking messages, rank 1 receives them and
answers with a 4-byte acknowledgement; bandwidth = bytes sent / time. Run
one rank on each of two nodes:

    srun -N 2 -n 2 singularity exec "$SIF" python osu_bw.py

Rank 0 prints the MPI library (``MPI.Get_library_version``) and one
``SIZE BANDWIDTH`` line (MB/s, 10^6 bytes) per message size, as osu_bw does.
"""

import sys
import time

from mpi4py import MPI
import numpy as np

WINDOW = 64
MAX_SIZE = 4 * 1024 * 1024
LARGE = 8192  # from this size on: fewer iterations, as osu_bw does


def bandwidth(comm, size):
    """MB/s for messages of `size` bytes (rank 0's view; 0 on rank 1)."""
    loops, skip = (20, 2) if size >= LARGE else (100, 10)
    buf = np.zeros(max(size, 1), dtype=np.uint8)[:size]
    ack = np.zeros(4, dtype=np.uint8)
    comm.Barrier()
    for i in range(loops + skip):
        if i == skip:
            comm.Barrier()
            t0 = time.perf_counter()
        if comm.rank == 0:
            MPI.Request.Waitall(
                [comm.Isend(buf, dest=1, tag=100) for _ in range(WINDOW)]
            )
            comm.Recv(ack, source=1, tag=101)
        else:
            MPI.Request.Waitall(
                [comm.Irecv(buf, source=0, tag=100) for _ in range(WINDOW)]
            )
            comm.Send(ack, dest=0, tag=101)
    elapsed = time.perf_counter() - t0
    return size / 1e6 * loops * WINDOW / elapsed if comm.rank == 0 else 0.0


def main():
    """Print osu_bw's table from rank 0; the exit status."""
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        if comm.rank == 0:
            print(
                f"osu_bw.py: needs exactly 2 ranks (got {comm.size})", file=sys.stderr
            )
        return 2
    if comm.rank == 0:
        print(f"# MPI library: {MPI.Get_library_version().splitlines()[0].strip()}")
        print(f"# nodes: {MPI.Get_processor_name()} -> ", end="")
    peer = comm.sendrecv(
        MPI.Get_processor_name(), dest=1 - comm.rank, source=1 - comm.rank
    )
    if comm.rank == 0:
        print(peer)
        print("# OSU MPI Bandwidth Test (osu_bw algorithm, mpi4py)")
        print(f"# {'Size':<10}{'Bandwidth (MB/s)':>20}")
    size = 1
    while size <= MAX_SIZE:
        mbs = bandwidth(comm, size)
        if comm.rank == 0:
            print(f"{size:<12}{mbs:>20.2f}", flush=True)
        size *= 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

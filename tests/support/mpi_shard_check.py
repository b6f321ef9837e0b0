"""Run under an MPI launcher: every rank loads its shard, rank 0 checks them all together.

    mpirun -np 4 python tests/support/mpi_shard_check.py --n 103 --batch-size 5 [--drop-last]

Each rank takes ``(rank, world_size)`` from ``netcl_loader.distributed.from_env()``
(not from MPI), iterates ``--epochs`` epochs with ``--workers`` worker
processes over a dataset whose samples are their own indices, and sends the
indices it saw to rank 0 (``comm.gather``). Rank 0 checks, per epoch, that
the shares have equal lengths, interleave (``share_r[j]`` at position
``j * world_size + r``) into the one global order that a single-process loader
draws for that seed and epoch, padded by wrap-around (or truncated with
``--drop-last``), so that together they cover the dataset and overlap only in
the padding; and that every rank's share changes between epochs. It prints
one verdict line, ``mpi_shard_check: PASS ...`` or ``mpi_shard_check: FAIL ...``,
and every rank exits 1 on failure.
"""
import argparse
import faulthandler
import sys

import numpy as np
from mpi4py import MPI  # initialises MPI first, as a training script would

from netcl_loader import ArrayDataset, DataLoader
from netcl_loader.distributed import from_env


def shard_indices(args, rank, world_size):
    """The indices this rank saw, one list per epoch, and len(loader)."""
    ds = ArrayDataset(np.arange(args.n, dtype=np.int64))
    with DataLoader(ds, batch_size=args.batch_size, shuffle=True, drop_last=args.drop_last,
                    num_workers=args.workers, seed=args.seed, rank=rank,
                    world_size=world_size) as loader:
        seen = [[int(i) for (b,) in loader for i in b] for _ in range(args.epochs)]
        return seen, len(loader)


def expected_global_order(args, epoch):
    """The order a single-process loader with the same seed draws in ``epoch``."""
    with DataLoader(ArrayDataset(np.arange(args.n, dtype=np.int64)), batch_size=args.n,
                    shuffle=True, num_workers=0, seed=args.seed) as loader:
        loader.set_epoch(epoch)
        (batch,) = [b.tolist() for (b,) in loader]
    return batch


def check(args, world_size, reports):
    """Problems found in the gathered shares (empty: all good)."""
    problems = []
    n, bs = args.n, args.batch_size
    per_rank = n // world_size if args.drop_last else -(-n // world_size)
    seen_per_rank = per_rank // bs * bs if args.drop_last else per_rank
    for rank, rep in enumerate(reports):
        if rep["rank"] != rank or rep["world_size"] != world_size:
            problems.append(f"from_env() on MPI rank {rank} gave ({rep['rank']}, {rep['world_size']})")
        if rep["mpi"] != (rank, world_size):
            problems.append(f"gather order: slot {rank} holds MPI rank {rep['mpi']}")
    lens = {rep["len"] for rep in reports}
    if len(lens) != 1:
        problems.append(f"len(loader) differs between ranks: {sorted(lens)}")
    for epoch in range(args.epochs):
        shares = [rep["seen"][epoch] for rep in reports]
        lengths = [len(s) for s in shares]
        if lengths != [seen_per_rank] * world_size:
            problems.append(f"epoch {epoch}: share lengths {lengths}, expected {seen_per_rank} each")
            continue
        interleaved = [None] * (seen_per_rank * world_size)
        for rank, share in enumerate(shares):
            interleaved[rank::world_size] = share
        order = expected_global_order(args, epoch)
        if sorted(order) != list(range(n)):
            problems.append(f"epoch {epoch}: the global order is not a permutation")
        total = per_rank * world_size
        padded = (order * (-(-total // n)))[:total] if n else []
        if interleaved != padded[:len(interleaved)]:
            problems.append(f"epoch {epoch}: shares do not interleave into the padded global order")
        union = set(interleaved)
        overlap = len(interleaved) - len(union)
        if args.drop_last:
            if overlap:
                problems.append(f"epoch {epoch}: {overlap} indices seen twice with drop_last")
            if len(union) != seen_per_rank * world_size:
                problems.append(f"epoch {epoch}: {len(union)} distinct indices, expected "
                                f"{seen_per_rank * world_size}")
        else:
            if union != set(range(n)):
                problems.append(f"epoch {epoch}: shares miss {sorted(set(range(n)) - union)[:10]}")
            if interleaved[n:] != interleaved[:total - n]:
                problems.append(f"epoch {epoch}: the overlap is not the wrap-around padding")
            if overlap != total - n:
                problems.append(f"epoch {epoch}: {overlap} duplicates, expected {total - n} (padding)")
    if args.epochs > 1:
        for rank, rep in enumerate(reports):
            if any(rep["seen"][e] == rep["seen"][0] for e in range(1, args.epochs)):
                problems.append(f"rank {rank}: its share did not change between epochs")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=103)
    parser.add_argument("--batch-size", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--drop-last", action="store_true")
    parser.add_argument("--hang-seconds", type=float, default=120.0,
                        help="dump every thread's stack and exit after this long")
    args = parser.parse_args()
    # A hang (in the loader or in MPI) shows where it is instead of only timing out.
    faulthandler.dump_traceback_later(args.hang_seconds, exit=True)

    comm = MPI.COMM_WORLD
    rank, world_size = from_env()
    try:
        seen, length = shard_indices(args, rank, world_size)
        report = {"rank": rank, "world_size": world_size, "len": length, "seen": seen,
                  "mpi": (comm.Get_rank(), comm.Get_size())}
    except Exception as exc:  # still take part in the gather, so rank 0 reports it
        report = {"error": f"{type(exc).__name__}: {exc}", "mpi": (comm.Get_rank(), comm.Get_size())}
    reports = comm.gather(report, root=0)
    ok = True
    if comm.Get_rank() == 0:
        errors = [f"rank {r['mpi'][0]}: {r['error']}" for r in reports if "error" in r]
        problems = errors or check(args, comm.Get_size(), reports)
        ok = not problems
        head = (f"mpi_shard_check: {'PASS' if ok else 'FAIL'} world_size={comm.Get_size()} "
                f"n={args.n} drop_last={args.drop_last} epochs={args.epochs}")
        print(head if ok else head + ": " + "; ".join(problems), flush=True)
    ok = comm.bcast(ok, root=0)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""from_env(): this process's (rank, world_size) from the launcher's environment."""
from __future__ import annotations

import os

__all__ = ["from_env"]

#: Launchers in the order they are tried: (name, rank variable, size variable).
LAUNCHERS = (
    ("torchrun", "RANK", "WORLD_SIZE"),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),
    ("MPICH / Intel MPI", "PMI_RANK", "PMI_SIZE"),
    ("Slurm", "SLURM_PROCID", "SLURM_NTASKS"),
)


def from_env(environ=None):
    """``(rank, world_size)`` set by torchrun, Open MPI, MPICH/Intel MPI or Slurm.

    Parameters
    ----------
    environ : mapping, optional
        The environment to read; ``os.environ`` by default.

    Returns
    -------
    tuple of int
        ``(rank, world_size)``, or ``(0, 1)`` when no launcher is found.

    Raises
    ------
    ValueError
        When a launcher's variables are present but not valid: not ints, only
        one of the pair, or a rank outside ``[0, world_size)``.

    Examples
    --------
    >>> rank, world_size = from_env()
    >>> loader = DataLoader(ds, batch_size=64, seed=0, rank=rank, world_size=world_size)
    """
    env = os.environ if environ is None else environ
    for name, rank_var, size_var in LAUNCHERS:
        has_rank, has_size = rank_var in env, size_var in env
        if not has_rank and not has_size:
            continue
        if has_rank != has_size:
            present, missing = (rank_var, size_var) if has_rank else (size_var, rank_var)
            raise ValueError(f"{name}: {present} is set but {missing} is not; set both or neither")
        try:
            rank, size = int(env[rank_var]), int(env[size_var])
        except ValueError:
            raise ValueError(f"{name}: {rank_var}={env[rank_var]!r} and {size_var}={env[size_var]!r} "
                             f"must be ints") from None
        if size < 1 or not 0 <= rank < size:
            raise ValueError(f"{name}: {rank_var}={rank} must be in [0, {size_var}={size})")
        return rank, size
    return 0, 1

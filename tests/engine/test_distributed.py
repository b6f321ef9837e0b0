"""Distributed sharding (rank, world_size) and from_env(), in-process and under a real MPI launcher."""
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from netcl_loader import ArrayDataset, DataLoader
from netcl_loader.distributed import LAUNCHERS, from_env

#: The support modules, mpi_shard_check.py among them.
SUPPORT = Path(__file__).resolve().parents[1] / "support"
#: Seconds the whole mpirun may take (4 ranks of 2 workers each on 2 cores).
MPIRUN_TIMEOUT_SECONDS = 120
ALL_VARS = [v for _, r, s in LAUNCHERS for v in (r, s)]


# -- from_env ------------------------------------------------------------------
@pytest.fixture
def clean_env(monkeypatch):
    """os.environ without any launcher's variables."""
    for var in ALL_VARS:
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


@pytest.mark.parametrize("rank_var,size_var", [
    ("RANK", "WORLD_SIZE"),                                # torchrun
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"),      # Open MPI
    ("PMI_RANK", "PMI_SIZE"),                              # MPICH, Intel MPI
    ("SLURM_PROCID", "SLURM_NTASKS"),                      # Slurm
])
def test_from_env_reads_each_launcher(clean_env, rank_var, size_var):
    assert from_env({rank_var: "2", size_var: "4"}) == (2, 4)
    assert from_env({rank_var: "0", size_var: "1"}) == (0, 1)
    clean_env.setenv(rank_var, "3")
    clean_env.setenv(size_var, "8")
    assert from_env() == (3, 8)


def test_from_env_without_a_launcher(clean_env):
    assert from_env() == (0, 1)
    assert from_env({}) == (0, 1)
    assert from_env({"PATH": "/bin", "LOCAL_RANK": "1"}) == (0, 1)


def test_from_env_reads_the_given_mapping_not_os_environ(clean_env):
    clean_env.setenv("RANK", "1")
    clean_env.setenv("WORLD_SIZE", "2")
    assert from_env({}) == (0, 1)
    assert from_env({"PMI_RANK": "5", "PMI_SIZE": "6"}) == (5, 6)


def test_from_env_prefers_the_innermost_launcher():
    # torchrun or mpirun inside a Slurm allocation: Slurm's variables describe
    # the allocation, the inner launcher's the processes actually started.
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2"}
    assert from_env({**slurm, "RANK": "5", "WORLD_SIZE": "8"}) == (5, 8)
    assert from_env({**slurm, "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"}) == (3, 4)
    assert from_env({**slurm, "PMI_RANK": "1", "PMI_SIZE": "3"}) == (1, 3)


@pytest.mark.parametrize("env,named", [
    ({"RANK": "x", "WORLD_SIZE": "4"}, ["RANK", "'x'", "WORLD_SIZE"]),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": ""}, ["OMPI_COMM_WORLD_SIZE", "''"]),
    ({"PMI_RANK": "1.5", "PMI_SIZE": "4"}, ["PMI_RANK", "'1.5'"]),
    ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4"}, ["SLURM_PROCID=4", "SLURM_NTASKS=4"]),
    ({"RANK": "-1", "WORLD_SIZE": "4"}, ["RANK=-1", "WORLD_SIZE=4"]),
    ({"PMI_RANK": "0", "PMI_SIZE": "0"}, ["PMI_RANK=0", "PMI_SIZE=0"]),
    ({"RANK": "1"}, ["RANK", "WORLD_SIZE"]),
    ({"OMPI_COMM_WORLD_SIZE": "4"}, ["OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"]),
])
def test_from_env_rejects_bad_values_naming_them(env, named):
    with pytest.raises(ValueError) as info:
        from_env(env)
    for part in named:
        assert part in str(info.value)


# -- sharding ----------------------------------------------------------------------
def indices_dataset(n):
    """Samples (index,): batches carry the indices they were made of."""
    return ArrayDataset(np.arange(n, dtype=np.int64))


def epoch_batches(loader):
    return [b[0].tolist() for b in loader]


def global_order(n, seed, epoch, shuffle=True):
    """The non-distributed order of one epoch: one batch of the whole dataset."""
    if n == 0:
        return []
    with DataLoader(indices_dataset(n), batch_size=n, shuffle=shuffle, num_workers=0, seed=seed) as dl:
        dl.set_epoch(epoch)
        (batch,) = epoch_batches(dl)
    return batch


def torch_rule(order, world_size, rank, drop_last):
    """PyTorch's DistributedSampler (no shuffle) applied to ``order``: padding, truncation, striding."""
    from torch.utils.data import DistributedSampler
    sampler = DistributedSampler(range(len(order)), num_replicas=world_size, rank=rank,
                                 shuffle=False, drop_last=drop_last)
    return [order[i] for i in sampler]


def chunk(indices, batch_size, drop_last):
    batches = [indices[i:i + batch_size] for i in range(0, len(indices), batch_size)]
    if drop_last and batches and len(batches[-1]) < batch_size:
        batches.pop()
    return batches


COMBOS = [  # n, world_size, batch_size, drop_last
    (10, 4, 2, False), (10, 4, 2, True), (10, 4, 3, False), (10, 4, 3, True),
    (13, 3, 4, False), (13, 3, 4, True), (16, 4, 4, False), (16, 4, 4, True),
    (7, 2, 1, False), (7, 5, 2, False),   # padding longer than half the dataset
    (2, 5, 1, False),                     # padding longer than the dataset: wraps twice
    (3, 4, 2, True),                      # drop_last leaves nothing
    (0, 3, 2, False), (1, 1, 2, False), (9, 1, 4, True),
]


@pytest.mark.parametrize("n,world_size,batch_size,drop_last", COMBOS)
def test_sharding_follows_distributed_sampler(n, world_size, batch_size, drop_last):
    pytest.importorskip("torch")
    import torch
    from torch.utils.data import DistributedSampler
    seed = 11
    shares = {}
    for shuffle in (True, False):
        for epoch in (0, 1):
            order = global_order(n, seed, epoch, shuffle)
            lengths = set()
            for rank in range(world_size):
                with DataLoader(indices_dataset(n), batch_size=batch_size, shuffle=shuffle,
                                drop_last=drop_last, num_workers=0, seed=seed, rank=rank,
                                world_size=world_size) as dl:
                    dl.set_epoch(epoch)
                    got = epoch_batches(dl)
                    assert len(dl) == len(got)
                expect = chunk(torch_rule(order, world_size, rank, drop_last), batch_size, drop_last)
                assert got == expect, (shuffle, epoch, rank)
                if not shuffle:  # orders match torch's own DataLoader exactly
                    sampler = DistributedSampler(range(n), num_replicas=world_size, rank=rank,
                                                 shuffle=False, drop_last=drop_last)
                    ref = torch.utils.data.DataLoader(range(n), batch_size=batch_size,
                                                      sampler=sampler, drop_last=drop_last)
                    assert got == [b.tolist() for b in ref]
                    assert len(dl) == len(ref)
                lengths.add(len(got))
                shares[shuffle, epoch, rank] = got
            assert len(lengths) == 1  # equal batch counts on every rank
    if n >= 10 and world_size > 1 and shares[True, 0, 0]:  # a new order each epoch
        assert any(shares[True, 0, r] != shares[True, 1, r] for r in range(world_size))


def test_len_per_rank():
    for n, ws, bs, dl in [(103, 4, 8, False), (103, 4, 8, True), (100, 4, 5, True), (5, 8, 1, False)]:
        per_rank = n // ws if dl else -(-n // ws)
        expect = per_rank // bs if dl else -(-per_rank // bs)
        for rank in range(ws):
            loader = DataLoader(indices_dataset(n), batch_size=bs, drop_last=dl, num_workers=0,
                                seed=0, rank=rank, world_size=ws)
            assert len(loader) == expect
            assert sum(len(b) for b in epoch_batches(loader)) == (expect * bs if dl else per_rank)


def test_world_size_one_is_the_plain_loader():
    plain = DataLoader(indices_dataset(11), batch_size=3, num_workers=0, seed=4)
    one = DataLoader(indices_dataset(11), batch_size=3, num_workers=0, seed=4, rank=0, world_size=1)
    assert epoch_batches(plain) == epoch_batches(one) and len(plain) == len(one)
    # world_size=1 needs no seed, and a sampler owns its order there.
    DataLoader(indices_dataset(11), num_workers=0, rank=0, world_size=1)
    DataLoader(indices_dataset(11), num_workers=0, rank=0, world_size=1, sampler=range(11))


def test_workers_give_the_same_shards():
    n, ws, bs = 29, 3, 4
    for rank in range(ws):
        kw = dict(batch_size=bs, seed=8, rank=rank, world_size=ws)
        with DataLoader(indices_dataset(n), num_workers=0, **kw) as a, \
                DataLoader(indices_dataset(n), num_workers=2, **kw) as b:
            assert [epoch_batches(a) for _ in range(2)] == [epoch_batches(b) for _ in range(2)]


def test_set_epoch_moves_every_rank_together():
    n, ws = 30, 3
    loaders = [DataLoader(indices_dataset(n), batch_size=4, num_workers=0, seed=2, rank=r,
                          world_size=ws) for r in range(ws)]
    for epoch in (5, 2, 5):
        seen = []
        for dl in loaders:
            dl.set_epoch(epoch)
            seen += [i for b in epoch_batches(dl) for i in b]
        assert sorted(seen) == list(range(n))
        order = global_order(n, 2, epoch)
        assert seen[:n // ws] == order[0::ws]


@pytest.mark.parametrize("kwargs,named", [
    (dict(rank=0), ["rank=0", "world_size=None"]),
    (dict(world_size=2), ["rank=None", "world_size=2"]),
    (dict(rank=4, world_size=4, seed=0), ["rank", "4", "world_size=4"]),
    (dict(rank=-1, world_size=4, seed=0), ["rank", "-1"]),
    (dict(rank=0, world_size=0, seed=0), ["world_size", "0"]),
    (dict(rank=1, world_size=2), ["seed", "world_size=2"]),
    (dict(rank=0, world_size=2, seed=0, sampler=range(10)), ["sampler"]),
    (dict(rank=0, world_size=2, seed=0, batch_sampler=[[0, 1]]), ["batch_sampler"]),
])
def test_distributed_argument_errors(kwargs, named):
    with pytest.raises(ValueError) as info:
        DataLoader(indices_dataset(10), num_workers=0, **kwargs)
    for part in named:
        assert part in str(info.value)


# -- under a real launcher ----------------------------------------------------
def _mpirun():
    """The mpirun command line, or a pytest.skip with the reason."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun is not installed (apt-get install openmpi-bin libopenmpi-dev)")
    try:
        import mpi4py  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"mpi4py is not installed ({exc}); pip install mpi4py")
    version = subprocess.run([mpirun, "--version"], capture_output=True, text=True, timeout=30)
    cmd = [mpirun, "-np", "4"]
    if "Open MPI" in version.stdout + version.stderr:
        # 4 ranks on fewer cores; Open MPI refuses root unless told.
        cmd += ["--oversubscribe", "--bind-to", "none"]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-run-as-root")
    return cmd


#: One machine: shared memory between ranks, the runtime's wire-up on loopback
#: only, and no cross-process memory attach (often refused in containers).
OPEN_MPI_LOCAL = {
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    "OMPI_MCA_btl": "self,vader",
    "OMPI_MCA_btl_vader_single_copy_mechanism": "none",
    "OMPI_MCA_oob_tcp_if_include": "lo",
}


@pytest.mark.slow
@pytest.mark.parametrize("drop_last", [False, True])
def test_shards_under_mpirun(drop_last):
    cmd = _mpirun() + [sys.executable, str(SUPPORT / "mpi_shard_check.py"), "--n", "103",
                       "--batch-size", "5", "--epochs", "2", "--workers", "2", "--seed", "7",
                       "--hang-seconds", str(MPIRUN_TIMEOUT_SECONDS // 2)]
    if drop_last:
        cmd.append("--drop-last")
    env = {k: v for k, v in os.environ.items() if k not in ALL_VARS}  # mpirun sets its own
    env.update(OPEN_MPI_LOCAL)
    # Its own session, so that a hung job can be ended with every rank in it.
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=MPIRUN_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        proc.terminate()  # mpirun passes SIGTERM on to the ranks
        try:
            stdout, stderr = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
        pytest.fail(f"mpirun did not finish in {MPIRUN_TIMEOUT_SECONDS} s; output:\n{stdout}\n{stderr}")
    out = stdout + stderr
    assert proc.returncode == 0, out
    verdict = [line for line in stdout.splitlines() if line.startswith("mpi_shard_check:")]
    assert verdict == [f"mpi_shard_check: PASS world_size=4 n=103 drop_last={drop_last} epochs=2"], out

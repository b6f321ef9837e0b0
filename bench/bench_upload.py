"""Main-thread cost and delivered bandwidth of Uploader.upload against a synchronous to_device.

Measures, for the ``big`` batch of peers.py (64 x 3 x 224 x 224 float32 + int64
labels) on one OpenCL device (PoCL's CPU device where there is no other):

(a) the main thread's time in ``Uploader.upload`` per batch: allocation from
    the pool and a non-blocking enqueue, nothing waited for;
(b) the main thread's time in a synchronous ``pyopencl.array.to_device`` per
    batch, into a fresh buffer (what a training loop written by hand does) and
    into a pooled one (the bare copy);
(c) device bytes/s delivered while each batch is read by a kernel (a running
    sum standing in for the training step): the uploads overlapped with the
    kernels, on the kernels' queue and on a queue of their own, against
    ``to_device`` followed by the kernel.

Host batches live in a few read-only "slots" reused round-robin, and a slot is
refilled only once the upload from it is ``ready()``, as the DataLoader does.
Every figure is the median over repetitions, after warm-up.

Then the whole loader (issue 4's figures), on peers.py's ``big`` scenario (a
dataset whose plain ``__getitem__`` returns a float32 (3, 224, 224) view of one
preloaded array of 2048 samples and an int label; batch 64; ``num_workers=2``,
``seed=0``), each variant one loader, one warm-up epoch, then ``--epochs``
measured ones:

(A) ``DataLoader`` with ``bind_queue(queue)``: the main thread's time inside
    ``next()`` per batch (nothing else is timed: not the step), and the bytes
    of the float32 device arrays delivered per wall second while a kernel on
    the same queue reads each batch (enqueued with ``wait_for=x.events``,
    ``queue.finish()`` at the end of each epoch);
(B) the same loader unbound (NumPy batches), each followed by a synchronous
    ``pyopencl.array.to_device(queue, x)`` (a fresh buffer, as a hand-written
    loop does): time in ``next()`` and in ``to_device`` apart, and bytes/s with
    the same kernel; "(B) pooled" is the same with ``to_device`` into a pooled
    buffer, the bare copy.

The step only enqueues its kernel, so the main thread runs ahead of the
device until the loader has no free ring slot: (A)'s ``next()`` then blocks
until the oldest upload completes, and when the device is the bottleneck that
wait is most of its time (in (B) the same wait sits in ``to_device``). "(A)
step waits" is (A) with a step that waits for its kernel, as a loop that reads
its loss back each step does (outside the timers): the loader's own cost.
The table gives medians over batches (ms) and over epochs (GB/s), and the
ratios of (B)'s main-thread time (``next()`` + copy) and GB/s to (A)'s; the
lines under it give the spread of ``next()``, the epoch-ending ``next()``
(which waits for the epoch's last uploads) and ``loader.stats`` over the
measured epochs.

Run: ``python bench/bench_upload.py`` (``--help`` for the options; ``--quick`` for a smoke run).
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import time

import numpy as np

try:
    import pyopencl as cl
    import pyopencl.array as cl_array
except ImportError as exc:  # pragma: no cover - depends on the machine
    sys.exit(f"bench_upload needs pyopencl: pip install 'netcl-loader[pocl]' ({exc})")

from netcl_loader import DataLoader
from netcl_loader.gpu_batch import Uploader
from peers import ViewDataset  # the benchmark scenarios' datasets live in the peers script

# The stand-in training step: one work-item per element (pyopencl's
# ElementwiseKernel, a strided loop, runs some 20x slower on PoCL).
_RUNNING_SUM_SRC = """
__kernel void running_sum(__global float *acc, __global const float *x)
{
    size_t i = get_global_id(0);
    acc[i] += x[i];
}
"""

# peers.py's "big".
BIG_SAMPLE_SHAPE = (3, 224, 224)
BIG_BATCH_SIZE = 64
BIG_SAMPLES = 2048
LOADER_WORKERS = 2
LOADER_SEED = 0
#: A next() call slower than this counts as a stall in the loader figures.
STALL_MS = 1.0


def pick_queue(platform_substring: str) -> cl.CommandQueue:
    """A queue on the first usable device of the first platform whose name contains the substring."""
    from netcl_loader import _opencl
    for platform, device in _opencl.usable_devices()[0]:
        if platform_substring.lower() in platform.name.lower():
            return cl.CommandQueue(cl.Context([device]))
    sys.exit(f"no OpenCL device on a platform matching --platform={platform_substring!r}")


def make_slots(n_slots: int, batch_size: int, seed: int = 0):
    """Host batches as read-only views into one buffer, like the ring's slots."""
    n_float = batch_size * int(np.prod(BIG_SAMPLE_SHAPE))
    slot_bytes = n_float * 4 + batch_size * 8
    ring = np.empty(n_slots * slot_bytes, np.uint8)
    rng = np.random.default_rng(seed)
    slots = []
    for k in range(n_slots):
        base = k * slot_bytes
        images = ring[base: base + n_float * 4].view(np.float32).reshape(
            (batch_size,) + BIG_SAMPLE_SHAPE)
        labels = ring[base + n_float * 4: base + slot_bytes].view(np.int64)
        images[...] = rng.random(images.shape, dtype=np.float32)
        labels[:] = rng.integers(0, 1000, batch_size)
        images.flags.writeable = False
        labels.flags.writeable = False
        slots.append((images, labels))
    return slots


def median_ms(samples):
    return statistics.median(samples) * 1e3


def bench_upload_enqueue(uploader, slots, reps, warmup):
    """(a): seconds per Uploader.upload call, each slot reused once its batch is ready."""
    in_flight = [None] * len(slots)
    times = []
    for i in range(warmup + reps):
        k = i % len(slots)
        if in_flight[k] is not None:
            in_flight[k].wait()  # outside the timer: the loader polls, it never waits here
            in_flight[k] = None
        t0 = time.perf_counter()
        in_flight[k] = uploader.upload(slots[k])
        t1 = time.perf_counter()
        if i >= warmup:
            times.append(t1 - t0)
    for out in in_flight:
        if out is not None:
            out.wait()
    return times


def bench_to_device(queue, slots, reps, warmup, allocator=None):
    """(b): seconds per synchronous to_device of the float field (labels are already NumPy)."""
    times = []
    for i in range(warmup + reps):
        images, _ = slots[i % len(slots)]
        t0 = time.perf_counter()
        dev = cl_array.to_device(queue, images, allocator=allocator)
        t1 = time.perf_counter()
        del dev
        if i >= warmup:
            times.append(t1 - t0)
    return times


def bench_overlap(mode, queue, slots, n_batches, reps, warmup, pool):
    """(c): bytes/s delivered, and seconds per batch the main thread spent in
    the upload or to_device call and blocked on a slot, per repetition.

    mode "upload": Uploader on the kernels' queue; "upload-copy-queue": on a
    queue of its own, the kernel waiting for the copy events; "to_device":
    synchronous copy, then the kernel.
    """
    ctx = queue.context
    step = cl.Kernel(cl.Program(ctx, _RUNNING_SUM_SRC).build(), "running_sum")
    acc = cl_array.zeros(queue, slots[0][0].shape, np.float32, allocator=pool)
    if mode == "upload-copy-queue":
        uploader = Uploader(cl.CommandQueue(ctx), allocator=pool)
    elif mode == "upload":
        uploader = Uploader(queue, allocator=pool)
    else:
        uploader = None
    nbytes = slots[0][0].nbytes
    rates, main_thread, slot_waits = [], [], []
    for r in range(warmup + reps):
        in_flight = [None] * len(slots)
        spent = blocked = 0.0
        queue.finish()
        t_start = time.perf_counter()
        for i in range(n_batches):
            k = i % len(slots)
            if uploader is not None:
                if in_flight[k] is not None and not in_flight[k].ready():
                    # The loader's deferral: a slot is refilled only once its
                    # copy is done. Sleep in wait() rather than spin on
                    # ready(): a spinning main thread takes a core from
                    # PoCL's threads (measured: 2.4x slower on 2 cores).
                    t0 = time.perf_counter()
                    in_flight[k].wait()
                    blocked += time.perf_counter() - t0
                t0 = time.perf_counter()
                out = uploader.upload(slots[k])
                in_flight[k] = out
                x = out[0] if out[0].queue is queue else out[0].with_queue(queue)
            else:
                t0 = time.perf_counter()
                x = cl_array.to_device(queue, slots[k][0], allocator=pool)
            spent += time.perf_counter() - t0
            step(queue, (x.size,), None, acc.base_data, x.base_data, wait_for=x.events)
        queue.finish()
        elapsed = time.perf_counter() - t_start
        if r >= warmup:
            rates.append(n_batches * nbytes / elapsed)
            main_thread.append(spent / n_batches)
            slot_waits.append(blocked / n_batches)
    return rates, main_thread, slot_waits


# --------------------------------------------------------------------------
# The whole loader: peers.py's "big", num_workers=2 (issue 4's figures)
# --------------------------------------------------------------------------

def make_big_dataset(n_samples=BIG_SAMPLES, seed=0, period=97):
    """The big scenario's dataset, every page touched; rows repeat with a short
    period (drawing 1.2 GB of random numbers would take seconds)."""
    rng = np.random.default_rng(seed)
    data = np.empty((n_samples,) + BIG_SAMPLE_SHAPE, np.float32)
    block = rng.random((min(period, n_samples),) + BIG_SAMPLE_SHAPE, dtype=np.float32)
    for start in range(0, n_samples, len(block)):
        stop = min(start + len(block), n_samples)
        data[start:stop] = block[:stop - start]
    return ViewDataset(data, rng.integers(0, 1000, n_samples))


def _stats_delta(after, before):
    return {k: after[k] - before[k] for k in
            ("batches", "epochs", "wait_seconds", "wall_seconds", "piped_batches",
             "uploads", "upload_fallbacks", "worker_restarts")}


def bench_loader(variant, loader, queue, step, acc, epochs, copy_pool=None, wait_step=False):
    """One loader variant: a warm-up epoch, then ``epochs`` measured ones.

    variant "A": ``loader`` is bound to ``queue``, batches arrive as device
    arrays. "B": ``loader`` yields NumPy batches, each copied with a
    synchronous ``to_device`` (into a fresh buffer, or one from ``copy_pool``).
    Every batch is then read by ``step`` on ``queue`` (the user's step, not
    timed); ``queue.finish()`` ends each epoch. With ``wait_step`` the step
    also waits for its kernel (as a loop reading its loss back each step
    does), still outside the timers.

    Returns per-batch seconds inside ``next()`` and inside ``to_device``, per
    epoch seconds of ``iter()`` and of the final ``next()`` that raises
    StopIteration (it waits for the epoch's last uploads), bytes/s of float32
    device arrays per epoch, batches that were not device arrays in (A), and
    the change of ``loader.stats`` over the measured epochs.
    """
    res = {"next": [], "copy": [], "iter": [], "stop": [], "rates": [], "not_device": 0,
           "batches_per_epoch": []}
    stats_before = None
    for e in range(1 + epochs):
        measured = e > 0
        if e == 1:
            stats_before = loader.stats.as_dict()
        queue.finish()
        nbytes = nbatches = 0
        next_s, copy_s = [], []
        t_start = time.perf_counter()
        it = iter(loader)
        t_iter = time.perf_counter() - t_start
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                t_stop = time.perf_counter() - t0
                break
            t1 = time.perf_counter()
            next_s.append(t1 - t0)
            x = batch[0]
            if variant == "B":
                t1 = time.perf_counter()
                x = cl_array.to_device(queue, x, allocator=copy_pool)
                copy_s.append(time.perf_counter() - t1)
            elif not isinstance(x, cl_array.Array):  # an upload fallback: NumPy batch
                res["not_device"] += 1
                x = cl_array.to_device(queue, x)
            ev = step(queue, (x.size,), None, acc.base_data, x.base_data, wait_for=x.events)
            if wait_step:
                ev.wait()
            nbytes += x.nbytes
            nbatches += 1
            del batch, x, ev
        queue.finish()
        elapsed = time.perf_counter() - t_start
        del it
        if measured:
            res["next"] += next_s
            res["copy"] += copy_s
            res["iter"].append(t_iter)
            res["stop"].append(t_stop)
            res["rates"].append(nbytes / elapsed)
            res["batches_per_epoch"].append(nbatches)
    res["stats"] = _stats_delta(loader.stats.as_dict(), stats_before)
    res["stats_line"] = loader.stats.summary()
    return res


def run_loader_variants(queue, epochs, pool):
    """(A), (A) with a step that waits for its kernel, (B) and (B) pooled: one
    loader each, run one after the other and closed."""
    dataset = make_big_dataset()
    step = cl.Kernel(cl.Program(queue.context, _RUNNING_SUM_SRC).build(), "running_sum")
    acc = cl_array.zeros(queue, (BIG_BATCH_SIZE,) + BIG_SAMPLE_SHAPE, np.float32,
                         allocator=pool)
    results = {}
    for name, bound, copy_pool, wait_step in [
            ("(A) bind_queue", True, None, False),
            ("(A) bind_queue, step waits", True, None, True),
            ("(B) NumPy + to_device", False, None, False),
            ("(B) pooled to_device", False, pool, False)]:
        loader = DataLoader(dataset, batch_size=BIG_BATCH_SIZE, shuffle=True,
                            num_workers=LOADER_WORKERS, seed=LOADER_SEED)
        try:
            if bound:
                loader.bind_queue(queue)
            results[name] = bench_loader("A" if bound else "B", loader, queue, step, acc,
                                         epochs, copy_pool=copy_pool, wait_step=wait_step)
        finally:
            loader.close()
            del loader
            gc.collect()
    queue.finish()
    return results


def summarise_loader(results):
    """Figures per variant, and the (B)/(A) ratios."""
    out = {}
    for name, r in results.items():
        next_ms = [t * 1e3 for t in r["next"]]
        copy_ms = [t * 1e3 for t in r["copy"]]
        per_batch = ([a + b for a, b in zip(next_ms, copy_ms)] if copy_ms else next_ms)
        out[name] = {
            "loader_ms": statistics.median(next_ms),
            "loader_p90_ms": float(np.percentile(next_ms, 90)),
            "loader_max_ms": max(next_ms),
            "loader_mean_ms": statistics.fmean(next_ms),
            "stalls_over_1ms": sum(t > STALL_MS for t in next_ms),
            "copy_ms": statistics.median(copy_ms) if copy_ms else None,
            "main_thread_ms": statistics.median(per_batch),
            "iter_ms": statistics.median(r["iter"]) * 1e3,
            "epoch_end_ms": statistics.median(r["stop"]) * 1e3,
            "GBps": statistics.median(r["rates"]) / 1e9,
            "batches": len(next_ms),
            "epochs": len(r["rates"]),
            "not_device_batches": r["not_device"],
            "stats": r["stats"],
            "stats_line": r["stats_line"],
        }
    a = out.get("(A) bind_queue")
    for name, fig in out.items():
        ref = a if a is not None and (name.startswith("(B)") or fig is a) else None
        fig["ratio_main_thread"] = fig["main_thread_ms"] / ref["main_thread_ms"] if ref else None
        fig["ratio_GBps"] = fig["GBps"] / ref["GBps"] if ref else None
    return out


def _f(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def loader_table(summary):
    """The markdown table of issue 4's figures."""
    lines = ["| variant | loader ms/batch (main thread, in next()) | sync copy ms/batch "
             "| main thread ms/batch, total | GB/s to the device "
             "| main thread (B)/(A) | GB/s (B)/(A) |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, f in summary.items():
        lines.append(f"| {name} | {_f(f['loader_ms'])} | {_f(f['copy_ms'])} "
                     f"| {_f(f['main_thread_ms'])} | {_f(f['GBps'], 2)} "
                     f"| {_f(f['ratio_main_thread'], 1)} | {_f(f['ratio_GBps'], 2)} |")
    return "\n".join(lines)


def loader_details(summary):
    lines = []
    for name, f in summary.items():
        st = f["stats"]
        lines.append(
            f"{name}: next() p90 {f['loader_p90_ms']:.3f} ms, max {f['loader_max_ms']:.1f} ms, "
            f"mean {f['loader_mean_ms']:.3f} ms, {f['stalls_over_1ms']}/{f['batches']} calls "
            f"over {STALL_MS:g} ms; iter() {f['iter_ms']:.3f} ms, epoch-ending next() "
            f"{f['epoch_end_ms']:.3f} ms (medians); measured epochs: {st['uploads']} uploads, "
            f"{st['upload_fallbacks']} fallbacks, {st['piped_batches']} piped, "
            f"{st['worker_restarts']} worker restarts, waited {st['wait_seconds']:.3f} s "
            f"of {st['wall_seconds']:.3f} s"
            + (f"; {f['not_device_batches']} batches were NumPy, not device arrays"
               if f["not_device_batches"] else ""))
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--batch-size", type=int, default=BIG_BATCH_SIZE,
                        help="samples per batch of the Uploader-only figures (default: "
                             "%(default)s, as big; the loader figures always use 64)")
    parser.add_argument("--slots", type=int, default=4,
                        help="host slots reused round-robin (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=None,
                        help="timed batches for (a) and (b) (default: 30, --quick: 10)")
    parser.add_argument("--overlap-batches", type=int, default=16,
                        help="batches per repetition of (c) (default: %(default)s)")
    parser.add_argument("--overlap-reps", type=int, default=None,
                        help="timed repetitions of (c) (default: 5, --quick: 2)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed batches or repetitions first (default: %(default)s)")
    parser.add_argument("--epochs", type=int, default=None,
                        help="measured epochs per loader variant, after one warm-up epoch "
                             "(default: 8, --quick: 2; 0 skips the loader figures)")
    parser.add_argument("--quick", action="store_true",
                        help="fewer repetitions and epochs: a smoke run, noisy figures")
    parser.add_argument("--platform", default="",
                        help="substring of the OpenCL platform name "
                             "(default: the first with a device)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of tables")
    args = parser.parse_args(argv)
    for name, full, quick in (("reps", 30, 10), ("overlap_reps", 5, 2), ("epochs", 8, 2)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    for name in ("batch_size", "slots", "reps", "overlap_batches", "overlap_reps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.epochs < 0:
        parser.error(f"--epochs must be >= 0, got {args.epochs}")

    queue = pick_queue(args.platform)
    device = queue.device
    slots = make_slots(args.slots, args.batch_size)
    batch_mb = (slots[0][0].nbytes + slots[0][1].nbytes) / 1e6

    uploader = Uploader(queue)
    enqueue = bench_upload_enqueue(uploader, slots, args.reps, args.warmup)
    pool = uploader.allocator
    sync_fresh = bench_to_device(queue, slots, args.reps, args.warmup)
    sync_pooled = bench_to_device(queue, slots, args.reps, args.warmup, allocator=pool)
    overlap = {
        mode: bench_overlap(mode, queue, slots, args.overlap_batches, args.overlap_reps,
                            args.warmup, pool)
        for mode in ("upload", "upload-copy-queue", "to_device")
    }
    loader_summary = None
    if args.epochs:
        loader_summary = summarise_loader(run_loader_variants(queue, args.epochs, pool))
    uploader.close()

    result = {
        "device": f"{device.name.strip()} ({device.platform.name.strip()})",
        "batch": f"{args.batch_size}x{'x'.join(map(str, BIG_SAMPLE_SHAPE))} float32 + int64 labels",
        "batch_MB": round(batch_mb, 2),
        "a_upload_enqueue_ms": round(median_ms(enqueue), 3),
        "b_to_device_fresh_ms": round(median_ms(sync_fresh), 3),
        "b_to_device_pooled_ms": round(median_ms(sync_pooled), 3),
        "c_GBps": {m: round(statistics.median(r) / 1e9, 3) for m, (r, _, _) in overlap.items()},
        "c_call_ms_per_batch": {m: round(median_ms(t), 3) for m, (_, t, _) in overlap.items()},
        "c_slot_wait_ms_per_batch": {m: round(median_ms(w), 3) for m, (_, _, w) in overlap.items()},
        "reps": {"a_b": args.reps, "c": f"{args.overlap_reps} x {args.overlap_batches} batches"},
        "loader": loader_summary,
        "loader_setup": (f"big ({BIG_SAMPLES} samples, batch {BIG_BATCH_SIZE}), "
                         f"num_workers={LOADER_WORKERS}, seed={LOADER_SEED}, "
                         f"{args.epochs} measured epochs after 1 warm-up epoch per variant"),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"device: {result['device']}")
    print(f"batch:  {result['batch']} ({batch_mb:.1f} MB); medians, {args.reps} batches "
          f"for (a)/(b), {args.overlap_reps} reps x {args.overlap_batches} batches for (c)")
    for label, key in [("(a) Uploader.upload, main thread", "a_upload_enqueue_ms"),
                       ("(b) to_device, fresh buffer", "b_to_device_fresh_ms"),
                       ("    to_device, pooled buffer", "b_to_device_pooled_ms")]:
        print(f"{label:<40}{result[key]:9.3f} ms/batch")
    for mode in overlap:
        print(f"(c) {mode:<18} + running-sum kernel: {result['c_GBps'][mode]:6.2f} GB/s delivered; "
              f"main thread {result['c_call_ms_per_batch'][mode]:7.3f} ms/batch in the call, "
              f"{result['c_slot_wait_ms_per_batch'][mode]:7.3f} blocked on a slot")
    if loader_summary:
        print()
        print(f"DataLoader: {result['loader_setup']}; medians over batches (ms) and epochs (GB/s)")
        print()
        print(loader_table(loader_summary))
        print()
        for line in loader_details(loader_summary):
            print(line)
        for name in ("(A) bind_queue", "(A) bind_queue, step waits"):
            ms = loader_summary[name]["loader_ms"]
            print(f"target, under 1 ms per batch in next(): {name}: "
                  f"{'met' if ms < 1.0 else 'NOT met'} ({ms:.3f} ms)")


if __name__ == "__main__":
    main()

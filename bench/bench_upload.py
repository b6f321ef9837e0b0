"""Main-thread cost and delivered bandwidth of Uploader.upload against a synchronous to_device.

Measures, for SPEC §9's ``big`` batch (64 x 3 x 224 x 224 float32 + int64
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

Run: ``python bench/bench_upload.py`` (``--help`` for the options).
"""
from __future__ import annotations

import argparse
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

from netcl_loader.gpu_batch import Uploader

# The stand-in training step: one work-item per element (pyopencl's
# ElementwiseKernel, a strided loop, runs some 20x slower on PoCL).
_RUNNING_SUM_SRC = """
__kernel void running_sum(__global float *acc, __global const float *x)
{
    size_t i = get_global_id(0);
    acc[i] += x[i];
}
"""

# SPEC §9 "big".
BIG_SAMPLE_SHAPE = (3, 224, 224)
BIG_BATCH_SIZE = 64


def pick_queue(platform_substring: str) -> cl.CommandQueue:
    """A queue on the first device of the first platform whose name contains the substring."""
    for platform in cl.get_platforms():
        if platform_substring.lower() not in platform.name.lower():
            continue
        devices = platform.get_devices()
        if devices:
            return cl.CommandQueue(cl.Context([devices[0]]))
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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--batch-size", type=int, default=BIG_BATCH_SIZE,
                        help="samples per batch (default: %(default)s, SPEC §9 big)")
    parser.add_argument("--slots", type=int, default=4,
                        help="host slots reused round-robin (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=30,
                        help="timed batches for (a) and (b) (default: %(default)s)")
    parser.add_argument("--overlap-batches", type=int, default=16,
                        help="batches per repetition of (c) (default: %(default)s)")
    parser.add_argument("--overlap-reps", type=int, default=5,
                        help="timed repetitions of (c) (default: %(default)s)")
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed batches or repetitions first (default: %(default)s)")
    parser.add_argument("--platform", default="",
                        help="substring of the OpenCL platform name "
                             "(default: the first with a device)")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    for name in ("batch_size", "slots", "reps", "overlap_batches", "overlap_reps"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")

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


if __name__ == "__main__":
    main()

"""Wake latency and timeout accuracy of the ring's waits, printed (run by
.ci/windows on Windows CPython under wine; runs anywhere the package does).

Timeouts: how far past its deadline a wait with nothing to wake it returns.
Wakes: from a publish to the return of a waiter asleep on the ring, for a
thread of this process and for a spawned process."""

import multiprocessing
import statistics
import threading
import time

from netcl_loader._ring import RingHeader, Segment

ROUNDS = 10
READY = 2


def ring():
    seg = Segment.create(RingHeader.header_bytes(2, 1, 4))
    return RingHeader(seg, 2, True, 1, 4)


def waiter(r, seen, ready, out):
    ready.set()
    r.wait_gen(seen, 60_000)
    out.send(time.perf_counter())


def ms(xs):
    return (f"median {statistics.median(xs) * 1e3:.2f} ms, "
            f"max {max(xs) * 1e3:.2f} ms over {len(xs)}")


def main():
    r = ring()
    for timeout_ms in (10, 50, 200):
        over = []
        for _ in range(ROUNDS if timeout_ms < 200 else 5):
            t0 = time.perf_counter()
            assert r.wait_gen(r.gen(), timeout_ms) == 1
            over.append(time.perf_counter() - t0 - timeout_ms / 1000)
        print(f"timeout {timeout_ms:3d} ms: returns after the deadline by {ms(over)}; "
              f"earliest {min(over) * 1e3:+.2f} ms")

    lat = []
    for _ in range(ROUNDS):
        seen, done = r.gen(), []
        ready = threading.Event()
        t = threading.Thread(target=lambda: (ready.set(), r.wait_gen(seen, 60_000),
                                             done.append(time.perf_counter())))
        t.start()
        ready.wait()
        time.sleep(0.05)
        t0 = time.perf_counter()
        r.publish(0, READY)
        t.join()
        lat.append(done[0] - t0)
    print(f"wake, thread:  {ms(lat)}")

    ctx = multiprocessing.get_context("spawn")
    lat = []
    for _ in range(3):
        seen = r.gen()
        recv, send = ctx.Pipe(duplex=False)
        ready = ctx.Event()
        p = ctx.Process(target=waiter, args=(r, seen, ready, send))
        p.start()
        send.close()
        ready.wait(120)
        time.sleep(0.3)
        t0 = time.perf_counter()
        r.publish(0, READY)
        lat.append(recv.recv() - t0)
        p.join()
    print(f"wake, process: {ms(lat)}")


if __name__ == "__main__":
    main()

"""One helper for every wait that sleeps in slices (liveness and timeouts are checked
between slices): the slice's length and the time left, in one place."""
from __future__ import annotations

import time

__all__ = ["Deadline", "WAIT_SLICE_MS"]

#: Longest sleep in one slice of a wait: a dead worker or a timeout is seen
#: within this long.
WAIT_SLICE_MS = 50


class Deadline:
    """``timeout`` seconds from now (None: never), sliced.

    Examples
    --------
    >>> d = Deadline(2.0)
    >>> while not ready(d.slice_ms()):   # a C wait of at most one slice
    ...     check_alive()
    ...     if d.expired():
    ...         raise TimeoutError(...)
    """

    __slots__ = ("timeout", "start", "end")

    def __init__(self, timeout):
        self.timeout = timeout
        self.start = time.monotonic()
        self.end = None if timeout is None else self.start + timeout

    def expired(self):
        """True once the timeout has passed (never without one)."""
        return self.end is not None and time.monotonic() >= self.end

    def slice_ms(self):
        """Milliseconds the next slice may sleep: at most WAIT_SLICE_MS, at least 1,
        and no further than the deadline."""
        if self.end is None:
            return WAIT_SLICE_MS
        left = self.end - time.monotonic()
        return max(1, min(WAIT_SLICE_MS, int(left * 1000) + 1))

    def slice_seconds(self):
        """:meth:`slice_ms` in seconds (for waits that take seconds)."""
        return self.slice_ms() / 1000.0

    def elapsed(self):
        return time.monotonic() - self.start

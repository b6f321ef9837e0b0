# cython: language_level=3
"""Compiled per-batch seeding: the batch's seed, and the global RNGs seeded, saved and
restored without going through their Python state objects.

Why in C: with ``worker_seeding="batch"`` every batch seeds ``random`` and
NumPy's global RNG, and with ``num_workers=0`` the caller's states are saved
before and restored after.  Through the public calls that is 130-200 µs per
batch (``np.random.get_state``/``set_state`` build and check a 624-word dict
each time); the states themselves are 2.5 KB of Mersenne Twister words.

The seeding here writes exactly what ``random.seed(n)`` and
``np.random.seed(n & 0xFFFFFFFF)`` write (the reference algorithms of both
libraries), and saving is a copy of those words.  Where the words live is
found once, at import, and verified against the public calls
(:func:`fast_rngs`); where that fails (another Python or NumPy build) the
loader falls back to the public calls, with the same results.
"""
from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_FromStringAndSize
from libc.stdint cimport uint32_t, uint64_t
from libc.string cimport memcpy

import ctypes
import random
import struct

import numpy as np

DEF MT_N = 624
DEF MT_M = 397

cdef uint64_t _GOLDEN = 0x9E3779B97F4A7C15ULL


cdef inline uint64_t _mix64(uint64_t x) noexcept nogil:
    # SplitMix64's finaliser.
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ULL
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBULL
    return x ^ (x >> 31)


def batch_seed(base_seed, epoch, batch_index, rank=None):
    """The 63-bit seed of batch ``batch_index`` of ``epoch`` (``worker_seeding="batch"``).

    Depends on nothing but its arguments (each taken modulo 2**64), so a
    batch's random transforms are the same for every ``num_workers`` and
    after a resume.
    """
    cdef uint64_t h = _mix64((<uint64_t>(base_seed & 0xFFFFFFFFFFFFFFFF)) ^ _GOLDEN)
    h = _mix64(h ^ ((<uint64_t>(epoch & 0xFFFFFFFFFFFFFFFF)) * _GOLDEN))
    h = _mix64(h ^ ((<uint64_t>(batch_index & 0xFFFFFFFFFFFFFFFF)) * _GOLDEN))
    if rank is not None:
        h = _mix64(h ^ ((<uint64_t>((rank + 1) & 0xFFFFFFFFFFFFFFFF)) * _GOLDEN))
    return h >> 1


cdef void _init_genrand(uint32_t *mt, uint32_t s) noexcept nogil:
    # The Mersenne Twister's reference seeding of one word (also NumPy's legacy seed).
    cdef int i
    mt[0] = s
    for i in range(1, MT_N):
        mt[i] = <uint32_t>(1812433253U * (mt[i - 1] ^ (mt[i - 1] >> 30)) + i)


cdef void _init_by_array(uint32_t *mt, const uint32_t *key, int n) noexcept nogil:
    # The reference seeding from an array of words (CPython's random.seed(int)).
    cdef int i = 1, j = 0, k
    _init_genrand(mt, 19650218U)
    k = MT_N if MT_N > n else n
    while k:
        mt[i] = <uint32_t>((mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1664525U)) + key[j] + j)
        i += 1
        j += 1
        if i >= MT_N:
            mt[0] = mt[MT_N - 1]
            i = 1
        if j >= n:
            j = 0
        k -= 1
    k = MT_N - 1
    while k:
        mt[i] = <uint32_t>((mt[i] ^ ((mt[i - 1] ^ (mt[i - 1] >> 30)) * 1566083941U)) - i)
        i += 1
        if i >= MT_N:
            mt[0] = mt[MT_N - 1]
            i = 1
        k -= 1
    mt[0] = 0x80000000U


#: Bytes of one Mersenne Twister state: 624 words and a position (an int).
DEF MT_BYTES = MT_N * 4 + 4


cdef class FastRngs:
    """The words of ``random``'s and NumPy's global Mersenne Twisters, at the
    addresses :func:`fast_rngs` found and verified."""

    cdef char *py_index     # CPython's RandomObject: int index, then uint32 state[624]
    cdef char *np_state     # NumPy's mt19937_state: uint32 key[624], then int pos
    cdef char *np_gauss     # RandomState's legacy cache: int has_gauss ... double gauss
    cdef Py_ssize_t gauss_gap  # bytes from has_gauss to gauss
    cdef object keep        # the objects whose memory this points into

    def seed(self, uint64_t seed):
        """``random.seed(seed)`` and ``np.random.seed(seed & 0xFFFFFFFF)`` (``seed`` < 2**64),
        less ``random``'s ``gauss_next``, which the caller resets."""
        cdef uint32_t key[2]
        cdef int n
        key[0] = <uint32_t>seed
        key[1] = <uint32_t>(seed >> 32)
        n = 2 if key[1] else 1
        _init_by_array(<uint32_t *>(self.py_index + 4), key, n)
        (<int *>self.py_index)[0] = MT_N
        _init_genrand(<uint32_t *>self.np_state, <uint32_t>seed)
        (<int *>(self.np_state + MT_N * 4))[0] = MT_N
        (<int *>self.np_gauss)[0] = 0
        (<double *>(self.np_gauss + self.gauss_gap))[0] = 0.0

    def save(self):
        """Both states (and NumPy's gauss cache) as bytes, for :meth:`restore`."""
        cdef bytes out = PyBytes_FromStringAndSize(NULL, 2 * MT_BYTES + 12)
        cdef char *p = PyBytes_AS_STRING(out)
        memcpy(p, self.py_index, MT_BYTES)
        memcpy(p + MT_BYTES, self.np_state, MT_BYTES)
        memcpy(p + 2 * MT_BYTES, self.np_gauss, 4)
        memcpy(p + 2 * MT_BYTES + 4, self.np_gauss + self.gauss_gap, 8)
        return out

    def restore(self, bytes saved):
        """Put back what :meth:`save` returned."""
        cdef const char *p = saved
        if len(saved) != 2 * MT_BYTES + 12:
            raise ValueError("not a saved RNG state")
        memcpy(self.py_index, p, MT_BYTES)
        memcpy(self.np_state, p + MT_BYTES, MT_BYTES)
        memcpy(self.np_gauss, p + 2 * MT_BYTES, 4)
        memcpy(self.np_gauss + self.gauss_gap, p + 2 * MT_BYTES + 4, 8)


def _object_bytes(obj):
    return ctypes.string_at(id(obj), type(obj).__basicsize__)


def _find(haystack, needle):
    at = haystack.find(needle)
    if at < 0 or haystack.find(needle, at + 1) >= 0:
        return -1  # absent, or not one place
    return at


def _probe():
    """A FastRngs on this process's global RNGs, or None where their words cannot
    be found and verified."""
    cdef FastRngs fast
    inst = random._inst
    rs = np.random.mtrand._rand
    if type(inst).__basicsize__ < MT_BYTES or not hasattr(rs, "_bit_generator"):
        return None
    bitgen = rs._bit_generator
    if type(bitgen).__name__ != "MT19937":
        return None
    py_saved, np_saved = random.getstate(), rs.get_state()
    try:
        # random: a distinctive state, then where its words lie in the object.
        words = tuple((0x9E3779B9 * (i + 7)) & 0xFFFFFFFF for i in range(MT_N))
        random.setstate((3, words + (MT_N,), None))
        off = _find(_object_bytes(inst), struct.pack(f"<{MT_N}I", *words))
        if off < 4:
            return None
        # NumPy: the state address is public; the gauss cache is found by value.
        gauss = 1.2345678901234567e-250
        rs.set_state(("MT19937", np.array(words, np.uint32), 17, 1, gauss))
        mem = _object_bytes(rs)
        g = _find(mem, struct.pack("<d", gauss))
        if g < 0:
            return None
        # has_gauss (an int set to 1) sits before the double, on its alignment.
        h = -1
        for gap in (8, 4, 16):
            if g - gap >= 0 and struct.unpack_from("<i", mem, g - gap)[0] == 1:
                h = g - gap
                break
        if h < 0:
            return None
        fast = FastRngs()
        fast.keep = (inst, rs, bitgen)
        fast.py_index = <char *><size_t>(id(inst) + off - 4)
        fast.np_state = <char *><size_t>bitgen.ctypes.state_address
        fast.np_gauss = <char *><size_t>(id(rs) + h)
        fast.gauss_gap = g - h
        if not _verify(fast, inst, rs):
            return None
        return fast
    finally:
        random.setstate(py_saved)
        rs.set_state(np_saved)


def _verify(FastRngs fast, inst, rs):
    """The compiled calls give what the public ones give, and round-trip."""
    for seed in (0, 1, 12345, 0xFFFFFFFF, 1 << 32, (1 << 63) - 1, 0xDEADBEEFCAFEF00D >> 1):
        random.seed(seed)
        np.random.seed(seed & 0xFFFFFFFF)
        want_py, want_np = random.getstate()[1], rs.get_state()
        random.seed(99)
        np.random.seed(99)
        np.random.standard_normal()  # a cached gauss, which seeding must clear
        fast.seed(seed)
        got_np = rs.get_state()
        if random.getstate()[1] != want_py or got_np[2:] != want_np[2:] \
                or not np.array_equal(got_np[1], want_np[1]):
            return False
        np.random.standard_normal()
        saved = fast.save()
        a = (random.random(), np.random.standard_normal(), np.random.random())
        random.seed(5)
        np.random.seed(5)
        fast.restore(saved)
        if (random.random(), np.random.standard_normal(), np.random.random()) != a:
            return False
    return True


_fast = None
_probed = False


def fast_rngs():
    """The verified :class:`FastRngs` of this process, or None (then use the public calls)."""
    global _fast, _probed
    if not _probed:
        _probed = True
        try:
            _fast = _probe()
        except Exception:
            _fast = None
    return _fast

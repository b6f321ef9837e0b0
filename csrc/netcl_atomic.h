/* netcl_atomic.h: 32-bit atomics that work across processes.
 *
 * Slot states live in shared memory and are changed by several processes, so
 * the atomics must be lock-free: a libatomic fallback would take a lock that is
 * private to each process and protect nothing.  The static assertion below
 * refuses to build where 32-bit atomics are not lock-free.
 */
#ifndef NETCL_ATOMIC_H
#define NETCL_ATOMIC_H

#include <stdint.h>

/* The MSVC branch is built by MSVC only, which nothing here runs.  It is kept
 * honest by .ci/windows, which compiles every C file and module a second time
 * with mingw-w64 and NETCL_ATOMIC_FORCE_MSVC defined (mingw-w64 ships the same
 * _Interlocked intrinsics in intrin.h), with -Wall -Werror.  What no compile
 * can check is said here: the intrinsics take `long`, which is 32 bits on
 * Windows (LLP64), and aligned 32-bit loads and stores are atomic on x86-64 and
 * ARM64. */
#if (defined(_MSC_VER) && !defined(__clang__)) || defined(NETCL_ATOMIC_FORCE_MSVC)
#include <intrin.h>
#include <windows.h>

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(long) == 4 && sizeof(uint32_t) == 4,
               "the _Interlocked intrinsics on uint32_t need a 32-bit long (LLP64)");
#endif

static inline uint32_t netcl_load_acquire(volatile uint32_t *p) {
    uint32_t v = *p;            /* aligned 32-bit loads are atomic on x86/ARM64 */
    _ReadWriteBarrier();
    MemoryBarrier();
    return v;
}
static inline void netcl_store_release(volatile uint32_t *p, uint32_t v) {
    MemoryBarrier();
    _ReadWriteBarrier();
    *p = v;
}
static inline uint32_t netcl_load_seq(volatile uint32_t *p) {
    return (uint32_t)_InterlockedCompareExchange((volatile long *)p, 0, 0);
}
static inline void netcl_store_seq(volatile uint32_t *p, uint32_t v) {
    _InterlockedExchange((volatile long *)p, (long)v);
}
static inline uint32_t netcl_fetch_add(volatile uint32_t *p, uint32_t v) {
    return (uint32_t)_InterlockedExchangeAdd((volatile long *)p, (long)v);
}
static inline int netcl_cas(volatile uint32_t *p, uint32_t expected, uint32_t desired) {
    return (uint32_t)_InterlockedCompareExchange((volatile long *)p, (long)desired,
                                                 (long)expected) == expected;
}

#else /* GCC, Clang */

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L && !defined(__STDC_NO_ATOMICS__)
#include <stdatomic.h>
_Static_assert(ATOMIC_INT_LOCK_FREE == 2,
               "netcl_loader needs lock-free 32-bit atomics to share slot states between processes");
#endif
_Static_assert(sizeof(uint32_t) == 4, "uint32_t must be 32 bits");

static inline uint32_t netcl_load_acquire(volatile uint32_t *p) {
    return __atomic_load_n(p, __ATOMIC_ACQUIRE);
}
static inline void netcl_store_release(volatile uint32_t *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_RELEASE);
}
static inline uint32_t netcl_load_seq(volatile uint32_t *p) {
    return __atomic_load_n(p, __ATOMIC_SEQ_CST);
}
static inline void netcl_store_seq(volatile uint32_t *p, uint32_t v) {
    __atomic_store_n(p, v, __ATOMIC_SEQ_CST);
}
static inline uint32_t netcl_fetch_add(volatile uint32_t *p, uint32_t v) {
    return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST);
}
static inline int netcl_cas(volatile uint32_t *p, uint32_t expected, uint32_t desired) {
    return __atomic_compare_exchange_n(p, &expected, desired, 0, __ATOMIC_ACQ_REL,
                                       __ATOMIC_ACQUIRE);
}
#endif

#endif /* NETCL_ATOMIC_H */

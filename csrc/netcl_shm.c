/* netcl_shm.c: see netcl_shm.h. */
#if defined(__linux__) && !defined(_GNU_SOURCE)
#define _GNU_SOURCE
#endif

#include "netcl_shm.h"
#include "netcl_atomic.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#if defined(_WIN32)
#include <windows.h>
#else
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#endif

#if defined(__linux__)
#include <linux/futex.h>
#include <sys/syscall.h>
#endif

#if defined(__APPLE__)
#include <stdlib.h>
#endif

size_t netcl_page_size(void) {
#if defined(_WIN32)
    SYSTEM_INFO si;
    GetSystemInfo(&si);
    return (size_t)si.dwPageSize;
#else
    long p = sysconf(_SC_PAGESIZE);
    return p > 0 ? (size_t)p : 4096;
#endif
}

#if defined(_WIN32)

/* Waits across processes.  WaitOnAddress wakes only threads of its own
 * process, and the ring's waits are between processes (the main process
 * sleeps on a publish by a worker, a worker on a push by the main process).
 * So a word in a region from netcl_shm_create sleeps on a named event instead,
 * and the region carries what the events' names need: its first page (before
 * the address the caller gets) is a wake block with a key unique to the
 * region and one epoch counter per bucket of wait words.
 *
 * The rule, for a word in bucket k:
 *   - a waker changes the word, then advances epoch[k] from e to e + 1 and
 *     sets the event named (key, k, e), if it exists (someone waits on it);
 *   - a waiter reads e = epoch[k], creates (or opens) the event (key, k, e),
 *     then sleeps on it only if epoch[k] is still e and the word is still the
 *     expected value.
 * No wake is lost: a waker that advanced epoch[k] from e before the waiter's
 * second look is seen there (the waiter starts over), and one that does it
 * after finds the waiter's event and sets it.  An event is set once and never
 * reset; each name is used for one epoch, and the event goes when its last
 * handle is closed.  Words of several buckets, or regions whose keys collide,
 * only wake each other for nothing: the waiter looks at its word again.
 *
 * Memory not from netcl_shm_create is private to this process, where
 * WaitOnAddress and WakeByAddressAll are enough.  Either side picks the same
 * way, from the address alone. */
#define NETCL_WAKE_MAGIC "netcl-wake-v1"
#define NETCL_WAKE_BUCKETS 256u

typedef struct {
    char magic[16];
    uint64_t key;
    uint32_t epoch[NETCL_WAKE_BUCKETS];
} netcl_wake_block_t;

static uint64_t netcl_wake_key(void) {
    static volatile uint32_t counter = 0;
    LARGE_INTEGER now;
    QueryPerformanceCounter(&now);
    /* The process id tells live processes apart; the counter, regions of
     * one process; the clock, a process from an earlier one of the same id. */
    return ((uint64_t)GetCurrentProcessId() << 32) ^ (uint64_t)now.QuadPart ^
           ((uint64_t)netcl_fetch_add(&counter, 1) << 48);
}

/* The wake block of the region holding addr, or NULL for other memory. */
static netcl_wake_block_t *netcl_wake_block_of(const volatile void *addr) {
    MEMORY_BASIC_INFORMATION mbi;
    if (VirtualQuery((const void *)addr, &mbi, sizeof mbi) == 0 || mbi.Type != MEM_MAPPED ||
        mbi.AllocationBase == NULL)
        return NULL;
    netcl_wake_block_t *b = (netcl_wake_block_t *)mbi.AllocationBase;
    if ((const char *)addr < (const char *)b + netcl_page_size()) return NULL;
    /* Another mapping's first page may be absent or unreadable. */
    if (VirtualQuery(b, &mbi, sizeof mbi) == 0 || mbi.State != MEM_COMMIT ||
        (mbi.Protect & (PAGE_READWRITE | PAGE_READONLY | PAGE_EXECUTE_READWRITE |
                        PAGE_EXECUTE_READ)) == 0 || (mbi.Protect & PAGE_GUARD))
        return NULL;
    if (memcmp(b->magic, NETCL_WAKE_MAGIC, sizeof NETCL_WAKE_MAGIC) != 0) return NULL;
    return b;
}

static uint32_t netcl_wake_bucket(const netcl_wake_block_t *b, const volatile void *addr) {
    uint32_t off = (uint32_t)(((const char *)addr - (const char *)b) >> 2);
    return (off * 2654435761u) >> 24; /* Fibonacci hashing onto 256 buckets */
}

static void netcl_wake_name(wchar_t *name, size_t n, const netcl_wake_block_t *b,
                            uint32_t bucket, uint32_t epoch) {
    _snwprintf(name, n, L"Local\\netcl-wake-%016llx-%u-%u", (unsigned long long)b->key,
               bucket, epoch);
    name[n - 1] = 0;
}

static void netcl_shm_reset(netcl_shm_t *shm) {
    shm->addr = NULL;
    shm->size = 0;
    shm->handle = -1;
}

/* Map the wake block and `size` bytes after it; the caller gets the latter. */
static int netcl_shm_map(netcl_shm_t *shm, HANDLE h, size_t size, char *err, size_t errlen) {
    size_t page = netcl_page_size();
    char *p = (char *)MapViewOfFile(h, FILE_MAP_ALL_ACCESS, 0, 0, page + size);
    if (p == NULL) {
        snprintf(err, errlen, "MapViewOfFile of %zu bytes failed (error %lu)", page + size,
                 (unsigned long)GetLastError());
        return ENOMEM;
    }
    shm->addr = p + page;
    shm->size = size;
    shm->handle = (intptr_t)h;
    return 0;
}

int netcl_shm_create(netcl_shm_t *shm, size_t size, char *err, size_t errlen) {
    netcl_shm_reset(shm);
    /* 0 bytes maps a page, as mmap of a page-sized object does on POSIX
     * (CreateFileMapping refuses a size of 0 for pagefile-backed memory). */
    if (size == 0) size = netcl_page_size();
    size_t page = netcl_page_size();
    if (size > (size_t)-1 - page) {
        snprintf(err, errlen, "%zu bytes of shared memory is more than the address space",
                 size);
        return ENOMEM;
    }
    /* SEC_COMMIT (the default) charges the whole size against the commit
     * limit now, so a shortage fails here. */
    unsigned long long total = (unsigned long long)page + size;
    HANDLE h = CreateFileMappingW(INVALID_HANDLE_VALUE, NULL, PAGE_READWRITE,
                                  (DWORD)(total >> 32), (DWORD)(total & 0xffffffffu), NULL);
    if (h == NULL) {
        snprintf(err, errlen, "CreateFileMapping of %llu bytes failed (error %lu)", total,
                 (unsigned long)GetLastError());
        return ENOMEM;
    }
    int rc = netcl_shm_map(shm, h, size, err, errlen);
    if (rc != 0) {
        CloseHandle(h);
        netcl_shm_reset(shm);
        return rc;
    }
    netcl_wake_block_t *b = (netcl_wake_block_t *)((char *)shm->addr - page);
    b->key = netcl_wake_key();
    memcpy(b->magic, NETCL_WAKE_MAGIC, sizeof NETCL_WAKE_MAGIC);
    return 0;
}

int netcl_shm_attach(netcl_shm_t *shm, intptr_t handle, size_t size, char *err, size_t errlen) {
    netcl_shm_reset(shm);
    if (size == 0) size = netcl_page_size();
    int rc = netcl_shm_map(shm, (HANDLE)handle, size, err, errlen);
    if (rc != 0) {
        netcl_shm_reset(shm);
        return rc;
    }
    const netcl_wake_block_t *b =
        (const netcl_wake_block_t *)((char *)shm->addr - netcl_page_size());
    if (memcmp(b->magic, NETCL_WAKE_MAGIC, sizeof NETCL_WAKE_MAGIC) != 0) {
        snprintf(err, errlen, "handle %lld is not shared memory made by netcl_loader",
                 (long long)handle);
        netcl_shm_unmap(shm);
        netcl_shm_reset(shm);
        return EINVAL;
    }
    return 0;
}

void netcl_shm_unmap(netcl_shm_t *shm) {
    if (shm->addr != NULL) UnmapViewOfFile((char *)shm->addr - netcl_page_size());
    shm->addr = NULL;
}

void netcl_shm_close_handle(intptr_t handle) {
    if (handle != -1 && handle != 0) CloseHandle((HANDLE)handle);
}

int netcl_wait_u32(volatile uint32_t *addr, uint32_t expected, int timeout_ms) {
    /* The deadline is kept on QueryPerformanceCounter's clock (monotonic), not
     * by counting sleeps: a sleep may end early (a wake of another word in the
     * bucket, a timer that rounds down) or late (the timer's tick, about
     * 15.6 ms by default), and only the clock tells how long is left.  So 1
     * (timeout) is never returned before timeout_ms has passed. */
    LARGE_INTEGER freq, start, now;
    QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&start);
    long long limit_ms = timeout_ms > 0 ? timeout_ms : 0;
    netcl_wake_block_t *b = netcl_wake_block_of(addr);
    for (;;) {
        if (netcl_load_seq(addr) != expected) return 0;
        QueryPerformanceCounter(&now);
        long long elapsed_ms = (now.QuadPart - start.QuadPart) * 1000 / freq.QuadPart;
        if (elapsed_ms >= limit_ms) return 1;
        DWORD left = (DWORD)(limit_ms - elapsed_ms); /* >= 1: never a busy loop */
        if (b == NULL) {
            uint32_t seen = expected;
            WaitOnAddress(addr, &seen, sizeof seen, left);
            continue;
        }
        uint32_t k = netcl_wake_bucket(b, addr);
        uint32_t e = netcl_load_seq(&b->epoch[k]);
        wchar_t name[64];
        netcl_wake_name(name, 64, b, k, e);
        HANDLE ev = CreateEventW(NULL, TRUE, FALSE, name);
        if (ev == NULL) {
            /* No event (out of handles): sleep on the clock, a bounded wait. */
            Sleep(left < 10 ? left : 10);
            continue;
        }
        if (netcl_load_seq(&b->epoch[k]) == e && netcl_load_seq(addr) == expected)
            WaitForSingleObject(ev, left);
        CloseHandle(ev);
    }
}

void netcl_wake_all(volatile uint32_t *addr) {
    netcl_wake_block_t *b = netcl_wake_block_of(addr);
    if (b == NULL) {
        WakeByAddressAll((void *)addr);
        return;
    }
    uint32_t k = netcl_wake_bucket(b, addr);
    uint32_t e = netcl_fetch_add(&b->epoch[k], 1);
    wchar_t name[64];
    netcl_wake_name(name, 64, b, k, e);
    HANDLE ev = OpenEventW(EVENT_MODIFY_STATE, FALSE, name);
    if (ev == NULL) return; /* nobody sleeps on that epoch */
    SetEvent(ev);
    CloseHandle(ev);
}

#else /* POSIX */

static int netcl_open_anonymous(size_t size, char *err, size_t errlen) {
    int fd = -1;
#if defined(__linux__) && defined(SYS_memfd_create)
    fd = (int)syscall(SYS_memfd_create, "netcl_loader", 1u /* MFD_CLOEXEC */);
    if (fd < 0) {
        snprintf(err, errlen, "memfd_create failed: %s", strerror(errno));
        return -errno;
    }
#else
    /* A unique name that lives only until the unlink below: other processes
     * receive the fd, never the name, so nothing is left in /dev/shm. */
    char name[64];
    for (int attempt = 0; attempt < 64 && fd < 0; attempt++) {
        snprintf(name, sizeof name, "/netcl_%ld_%lx", (long)getpid(),
                 (unsigned long)arc4random());
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0) {
        snprintf(err, errlen, "shm_open failed: %s", strerror(errno));
        return -errno;
    }
    shm_unlink(name);
#endif
    if (ftruncate(fd, (off_t)size) != 0) {
        int e = errno;
        snprintf(err, errlen, "ftruncate to %zu bytes failed: %s", size, strerror(e));
        close(fd);
        return -e;
    }
#if defined(__linux__)
    /* Reserve every page now: ftruncate alone leaves a sparse object whose
     * first write past the free space is a SIGBUS. */
    int rc = posix_fallocate(fd, 0, (off_t)size);
    if (rc != 0 && rc != EOPNOTSUPP && rc != ENOSYS && rc != EINVAL) {
        snprintf(err, errlen, "reserving %zu bytes failed: %s", size, strerror(rc));
        close(fd);
        return -rc;
    }
#endif
    return fd;
}

static int netcl_map(netcl_shm_t *shm, int fd, size_t size, int populate, char *err,
                     size_t errlen) {
    int flags = MAP_SHARED;
#if defined(MAP_POPULATE)
    if (populate) flags |= MAP_POPULATE;
#endif
    void *p = mmap(NULL, size, PROT_READ | PROT_WRITE, flags, fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        snprintf(err, errlen, "mmap of %zu bytes failed: %s", size, strerror(e));
        return e;
    }
    shm->addr = p;
    shm->size = size;
    shm->handle = fd;
    return 0;
}

int netcl_shm_create(netcl_shm_t *shm, size_t size, char *err, size_t errlen) {
    shm->addr = NULL;
    shm->size = 0;
    shm->handle = -1;
    if (size == 0) size = netcl_page_size();
    int fd = netcl_open_anonymous(size, err, errlen);
    if (fd < 0) return -fd;
    int rc = netcl_map(shm, fd, size, 1, err, errlen);
    if (rc != 0) {
        close(fd);
        return rc;
    }
    /* Touch every page once, here, so that the cost and any shortage come now
     * and not on the first batch. */
    size_t page = netcl_page_size();
    volatile char *c = (volatile char *)shm->addr;
    for (size_t off = 0; off < size; off += page) c[off] = 0;
    return 0;
}

int netcl_shm_attach(netcl_shm_t *shm, intptr_t handle, size_t size, char *err, size_t errlen) {
    shm->addr = NULL;
    shm->size = 0;
    shm->handle = -1;
    if (size == 0) size = netcl_page_size();
    struct stat st;
    if (fstat((int)handle, &st) != 0) {
        int e = errno;
        snprintf(err, errlen, "fstat of shared-memory fd %ld failed: %s", (long)handle,
                 strerror(e));
        return e;
    }
    if ((size_t)st.st_size < size) {
        snprintf(err, errlen, "shared-memory fd %ld holds %lld bytes, %zu expected",
                 (long)handle, (long long)st.st_size, size);
        return EINVAL;
    }
    return netcl_map(shm, (int)handle, size, 0, err, errlen);
}

void netcl_shm_unmap(netcl_shm_t *shm) {
    if (shm->addr != NULL) munmap(shm->addr, shm->size);
    shm->addr = NULL;
}

void netcl_shm_close_handle(intptr_t handle) {
    if (handle >= 0) close((int)handle);
}

int netcl_wait_u32(volatile uint32_t *addr, uint32_t expected, int timeout_ms) {
#if defined(__linux__) && defined(SYS_futex)
    /* A shared futex (no FUTEX_PRIVATE_FLAG): the waker is another process. */
    struct timespec ts;
    ts.tv_sec = timeout_ms / 1000;
    ts.tv_nsec = (long)(timeout_ms % 1000) * 1000000L;
    long rc = syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAIT, expected, &ts, NULL, 0);
    if (rc == -1 && errno == ETIMEDOUT) return 1;
    return 0;
#else
    /* Portable slow path: sleep in steps that grow from 50 us to 2 ms. */
    long step_us = 50, waited_us = 0, limit_us = (long)timeout_ms * 1000L;
    while (netcl_load_acquire(addr) == expected) {
        if (waited_us >= limit_us) return 1;
        struct timespec ts = {0, step_us * 1000L};
        nanosleep(&ts, NULL);
        waited_us += step_us;
        if (step_us < 2000) step_us *= 2;
    }
    return 0;
#endif
}

void netcl_wake_all(volatile uint32_t *addr) {
#if defined(__linux__) && defined(SYS_futex)
    syscall(SYS_futex, (uint32_t *)addr, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
#else
    (void)addr;
#endif
}

#endif

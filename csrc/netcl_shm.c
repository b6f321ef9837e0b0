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

int netcl_shm_create(netcl_shm_t *shm, size_t size, char *err, size_t errlen) {
    /* SEC_COMMIT (the default) charges the whole size against the commit
     * limit now, so a shortage fails here. */
    DWORD hi = (DWORD)(((unsigned long long)size) >> 32), lo = (DWORD)(size & 0xffffffffu);
    HANDLE h = CreateFileMappingW(INVALID_HANDLE_VALUE, NULL, PAGE_READWRITE, hi, lo, NULL);
    if (h == NULL) {
        snprintf(err, errlen, "CreateFileMapping of %zu bytes failed (error %lu)", size,
                 (unsigned long)GetLastError());
        return ENOMEM;
    }
    void *p = MapViewOfFile(h, FILE_MAP_ALL_ACCESS, 0, 0, size);
    if (p == NULL) {
        snprintf(err, errlen, "MapViewOfFile of %zu bytes failed (error %lu)", size,
                 (unsigned long)GetLastError());
        CloseHandle(h);
        return ENOMEM;
    }
    shm->addr = p;
    shm->size = size;
    shm->handle = (intptr_t)h;
    return 0;
}

int netcl_shm_attach(netcl_shm_t *shm, intptr_t handle, size_t size, char *err, size_t errlen) {
    void *p = MapViewOfFile((HANDLE)handle, FILE_MAP_ALL_ACCESS, 0, 0, size);
    if (p == NULL) {
        snprintf(err, errlen, "MapViewOfFile of %zu bytes failed (error %lu)", size,
                 (unsigned long)GetLastError());
        return ENOMEM;
    }
    shm->addr = p;
    shm->size = size;
    shm->handle = handle;
    return 0;
}

void netcl_shm_unmap(netcl_shm_t *shm) {
    if (shm->addr != NULL) UnmapViewOfFile(shm->addr);
    shm->addr = NULL;
}

void netcl_shm_close_handle(intptr_t handle) {
    if (handle != -1 && handle != 0) CloseHandle((HANDLE)handle);
}

int netcl_wait_u32(volatile uint32_t *addr, uint32_t expected, int timeout_ms) {
    /* WaitOnAddress only wakes threads of one process; sleep in short steps. */
    int waited = 0;
    while (netcl_load_acquire(addr) == expected) {
        if (waited >= timeout_ms) return 1;
        Sleep(1);
        waited += 1;
    }
    return 0;
}

void netcl_wake_all(volatile uint32_t *addr) { (void)addr; }

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

/* netcl_shm.h: unnamed shared memory, and waits on 32-bit words in it.
 *
 * Ownership: the process that calls netcl_shm_create owns the handle (fd or
 * HANDLE) and closes it with netcl_shm_close_handle; every process that maps
 * the region unmaps it with netcl_shm_unmap.  The memory has no name that can
 * outlive its processes (Linux: memfd; macOS: shm_open then shm_unlink at once;
 * Windows: a pagefile-backed mapping, one page longer than asked for, which
 * holds the region's wake block before the address the caller gets), so a
 * killed process leaks nothing.
 */
#ifndef NETCL_SHM_H
#define NETCL_SHM_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    void *addr;       /* start of the mapping, NULL when unmapped */
    size_t size;      /* bytes mapped */
    intptr_t handle;  /* fd (POSIX) or HANDLE (Windows); -1 when none */
} netcl_shm_t;

/* Create, reserve (every page allocated now, so that a shortage is an error
 * here and never a SIGBUS later) and map `size` bytes.  0 on success, else an
 * errno value with a message in err. */
int netcl_shm_create(netcl_shm_t *shm, size_t size, char *err, size_t errlen);

/* Map an existing region from a handle received from its creator. */
int netcl_shm_attach(netcl_shm_t *shm, intptr_t handle, size_t size, char *err,
                     size_t errlen);

void netcl_shm_unmap(netcl_shm_t *shm);
void netcl_shm_close_handle(intptr_t handle);
size_t netcl_page_size(void);

/* Sleep until *addr != expected, a wake, or timeout_ms.  Never spins: a
 * futex on Linux, named events on Windows (see netcl_shm.c), short sleeps
 * elsewhere.  Returns 0 when the word changed or (Linux) a wake came, 1 on
 * timeout, never before timeout_ms has passed on Windows, where the deadline
 * is kept on a monotonic clock.  A waker changes the word, then wakes.  Call
 * without the GIL. */
int netcl_wait_u32(volatile uint32_t *addr, uint32_t expected, int timeout_ms);

/* Wake every thread, in every process, waiting on addr.  Across processes
 * the word must lie in a region from netcl_shm_create (on Windows: other
 * memory wakes only this process's threads). */
void netcl_wake_all(volatile uint32_t *addr);

#endif /* NETCL_SHM_H */

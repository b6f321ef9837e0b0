/* netcl_collate.h: stack B samples into one output buffer.
 *
 * The caller checks shapes and dtypes and gathers the sample pointers while it
 * holds the GIL; this routine then runs without it: one memcpy per sample,
 * into a buffer that the caller owns (a fresh array, or a ring slot).
 */
#ifndef NETCL_COLLATE_H
#define NETCL_COLLATE_H

#include <stddef.h>
#include <string.h>

static inline void netcl_gather(char *dst, const char *const *srcs, size_t item_bytes,
                                size_t n) {
    for (size_t i = 0; i < n; i++) {
        memcpy(dst + i * item_bytes, srcs[i], item_bytes);
    }
}

#endif /* NETCL_COLLATE_H */

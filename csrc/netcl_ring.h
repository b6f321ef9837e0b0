/* netcl_ring.h: the layout of a ring's header region in shared memory.
 *
 * One header line, then one 64-byte line per slot, so that two processes
 * working on neighbouring slots never share a cache line.  The slot data live
 * in separate regions (one per slot) so that a slot can grow on its own.
 * The state word of a slot moves FREE -> ASSIGNED -> READY | PIPED | CANCELLED
 * -> FREE; it is published with a release store after every other field of
 * the slot is written, and read with an acquire load before any of them.
 */
#ifndef NETCL_RING_H
#define NETCL_RING_H

#include <stdint.h>

#define NETCL_RING_MAGIC 0x6e636c72u /* "nclr" */
#define NETCL_RING_VERSION 1u
#define NETCL_LINE 64

enum netcl_slot_state {
    NETCL_FREE = 0,      /* owned by the consumer side, holds nothing */
    NETCL_ASSIGNED = 1,  /* given to a producer, being filled */
    NETCL_READY = 2,     /* the batch is in the slot's data region */
    NETCL_PIPED = 3,     /* the batch (or an error) comes through the producer's pipe */
    NETCL_CANCELLED = 4  /* the producer skipped a stale task: nothing to read */
};

typedef struct {
    uint32_t magic;
    uint32_t version;
    uint32_t nslots;
    uint32_t gen;      /* bumped on every publish: the word that waiters sleep on */
    uint32_t waiters;  /* processes sleeping on gen: wakes are skipped when 0 */
    uint32_t token;    /* the consumer's current iteration; older tasks are stale */
    uint32_t ticket;   /* next sequence number for producers that claim slots themselves */
    uint32_t nqueues;  /* task queues, one per worker process (0 for a plain ring) */
    uint32_t qcap;     /* entries per task queue */
    uint32_t index_bytes; /* bytes of each slot's task index area */
    uint32_t pad[6];
} netcl_ring_header_t;

typedef struct {
    uint32_t state;
    uint32_t token;     /* iteration the task belongs to */
    uint32_t owner;     /* producer id + 1, 0 for none */
    uint32_t epoch;     /* epoch the task belongs to (workers reseed per epoch) */
    uint64_t seq;       /* batch number within its iteration */
    uint64_t meta_off;  /* layout record: offset and length in the data region */
    uint64_t meta_len;
    uint64_t used;      /* bytes of the data region in use */
    uint64_t needed;    /* bytes the batch needed; > capacity when it was piped */
    uint64_t capacity;  /* bytes of the data region */
} netcl_slot_header_t;

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(netcl_ring_header_t) == NETCL_LINE, "ring header is one cache line");
_Static_assert(sizeof(netcl_slot_header_t) == NETCL_LINE, "slot header is one cache line");
#endif

static inline netcl_slot_header_t *netcl_slot(void *base, uint32_t i) {
    return (netcl_slot_header_t *)((char *)base + NETCL_LINE * (1 + (uint64_t)i));
}

/* Task queues: one single-producer (the main process), single-consumer (one
 * worker) queue of slot entries per worker, so that handing a task to a busy
 * worker is a store and no system call.  The producer's and the consumer's
 * words sit on separate cache lines. */
typedef struct {
    uint32_t head;      /* written by the producer: entries pushed */
    uint32_t pad0[15];
    uint32_t tail;      /* written by the consumer: entries popped */
    uint32_t sleeping;  /* the consumer sleeps on head: the producer must wake it */
    uint32_t pad1[14];
} netcl_queue_t;

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(netcl_queue_t) == 2 * NETCL_LINE, "queue control is two cache lines");
#endif

static inline uint64_t netcl_queues_offset(uint32_t nslots) {
    return (uint64_t)NETCL_LINE * (1 + (uint64_t)nslots);
}

static inline uint64_t netcl_entries_offset(uint32_t nslots, uint32_t nqueues) {
    return netcl_queues_offset(nslots) + (uint64_t)nqueues * sizeof(netcl_queue_t);
}

static inline uint64_t netcl_index_offset(uint32_t nslots, uint32_t nqueues, uint32_t qcap) {
    uint64_t end = netcl_entries_offset(nslots, nqueues) + (uint64_t)nqueues * qcap * 4u;
    return (end + NETCL_LINE - 1) / NETCL_LINE * NETCL_LINE;
}

static inline uint64_t netcl_header_bytes(uint32_t nslots, uint32_t nqueues, uint32_t qcap,
                                          uint32_t index_bytes) {
    return netcl_index_offset(nslots, nqueues, qcap) + (uint64_t)nslots * index_bytes;
}

#endif /* NETCL_RING_H */

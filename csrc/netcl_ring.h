/* netcl_ring.h: the layout of a ring's header region in shared memory, and
 * the protocol on it (static inline: the per-batch hot path of both sides).
 *
 * One header line, then two 64-byte lines per slot, so that two processes
 * working on neighbouring slots never share a cache line.  The slot data live
 * in separate regions (one per slot) so that a slot can grow on its own.
 * The state word of a slot moves FREE -> ASSIGNED -> READY | PIPED | CANCELLED
 * -> FREE; it is published with a release store after every other field of
 * the slot is written, and read with an acquire load before any of them.
 */
#ifndef NETCL_RING_H
#define NETCL_RING_H

#include <stdint.h>
#include <string.h>

#include "netcl_atomic.h"
#include "netcl_shm.h"

#define NETCL_RING_MAGIC 0x6e636c72u /* "nclr" */
#define NETCL_RING_VERSION 2u
#define NETCL_LINE 64
#define NETCL_SLOT_LINES 2

enum netcl_slot_state {
    NETCL_FREE = 0,      /* owned by the consumer side, holds nothing */
    NETCL_ASSIGNED = 1,  /* given to a producer, being filled */
    NETCL_READY = 2,     /* the batch is in the slot's data region */
    NETCL_PIPED = 3,     /* the batch (or an error) comes through the producer's pipe */
    NETCL_CANCELLED = 4, /* the producer skipped a stale task: nothing to read */
    NETCL_GROW = 5       /* the batch needs a bigger region: `needed` says how big; the
                          * consumer grows the slot (ASSIGNED again) or refuses */
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
    /* The worker's stage times for the batch, in nanoseconds: what the
     * main process's stats add up (a few integers, no Python on the way). */
    uint64_t fetch_ns;      /* the dataset: __getitem__, __getitems__ or gather_batch */
    uint64_t collate_ns;    /* collation (0 when fused into the fetch) */
    uint64_t transform_ns;  /* transforms */
    uint64_t write_ns;      /* layout record, copies into the slot, publish */
    uint64_t start_ns;      /* CLOCK_MONOTONIC when the worker took the task */
    uint64_t skipped;       /* samples the dataset replaced by good ones (bad files) */
    uint64_t pad[2];
} netcl_slot_header_t;

#if defined(__STDC_VERSION__) && __STDC_VERSION__ >= 201112L
_Static_assert(sizeof(netcl_ring_header_t) == NETCL_LINE, "ring header is one cache line");
_Static_assert(sizeof(netcl_slot_header_t) == NETCL_SLOT_LINES * NETCL_LINE,
               "slot header is two cache lines");
#endif

static inline netcl_slot_header_t *netcl_slot(void *base, uint32_t i) {
    return (netcl_slot_header_t *)((char *)base + NETCL_LINE * (1 + NETCL_SLOT_LINES * (uint64_t)i));
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
    return (uint64_t)NETCL_LINE * (1 + NETCL_SLOT_LINES * (uint64_t)nslots);
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

/* Interleaving points: empty in the library; the protocol's C test defines
 * it to yield or sleep at random, so that every window between two steps of
 * a handshake gets hit. */
#ifndef NETCL_RING_YIELD
#define NETCL_RING_YIELD() ((void)0)
#endif

/* ---- the protocol ------------------------------------------------------
 *
 * Slot states (main process M, worker W):
 *   FREE --M: assign--> ASSIGNED --W: publish--> READY | PIPED | CANCELLED
 *   READY | PIPED | CANCELLED --M: free--> FREE
 * Only M moves a slot out of FREE and back to it; only the worker the task
 * names publishes it.  Every publish bumps `gen` (what waiters sleep on). */

/* Release-store a slot's state (after every other field of it is written),
 * then wake whoever sleeps on the ring's wake word. */
static inline void netcl_ring_publish(netcl_ring_header_t *hdr, netcl_slot_header_t *s,
                                      uint32_t state) {
    netcl_store_release(&s->state, state);
    NETCL_RING_YIELD();
    netcl_fetch_add(&hdr->gen, 1);
    NETCL_RING_YIELD();
    if (netcl_load_seq(&hdr->waiters) != 0) netcl_wake_all(&hdr->gen);
}

/* Sleep until the wake word differs from `seen` (read before the caller
 * checked its condition) or timeout_ms passes: 0 when woken, 1 on timeout.
 * Registering as a waiter before the last look closes the lost-wake race:
 * a publish after it sees `waiters` and wakes; one before it changed `gen`. */
static inline int netcl_ring_wait_gen(netcl_ring_header_t *hdr, uint32_t seen, int timeout_ms) {
    int rc = 0;
    netcl_fetch_add(&hdr->waiters, 1);
    NETCL_RING_YIELD();
    if (netcl_load_seq(&hdr->gen) == seen) rc = netcl_wait_u32(&hdr->gen, seen, timeout_ms);
    netcl_fetch_add(&hdr->waiters, (uint32_t)-1);
    return rc;
}

/* Wake the consumer of `q` if it sleeps with entries waiting; returns the
 * entries waiting.  The producer must call it before it blocks on anything
 * the consumer will do (else both would wait). */
static inline uint32_t netcl_queue_kick(netcl_queue_t *q) {
    uint32_t waiting = q->head - netcl_load_acquire(&q->tail);
    if (waiting && netcl_load_seq(&q->sleeping)) netcl_wake_all(&q->head);
    return waiting;
}

/* Push `entry` on a single-producer/single-consumer queue: 0 when full.
 * A store and a release; with `wake`, a system call when the consumer
 * sleeps.  Without, the consumer finds the entry when it next looks (it is
 * busy) or when kicked: a waker that batches its wakes saves a system call
 * and a context switch per task. */
static inline int netcl_queue_push(netcl_queue_t *q, uint32_t *entries, uint32_t qcap,
                                   uint32_t entry, int wake) {
    uint32_t head = q->head; /* only the producer writes it */
    if (head - netcl_load_acquire(&q->tail) >= qcap) return 0;
    entries[head % qcap] = entry;
    netcl_store_seq(&q->head, head + 1);
    NETCL_RING_YIELD();
    if (wake && netcl_load_seq(&q->sleeping)) netcl_wake_all(&q->head);
    return 1;
}

/* Pop the next entry (consumer side), sleeping up to timeout_ms: the entry,
 * or -1 after the timeout.  The consumer announces its sleep, then looks
 * again: a push in between either sees `sleeping` and wakes it, or has
 * changed `head` before the wait begins. */
static inline int64_t netcl_queue_pop(netcl_queue_t *q, const uint32_t *entries, uint32_t qcap,
                                      int timeout_ms) {
    uint32_t tail = q->tail; /* only the consumer writes it */
    uint32_t head = netcl_load_acquire(&q->head);
    if (head == tail) {
        NETCL_RING_YIELD();
        netcl_store_seq(&q->sleeping, 1);
        NETCL_RING_YIELD();
        head = netcl_load_seq(&q->head);
        if (head == tail) netcl_wait_u32(&q->head, head, timeout_ms);
        netcl_store_seq(&q->sleeping, 0);
        head = netcl_load_acquire(&q->head);
        if (head == tail) return -1;
    }
    uint32_t entry = entries[tail % qcap];
    netcl_store_release(&q->tail, tail + 1);
    return (int64_t)entry;
}

/* Assign FREE slot `s` a task and write its indices into the slot's index
 * area (`area`, `index_bytes` long: a length word, then int64 indices).
 * Returns 1 when the indices fit there, 0 when they must travel by pipe
 * (the slot is assigned either way), -1 when the slot was not FREE (and is
 * left as it was). */
static inline int netcl_ring_assign(netcl_slot_header_t *s, char *area, uint32_t index_bytes,
                                    uint32_t token, uint64_t seq, uint32_t owner, uint32_t epoch,
                                    const int64_t *indices, uint64_t n) {
    /* Claim first: a slot someone else claimed (producers that claim slots
     * themselves race for FREE ones) must keep its fields untouched. */
    if (!netcl_cas(&s->state, NETCL_FREE, NETCL_ASSIGNED)) return -1;
    s->token = token;
    s->seq = seq;
    s->owner = owner;
    s->epoch = epoch;
    s->meta_off = s->meta_len = s->used = s->needed = 0;
    s->fetch_ns = s->collate_ns = s->transform_ns = s->write_ns = s->start_ns = 0;
    int fits = indices != NULL && n * 8u + 8u <= index_bytes;
    if (fits) {
        *(uint64_t *)area = n * 8u;
        if (n) memcpy(area + 8, indices, n * 8u);
    }
    /* The worker reads the fields after it pops the task's entry, which the
     * owner pushes after this returns (release/acquire on the queue); a
     * consumer reads them only after the publish (release/acquire on state). */
    return fits;
}

/* The first of `n` slots (in the order given) whose state is READY or
 * PIPED, or -1.  In-order delivery passes one slot; out-of-order, all. */
static inline int64_t netcl_ring_find_published(netcl_ring_header_t *hdr, const uint32_t *slots,
                                                uint32_t n) {
    for (uint32_t k = 0; k < n; k++) {
        uint32_t st = netcl_load_acquire(&netcl_slot(hdr, slots[k])->state);
        if (st == NETCL_READY || st == NETCL_PIPED) return k;
    }
    return -1;
}

/* The consumer's next slot to look at among `slots` (oldest task first):
 * the first that asks to grow (the producer waits for it), else the first
 * published one, where `any` (out-of-order delivery) or only the oldest
 * (in-order).  -1 when there is none. */
static inline int64_t netcl_ring_find_next(netcl_ring_header_t *hdr, const uint32_t *slots,
                                           uint32_t n, int any) {
    int64_t first = -1;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t st = netcl_load_acquire(&netcl_slot(hdr, slots[k])->state);
        if (st == NETCL_GROW) return k;
        if (first < 0 && (st == NETCL_READY || st == NETCL_PIPED) && (any || k == 0)) first = k;
    }
    return first;
}

/* Wait up to timeout_ms for netcl_ring_find_next to find a slot: its
 * position, or -1 on timeout. */
static inline int64_t netcl_ring_wait_next(netcl_ring_header_t *hdr, const uint32_t *slots,
                                           uint32_t n, int any, int timeout_ms) {
    for (;;) {
        uint32_t seen = netcl_load_seq(&hdr->gen);
        NETCL_RING_YIELD();
        int64_t k = netcl_ring_find_next(hdr, slots, n, any);
        if (k >= 0) return k;
        NETCL_RING_YIELD();
        if (netcl_ring_wait_gen(hdr, seen, timeout_ms)) {
            return netcl_ring_find_next(hdr, slots, n, any);
        }
    }
}

/* Wait up to timeout_ms for one of `slots` to be published: its position in
 * `slots`, or -1 on timeout (the caller checks liveness, then waits again). */
static inline int64_t netcl_ring_wait_published(netcl_ring_header_t *hdr, const uint32_t *slots,
                                                uint32_t n, int timeout_ms) {
    for (;;) {
        uint32_t seen = netcl_load_seq(&hdr->gen);
        NETCL_RING_YIELD();
        int64_t k = netcl_ring_find_published(hdr, slots, n);
        if (k >= 0) return k;
        NETCL_RING_YIELD();
        if (netcl_ring_wait_gen(hdr, seen, timeout_ms)) {
            return netcl_ring_find_published(hdr, slots, n);
        }
    }
}

#endif /* NETCL_RING_H */

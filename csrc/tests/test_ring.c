/* test_ring.c: the ring protocol of netcl_ring.h run by real processes, with
 * random interleavings.
 *
 * The main process hands tasks to W forked workers through their task queues
 * (netcl_ring_assign + netcl_queue_push), each worker pops its entries, may
 * skip a stale task (CANCELLED), writes a value derived from the task into
 * the slot's index area and publishes READY; the main process waits for the
 * oldest pending slot (netcl_ring_wait_published), checks the value, frees
 * the slot and hands out the next task.  Random yields and sleeps at every
 * step shake the interleavings.  Checked: every task is delivered exactly
 * once and in order, values are those of their task, a slot is never
 * published by a worker it was not given to, and no wait misses its wake
 * (a wait that times out with the slot published counts as a lost wake).
 *
 * Build and run (the test suite does this):
 *   cc -O1 -std=c11 -Icsrc csrc/tests/test_ring.c csrc/netcl_shm.c -o test_ring
 *   ./test_ring [tasks] [workers] [slots] [seed]
 * Exit status 0 and "ok ..." on success.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void jitter(void);
#define NETCL_RING_YIELD() jitter()
#include "netcl_ring.h"

#define ENTRY_TASK 0u
#define ENTRY_STOP (3u << 24)
#define ENTRY_SLOT_MASK 0x00FFFFFFu
/* Waits long enough that a timeout can only mean a missed wake. */
#define WAIT_MS 5000
#define MAX_SLOTS 64

static uint64_t rng_state;

static uint32_t rnd(void) { /* xorshift64* */
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 2685821657736338717ull) >> 32);
}

static void jitter(void) {
    uint32_t r = rnd() % 16;
    if (r < 4) sched_yield();
    else if (r == 4) {
        struct timespec ts = {0, (long)(rnd() % 200) * 1000L};
        nanosleep(&ts, NULL);
    }
}

static uint64_t value_of(uint64_t seq, uint32_t token) { return seq * 1000003u + token; }

typedef struct {
    netcl_ring_header_t *hdr;
    netcl_queue_t *queues;
    uint32_t *entries;
    char *index_area;
    uint32_t nslots, nqueues, qcap, index_bytes;
} ring_t;

static void worker(ring_t *r, uint32_t wid) {
    netcl_queue_t *q = &r->queues[wid];
    uint32_t *entries = r->entries + (uint64_t)wid * r->qcap;
    for (;;) {
        int64_t e = netcl_queue_pop(q, entries, r->qcap, WAIT_MS);
        if (e < 0) {
            if (getppid() == 1) _exit(3);
            continue;
        }
        if ((uint32_t)e == ENTRY_STOP) _exit(0);
        uint32_t slot = (uint32_t)e & ENTRY_SLOT_MASK;
        netcl_slot_header_t *s = netcl_slot(r->hdr, slot);
        jitter();
        if (netcl_load_acquire(&s->state) != NETCL_ASSIGNED || s->owner != wid + 1) {
            fprintf(stderr, "worker %u: slot %u not assigned to it (state %u owner %u)\n", wid,
                    slot, s->state, s->owner);
            _exit(4);
        }
        char *area = r->index_area + (uint64_t)slot * r->index_bytes;
        uint64_t seq = s->seq;
        if (*(uint64_t *)area != 8 || *(int64_t *)(area + 8) != (int64_t)seq) {
            fprintf(stderr, "worker %u: task indices of slot %u wrong\n", wid, slot);
            _exit(5);
        }
        if (netcl_load_acquire(&r->hdr->token) != s->token) {
            netcl_ring_publish(r->hdr, s, NETCL_CANCELLED);
            continue;
        }
        jitter();
        s->meta_off = value_of(seq, s->token);
        jitter();
        netcl_ring_publish(r->hdr, s, NETCL_READY);
    }
}

int main(int argc, char **argv) {
    uint64_t ntasks = argc > 1 ? strtoull(argv[1], NULL, 10) : 20000;
    uint32_t nworkers = argc > 2 ? (uint32_t)atoi(argv[2]) : 3;
    uint32_t nslots = argc > 3 ? (uint32_t)atoi(argv[3]) : 5;
    rng_state = argc > 4 ? strtoull(argv[4], NULL, 10) | 1u : 88172645463325252ull;
    if (nslots > MAX_SLOTS || nworkers == 0 || nslots == 0) return 2;

    ring_t r;
    r.nslots = nslots;
    r.nqueues = nworkers;
    r.qcap = 2 * nslots + 8;
    r.index_bytes = 16;
    uint64_t bytes = netcl_header_bytes(nslots, nworkers, r.qcap, r.index_bytes);
    void *base = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) { perror("mmap"); return 2; }
    memset(base, 0, bytes);
    r.hdr = (netcl_ring_header_t *)base;
    r.hdr->nslots = nslots;
    r.queues = (netcl_queue_t *)((char *)base + netcl_queues_offset(nslots));
    r.entries = (uint32_t *)((char *)base + netcl_entries_offset(nslots, nworkers));
    r.index_area = (char *)base + netcl_index_offset(nslots, nworkers, r.qcap);

    pid_t pids[64];
    for (uint32_t w = 0; w < nworkers; w++) {
        pids[w] = fork();
        if (pids[w] == 0) {
            rng_state ^= (uint64_t)(w + 1) * 0x9E3779B97F4A7C15ull;
            worker(&r, w);
        }
    }

    /* The main process: a FIFO of pending (seq, slot), tasks in order. */
    uint32_t free_slots[MAX_SLOTS], nfree = nslots;
    for (uint32_t i = 0; i < nslots; i++) free_slots[i] = nslots - 1 - i;
    uint64_t pend_seq[MAX_SLOTS];
    uint32_t pend_slot[MAX_SLOTS], pend_head = 0, pend_len = 0;
    uint64_t next_task = 0, delivered = 0, cancelled = 0, lost_wakes = 0, token = 1;
    uint64_t stale_until = 0; /* tasks below this seq belong to an old token */
    netcl_store_release(&r.hdr->token, (uint32_t)token);
    int bad = 0;
    while (delivered < ntasks && !bad) {
        while (nfree && next_task < ntasks && pend_len < nslots) {
            uint32_t slot = free_slots[--nfree];
            uint32_t wid = (uint32_t)(next_task % nworkers);
            int64_t idx = (int64_t)next_task;
            if (netcl_ring_assign(netcl_slot(r.hdr, slot),
                                  r.index_area + (uint64_t)slot * r.index_bytes, r.index_bytes,
                                  (uint32_t)token, next_task, wid + 1, 0, &idx, 1) != 1) {
                fprintf(stderr, "assign of slot %u failed\n", slot);
                bad = 1;
                break;
            }
            /* Half the tasks are pushed quietly and kicked before the wait. */
            while (!netcl_queue_push(&r.queues[wid], r.entries + (uint64_t)wid * r.qcap, r.qcap,
                                     ENTRY_TASK | slot, (int)(rnd() & 1)))
                sched_yield();
            pend_seq[(pend_head + pend_len) % MAX_SLOTS] = next_task;
            pend_slot[(pend_head + pend_len) % MAX_SLOTS] = slot;
            pend_len++;
            next_task++;
            jitter();
        }
        if (!pend_len) break;
        for (uint32_t w = 0; w < nworkers; w++) netcl_queue_kick(&r.queues[w]);
        uint32_t slot = pend_slot[pend_head];
        uint64_t seq = pend_seq[pend_head];
        netcl_slot_header_t *s = netcl_slot(r.hdr, slot);
        if (seq < stale_until) {
            /* A stale task ends READY or CANCELLED: poll, it is not waited for. */
            while (netcl_load_acquire(&s->state) == NETCL_ASSIGNED) sched_yield();
        } else if (netcl_ring_wait_published(r.hdr, &slot, 1, WAIT_MS) < 0) {
            fprintf(stderr, "lost wake: slot %u (task %llu) not published after %d ms\n", slot,
                    (unsigned long long)seq, WAIT_MS);
            lost_wakes++;
            bad = 1;
            break;
        }
        uint32_t st = netcl_load_acquire(&s->state);
        if (st == NETCL_READY) {
            if (seq < stale_until) {
                /* A task of the old token finished anyway: freed unread. */
            } else if (s->meta_off != value_of(seq, s->token) || s->seq != seq) {
                fprintf(stderr, "slot %u: seq %llu value %llu, expected %llu\n", slot,
                        (unsigned long long)s->seq, (unsigned long long)s->meta_off,
                        (unsigned long long)value_of(seq, s->token));
                bad = 1;
            } else if (seq != delivered + cancelled) {
                fprintf(stderr, "out of order: %llu after %llu\n", (unsigned long long)seq,
                        (unsigned long long)(delivered + cancelled));
                bad = 1;
            } else {
                delivered++;
            }
        } else if (st == NETCL_CANCELLED) {
            if (seq >= stale_until) {
                fprintf(stderr, "task %llu cancelled with a current token\n",
                        (unsigned long long)seq);
                bad = 1;
            }
            cancelled++;
        } else {
            fprintf(stderr, "slot %u woke in state %u\n", slot, st);
            bad = 1;
        }
        if (st == NETCL_READY && seq < stale_until) cancelled++;
        netcl_store_release(&s->state, NETCL_FREE);
        free_slots[nfree++] = slot;
        pend_head = (pend_head + 1) % MAX_SLOTS;
        pend_len--;
        /* Now and then the main process "starts a new iteration": the tasks
         * in flight become stale and workers may skip them. */
        if (rnd() % 997 == 0 && pend_len) {
            token++;
            netcl_store_release(&r.hdr->token, (uint32_t)token);
            stale_until = next_task;
        }
    }
    for (uint32_t w = 0; w < nworkers; w++)
        while (!netcl_queue_push(&r.queues[w], r.entries + (uint64_t)w * r.qcap, r.qcap, ENTRY_STOP, 1))
            sched_yield();
    int status_bad = 0;
    for (uint32_t w = 0; w < nworkers; w++) {
        int status;
        waitpid(pids[w], &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) status_bad = 1;
    }
    if (bad || status_bad || delivered + cancelled != ntasks || lost_wakes) {
        fprintf(stderr, "FAILED: delivered %llu cancelled %llu of %llu, lost wakes %llu, "
                "workers %s\n", (unsigned long long)delivered, (unsigned long long)cancelled,
                (unsigned long long)ntasks, (unsigned long long)lost_wakes,
                status_bad ? "failed" : "ok");
        return 1;
    }
    printf("ok %llu tasks (%llu delivered, %llu stale) through %u slots by %u workers\n",
           (unsigned long long)ntasks, (unsigned long long)delivered,
           (unsigned long long)cancelled, nslots, nworkers);
    return 0;
}

/* test_wait_windows.c: netcl_wait_u32 and netcl_wake_all on Windows, at the C
 * level (.ci/windows builds it with mingw-w64, once with each branch of
 * netcl_atomic.h, and runs it under wine).
 *
 * Two views of one region stand for two processes: each view has its own
 * address, as each process has, so a wake through one view reaching a waiter
 * on the other goes the way a wake between processes goes (named events),
 * and private memory goes the WaitOnAddress way.  Checked: a timeout returns
 * no earlier than its deadline and not at a multiple of it; one wake_all
 * wakes every waiter; thousands of hand-offs lose no wake; a zero-byte region
 * maps; a failed create leaves the handle fields reset.  Prints "ok" lines
 * and exits 0, or says what failed and exits 1. */
#include "netcl_atomic.h"
#include "netcl_shm.h"

#include <stdio.h>
#include <string.h>
#include <windows.h>

#define WAITERS 4
#define HANDOFFS 2000
#define TIMEOUT_MS 200
#define LONG_MS 10000 /* a waiter that reaches this was not woken: a lost wake */

static int failures = 0;
#define CHECK(cond, ...)                                       \
    do {                                                       \
        if (!(cond)) {                                         \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);        \
            printf(__VA_ARGS__);                               \
            printf("\n");                                      \
            failures++;                                        \
        }                                                      \
    } while (0)

static double now_ms(void) {
    static LARGE_INTEGER freq;
    LARGE_INTEGER t;
    if (freq.QuadPart == 0) QueryPerformanceFrequency(&freq);
    QueryPerformanceCounter(&t);
    return (double)t.QuadPart * 1000.0 / (double)freq.QuadPart;
}

typedef struct {
    volatile uint32_t *word;
    uint32_t expected;
    int rc;
    double returned_ms;
} waiter_t;

static DWORD WINAPI waiter_main(void *arg) {
    waiter_t *w = (waiter_t *)arg;
    w->rc = netcl_wait_u32(w->word, w->expected, LONG_MS);
    w->returned_ms = now_ms();
    return 0;
}

static void check_timeout(const char *what, volatile uint32_t *word) {
    double best = 1e9;
    for (int k = 0; k < 3; k++) {
        double t0 = now_ms();
        int rc = netcl_wait_u32(word, netcl_load_seq(word), TIMEOUT_MS);
        double took = now_ms() - t0;
        CHECK(rc == 1, "%s: a wait with nothing to wake it returned %d", what, rc);
        CHECK(took >= TIMEOUT_MS, "%s: a %d ms timeout returned after %.2f ms", what,
              TIMEOUT_MS, took);
        if (took < best) best = took;
    }
    CHECK(best < 2 * TIMEOUT_MS, "%s: a %d ms timeout took %.2f ms at best", what, TIMEOUT_MS,
          best);
    printf("ok %s: %d ms timeout returned after %.2f ms at best\n", what, TIMEOUT_MS, best);
}

/* WAITERS threads wait on `wait_word`; one store and wake_all through
 * `wake_word` (the same word, maybe through another view) wakes them all. */
static void check_wake_all(const char *what, volatile uint32_t *wait_word,
                           volatile uint32_t *wake_word) {
    waiter_t w[WAITERS];
    HANDLE th[WAITERS];
    uint32_t v = netcl_load_seq(wait_word);
    for (int k = 0; k < WAITERS; k++) {
        w[k].word = wait_word;
        w[k].expected = v;
        w[k].rc = -1;
        th[k] = CreateThread(NULL, 0, waiter_main, &w[k], 0, NULL);
    }
    Sleep(200); /* let them sleep (one still on its way returns at once: no harm) */
    double t0 = now_ms();
    netcl_store_seq(wake_word, v + 1);
    netcl_wake_all(wake_word);
    WaitForMultipleObjects(WAITERS, th, TRUE, INFINITE);
    double worst = 0;
    for (int k = 0; k < WAITERS; k++) {
        CloseHandle(th[k]);
        CHECK(w[k].rc == 0, "%s: waiter %d returned %d (1: not woken)", what, k, w[k].rc);
        if (w[k].returned_ms - t0 > worst) worst = w[k].returned_ms - t0;
    }
    CHECK(worst < LONG_MS / 2, "%s: the last waiter returned %.2f ms after the wake", what, worst);
    printf("ok %s: one wake_all woke %d waiters, the last %.3f ms after it\n", what, WAITERS,
           worst);
}

typedef struct {
    volatile uint32_t *ping, *pong; /* the same two words, through this side's view */
    int lost;
} side_t;

/* Ping-pong: each side waits for the other's turn, then takes its own. */
static DWORD WINAPI pong_main(void *arg) {
    side_t *s = (side_t *)arg;
    for (uint32_t i = 0; i < HANDOFFS; i++) {
        while (netcl_load_seq(s->ping) == i)
            if (netcl_wait_u32(s->ping, i, LONG_MS) == 1) s->lost++;
        netcl_store_seq(s->pong, i + 1);
        netcl_wake_all(s->pong);
    }
    return 0;
}

static void check_handoffs(const char *what, volatile uint32_t *ping_a, volatile uint32_t *pong_a,
                           volatile uint32_t *ping_b, volatile uint32_t *pong_b) {
    netcl_store_seq(ping_a, 0);
    netcl_store_seq(pong_a, 0);
    side_t b = {ping_b, pong_b, 0};
    HANDLE th = CreateThread(NULL, 0, pong_main, &b, 0, NULL);
    int lost = 0;
    double t0 = now_ms();
    for (uint32_t i = 0; i < HANDOFFS; i++) {
        netcl_store_seq(ping_a, i + 1);
        netcl_wake_all(ping_a);
        while (netcl_load_seq(pong_a) == i)
            if (netcl_wait_u32(pong_a, i, LONG_MS) == 1) lost++;
    }
    WaitForSingleObject(th, INFINITE);
    CloseHandle(th);
    double took = now_ms() - t0;
    CHECK(lost + b.lost == 0, "%s: %d waits timed out: lost wakes", what, lost + b.lost);
    printf("ok %s: %d hand-offs, no wake lost, %.1f us per round trip\n", what, HANDOFFS,
           took * 1000.0 / HANDOFFS);
}

int main(void) {
    char err[256];
    printf("atomics: %s\n",
#if defined(NETCL_ATOMIC_FORCE_MSVC)
           "the MSVC branch (_Interlocked intrinsics)"
#else
           "the GCC branch (__atomic builtins)"
#endif
    );

    /* Private memory: WaitOnAddress within the process. */
    static volatile uint32_t private_words[32];
    check_timeout("private memory", &private_words[0]);
    check_wake_all("private memory", &private_words[0], &private_words[0]);
    check_handoffs("private memory", &private_words[1], &private_words[17], &private_words[1],
                   &private_words[17]);

    /* A region and a second view of it (another address, as in another process). */
    netcl_shm_t a, b;
    CHECK(netcl_shm_create(&a, 4096, err, sizeof err) == 0, "create: %s", err);
    HANDLE dup;
    DuplicateHandle(GetCurrentProcess(), (HANDLE)a.handle, GetCurrentProcess(), &dup, 0, FALSE,
                    DUPLICATE_SAME_ACCESS);
    CHECK(netcl_shm_attach(&b, (intptr_t)dup, 4096, err, sizeof err) == 0, "attach: %s", err);
    CHECK(a.addr != b.addr, "two views at one address");
    volatile uint32_t *wa = (volatile uint32_t *)a.addr, *wb = (volatile uint32_t *)b.addr;
    check_timeout("shared memory", wa + 3);
    check_wake_all("shared memory, one view", wa + 3, wa + 3);
    check_wake_all("shared memory, woken through another view", wb + 3, wa + 3);
    check_handoffs("shared memory, two views", wa + 5, wa + 37, wb + 5, wb + 37);
    netcl_shm_unmap(&b);
    netcl_shm_close_handle(b.handle);
    netcl_shm_unmap(&a);
    netcl_shm_close_handle(a.handle);

    /* 0 bytes maps a page, as on POSIX; a failed create resets the fields. */
    netcl_shm_t z;
    CHECK(netcl_shm_create(&z, 0, err, sizeof err) == 0, "0 bytes: %s", err);
    CHECK(z.addr != NULL && z.size == netcl_page_size(), "0 bytes mapped %zu bytes", z.size);
    ((volatile char *)z.addr)[z.size - 1] = 1;
    netcl_shm_unmap(&z);
    netcl_shm_close_handle(z.handle);
    netcl_shm_t f = {(void *)&f, 12345, 678};
    err[0] = 0;
    CHECK(netcl_shm_create(&f, (size_t)1 << 60, err, sizeof err) != 0, "2^60 bytes mapped");
    CHECK(f.addr == NULL && f.size == 0 && f.handle == -1,
          "a failed create left addr %p, size %zu, handle %lld", f.addr, f.size,
          (long long)f.handle);
    CHECK(err[0] != 0, "a failed create gave no message");
    printf("ok zero-byte region maps %zu bytes; a failed create resets the fields (%s)\n",
           netcl_page_size(), err);

    if (failures) {
        printf("%d checks failed\n", failures);
        return 1;
    }
    printf("ok all\n");
    return 0;
}

/*
 * threads: two named threads with different call chains; main only waits.
 *
 * Expected stacks (innermost first):
 *   thread "worker-a": thread_a_leaf, thread_a_step, thread_a_work,
 *                      (libc: start_thread, clone3)
 *   thread "worker-b": thread_b_leaf, thread_b_middle, thread_b_step, thread_b_work,
 *                      (libc: start_thread, clone3)
 *   main thread: blocked in pthread_join (no CPU samples expected).
 *
 * Usage: threads SECONDS (default 2), or threads --work N (fixed work, for
 * benchmarks: each thread makes the same number of calls, N units of about a
 * second of CPU in all).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

volatile unsigned long threads_sink;
static double run_seconds = 2.0;
/* With --work: the calls each thread makes (0: run for run_seconds). */
static long fixed_calls = 0;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Whether a thread that has made `calls` calls since `end` was set goes on. */
static int keep_going(long calls, double end) {
    return fixed_calls > 0 ? calls < fixed_calls : now_seconds() < end;
}

static unsigned long burn(unsigned long x, long iterations) {
    for (long i = 0; i < iterations; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

KEEP_FRAME unsigned long thread_a_leaf(unsigned long x) { x = burn(x, 50000); threads_sink = x; return x; }
KEEP_FRAME unsigned long thread_a_step(unsigned long x) { return thread_a_leaf(x ^ 5) + 1; }

KEEP_FRAME void *thread_a_work(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "worker-a");
    double end = now_seconds() + run_seconds;
    unsigned long x = 1;
    for (long calls = 0; keep_going(calls, end); calls++)
        x = thread_a_step(x);
    threads_sink = x;
    return NULL;
}

KEEP_FRAME unsigned long thread_b_leaf(unsigned long x) { x = burn(x, 50000); threads_sink = x; return x; }
KEEP_FRAME unsigned long thread_b_middle(unsigned long x) { return thread_b_leaf(x ^ 7) + 1; }
KEEP_FRAME unsigned long thread_b_step(unsigned long x) { return thread_b_middle(x ^ 6) + 1; }

KEEP_FRAME void *thread_b_work(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "worker-b");
    double end = now_seconds() + run_seconds;
    unsigned long x = 2;
    for (long calls = 0; keep_going(calls, end); calls++)
        x = thread_b_step(x);
    threads_sink = x;
    return NULL;
}

/* `--work N`: N units of about a second of CPU on this project's 2-core VM,
 * split between the two threads. */
#define CALLS_PER_WORK_UNIT 20000

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "--work") == 0)
        fixed_calls = atol(argv[2]) * CALLS_PER_WORK_UNIT / 2;
    else if (argc > 1)
        run_seconds = atof(argv[1]);
    pthread_t a, b;
    if (pthread_create(&a, NULL, thread_a_work, NULL) != 0)
        return 1;
    if (pthread_create(&b, NULL, thread_b_work, NULL) != 0)
        return 1;
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    return 0;
}

/*
 * hostile_threads: THREADS threads, all started at once, each burns
 * MILLISECONDS of its own CPU time in hostile_thread_burn and exits. With
 * 5 ms each, no thread lives long enough for a per-thread 99 Hz sampling
 * counter (a period of 10.1 ms of its CPU time) to fire.
 *
 * Expected stacks (innermost first):
 *   hostile_thread_burn, (libc: start_thread, clone3)
 *
 * Usage: hostile_threads THREADS MILLISECONDS
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

static long milliseconds = 5;
volatile unsigned long hostile_threads_sink;

static double thread_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

KEEP_FRAME void *hostile_thread_burn(void *argument) {
    (void)argument;
    double end = thread_cpu_seconds() + milliseconds / 1000.0;
    while (thread_cpu_seconds() < end)
        for (int i = 0; i < 1000; i++)
            hostile_threads_sink += i;
    return NULL;
}

int main(int argc, char **argv) {
    int count = argc > 1 ? atoi(argv[1]) : 1000;
    milliseconds = argc > 2 ? atol(argv[2]) : 5;
    pthread_t *threads = calloc(count, sizeof *threads);
    char *started = calloc(count, 1);
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setstacksize(&attributes, 64 << 10);
    int made = 0;
    for (int i = 0; i < count; i++)
        if (pthread_create(&threads[i], &attributes, hostile_thread_burn, NULL) == 0) {
            started[i] = 1;
            made++;
        }
    for (int i = 0; i < count; i++)
        if (started[i])
            pthread_join(threads[i], NULL);
    if (made != count) {
        fprintf(stderr, "hostile_threads: %d of %d threads started\n", made, count);
        return 1;
    }
    return 0;
}

/*
 * The fake requests of the trace context servers (trace_ctx_library.c,
 * go124_labels_standin.c): `request_work` spins ~15 ms (a request, its
 * ids published), `idle_work` ~5 ms (between requests, none), both kept as
 * frames of their own; `now` is the monotonic clock in seconds;
 * `serve_on_threads` runs a server's loop on THREADS threads (at most 64)
 * and prints the sum of what they returned.
 */
#ifndef REQUEST_WORK_H
#define REQUEST_WORK_H

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <time.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static uint64_t spin(double seconds, uint64_t x) {
    double end = now() + seconds;
    while (now() < end)
        for (int i = 0; i < 1000; i++)
            x = x * 6364136223846793005ull + (uint64_t)i;
    return x;
}

__attribute__((noinline)) uint64_t request_work(uint64_t seed) {
    uint64_t x = spin(0.015, seed);
    __asm__ volatile("" : "+r"(x));
    return x;
}

__attribute__((noinline)) uint64_t idle_work(uint64_t seed) {
    uint64_t x = spin(0.005, seed);
    __asm__ volatile("" : "+r"(x));
    return x;
}

static void serve_on_threads(int threads, void *(*serve)(void *)) {
    pthread_t workers[64];
    for (int i = 0; i < threads && i < 64; i++)
        pthread_create(&workers[i], NULL, serve, NULL);
    uintptr_t sum = 0;
    for (int i = 0; i < threads && i < 64; i++) {
        void *result;
        pthread_join(workers[i], &result);
        sum += (uintptr_t)result;
    }
    printf("%lu\n", (unsigned long)sum);
}

#endif

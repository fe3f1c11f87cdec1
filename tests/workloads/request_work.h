/*
 * The fake requests of the trace context servers (trace_ctx_library.c,
 * go124_labels_standin.c): `request_work` spins ~15 ms (a request, its
 * ids published), `idle_work` ~5 ms (between requests, none), both kept as
 * frames of their own; `now` is the monotonic clock in seconds.
 */
#ifndef REQUEST_WORK_H
#define REQUEST_WORK_H

#include <stdint.h>
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

#endif

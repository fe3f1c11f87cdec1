/*
 * hostile_named_lib: a library whose one working function is named by the
 * build: `-DFN=NAME` (the tests build it twice, HOSTSECRET_fn for the
 * host's file and CONTAINER_fn0 for a container's file at the same path).
 * Built by the test itself (-shared -fPIC -DFN=...), not by build_workload.
 *
 * Expected stacks (innermost first): FN, entry, then the caller's main.
 */
#include <time.h>

#ifndef FN
#define FN hostile_named_fn
#endif

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

volatile unsigned long hostile_named_sink;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

KEEP_FRAME void FN(double seconds) {
    double end = now_seconds() + seconds;
    while (now_seconds() < end)
        for (unsigned long i = 0; i < 20000; i++)
            hostile_named_sink += i * i;
}

KEEP_FRAME void entry(double seconds) {
    FN(seconds);
    __asm__ volatile("");
}

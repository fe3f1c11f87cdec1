/*
 * recursion: a 300-frame-deep recursion of ~80-byte frames; the leaf burns CPU.
 *
 * Expected stacks (innermost first), most samples:
 *   recursion_leaf
 *   recurse_deep x 300 (depth 0 is the innermost, called by depth 1, ...)
 *   recursion_driver
 *   main
 *   (libc start)
 * About 300 * 80 = 24 KB of stack: a 32 KB stack copy holds all of it,
 * an 8 KB copy does not.
 *
 * Usage: recursion SECONDS (default 2), or recursion --work N (fixed work, for benchmarks).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

#define DEPTH 300

volatile unsigned long recursion_sink;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

KEEP_FRAME unsigned long recursion_leaf(unsigned long x) {
    for (long i = 0; i < 200000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    recursion_sink = x;
    return x;
}

/* The volatile locals give the frame its size and keep it live across the call. */
KEEP_FRAME unsigned long recurse_deep(int depth, unsigned long x) {
    volatile unsigned long pad[7];
    pad[depth % 7] = x;
    unsigned long result = depth == 0 ? recursion_leaf(x) : recurse_deep(depth - 1, x + 1);
    return result + pad[depth % 7];
}

KEEP_FRAME unsigned long recursion_driver(unsigned long x) { return recurse_deep(DEPTH - 1, x) + 1; }

/* `--work N`: a fixed amount of work (N units of about a second each on
 * this project's 2-core VM), so that a benchmark sees profiling overhead as
 * a longer run instead of less work done. */
#define CALLS_PER_WORK_UNIT 5000

int main(int argc, char **argv) {
    unsigned long x = 1;
    if (argc > 2 && strcmp(argv[1], "--work") == 0) {
        long calls = atol(argv[2]) * CALLS_PER_WORK_UNIT;
        for (long i = 0; i < calls; i++)
            x = recursion_driver(x);
        recursion_sink = x;
        return 0;
    }
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    double end = now_seconds() + seconds;
    while (now_seconds() < end)
        x = recursion_driver(x);
    recursion_sink = x;
    return 0;
}

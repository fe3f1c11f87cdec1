/*
 * chain: a fixed call chain whose leaves split the CPU 70/30.
 *
 * Expected stacks (innermost first), every sample of the main thread:
 *   chain_leaf_70 | chain_leaf_30
 *   chain_e
 *   chain_d
 *   chain_c
 *   chain_b
 *   chain_a
 *   main
 *   (libc start: __libc_start_call_main, __libc_start_main, _start)
 * chain_e runs the same loop 7 times in chain_leaf_70 for every 3 times in
 * chain_leaf_30, so about 70 % of the samples end in chain_leaf_70.
 *
 * Usage: chain SECONDS (default 2), or chain --work N (fixed work, for benchmarks). Built -O2 -fomit-frame-pointer -g: the
 * chain only survives because of the attributes and the work after each call.
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

#define ITERATIONS_PER_UNIT 8000

volatile unsigned long chain_sink;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/*
 * Both leaves run exactly the same loop per unit of work, and at the same
 * offset in a 64-byte line, so that nothing but the work split tells their
 * times apart.
 */
#define LEAF_ALIGN __attribute__((aligned(64)))

KEEP_FRAME LEAF_ALIGN unsigned long chain_leaf_70(unsigned long seed, int units) {
    unsigned long x = seed;
    for (long i = 0; i < (long)units * ITERATIONS_PER_UNIT; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    chain_sink = x;
    return x;
}

KEEP_FRAME LEAF_ALIGN unsigned long chain_leaf_30(unsigned long seed, int units) {
    unsigned long x = seed;
    for (long i = 0; i < (long)units * ITERATIONS_PER_UNIT; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    chain_sink = x;
    return x;
}

/*
 * Each caller uses its callee's result, so no call becomes a tail jump.
 * A call's length varies (1 to 4 times the same 7 + 3 units, from the
 * seed's top bits): with a fixed length, one call took ~200 us, a fifth of
 * the 999 Hz sampling period, and the samples could stay in phase with the
 * calls for long enough to skew the split (a CI run read 75.3 %).
 */
KEEP_FRAME unsigned long chain_e(unsigned long seed) {
    int scale = 1 + (int)(seed >> 62);
    unsigned long x = chain_leaf_70(seed, 7 * scale);
    x ^= chain_leaf_30(x, 3 * scale);
    return x + 1;
}

KEEP_FRAME unsigned long chain_d(unsigned long seed) { return chain_e(seed ^ 4) + 1; }
KEEP_FRAME unsigned long chain_c(unsigned long seed) { return chain_d(seed ^ 3) + 1; }
KEEP_FRAME unsigned long chain_b(unsigned long seed) { return chain_c(seed ^ 2) + 1; }
KEEP_FRAME unsigned long chain_a(unsigned long seed) { return chain_b(seed ^ 1) + 1; }

/* `--work N`: a fixed amount of work (N units of about a second each on
 * this project's 2-core VM), so that a benchmark sees profiling overhead as
 * a longer run instead of less work done. */
#define CALLS_PER_WORK_UNIT 5000

int main(int argc, char **argv) {
    unsigned long x = 1;
    if (argc > 2 && strcmp(argv[1], "--work") == 0) {
        long calls = atol(argv[2]) * CALLS_PER_WORK_UNIT;
        for (long i = 0; i < calls; i++)
            x = chain_a(x);
        chain_sink = x;
        return 0;
    }
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    double end = now_seconds() + seconds;
    while (now_seconds() < end)
        x = chain_a(x);
    chain_sink = x;
    return 0;
}

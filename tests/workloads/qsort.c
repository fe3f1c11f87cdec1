/*
 * qsort: a chain that crosses libc, which has no frame pointers.
 *
 * Expected stacks (innermost first), most samples:
 *   compare_callback
 *   (glibc internals: msort_with_tmp, recursively, then qsort_r; glibc's
 *    qsort tail-calls qsort_r, so `qsort` itself is usually not a frame,
 *    and the internals are only named with libc's debug symbols)
 *   sort_many
 *   main
 *   (libc start)
 * compare_callback burns CPU on every comparison, so nearly every sample is
 * in it, called from inside libc.
 *
 * Usage: qsort SECONDS (default 2), or qsort --work N (fixed work, for benchmarks).
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

#define VALUES 4096

volatile unsigned long qsort_sink;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

KEEP_FRAME int compare_callback(const void *left, const void *right) {
    unsigned long x = *(const unsigned int *)left;
    for (int i = 0; i < 200; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    qsort_sink = x;
    unsigned int a = *(const unsigned int *)left, b = *(const unsigned int *)right;
    return (a > b) - (a < b);
}

KEEP_FRAME unsigned long sort_many(unsigned int *values, unsigned long seed) {
    for (int i = 0; i < VALUES; i++) {
        seed = seed * 6364136223846793005UL + 1442695040888963407UL;
        values[i] = (unsigned int)(seed >> 33);
    }
    qsort(values, VALUES, sizeof values[0], compare_callback);
    return seed + values[0];
}

/* `--work N`: N units of about a second of CPU on this project's 2-core VM. */
#define SORTS_PER_WORK_UNIT 110

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "--work") == 0) {
        static unsigned int fixed_values[VALUES];
        long sorts = atol(argv[2]) * SORTS_PER_WORK_UNIT;
        unsigned long fixed_seed = 1;
        for (long i = 0; i < sorts; i++)
            fixed_seed = sort_many(fixed_values, fixed_seed);
        qsort_sink = fixed_seed;
        return 0;
    }
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    double end = now_seconds() + seconds;
    static unsigned int values[VALUES];
    unsigned long seed = 1;
    while (now_seconds() < end)
        seed = sort_many(values, seed);
    qsort_sink = seed;
    return 0;
}

/*
 * forker_child: what forker execs. Burns MILLISECONDS (argv[1]) of its own
 * CPU time (not wall time: a busy machine makes it take longer, not burn
 * less, so that tests judging its samples by its CPU time get the CPU they
 * asked for), or makes a fixed number of burn calls with `--calls N`
 * (forker --work).
 *
 * Expected stacks (innermost first):
 *   forker_child_burn, forker_child_work, main, (libc start)
 */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

volatile unsigned long forker_child_sink;

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

KEEP_FRAME unsigned long forker_child_burn(unsigned long x) {
    for (long i = 0; i < 20000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    forker_child_sink = x;
    return x;
}

/* Burns `seconds` of CPU, or makes `calls` burn calls when `calls` > 0. */
KEEP_FRAME unsigned long forker_child_work(double seconds, long calls) {
    unsigned long x = 1;
    if (calls > 0) {
        for (; calls > 0; calls--)
            x = forker_child_burn(x) + 1;
        return x;
    }
    double end = cpu_seconds() + seconds;
    while (cpu_seconds() < end)
        x = forker_child_burn(x) + 1;
    return x;
}

int main(int argc, char **argv) {
    if (argc > 2 && strcmp(argv[1], "--calls") == 0) {
        forker_child_sink = forker_child_work(0, atol(argv[2]));
        return 0;
    }
    double milliseconds = argc > 1 ? atof(argv[1]) : 30.0;
    forker_child_sink = forker_child_work(milliseconds / 1000.0, 0);
    return 0;
}

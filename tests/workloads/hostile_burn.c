/*
 * hostile_burn: burns CPU for SECONDS of wall time, then exits with
 * EXIT_CODE (default 0). With TERM_CODE >= 0, a SIGTERM handler exits at
 * once with TERM_CODE (what a service that is a container's PID 1 does);
 * without it (or with -1) SIGTERM kills it. Further arguments are ignored
 * (tests add a word that tells their processes apart).
 *
 * Expected stacks (innermost first):
 *   hostile_burn_leaf, hostile_burn_outer, main, (libc start)
 *
 * Usage: hostile_burn SECONDS [EXIT_CODE [TERM_CODE [ignored...]]]
 */
#include <signal.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

volatile unsigned long hostile_burn_sink;
static int term_code = -1;

static void on_term(int signal_number) {
    (void)signal_number;
    _exit(term_code);
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

KEEP_FRAME unsigned long hostile_burn_leaf(unsigned long x) {
    for (long i = 0; i < 20000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    hostile_burn_sink = x;
    return x;
}

KEEP_FRAME unsigned long hostile_burn_outer(double seconds) {
    double end = now_seconds() + seconds;
    unsigned long x = 1;
    while (now_seconds() < end)
        x = hostile_burn_leaf(x) + 1;
    return x;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 2.0;
    int exit_code = argc > 2 ? atoi(argv[2]) : 0;
    term_code = argc > 3 ? atoi(argv[3]) : -1;
    if (term_code >= 0)
        signal(SIGTERM, on_term);
    hostile_burn_sink = hostile_burn_outer(seconds);
    return exit_code;
}

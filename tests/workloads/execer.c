/*
 * execer: burns CPU as itself, then execs another program in the same
 * process (same pid), which burns CPU under its own name.
 *
 * Runs execer_burn for SECONDS of its own CPU time (not wall time: on a
 * busy machine a test's load starved it to 64 of its 1,000 samples in one
 * run of the suite; now it takes longer instead, as forker_child does),
 * then execs CHILD_PATH (the forker_child workload: comm "forker_child")
 * asking it to burn for CHILD_MS milliseconds.
 *
 * Expected stacks (innermost first):
 *   before the exec, process "execer": execer_burn, execer_work, main, (libc start)
 *   after the exec, process "forker_child": forker_child_burn, forker_child_work, main, (libc start)
 *
 * Usage: execer SECONDS CHILD_PATH CHILD_MS
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

volatile unsigned long execer_sink;

static double cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

KEEP_FRAME unsigned long execer_burn(unsigned long x) {
    for (long i = 0; i < 20000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    execer_sink = x;
    return x;
}

KEEP_FRAME unsigned long execer_work(double seconds) {
    double end = cpu_seconds() + seconds;
    unsigned long x = 1;
    while (cpu_seconds() < end)
        x = execer_burn(x) + 1;
    return x;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: execer SECONDS CHILD_PATH CHILD_MS\n");
        return 2;
    }
    execer_sink = execer_work(atof(argv[1]));
    char *child_argv[] = {"forker_child", argv[3], NULL};
    execv(argv[2], child_argv);
    perror("execer: execv");
    return 127;
}

/*
 * hostile_forks: CHILDREN children one after another, each burns
 * MICROSECONDS of its own CPU time in hostile_fork_burn and exits. With
 * 1 ms each, no child lives long enough for a per-process 99 Hz sampling
 * counter (a period of 10.1 ms of its CPU time) to fire.
 *
 * Expected stacks (innermost first):
 *   hostile_fork_burn, main, (libc start)
 *
 * Usage: hostile_forks CHILDREN MICROSECONDS
 */
#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

volatile unsigned long hostile_forks_sink;

static double process_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

KEEP_FRAME void hostile_fork_burn(long microseconds) {
    double end = process_cpu_seconds() + microseconds / 1e6;
    while (process_cpu_seconds() < end)
        for (int i = 0; i < 1000; i++)
            hostile_forks_sink += i;
}

int main(int argc, char **argv) {
    int children = argc > 1 ? atoi(argv[1]) : 2000;
    long microseconds = argc > 2 ? atol(argv[2]) : 1000;
    for (int i = 0; i < children; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            hostile_fork_burn(microseconds);
            _exit(0);
        }
        if (pid < 0)
            return 1;
        waitpid(pid, NULL, 0);
    }
    return 0;
}

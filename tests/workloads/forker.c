/*
 * forker: forks and execs short-lived children, over and over.
 *
 * Every round the parent forks a child that execs CHILD_PATH (the
 * forker_child workload: comm "forker_child", its own binary) asking it to
 * burn CPU for 30 ms, and every fourth round also a child that execs
 * /bin/true. The parent burns a little CPU itself, then reaps the children.
 *
 * Expected stacks (innermost first):
 *   parent "forker": forker_parent_burn, main, (libc start)
 *   exec'd children "forker_child": forker_child_burn, forker_child_work, main, (libc start)
 *
 * Usage: forker SECONDS CHILD_PATH, or forker --work N CHILD_PATH (fixed work,
 * for benchmarks: a fixed number of rounds whose children make a fixed number
 * of burn calls, N units of about a second of CPU in all).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

volatile unsigned long forker_sink;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

KEEP_FRAME unsigned long forker_parent_burn(unsigned long x) {
    for (long i = 0; i < 1000000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    forker_sink = x;
    return x;
}

KEEP_FRAME pid_t forker_spawn(const char *path, char *const argv[]) {
    pid_t pid = fork();
    if (pid == 0) {
        execv(path, argv);
        _exit(127);
    }
    return pid;
}

/* `--work N`: N units of about a second of CPU on this project's 2-core VM:
 * rounds of a ~30 ms child (1500 burn calls) and ~1 ms of the parent's. */
#define ROUNDS_PER_WORK_UNIT 30

int main(int argc, char **argv) {
    int fixed = argc > 3 && strcmp(argv[1], "--work") == 0;
    if (argc < 3 || (fixed && argc < 4)) {
        fprintf(stderr, "usage: forker SECONDS CHILD_PATH | forker --work N CHILD_PATH\n");
        return 2;
    }
    long rounds = fixed ? atol(argv[2]) * ROUNDS_PER_WORK_UNIT : 0;
    const char *child_path = fixed ? argv[3] : argv[2];
    double end = fixed ? 0 : now_seconds() + atof(argv[1]);
    char *timed_argv[] = {"forker_child", "30", NULL};
    char *fixed_argv[] = {"forker_child", "--calls", "1500", NULL};
    char **child_argv = fixed ? fixed_argv : timed_argv;
    char *true_argv[] = {"true", NULL};
    unsigned long x = 1;
    for (int round = 0; fixed ? round < rounds : now_seconds() < end; round++) {
        if (forker_spawn(child_path, child_argv) < 0)
            return 1;
        if (round % 4 == 0 && forker_spawn("/bin/true", true_argv) < 0)
            return 1;
        x = forker_parent_burn(x);
        int status;
        while (wait(&status) > 0) {
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                fprintf(stderr, "forker: a child failed (status %d)\n", status);
                return 1;
            }
        }
    }
    forker_sink = x;
    return 0;
}

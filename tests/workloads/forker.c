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
 * Usage: forker SECONDS CHILD_PATH
 */
#include <stdio.h>
#include <stdlib.h>
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

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: forker SECONDS CHILD_PATH\n");
        return 2;
    }
    double end = now_seconds() + atof(argv[1]);
    char *child_argv[] = {"forker_child", "30", NULL};
    char *true_argv[] = {"true", NULL};
    unsigned long x = 1;
    for (int round = 0; now_seconds() < end; round++) {
        if (forker_spawn(argv[2], child_argv) < 0)
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

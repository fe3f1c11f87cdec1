/*
 * churn: processes and libraries coming and going, for the profiler's
 * memory bounds and its handling of short-lived processes.
 *
 * Over SECONDS, evenly spread: PROCESSES children that exec CHILD_PATH (the
 * forker_child workload), each asked to burn 5 ms, every tenth 80 ms; and
 * DLOPEN_CYCLES cycles of dlopen(PLUGIN_PATH), a 3 ms call into it, dlclose
 * (so the library is unmapped and mapped again, often at another address).
 * For every child reaped, one line on stdout: "child PID CPU_MICROSECONDS"
 * (its user + system time from wait4), so that a test knows which children
 * really ran long enough to be sampled.
 *
 * Expected stacks (innermost first):
 *   exec'd children "forker_child": forker_child_burn, forker_child_work, main, (libc start)
 *   parent "churn": churn_plugin_burn, churn_plugin_work, churn_call_plugin, main, (libc start)
 *
 * Usage: churn SECONDS CHILD_PATH PLUGIN_PATH PROCESSES DLOPEN_CYCLES
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static int reap(int options) {
    int status;
    struct rusage usage;
    pid_t pid;
    while ((pid = wait4(-1, &status, options, &usage)) > 0) {
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "churn: child %d failed (status %d)\n", pid, status);
            return -1;
        }
        long micros = usage.ru_utime.tv_sec * 1000000L + usage.ru_utime.tv_usec +
                      usage.ru_stime.tv_sec * 1000000L + usage.ru_stime.tv_usec;
        printf("child %d %ld\n", pid, micros);
    }
    return 0;
}

KEEP_FRAME int churn_call_plugin(const char *path) {
    void *plugin = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!plugin) {
        fprintf(stderr, "churn: dlopen: %s\n", dlerror());
        return -1;
    }
    unsigned long (*work)(double) = (unsigned long (*)(double))dlsym(plugin, "churn_plugin_work");
    if (!work) {
        fprintf(stderr, "churn: dlsym: %s\n", dlerror());
        return -1;
    }
    volatile unsigned long sink = work(0.003);
    (void)sink;
    return dlclose(plugin);
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: churn SECONDS CHILD_PATH PLUGIN_PATH PROCESSES DLOPEN_CYCLES\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    double seconds = atof(argv[1]);
    int processes = atoi(argv[4]), cycles = atoi(argv[5]);
    double start = now_seconds();
    int spawned = 0, called = 0;
    while (spawned < processes || called < cycles) {
        double elapsed = now_seconds() - start;
        if (spawned < processes && elapsed >= seconds * spawned / processes) {
            char milliseconds[8];
            snprintf(milliseconds, sizeof milliseconds, "%d", spawned % 10 == 0 ? 80 : 5);
            char *child_argv[] = {"forker_child", milliseconds, NULL};
            pid_t pid = fork();
            if (pid == 0) {
                execv(argv[2], child_argv);
                _exit(127);
            }
            if (pid < 0)
                return 1;
            spawned++;
        } else if (called < cycles && elapsed >= seconds * called / cycles) {
            if (churn_call_plugin(argv[3]) != 0)
                return 1;
            called++;
        } else {
            if (reap(WNOHANG) != 0)
                return 1;
            usleep(1000);
        }
    }
    return reap(0) == 0 ? 0 : 1;
}

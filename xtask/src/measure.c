/*
 * measure: runs COMMAND, then prints its wall time and CPU time (user +
 * system, of it and of the descendants it waited for) on stderr as
 * `measure: wall_ns=N cpu_ns=N`; exits 0 if COMMAND did.
 *
 * `cargo xtask bench` runs every workload under it. It is a small C
 * program, built without debug information, because the profilers profile
 * it too (it is the command they start): a big binary here would add its
 * symbolization to every tool's CPU and memory.
 *
 * Usage: measure COMMAND [ARGS...]
 */
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: measure COMMAND [ARGS...]\n");
        return 2;
    }
    struct timespec start, end;
    clock_gettime(CLOCK_MONOTONIC, &start);
    pid_t pid = fork();
    if (pid < 0) {
        perror("measure: fork");
        return 1;
    }
    if (pid == 0) {
        execvp(argv[1], argv + 1);
        perror("measure: exec");
        _exit(127);
    }
    int status;
    if (waitpid(pid, &status, 0) < 0) {
        perror("measure: waitpid");
        return 1;
    }
    clock_gettime(CLOCK_MONOTONIC, &end);
    struct rusage usage;
    getrusage(RUSAGE_CHILDREN, &usage);
    long long wall = (end.tv_sec - start.tv_sec) * 1000000000LL + (end.tv_nsec - start.tv_nsec);
    long long cpu = (usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) * 1000000000LL
        + (usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) * 1000LL;
    fprintf(stderr, "measure: wall_ns=%lld cpu_ns=%lld\n", wall, cpu);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
}

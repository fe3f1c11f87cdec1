/*
 * hostile_fifo: maps LIBRARY (dlopen), then puts a FIFO at the library's
 * path (mkfifo beside it, renamed over it) and burns CPU for SECONDS of
 * wall time in the library's hostile_fifo_fn. A profiler that opens the
 * mapped file by its path opens the FIFO, and a plain open of a FIFO waits
 * for a writer that never comes.
 *
 * Expected stacks (innermost first):
 *   hostile_fifo_fn (libhostile_fifo_plugin.so), main, (libc start)
 *
 * Usage: hostile_fifo LIBRARY SECONDS
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <time.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    void *library = dlopen(argv[1], RTLD_NOW);
    if (!library) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    unsigned long (*work)(unsigned long) =
        (unsigned long (*)(unsigned long))dlsym(library, "hostile_fifo_fn");
    if (!work)
        return 1;
    char temporary[4096];
    snprintf(temporary, sizeof temporary, "%s.fifo-tmp", argv[1]);
    if (mkfifo(temporary, 0644) != 0 || rename(temporary, argv[1]) != 0) {
        perror("fifo");
        return 1;
    }
    double end = now_seconds() + atof(argv[2]);
    unsigned long x = 1;
    while (now_seconds() < end)
        x = work(x) + 1;
    return x == 0;
}

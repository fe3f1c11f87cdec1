/*
 * strings_static: a statically linked program (built `-static`) whose hot
 * loop calls glibc's string functions. In a static program those are
 * IFUNCs, called through 8-byte stubs of its `.plt` (`jmp *GOT(%rip)`)
 * that have no CFI; about 5 % of the samples land in a stub on an Intel
 * host, 0.03-0.5 % on an AMD EPYC (Zen 4) one.
 *
 * Expected stacks (innermost first):
 *   __strlen_evex (or another variant) / strlen@plt / memcpy@plt / ...,
 *   strings_static_work, main, __libc_start_call_main, ..., _start
 *
 * Usage: strings_static SECONDS (of its own CPU time)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

KEEP_FRAME size_t strings_static_work(char *a, char *b, size_t n) {
    size_t total = 0;
    for (int i = 0; i < 64; i++) {
        memcpy(b, a, n);
        total += strlen(b);
        memset(a, 'x', n - 1);
    }
    return total;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: strings_static SECONDS\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    char *a = malloc(64), *b = malloc(64);
    memset(a, 'y', 63);
    a[63] = 0;
    struct timespec start, now;
    /* CPU time, not wall time: a busy machine makes the run longer, not
     * its samples fewer. */
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &start);
    size_t total = 0;
    do {
        total += strings_static_work(a, b, 24);
        clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &now);
    } while (now.tv_sec - start.tv_sec + (now.tv_nsec - start.tv_nsec) / 1e9 < seconds);
    printf("%zu\n", total);
    return 0;
}

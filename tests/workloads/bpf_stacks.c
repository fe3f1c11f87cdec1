/* Workload for the BPF engine tests: known call chains, built with
 * `cc -O2 -fomit-frame-pointer -g` so that only DWARF unwinding reaches main.
 *
 *   bpf_stacks chain SECONDS      main -> chain_outer -> chain_middle -> chain_leaf
 *   bpf_stacks recurse SECONDS    main -> recurse x 301 -> chain_leaf (300 deep)
 *   bpf_stacks deep SECONDS       main -> recurse x 601 -> chain_leaf (beyond the
 *                                 512-frame limit)
 *   bpf_stacks syscall SECONDS    main -> chain_outer -> chain_middle -> read_leaf,
 *                                 which spends its time in read(2) of /dev/zero
 *
 * Prints "ready" once running, then burns CPU in the leaf for SECONDS.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <fcntl.h>
#include <unistd.h>

volatile unsigned long sink;

#define NOINLINE __attribute__((noinline, noclone))

NOINLINE void chain_leaf(void) {
    for (unsigned long i = 0; i < 200000; i++)
        sink += i * i;
}

static int syscall_mode;
static int zero_fd = -1;
static char buffer[1 << 20];

/* Most of its time is in the kernel, copying zeroes. */
NOINLINE void read_leaf(void) {
    for (int i = 0; i < 8; i++)
        sink += read(zero_fd, buffer, sizeof buffer);
}

NOINLINE void chain_middle(void) {
    if (syscall_mode)
        read_leaf();
    else
        chain_leaf();
    sink++; /* not a tail call */
}

NOINLINE void chain_outer(void) {
    chain_middle();
    sink++;
}

/* An 80-byte frame per level; the sum after the call keeps it from being a
 * tail call. */
NOINLINE unsigned long recurse(int depth) {
    volatile unsigned long frame[8];
    for (int i = 0; i < 8; i++)
        frame[i] = (unsigned long)depth + i;
    if (depth == 0) {
        chain_leaf();
        return frame[3];
    }
    return recurse(depth - 1) + frame[depth & 7];
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s chain|recurse|deep|syscall SECONDS\n", argv[0]);
        return 2;
    }
    int depth = strcmp(argv[1], "recurse") == 0 ? 300 : strcmp(argv[1], "deep") == 0 ? 600 : 0;
    syscall_mode = strcmp(argv[1], "syscall") == 0;
    zero_fd = open("/dev/zero", O_RDONLY);
    double end = now() + atof(argv[2]);
    printf("ready\n");
    fflush(stdout);
    while (now() < end) {
        if (depth)
            sink += recurse(depth);
        else
            chain_outer();
    }
    return 0;
}

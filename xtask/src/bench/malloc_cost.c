/*
 * malloc_cost: the thread CPU time of COUNT malloc+free pairs (16-271
 * bytes, 64 blocks live at a time), in nanoseconds per pair, for the
 * allocation section of `cargo xtask bench`: run unprofiled and under
 * sALLOC at a mean that samples nothing (the hooks alone) or every
 * allocation (the price of one sample).
 *
 * Usage: malloc_cost COUNT
 * Prints: "ns_per_pair X".
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    long count = argc > 1 ? atol(argv[1]) : 20000000;
    void *blocks[64] = {0};
    struct timespec start, end;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &start);
    for (long i = 0; i < count; i++) {
        int slot = (int)(i & 63);
        free(blocks[slot]);
        blocks[slot] = malloc(16 + (size_t)(i & 255));
    }
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &end);
    for (int slot = 0; slot < 64; slot++)
        free(blocks[slot]);
    double nanos = (end.tv_sec - start.tv_sec) * 1e9 + (end.tv_nsec - start.tv_nsec);
    printf("ns_per_pair %.2f\n", nanos / (double)count);
    return 0;
}

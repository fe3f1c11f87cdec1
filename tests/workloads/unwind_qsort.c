/* main -> qsort (libc) -> compare_keys, over and over: stacks that cross
 * libc's CFI. Prints "ready" once running; runs until killed. */
#include <stdio.h>
#include <stdlib.h>

#define COUNT 200 /* small enough for qsort's on-stack buffer: no malloc */

static volatile unsigned long sink;

__attribute__((noinline, noclone)) static int compare_keys(const void *a, const void *b) {
    unsigned long x = *(const unsigned long *)a, y = *(const unsigned long *)b;
    /* A little work so the callback shows in samples. */
    for (int i = 0; i < 40; i++) {
        x = x * 2862933555777941757UL + 3037000493UL;
        y = y * 2862933555777941757UL + 3037000493UL;
    }
    sink += x ^ y;
    unsigned long ka = *(const unsigned long *)a, kb = *(const unsigned long *)b;
    return (ka > kb) - (ka < kb);
}

__attribute__((noinline, noclone)) static void sort_round(unsigned long *keys, unsigned long seed) {
    for (int i = 0; i < COUNT; i++) {
        seed = seed * 6364136223846793005UL + 1;
        keys[i] = seed >> 11;
    }
    qsort(keys, COUNT, sizeof keys[0], compare_keys);
    sink += keys[0];
}

int main(void) {
    unsigned long keys[COUNT];
    printf("ready\n");
    fflush(stdout);
    for (unsigned long round = 1;; round++)
        sort_round(keys, round);
    return 0;
}

/* main -> recurse x 300 -> spin: deep stacks (about 80-100 bytes a frame)
 * that need more than 8 KiB of copied stack. Prints "ready" once running;
 * runs until killed. */
#include <stdio.h>

#define DEPTH 300

static volatile unsigned long sink;

__attribute__((noinline, noclone)) static unsigned long spin(unsigned long x) {
    for (int i = 0; i < 200000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

__attribute__((noinline, noclone)) static unsigned long recurse(int depth, unsigned long x) {
    volatile unsigned long pad[8];
    pad[0] = x;
    pad[7] = depth;
    unsigned long r = depth == 0 ? spin(x) : recurse(depth - 1, x + pad[7]);
    return r + pad[0];
}

int main(void) {
    printf("ready\n");
    fflush(stdout);
    for (unsigned long i = 0;; i++)
        sink += recurse(DEPTH, i);
    return 0;
}

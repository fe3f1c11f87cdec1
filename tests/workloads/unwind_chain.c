/* A 6-deep call chain main -> chain1 -> ... -> chain6 that spins in the
 * leaf. Built with -O2 -fomit-frame-pointer: only DWARF CFI unwinds it.
 * Prints "ready" once running; runs until killed. */
#include <stdio.h>

static volatile unsigned long sink;

#define NOINLINE __attribute__((noinline, noclone))

NOINLINE unsigned long chain6(unsigned long x) {
    /* The leaf: most samples land here. */
    for (int i = 0; i < 20000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

/* Each level does work after the call so that no call becomes a tail call,
 * and keeps a little state on the stack so frames differ in size. */
#define LEVEL(name, next, pad)                                                 \
    NOINLINE unsigned long name(unsigned long x) {                             \
        volatile unsigned long local[pad];                                     \
        local[0] = x;                                                          \
        unsigned long r = next(x + local[0]);                                  \
        return r ^ local[0];                                                   \
    }

LEVEL(chain5, chain6, 1)
LEVEL(chain4, chain5, 3)
LEVEL(chain3, chain4, 5)
LEVEL(chain2, chain3, 2)
LEVEL(chain1, chain2, 7)

int main(void) {
    printf("ready\n");
    fflush(stdout);
    for (unsigned long i = 0;; i++)
        sink += chain1(i);
    return 0;
}

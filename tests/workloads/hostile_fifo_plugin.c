/*
 * hostile_fifo_plugin: the library hostile_fifo maps, then hides behind a
 * FIFO (built -shared -fPIC, like the other C workloads otherwise).
 *
 * Expected stacks (innermost first): hostile_fifo_fn, then the caller's main.
 */
#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

volatile unsigned long hostile_fifo_sink;

KEEP_FRAME unsigned long hostile_fifo_fn(unsigned long x) {
    for (long i = 0; i < 20000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    hostile_fifo_sink = x;
    return x;
}

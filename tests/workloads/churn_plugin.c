/*
 * churn_plugin: the library churn dlopens, calls and dlcloses (built
 * -shared -fPIC, like the other C workloads otherwise).
 *
 * Expected stacks (innermost first): churn_plugin_burn, churn_plugin_work,
 * then the caller's churn_call_plugin, main.
 */
#include <time.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

volatile unsigned long churn_plugin_sink;

KEEP_FRAME unsigned long churn_plugin_burn(unsigned long x) {
    for (long i = 0; i < 20000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    churn_plugin_sink = x;
    return x;
}

KEEP_FRAME unsigned long churn_plugin_work(double seconds) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    double end = ts.tv_sec + ts.tv_nsec / 1e9 + seconds;
    unsigned long x = 1;
    for (;;) {
        x = churn_plugin_burn(x) + 1;
        clock_gettime(CLOCK_MONOTONIC, &ts);
        if (ts.tv_sec + ts.tv_nsec / 1e9 >= end)
            return x;
    }
}

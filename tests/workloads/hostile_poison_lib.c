/*
 * hostile_poison_lib: two different libraries that the tests build with the
 * same GNU build id (-Wl,--build-id=0x...) and pad to the same size.
 * -DVARIANT_A names its code ALPHA_*, -DVARIANT_B names it BETA_*. The
 * leaves are the same code at the same offset; B's middle frame keeps an
 * 8 KiB array (another CFA than A's code at the same offsets). The
 * executable segment ends at a page boundary in both, so that both have the
 * same segments too. Built by the test itself, not by build_workload.
 *
 * Expected stacks (innermost first):
 *   A: ALPHA_leaf, ALPHA_mid, entry, then the caller's main
 *   B: BETA_leaf, BETA_mid, entry, then the caller's main
 */
#include <time.h>

volatile unsigned long hostile_poison_sink;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

#ifdef VARIANT_A
__attribute__((noinline)) void ALPHA_leaf(double seconds) {
    double end = now_seconds() + seconds;
    while (now_seconds() < end)
        for (unsigned long i = 0; i < 20000; i++)
            hostile_poison_sink += i * i;
}
__attribute__((noinline)) void ALPHA_mid(double seconds) {
    ALPHA_leaf(seconds);
    __asm__ volatile("");
}
void entry(double seconds) {
    ALPHA_mid(seconds);
    __asm__ volatile("");
}
#else
__attribute__((noinline)) void BETA_leaf(double seconds) {
    double end = now_seconds() + seconds;
    while (now_seconds() < end)
        for (unsigned long i = 0; i < 20000; i++)
            hostile_poison_sink += i * i;
}
__attribute__((noinline)) void BETA_mid(double seconds) {
    volatile char big[8192];
    big[0] = 1;
    big[8191] = 2;
    BETA_leaf(seconds + big[0] - 1);
    __asm__ volatile("");
}
void entry(double seconds) {
    BETA_mid(seconds);
    __asm__ volatile("");
}
#endif

/* Ends .text at the same page boundary in both variants. */
__asm__(".section .text.zz_end,\"ax\",@progbits\n.p2align 12\nret\n.previous");

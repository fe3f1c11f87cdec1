/* Workload for tests/output.rs: a known call chain on two threads.
 *
 *   main / output_worker_main -> output_outer -> output_middle -> output_leaf
 *     -> output_mix (always inlined into output_leaf) -> output_hot
 *
 * The test finds these functions in the symbol table and builds stacks from
 * their call sites; the LINE_* markers let it find the expected source lines.
 *
 * With the argument `jit`, it also maps one anonymous executable page, as a
 * JIT compiler would, and names it in /tmp/perf-PID.map.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

static volatile unsigned long sink;

__attribute__((noinline)) unsigned long output_hot(unsigned long x) {
    for (int i = 0; i < 64; i++)
        x = x * 6364136223846793005ul + 1442695040888963407ul;
    sink = x;
    return x;
}

static inline __attribute__((always_inline)) unsigned long output_mix(unsigned long x) {
    return output_hot(x ^ 0x9e3779b97f4a7c15ul) >> 3; /* LINE_MIX_CALLS_HOT */
}

__attribute__((noinline)) unsigned long output_leaf(unsigned long n) {
    unsigned long acc = 0;
    for (unsigned long i = 0; i < n; i++)
        acc += output_mix(i + acc); /* LINE_LEAF_CALLS_MIX */
    return acc;
}

__attribute__((noinline)) unsigned long output_middle(unsigned long n) {
    return output_leaf(n) + 1; /* LINE_MIDDLE_CALLS_LEAF */
}

__attribute__((noinline)) unsigned long output_outer(unsigned long n) {
    return output_middle(n) * 3; /* LINE_OUTER_CALLS_MIDDLE */
}

__attribute__((noinline)) void *output_worker_main(void *arg) {
    (void)arg;
    for (;;)
        sink += output_outer(100000); /* LINE_WORKER_CALLS_OUTER */
    return 0;
}

/* Maps an executable page holding `ret` and describes it in the perf map. */
static int output_fake_jit(void) {
    unsigned char *code = mmap(0, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (code == MAP_FAILED)
        return -1;
    memset(code, 0xc3, 4096);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
    FILE *map = fopen(path, "w");
    if (!map)
        return -1;
    fprintf(map, "%lx 100 output_jit_stub\n", (unsigned long)code);
    return fclose(map);
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "jit") == 0 && output_fake_jit() != 0)
        return 2;
    pthread_t worker;
    if (pthread_create(&worker, 0, output_worker_main, 0) != 0)
        return 1;
    pthread_setname_np(worker, "output_worker");
    for (;;)
        sink += output_outer(100000); /* LINE_MAIN_CALLS_OUTER */
}

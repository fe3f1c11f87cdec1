/*
 * signal_allocs: allocates in a loop while a SIGPROF handler (every 1 ms
 * of CPU) allocates too, for the sALLOC re-entrancy test: a signal that
 * lands inside ddprof's malloc or free hook re-enters it from the handler.
 * Run it with an allocator that is safe in a handler after ddprof's
 * library (libsignal_safe_alloc_plugin.so): glibc's malloc is not.
 *
 *   main_allocs     malloc + free, 16-271 bytes, MILLIONS of them
 *   handler_allocs  256 mallocs + frees of 4-64 KiB per signal
 * Prints "total FUNCTION BYTES COUNT" for both, "signals N" and
 * "interrupted_in_hooks N": the signals whose interrupted instruction was
 * inside the malloc or free that the program's calls bind to (ddprof's
 * hooks when it is preloaded first).
 *
 * Usage: signal_allocs MILLIONS
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>
#include <ucontext.h>

#include "allocation_workload.h"

static struct totals handler_totals;
static volatile unsigned long long signals, interrupted_in_hooks;
static uintptr_t hooks[2][2];
static uint64_t handler_seed = 777;

KEEP_FRAME void handler_allocs(struct totals *t) {
    for (int i = 0; i < 256; i++) {
        size_t size = 4096 + lcg(&handler_seed) % 61441;
        char *p = malloc(size);
        if (!p)
            abort();
        p[0] = p[size - 1] = 1;
        allocations_sink = p;
        free(p);
        t->bytes += size;
        t->count++;
    }
}

static void on_sigprof(int signal, siginfo_t *info, void *context) {
    (void)signal;
    (void)info;
    uintptr_t pc = (uintptr_t)((ucontext_t *)context)->uc_mcontext.gregs[REG_RIP];
    for (int i = 0; i < 2; i++)
        if (pc >= hooks[i][0] && pc < hooks[i][1])
            interrupted_in_hooks++;
    signals++;
    handler_allocs(&handler_totals);
}

KEEP_FRAME void main_allocs(unsigned long long allocations, uint64_t *seed, struct totals *t) {
    while (t->count < allocations) {
        size_t size = 16 + lcg(seed) % 256;
        char *p = malloc(size);
        if (!p)
            abort();
        p[0] = p[size - 1] = 1;
        allocations_sink = p;
        free(p);
        t->bytes += size;
        t->count++;
    }
}

/* [start, end) of the function `name` binds to in the global scope. */
static void function_range(const char *name, uintptr_t range[2]) {
    void *address = dlsym(RTLD_DEFAULT, name);
    Dl_info info;
    const ElfW(Sym) *symbol = NULL;
    if (address && dladdr1(address, &info, (void **)&symbol, RTLD_DL_SYMENT) && symbol) {
        range[0] = (uintptr_t)address;
        range[1] = (uintptr_t)address + symbol->st_size;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: signal_allocs MILLIONS\n");
        return 2;
    }
    function_range("malloc", hooks[0]);
    function_range("free", hooks[1]);
    struct sigaction action = {0};
    action.sa_sigaction = on_sigprof;
    action.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&action.sa_mask);
    sigaction(SIGPROF, &action, NULL);
    struct itimerval every_ms = {{0, 1000}, {0, 1000}};
    setitimer(ITIMER_PROF, &every_ms, NULL);
    unsigned long long allocations = strtoull(argv[1], NULL, 10) * 1000000;
    uint64_t seed = 12345;
    struct totals main_totals = {0};
    main_allocs(allocations, &seed, &main_totals);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    printf("total main_allocs %llu %llu\n", main_totals.bytes, main_totals.count);
    printf("total handler_allocs %llu %llu\n", handler_totals.bytes, handler_totals.count);
    printf("signals %llu\n", signals);
    printf("interrupted_in_hooks %llu\n", interrupted_in_hooks);
    return 0;
}

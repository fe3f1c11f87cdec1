/*
 * jemalloc_allocx: allocates with jemalloc's own API only, as a program
 * linked with jemalloc calls it, and prints the exact totals, for the
 * sALLOC tests. The functions are looked up in the global scope
 * (RTLD_DEFAULT), where a program's own references bind: jemalloc's when it
 * is preloaded, or ddprof's library's, which also serves them without
 * jemalloc.
 *
 *   with_mallocx  mallocx(64-byte aligned, zeroed), 256 B-4 KiB, sdallocx
 *   with_rallocx  mallocx 64 KiB, rallocx to 1 MiB, dallocx (both sizes
 *                 count, as the sampler sees two allocations)
 * each with half of MEGABYTES, called from `main`. Every block is freed;
 * the alignment and the zeroing are checked (abort otherwise).
 *
 * Usage: jemalloc_allocx MEGABYTES
 * Prints, per function: "total FUNCTION BYTES COUNT"; exits 3 when no
 * mallocx is found.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "allocation_workload.h"

#define MALLOCX_LG_ALIGN(la) ((int)(la))
#define MALLOCX_ZERO ((int)0x40)

static void *(*mallocx_)(size_t, int);
static void *(*rallocx_)(void *, size_t, int);
static void (*dallocx_)(void *, int);
static void (*sdallocx_)(void *, size_t, int);

KEEP_FRAME void with_mallocx(unsigned long long budget, uint64_t *seed, struct totals *t) {
    int flags = MALLOCX_LG_ALIGN(6) | MALLOCX_ZERO;
    while (t->bytes < budget) {
        size_t size = 256 + lcg(seed) % 3841;
        unsigned char *p = mallocx_(size, flags);
        if (!p || (uintptr_t)p % 64 != 0 || p[0] != 0 || p[size - 1] != 0)
            abort();
        touch(p, size);
        sdallocx_(p, size, flags);
        t->bytes += size;
        t->count++;
    }
}

KEEP_FRAME void with_rallocx(unsigned long long budget, struct totals *t) {
    while (t->bytes < budget) {
        char *p = mallocx_(64 << 10, 0);
        if (!p)
            abort();
        touch(p, 64 << 10);
        char *q = rallocx_(p, 1 << 20, 0);
        if (!q || q[(64 << 10) - 1] != (char)((64 << 10) - 1))
            abort();
        touch(q, 1 << 20);
        dallocx_(q, 0);
        t->bytes += (64 << 10) + (1 << 20);
        t->count += 2;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: jemalloc_allocx MEGABYTES\n");
        return 2;
    }
    mallocx_ = (void *(*)(size_t, int))dlsym(RTLD_DEFAULT, "mallocx");
    rallocx_ = (void *(*)(void *, size_t, int))dlsym(RTLD_DEFAULT, "rallocx");
    dallocx_ = (void (*)(void *, int))dlsym(RTLD_DEFAULT, "dallocx");
    sdallocx_ = (void (*)(void *, size_t, int))dlsym(RTLD_DEFAULT, "sdallocx");
    if (!mallocx_ || !rallocx_ || !dallocx_ || !sdallocx_) {
        fprintf(stderr, "no mallocx: not jemalloc\n");
        return 3;
    }
    unsigned long long total = strtoull(argv[1], NULL, 10) << 20;
    uint64_t seed = 12345;
    struct totals mallocx_totals = {0}, rallocx_totals = {0};
    with_mallocx(total / 2, &seed, &mallocx_totals);
    with_rallocx(total / 2, &rallocx_totals);
    printf("total with_mallocx %llu %llu\n", mallocx_totals.bytes, mallocx_totals.count);
    printf("total with_rallocx %llu %llu\n", rallocx_totals.bytes, rallocx_totals.count);
    return 0;
}

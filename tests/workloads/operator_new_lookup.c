/*
 * operator_new_lookup: a C program without libstdc++ that calls C++'s
 * operator new and delete found in the global scope (RTLD_DEFAULT), as a
 * library loaded RTLD_LOCAL with its own libstdc++ has its calls bound to
 * the first definitions there: under ddprof's sALLOC, its library's hooks,
 * with no next definition to forward to. For the sALLOC tests.
 *
 *   with_new          _Znwm / _ZdlPv, 64-4,159 bytes
 *   with_aligned_new  _ZnwmSt11align_val_t / _ZdlPvSt11align_val_t,
 *                     256-byte aligned, 1-64 KiB (alignment checked)
 * each with half of MEGABYTES, called from `main`.
 *
 * Usage: operator_new_lookup MEGABYTES
 * Prints "total FUNCTION BYTES COUNT"; exits 3 when no operator is found
 * (run alone: nothing defines them).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "allocation_workload.h"

static void *(*new_)(size_t);
static void (*delete_)(void *);
static void *(*aligned_new)(size_t, size_t);
static void (*aligned_delete)(void *, size_t);

KEEP_FRAME void with_new(unsigned long long budget, uint64_t *seed, struct totals *t) {
    while (t->bytes < budget) {
        size_t size = 64 + lcg(seed) % 4096;
        char *p = new_(size);
        if (!p)
            abort();
        touch(p, size);
        delete_(p);
        t->bytes += size;
        t->count++;
    }
}

KEEP_FRAME void with_aligned_new(unsigned long long budget, uint64_t *seed, struct totals *t) {
    while (t->bytes < budget) {
        size_t size = 1024 + lcg(seed) % 64513;
        char *p = aligned_new(size, 256);
        if (!p || (uintptr_t)p % 256 != 0)
            abort();
        touch(p, size);
        aligned_delete(p, 256);
        t->bytes += size;
        t->count++;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: operator_new_lookup MEGABYTES\n");
        return 2;
    }
    new_ = (void *(*)(size_t))dlsym(RTLD_DEFAULT, "_Znwm");
    delete_ = (void (*)(void *))dlsym(RTLD_DEFAULT, "_ZdlPv");
    aligned_new = (void *(*)(size_t, size_t))dlsym(RTLD_DEFAULT, "_ZnwmSt11align_val_t");
    aligned_delete = (void (*)(void *, size_t))dlsym(RTLD_DEFAULT, "_ZdlPvSt11align_val_t");
    if (!new_ || !delete_ || !aligned_new || !aligned_delete) {
        fprintf(stderr, "no operator new in the global scope\n");
        return 3;
    }
    unsigned long long total = strtoull(argv[1], NULL, 10) << 20;
    uint64_t seed = 12345;
    struct totals plain = {0}, aligned = {0};
    with_new(total / 2, &seed, &plain);
    with_aligned_new(total / 2, &seed, &aligned);
    printf("total with_new %llu %llu\n", plain.bytes, plain.count);
    printf("total with_aligned_new %llu %llu\n", aligned.bytes, aligned.count);
    return 0;
}

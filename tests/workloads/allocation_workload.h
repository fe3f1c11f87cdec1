/*
 * What the allocation workloads (allocations.c, cxx_allocs.cpp,
 * jemalloc_allocx.c, mappings.c, operator_new_lookup.c, signal_allocs.c)
 * share: the frame-keeping attribute of their allocating functions, their
 * exact totals, the generator of their sizes, and the way they use what
 * they allocate. C and C++ alike; each program includes it once.
 */
#ifndef ALLOCATION_WORKLOAD_H
#define ALLOCATION_WORKLOAD_H

#include <stddef.h>
#include <stdint.h>

/* A function that must keep its own frame: it is the leaf the sALLOC
 * tests look for. */
#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

/* What a function allocated: bytes and allocations, as the sampler sees
 * them. */
struct totals {
    unsigned long long bytes, count;
};

/* A linear congruential generator: the same sizes every run. */
static inline uint64_t lcg(uint64_t *state) {
    *state = *state * 6364136223846793005ull + 1442695040888963407ull;
    return *state >> 33;
}

/* The pointer escapes (a compiler may otherwise drop an allocation and
 * its free), and every byte is written, as a program uses what it
 * allocates (which also keeps the sampling rate one the allocation ring
 * holds: 1 GiB in 28 ms overflowed it). */
void *volatile allocations_sink;

static inline void touch(void *p, size_t size) {
    for (size_t i = 0; i < size; i++)
        ((volatile char *)p)[i] = (char)i;
    allocations_sink = p;
}

#endif

/*
 * libshipped_plugin.so: a library shipped with the provenance workload
 * (not the system's), with one hot function of its own.
 */
#include <stdint.h>

__attribute__((noinline)) uint64_t shipped_work(uint64_t rounds) {
    volatile uint64_t x = 1;
    for (uint64_t i = 0; i < rounds; i++)
        x = x * 6364136223846793005ull + i;
    return x;
}

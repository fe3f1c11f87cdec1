// cxx_allocs: allocates with C++'s operators new and delete only, in known
// functions, and prints the exact totals, for the sALLOC tests: under an
// allocator that defines its own operator new (tcmalloc, jemalloc,
// mimalloc), none of these allocations goes through malloc.
//
//   new_arrays       new char[] / delete[], 64-256 bytes   (_Znam, _ZdaPv)
//   new_objects      new Node / sized delete, 192 bytes    (_Znwm, _ZdlPvm)
//   aligned_objects  new of an alignas(64) type, 1 KiB     (_ZnwmSt11align_val_t)
//   nothrow_arrays   new (std::nothrow) char[], 1-3 MiB    (_ZnamRKSt9nothrow_t)
// each with a share of MEGABYTES (20/30/20/30 %), called from `main`. Every
// block is deleted. Before them, with `throw`, ten `new char[SIZE_MAX / 4]`
// throw std::bad_alloc, caught ("bad_alloc 10").
//
// Usage: cxx_allocs MEGABYTES [throw]
// Prints, per function: "total FUNCTION BYTES COUNT".
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>

#include "allocation_workload.h"

struct Node {
    char bytes[192];
};

struct alignas(64) Aligned {
    char bytes[1024];
};

extern "C" KEEP_FRAME void new_arrays(unsigned long long budget, uint64_t *seed, totals *t) {
    while (t->bytes < budget) {
        size_t size = 64 + lcg(seed) % 193;
        char *p = new char[size];
        touch(p, size);
        delete[] p;
        t->bytes += size;
        t->count++;
    }
}

extern "C" KEEP_FRAME void new_objects(unsigned long long budget, totals *t) {
    while (t->bytes < budget) {
        Node *node = new Node;
        touch(node, sizeof *node);
        delete node;
        t->bytes += sizeof(Node);
        t->count++;
    }
}

extern "C" KEEP_FRAME void aligned_objects(unsigned long long budget, totals *t) {
    while (t->bytes < budget) {
        Aligned *block = new Aligned;
        if (reinterpret_cast<uintptr_t>(block) % alignof(Aligned) != 0)
            std::abort();
        touch(block, sizeof *block);
        delete block;
        t->bytes += sizeof(Aligned);
        t->count++;
    }
}

extern "C" KEEP_FRAME void nothrow_arrays(unsigned long long budget, uint64_t *seed,
                                          totals *t) {
    while (t->bytes < budget) {
        size_t size = (1 + lcg(seed) % 3) << 20;
        char *p = new (std::nothrow) char[size];
        if (!p)
            std::abort();
        touch(p, size);
        delete[] p;
        t->bytes += size;
        t->count++;
    }
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        std::fprintf(stderr, "usage: cxx_allocs MEGABYTES [throw]\n");
        return 2;
    }
    // First (with "throw"), ten allocations that throw std::bad_alloc
    // through the hooks (out of address space): the thread must go on being
    // sampled after. (mimalloc, built as C, aborts there instead.)
    volatile size_t huge = SIZE_MAX / 4;
    int caught = 0;
    for (int i = 0; i < (argc > 2 ? 10 : 0); i++) {
        try {
            char *p = new char[huge];
            allocations_sink = p;
        } catch (const std::bad_alloc &) {
            caught++;
        }
    }
    std::printf("bad_alloc %d\n", caught);
    unsigned long long total = std::strtoull(argv[1], nullptr, 10) << 20;
    uint64_t seed = 12345;
    totals arrays{}, objects{}, aligned{}, nothrow{};
    new_arrays(total / 5, &seed, &arrays);
    new_objects(total * 3 / 10, &objects);
    aligned_objects(total / 5, &aligned);
    nothrow_arrays(total * 3 / 10, &seed, &nothrow);
    std::printf("total new_arrays %llu %llu\n", arrays.bytes, arrays.count);
    std::printf("total new_objects %llu %llu\n", objects.bytes, objects.count);
    std::printf("total aligned_objects %llu %llu\n", aligned.bytes, aligned.count);
    std::printf("total nothrow_arrays %llu %llu\n", nothrow.bytes, nothrow.count);
    return 0;
}

/*
 * mappings: memory a program maps for itself, for the sALLOC test of the
 * mmap, mmap64, munmap and mremap hooks.
 *
 *   map_buffers    anonymous mmaps of 64 KiB-2 MiB, each unmapped
 *   map_and_keep   32 anonymous mmap64s of 4 MiB (first round), kept to the end
 *   remap_buffers  a 1 MiB mmap grown to 3 MiB by mremap (moved), then
 *                  unmapped (the mmap counts; what mremap grows is not
 *                  sampled)
 *   trim_and_keep  16 anonymous mmaps of 6 MiB (first round), their first
 *                  and last MiB unmapped (as an allocator trims a mapping
 *                  to an alignment), the middle 4 MiB kept to the end
 *   cut_and_keep   16 anonymous mmaps of 4 MiB (first round), their last
 *                  3 MiB unmapped, the first MiB kept to the end
 *   move_and_keep  8 anonymous mmaps of 4 MiB (first round) moved by mremap
 *                  over a reservation, or over the first half of another
 *                  anonymous mmap of 8 MiB (which the move replaces: its second
 *                  half is kept), shrunk to 3 MiB, kept to the end
 *   map_then_replace  8 anonymous mmaps of 4 MiB (first round) replaced
 *                  by MAP_FIXED mappings at their addresses, kept to the
 *                  end (the mmaps count, then are freed by the replacement)
 *   malloc_blocks  mallocs and frees of 1-64 KiB, for proportions
 *   map_files      file mappings of this program (not allocations)
 *   map_at_hint    anonymous mmaps at an address the program chose (it
 *                  manages that space: not allocations), unmapped
 *   reserve_space  a 256 MiB PROT_NONE reservation (first round), kept:
 *                  address space, not memory
 * Every allocated byte is written, as a program uses what it allocates.
 * Prints "total FUNCTION BYTES COUNT" for the functions that allocate,
 * "held FUNCTION BYTES" for those that keep memory to the end, and
 * "kept BYTES" (all they keep).
 *
 * Usage: mappings ROUNDS
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include "allocation_workload.h"

static uint64_t seed = 4242;

/* A macro, not a function: the caller of mmap is the function the test
 * looks for. */
#define ANONYMOUS(p, size)                                                                         \
    do {                                                                                           \
        p = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);          \
        if (p == MAP_FAILED)                                                                       \
            abort();                                                                               \
    } while (0)

KEEP_FRAME void map_buffers(struct totals *t) {
    for (int i = 0; i < 64; i++) {
        size_t size = (size_t)(16 + lcg(&seed) % 497) * 4096;
        char *p;
        ANONYMOUS(p, size);
        touch(p, size);
        munmap(p, size);
        t->bytes += size;
        t->count++;
    }
}

KEEP_FRAME void *map_and_keep(struct totals *t) {
    size_t size = 4 << 20;
    void *p = mmap64(NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED)
        abort();
    t->bytes += size;
    t->count++;
    return p;
}

KEEP_FRAME void remap_buffers(struct totals *t) {
    for (int i = 0; i < 8; i++) {
        size_t size = 1 << 20, grown = 3 << 20;
        char *p;
        ANONYMOUS(p, size);
        touch(p, size);
        char *q = mremap(p, size, grown, MREMAP_MAYMOVE);
        if (q == MAP_FAILED)
            abort();
        touch(q, grown);
        munmap(q, grown);
        t->bytes += size;
        t->count++;
    }
}

/* What a keeper function mapped (`size`) and keeps of it to the end. */
#define KEPT(t, held, size, kept)                                                                  \
    do {                                                                                           \
        (t)->bytes += (size);                                                                      \
        (t)->count++;                                                                              \
        *(held) += (kept);                                                                         \
    } while (0)

KEEP_FRAME void trim_and_keep(struct totals *t, unsigned long long *held) {
    for (int i = 0; i < 16; i++) {
        size_t size = 6 << 20, mib = 1 << 20;
        char *p;
        ANONYMOUS(p, size);
        touch(p + mib, 4096);
        munmap(p, mib);
        munmap(p + 5 * mib, mib);
        allocations_sink = p + mib;
        KEPT(t, held, size, 4 * mib);
    }
}

KEEP_FRAME void cut_and_keep(struct totals *t, unsigned long long *held) {
    for (int i = 0; i < 16; i++) {
        size_t size = 4 << 20, mib = 1 << 20;
        char *p;
        ANONYMOUS(p, size);
        touch(p, 4096);
        munmap(p + mib, 3 * mib);
        allocations_sink = p;
        KEPT(t, held, size, mib);
    }
}

KEEP_FRAME void move_and_keep(struct totals *t, unsigned long long *held) {
    for (int i = 0; i < 8; i++) {
        size_t size = 4 << 20, kept = 3 << 20;
        char *p;
        ANONYMOUS(p, size);
        touch(p, 4096);
        /* Moved over a reservation (not sampled) or over the first half of
         * a mapping of its own (sampled; that half is gone once replaced),
         * then shrunk in place. */
        char *place;
        if (i % 2) {
            ANONYMOUS(place, 2 * size);
            KEPT(t, held, 2 * size, size);
        } else {
            place = mmap(NULL, size, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (place == MAP_FAILED)
                abort();
        }
        char *q = mremap(p, size, size, MREMAP_MAYMOVE | MREMAP_FIXED, place);
        if (q != place || mremap(q, size, kept, 0) != q)
            abort();
        allocations_sink = q;
        KEPT(t, held, size, kept);
    }
}

KEEP_FRAME void map_then_replace(struct totals *t) {
    for (int i = 0; i < 8; i++) {
        size_t size = 4 << 20;
        char *p;
        ANONYMOUS(p, size);
        touch(p, 4096);
        t->bytes += size;
        t->count++;
        void *q = mmap(p, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (q != p)
            abort();
        allocations_sink = q;
    }
}

KEEP_FRAME void reserve_space(void) {
    void *p = mmap(NULL, 256 << 20, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        abort();
    allocations_sink = p;
}

KEEP_FRAME void malloc_blocks(struct totals *t) {
    for (int i = 0; i < 2000; i++) {
        size_t size = 1024 + lcg(&seed) % 64512;
        char *p = malloc(size);
        if (!p)
            abort();
        touch(p, size);
        free(p);
        t->bytes += size;
        t->count++;
    }
}

KEEP_FRAME void map_files(const char *self) {
    int fd = open(self, O_RDONLY);
    if (fd < 0)
        abort();
    for (int i = 0; i < 64; i++) {
        void *p = mmap(NULL, 4096, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED)
            abort();
        allocations_sink = p;
        munmap(p, 4096);
    }
    close(fd);
}

KEEP_FRAME void map_at_hint(void) {
    for (int i = 0; i < 64; i++) {
        size_t size = 2 << 20;
        void *hint = (void *)(uintptr_t)(0x200000000000ull + ((uint64_t)i << 22));
        void *p = mmap(hint, size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            abort();
        allocations_sink = p;
        munmap(p, size);
    }
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 10;
    struct totals mapped = {0}, kept = {0}, remapped = {0}, malloced = {0}, replaced = {0};
    struct totals trimmed = {0}, cut = {0}, moved = {0};
    unsigned long long trimmed_held = 0, cut_held = 0, moved_held = 0;
    for (int round = 0; round < rounds; round++) {
        map_buffers(&mapped);
        for (int i = 0; round == 0 && i < 32; i++)
            allocations_sink = map_and_keep(&kept);
        if (round == 0) {
            map_then_replace(&replaced);
            reserve_space();
            trim_and_keep(&trimmed, &trimmed_held);
            cut_and_keep(&cut, &cut_held);
            move_and_keep(&moved, &moved_held);
        }
        remap_buffers(&remapped);
        malloc_blocks(&malloced);
        map_files(argv[0]);
        map_at_hint();
    }
    printf("total map_buffers %llu %llu\n", mapped.bytes, mapped.count);
    printf("total map_and_keep %llu %llu\n", kept.bytes, kept.count);
    printf("total remap_buffers %llu %llu\n", remapped.bytes, remapped.count);
    printf("total malloc_blocks %llu %llu\n", malloced.bytes, malloced.count);
    printf("total map_then_replace %llu %llu\n", replaced.bytes, replaced.count);
    printf("total trim_and_keep %llu %llu\n", trimmed.bytes, trimmed.count);
    printf("total cut_and_keep %llu %llu\n", cut.bytes, cut.count);
    printf("total move_and_keep %llu %llu\n", moved.bytes, moved.count);
    printf("held map_and_keep %llu\n", kept.bytes);
    printf("held trim_and_keep %llu\n", trimmed_held);
    printf("held cut_and_keep %llu\n", cut_held);
    printf("held move_and_keep %llu\n", moved_held);
    printf("kept %llu\n", kept.bytes + trimmed_held + cut_held + moved_held);
    return 0;
}

/*
 * libsignal_safe_alloc_plugin.so: an allocator that is safe to call from a
 * signal handler (a stack in 1 GiB of address space reserved at first use:
 * an allocation moves the top up by an atomic add; a free moves it back
 * down by a compare-and-swap if the block is the top one, else leaves the
 * block where it is), preloaded after ddprof's library by the sALLOC
 * signal-handler test, so that a handler interrupting a hook and
 * allocating again tests the hooks' re-entrancy, not glibc's malloc (which
 * is not async-signal-safe). A program that frees what it allocates in
 * turn, as the test's does, reuses the same memory (no page faults). Each
 * block has the top before and after it and its size in the 32 bytes
 * before it.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <errno.h>
#include <sys/mman.h>

#define REGION (1ull << 30)

static char *volatile base;
static size_t used;

static char *region(void) {
    char *current = __atomic_load_n(&base, __ATOMIC_ACQUIRE);
    if (current)
        return current;
    char *mapped = mmap(NULL, REGION, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (mapped == MAP_FAILED)
        return NULL;
    char *expected = NULL;
    if (!__atomic_compare_exchange_n(&base, &expected, mapped, 0, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE)) {
        munmap(mapped, REGION);
        return expected;
    }
    return mapped;
}

static void *bump(size_t size, size_t alignment) {
    char *start = region();
    if (!start || size > REGION || alignment > 4096)
        return NULL;
    size_t need = ((size + 15) & ~(size_t)15) + 32 + alignment;
    size_t offset = __atomic_fetch_add(&used, need, __ATOMIC_RELAXED);
    if (offset + need > REGION)
        return NULL;
    uintptr_t block = (uintptr_t)start + offset + 32;
    if (alignment > 16)
        block = (block + alignment - 1) & ~(uintptr_t)(alignment - 1);
    ((size_t *)block)[-4] = offset;
    ((size_t *)block)[-3] = offset + need;
    ((size_t *)block)[-2] = size;
    return (void *)block;
}

void *malloc(size_t size) { return bump(size, 16); }

void free(void *pointer) {
    if (!pointer)
        return;
    size_t after = ((size_t *)pointer)[-3];
    __atomic_compare_exchange_n(&used, &after, ((size_t *)pointer)[-4], 0, __ATOMIC_RELAXED,
                                __ATOMIC_RELAXED);
}

void *calloc(size_t count, size_t size) {
    size_t bytes;
    if (__builtin_mul_overflow(count, size, &bytes))
        return NULL;
    void *pointer = bump(bytes, 16);
    if (pointer)
        memset(pointer, 0, bytes);
    return pointer;
}

void *realloc(void *old, size_t size) {
    void *pointer = bump(size, 16);
    if (pointer && old) {
        size_t before = ((size_t *)old)[-2];
        memcpy(pointer, old, before < size ? before : size);
    }
    return pointer;
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    void *pointer = bump(size, alignment);
    if (!pointer)
        return ENOMEM;
    *out = pointer;
    return 0;
}

void *aligned_alloc(size_t alignment, size_t size) { return bump(size, alignment); }

void *memalign(size_t alignment, size_t size) { return bump(size, alignment); }

size_t malloc_usable_size(void *pointer) { return pointer ? ((size_t *)pointer)[-2] : 0; }

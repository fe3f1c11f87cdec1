/*
 * The allocation sampler ddprof preloads into the command it wraps (sALLOC).
 *
 * It only samples: it forwards every call to the allocator the program would
 * have used (the next definition in the lookup order: glibc's, or jemalloc's,
 * tcmalloc's, mimalloc's when the program links one; C++'s operators new and
 * delete too, which those allocators define without malloc), and for each sampled
 * allocation calls ddprof_sampled_allocation(size, address). ddprof defines
 * a uprobe on that function (in tracefs) and opens it as a perf event on
 * every CPU, so the kernel takes the sample there: registers and a user-stack copy, unwound by ddprof as a
 * CPU sample is. Anonymous memory it maps for itself (mmap, mmap64,
 * munmap) is sampled as allocations are. This library copies no
 * stack, writes no buffer, opens no file and takes no lock. With no event on the function (the profiler gone),
 * the call costs a few instructions.
 *
 * With DDPROF_ALLOC_LIVE=1 (sALLOC mode=l) it also remembers the addresses
 * it sampled, in a fixed table of its own (2 MiB, mapped at load), and calls
 * ddprof_sampled_free(address, 0, 0) when one of them is freed (or moved by
 * realloc), before the allocator may hand the address out again; the
 * mappings it sampled are followed in a table of their own (see
 * `mappings`). An allocation the table has no room for is reported with
 * address 0: sampled (alloc-space), not followed (ddprof counts it).
 *
 * Sampling is by bytes, a Poisson process of mean DDPROF_ALLOC_MEAN bytes
 * (512 KiB by default): each thread counts down an exponentially distributed
 * number of bytes; the allocation that crosses zero is sampled. An allocation
 * of size s is then sampled with probability 1 - exp(-s/mean), which ddprof
 * divides by to weigh it.
 *
 * Constraints, because it runs inside every allocation of someone else's
 * program:
 * - no libc call on the allocation path (only thread-local arithmetic);
 * - re-entrancy: dlsym may allocate while the next allocator is looked up;
 *   those few allocations come from a static arena and are never freed;
 * - initial-exec TLS: no allocation, no lock on a thread's first access;
 * - glibc symbol versions no newer than the first (x86-64: GLIBC_2.2.5,
 *   arm64: GLIBC_2.17), so the library loads into programs built against
 *   any glibc.
 */
#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define HIDDEN __attribute__((visibility("hidden")))
#define TLS __thread __attribute__((tls_model("initial-exec")))

/* The oldest symbol version each architecture's glibc has (x86-64's
 * first glibc, 2.2.5; arm64's, 2.17). */
#if defined(__x86_64__)
#define GLIBC_BASE "GLIBC_2.2.5"
#elif defined(__aarch64__)
#define GLIBC_BASE "GLIBC_2.17"
#else
#error "ddprof's allocation sampler supports x86-64 and arm64 only"
#endif

/* dlsym's base version: glibc 2.34 moved it into libc with a new default
 * version that older glibc does not have. */
void *dlsym_base(void *handle, const char *symbol);
__asm__(".symver dlsym_base, dlsym@" GLIBC_BASE);
#define RTLD_NEXT ((void *)-1l)

char *getenv_base(const char *name);
__asm__(".symver getenv_base, getenv@" GLIBC_BASE);

long sysconf_base(int name);
__asm__(".symver sysconf_base, sysconf@" GLIBC_BASE);

/*
 * The marker: two 2-byte nops, a nop and a return; ddprof's uprobe is on its
 * first instruction. Its CFI says the return address is at the stack
 * pointer, so that the unwinders reach the hook that called it. Arguments:
 * rdi = the allocation's size, rsi = its address, rdx = 1 for memory the
 * program mapped itself (mmap), 0 for the allocators' (malloc, new, ...).
 * On arm64: two nops and a return, the arguments in x0-x2, and the return
 * address in x30 (the CIE's default rules: CFA = sp, x30 unchanged).
 *
 * Not the 5-byte nop (0f 1f 44 00 00) that Linux >= 6.16 turns into a call
 * to its uprobe trampoline (~0.2 us a hit here instead of ~16 us for the
 * breakpoint trap): on 6.18 a process forked by a profiled program stopped
 * firing such a probe in its parent while another ddprof run defined or
 * removed its own probe (the parent's samples ended, 3 runs of 6; 0 of 6 with
 * these nops).
 */
#if defined(__x86_64__)
#define ALLOCATION_MARKER_BODY ".byte 0x66, 0x90, 0x66, 0x90, 0x90\n"
#define FREE_MARKER_BODY ".byte 0x90, 0x66, 0x90, 0x66, 0x90\n"
#else
#define ALLOCATION_MARKER_BODY "nop\nnop\n"
#define FREE_MARKER_BODY "nop\nnop\nnop\n"
#endif
__asm__(".text\n"
        ".globl ddprof_sampled_allocation\n"
        ".type ddprof_sampled_allocation, @function\n"
        ".p2align 4\n"
        "ddprof_sampled_allocation:\n"
        ".cfi_startproc\n"
        ALLOCATION_MARKER_BODY
        "ret\n"
        ".cfi_endproc\n"
        ".size ddprof_sampled_allocation, .-ddprof_sampled_allocation\n");
EXPORT void ddprof_sampled_allocation(size_t size, void *address, size_t mapped);

/* The free marker: other bytes than the allocation marker's (a nop, two
 * 2-byte nops, a return; on arm64 one more nop), the same CFI. rdi (x0) =
 * the sampled block's address (as the allocation marker gave it, or as a
 * last call of this marker renamed it); rsi (x1) = the bytes of it still
 * held, in the allocation marker's unit (0: all freed; a mapping partly
 * unmapped keeps the rest); rdx (x2) = the address it goes by from now on
 * (0: the same; a mapping moved by mremap, or whose first pages were
 * unmapped, is renamed to its first page still mapped, which no other
 * mapping can start at). */
__asm__(".text\n"
        ".globl ddprof_sampled_free\n"
        ".type ddprof_sampled_free, @function\n"
        ".p2align 4\n"
        "ddprof_sampled_free:\n"
        ".cfi_startproc\n"
        FREE_MARKER_BODY
        "ret\n"
        ".cfi_endproc\n"
        ".size ddprof_sampled_free, .-ddprof_sampled_free\n");
EXPORT void ddprof_sampled_free(void *address, size_t held, void *renamed);

/* The kernel's mmap, munmap, mremap, getpid and sched_yield, by number:
 * this library defines libc's names, so a call through them could come
 * back to its own hooks before they know where to forward. errno set as
 * libc's. */
#if defined(__x86_64__)
enum { NR_MMAP = 9, NR_MUNMAP = 11, NR_MREMAP = 25, NR_GETPID = 39, NR_SCHED_YIELD = 24 };
static long system_call(long number, long a, long b, long c, long d, long e, long f) {
    register long r10 __asm__("r10") = d;
    register long r8 __asm__("r8") = e;
    register long r9 __asm__("r9") = f;
    long result;
    __asm__ volatile("syscall"
                     : "=a"(result)
                     : "a"(number), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
                     : "rcx", "r11", "memory");
    if ((unsigned long)result > -4096ul) {
        errno = (int)-result;
        return -1;
    }
    return result;
}
#else
enum { NR_MMAP = 222, NR_MUNMAP = 215, NR_MREMAP = 216, NR_GETPID = 172, NR_SCHED_YIELD = 124 };
static long system_call(long number, long a, long b, long c, long d, long e, long f) {
    register long x8 __asm__("x8") = number;
    register long x0 __asm__("x0") = a;
    register long x1 __asm__("x1") = b;
    register long x2 __asm__("x2") = c;
    register long x3 __asm__("x3") = d;
    register long x4 __asm__("x4") = e;
    register long x5 __asm__("x5") = f;
    __asm__ volatile("svc #0"
                     : "+r"(x0)
                     : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
                     : "memory");
    if ((unsigned long)x0 > -4096ul) {
        errno = (int)-x0;
        return -1;
    }
    return x0;
}
#endif

static void *system_mmap(void *address, size_t length, int protection, int flags, int fd,
                         long offset) {
    return (void *)system_call(NR_MMAP, (long)address, (long)length, protection, flags, fd, offset);
}

static int system_munmap(void *address, size_t length) {
    return (int)system_call(NR_MUNMAP, (long)address, (long)length, 0, 0, 0, 0);
}

static void *system_mremap(void *old, size_t old_length, size_t length, int flags,
                           void *wanted) {
    return (void *)system_call(NR_MREMAP, (long)old, (long)old_length, (long)length, flags,
                               (long)wanted, 0);
}

typedef void *(*malloc_fn)(size_t);
typedef void (*free_fn)(void *);
typedef void *(*calloc_fn)(size_t, size_t);
typedef void *(*realloc_fn)(void *, size_t);
typedef void *(*reallocarray_fn)(void *, size_t, size_t);
typedef int (*posix_memalign_fn)(void **, size_t, size_t);
typedef void *(*aligned_fn)(size_t, size_t);
typedef void *(*valloc_fn)(size_t);
typedef void *(*mmap_fn)(void *, size_t, int, int, int, long);
typedef int (*munmap_fn)(void *, size_t);
typedef void *(*mremap_fn)(void *, size_t, size_t, int, ...);

static struct {
    malloc_fn malloc;
    free_fn free;
    calloc_fn calloc;
    realloc_fn realloc;
    reallocarray_fn reallocarray;
    posix_memalign_fn posix_memalign;
    aligned_fn aligned_alloc;
    aligned_fn memalign;
    valloc_fn valloc;
    valloc_fn pvalloc;
    mmap_fn mmap;
    mmap_fn mmap64;
    munmap_fn munmap;
    mremap_fn mremap;
} next;

/* 0: not resolved; 1: resolving (dlsym's allocations use the arena);
 * 2: resolved. */
static volatile int state;

/* What dlsym allocates while the next allocator is looked up. */
static char arena[16384] __attribute__((aligned(64)));
static size_t arena_used;

static int in_arena(const void *pointer) {
    return (const char *)pointer >= arena && (const char *)pointer < arena + sizeof arena;
}

static void *arena_alloc(size_t size) {
    size_t start = (arena_used + 63) & ~(size_t)63;
    if (size > sizeof arena - start)
        return NULL;
    arena_used = start + size;
    return arena + start;
}

/* Mean bytes between samples; 0 samples nothing. */
static int64_t mean = 512 * 1024;

/*
 * The sampled addresses still allocated (live mode only; NULL otherwise):
 * LIVE_BUCKETS buckets of LIVE_SLOTS addresses, a bucket picked by a hash of
 * the address; 0 is a free slot. Lock-free: a slot is taken by a
 * compare-and-swap from 0 and given back by one from the address, so two
 * threads never both own a slot. A bucket is one cache line: a free that
 * was not sampled (nearly all of them) reads one line.
 */
#define LIVE_BUCKET_BITS 15
#define LIVE_BUCKETS (1 << LIVE_BUCKET_BITS)
#define LIVE_SLOTS 8
static uintptr_t (*live)[LIVE_SLOTS];

static inline uintptr_t (*live_bucket(uintptr_t address))[LIVE_SLOTS] {
    uint64_t hash = (uint64_t)address * 0x9e3779b97f4a7c15ull;
    return &live[hash >> (64 - LIVE_BUCKET_BITS)];
}

/* Remembers a sampled address; whether there was room. */
static int live_insert(void *pointer) {
    uintptr_t address = (uintptr_t)pointer, (*bucket)[LIVE_SLOTS] = live_bucket(address);
    for (int i = 0; i < LIVE_SLOTS; i++) {
        uintptr_t empty = 0;
        if (__atomic_load_n(&(*bucket)[i], __ATOMIC_RELAXED) == 0 &&
            __atomic_compare_exchange_n(&(*bucket)[i], &empty, address, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED))
            return 1;
    }
    return 0;
}

/* Before `pointer` goes back to the allocator: if it was sampled, forgets it
 * and reports the free. */
static inline void live_forget(void *pointer) {
    if (!live || !pointer)
        return;
    uintptr_t address = (uintptr_t)pointer, (*bucket)[LIVE_SLOTS] = live_bucket(address);
    for (int i = 0; i < LIVE_SLOTS; i++) {
        uintptr_t expected = address;
        if (__atomic_load_n(&(*bucket)[i], __ATOMIC_RELAXED) == address &&
            __atomic_compare_exchange_n(&(*bucket)[i], &expected, 0, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            ddprof_sampled_free(pointer, 0, 0);
            return;
        }
    }
}

/*
 * The sampled mappings still mapped (live mode only; NULL otherwise), each
 * with what of it is still mapped: an munmap, a MAP_FIXED mapping or an
 * mremap that takes a part of one (an allocator trimming a mapping to an
 * alignment, a program giving back a buffer's tail) reports the bytes
 * left, and one that moves it (or unmaps its first pages) renames it. A
 * slot keeps up to MAPPING_PIECES ranges; a hole that would make more
 * forgets the smallest (counted freed: an underestimate).
 *
 * Mappings are few and their calls system calls: one lock, the holder's
 * process id in it. A thread waiting for it yields the CPU; a hook
 * re-entered on the thread that holds it (a signal handler's munmap)
 * leaves the table alone; a child forked while a thread of its parent held
 * it takes it over (the holder is not in the child).
 */
#define MAPPING_SLOTS 4096
#define MAPPING_PIECES 4
struct sampled_mapping {
    uintptr_t name;                     /* as last reported; 0: a free slot */
    size_t asked;                       /* the length the marker reported */
    size_t pages;                       /* the bytes of its pages when mapped */
    uintptr_t piece[MAPPING_PIECES][2]; /* [start, end) still mapped; empty: start == end */
};
static struct sampled_mapping *mappings;
static int mappings_used;
static long mappings_holder;
static TLS int in_mappings;
static size_t page_size = 4096;

static size_t whole_pages(size_t length) {
    size_t rounded = (length + page_size - 1) & ~(page_size - 1);
    return rounded < length ? ~(page_size - 1) : rounded;
}

static int mappings_enter(void) {
    if (!mappings || in_mappings)
        return 0;
    in_mappings = 1;
    long self = system_call(NR_GETPID, 0, 0, 0, 0, 0, 0);
    for (;;) {
        long holder = 0;
        if (__atomic_compare_exchange_n(&mappings_holder, &holder, self, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
            return 1;
        if (holder != self && __atomic_compare_exchange_n(&mappings_holder, &holder, self, 0,
                                                          __ATOMIC_ACQUIRE, __ATOMIC_RELAXED))
            return 1;
        system_call(NR_SCHED_YIELD, 0, 0, 0, 0, 0, 0);
    }
}

static void mappings_leave(void) {
    __atomic_store_n(&mappings_holder, 0, __ATOMIC_RELEASE);
    in_mappings = 0;
}

/* Follows a sampled mapping; whether there was room. */
static int mapping_insert(void *pointer, size_t length) {
    if (!mappings_enter())
        return 0;
    int inserted = 0;
    for (int i = 0; i < MAPPING_SLOTS && !inserted; i++) {
        struct sampled_mapping *m = &mappings[i];
        if (m->name != 0)
            continue;
        uintptr_t start = (uintptr_t)pointer;
        m->name = start;
        m->asked = length;
        m->pages = whole_pages(length);
        m->piece[0][0] = start;
        m->piece[0][1] = start + m->pages;
        for (int k = 1; k < MAPPING_PIECES; k++)
            m->piece[k][0] = m->piece[k][1] = 0;
        __atomic_add_fetch(&mappings_used, 1, __ATOMIC_RELAXED);
        inserted = 1;
    }
    mappings_leave();
    return inserted;
}

/* Takes [start, end) out of `m`; whether any of it was mapped. */
static int mapping_cut(struct sampled_mapping *m, uintptr_t start, uintptr_t end) {
    int cut = 0;
    for (int k = 0; k < MAPPING_PIECES; k++) {
        uintptr_t low = m->piece[k][0], high = m->piece[k][1];
        if (low >= high || end <= low || start >= high)
            continue;
        cut = 1;
        if (start <= low && end >= high) {
            m->piece[k][0] = m->piece[k][1] = 0;
        } else if (start <= low) {
            m->piece[k][0] = end;
        } else if (end >= high) {
            m->piece[k][1] = start;
        } else {
            /* A hole: the piece's upper part goes to an empty slot, or in
             * the place of the smallest piece when smaller than it. */
            m->piece[k][1] = start;
            int place = -1;
            size_t smallest = high - end;
            for (int j = 0; j < MAPPING_PIECES; j++) {
                size_t size = m->piece[j][1] - m->piece[j][0];
                if (m->piece[j][0] >= m->piece[j][1]) {
                    place = j;
                    break;
                }
                if (size < smallest) {
                    smallest = size;
                    place = j;
                }
            }
            if (place >= 0) {
                m->piece[place][0] = end;
                m->piece[place][1] = high;
            }
        }
    }
    return cut;
}

/* Reports what is left of `m` after a change: freed when nothing is,
 * else the bytes held (in the unit of the length reported) and its new
 * name when its first page moved. Called with the lock held. */
static void mapping_report(struct sampled_mapping *m) {
    size_t held = 0;
    uintptr_t first = UINTPTR_MAX, name = m->name;
    for (int k = 0; k < MAPPING_PIECES; k++) {
        if (m->piece[k][0] >= m->piece[k][1])
            continue;
        held += m->piece[k][1] - m->piece[k][0];
        if (m->piece[k][0] < first)
            first = m->piece[k][0];
    }
    if (held == 0) {
        m->name = 0;
        __atomic_sub_fetch(&mappings_used, 1, __ATOMIC_RELAXED);
        ddprof_sampled_free((void *)name, 0, 0);
        return;
    }
    size_t reported = (size_t)((unsigned __int128)held * m->asked / m->pages);
    m->name = first;
    ddprof_sampled_free((void *)name, reported ? reported : 1,
                        first != name ? (void *)first : (void *)0);
}

/* Before [address, address + length) is unmapped (or mapped over). */
static void mappings_unmap(void *address, size_t length) {
    if (!mappings || __atomic_load_n(&mappings_used, __ATOMIC_RELAXED) == 0 || length == 0)
        return;
    uintptr_t start = (uintptr_t)address, end = start + whole_pages(length);
    if (end < start)
        end = UINTPTR_MAX;
    if (!mappings_enter())
        return;
    for (int i = 0; i < MAPPING_SLOTS; i++)
        if (mappings[i].name != 0 && mapping_cut(&mappings[i], start, end))
            mapping_report(&mappings[i]);
    mappings_leave();
}

/* Whether any of `m` lies in [start, end), and whether all of it does. */
static int mapping_in(const struct sampled_mapping *m, uintptr_t start, uintptr_t end,
                      int *inside) {
    int touched = 0;
    *inside = 1;
    for (int k = 0; k < MAPPING_PIECES; k++) {
        uintptr_t low = m->piece[k][0], high = m->piece[k][1];
        if (low >= high)
            continue;
        int overlaps = high > start && low < end;
        touched |= overlaps;
        if (!overlaps || low < start || high > end)
            *inside = 0;
    }
    return touched;
}

/* After mremap moved (or resized) [old, old + old_length) to `moved`,
 * `length` bytes long, with the lock held: a mapping where it went
 * (MREMAP_FIXED replaces what is there) loses that part first, before a
 * moved one may be renamed to its address; then a mapping wholly in the
 * old range goes with it (cut to its new length), and one only partly in
 * it loses that part. */
static void mappings_remap(void *old, size_t old_length, void *moved, size_t length) {
    uintptr_t start = (uintptr_t)old, end = start + whole_pages(old_length);
    uintptr_t kept_end = start + whole_pages(length), shift = (uintptr_t)moved - start;
    uintptr_t landed = (uintptr_t)moved, landed_end = landed + whole_pages(length);
    int inside;
    for (int i = 0; shift != 0 && i < MAPPING_SLOTS; i++) {
        struct sampled_mapping *m = &mappings[i];
        if (m->name != 0 && !mapping_in(m, start, end, &inside) &&
            mapping_cut(m, landed, landed_end))
            mapping_report(m);
    }
    for (int i = 0; i < MAPPING_SLOTS; i++) {
        struct sampled_mapping *m = &mappings[i];
        if (m->name == 0 || !mapping_in(m, start, end, &inside))
            continue;
        int changed = 0;
        if (!inside) {
            changed = mapping_cut(m, start, end);
        } else {
            changed = shift != 0;
            if (kept_end < end)
                changed |= mapping_cut(m, kept_end, end);
            for (int k = 0; k < MAPPING_PIECES; k++)
                if (m->piece[k][0] < m->piece[k][1]) {
                    m->piece[k][0] += shift;
                    m->piece[k][1] += shift;
                }
        }
        if (changed)
            mapping_report(m);
    }
}

/*
 * The optional next definitions: C++'s operators new and delete (the
 * Itanium ABI's names; size_t is `unsigned long`, std::align_val_t a
 * size_t, std::nothrow_t an empty struct passed by reference) and
 * jemalloc's own API. Looked up with the rest when the library loads, never
 * later: a dlsym in the middle of a program's operator new could wait for
 * the loader's lock held by a thread in dlopen, and forms looked up at
 * different times could pair one allocator's new with another's delete. A
 * form with no next definition then (none loaded yet, or only in a library
 * loaded RTLD_LOCAL) is served from the next malloc and free.
 */
enum optional_symbol {
    NEW, NEW_ARRAY, NEW_NOTHROW, NEW_ARRAY_NOTHROW, NEW_ALIGNED, NEW_ARRAY_ALIGNED,
    NEW_ALIGNED_NOTHROW, NEW_ARRAY_ALIGNED_NOTHROW, DELETE, DELETE_ARRAY, DELETE_SIZED,
    DELETE_ARRAY_SIZED, DELETE_NOTHROW, DELETE_ARRAY_NOTHROW, DELETE_ALIGNED,
    DELETE_ARRAY_ALIGNED, DELETE_SIZED_ALIGNED, DELETE_ARRAY_SIZED_ALIGNED,
    DELETE_ALIGNED_NOTHROW, DELETE_ARRAY_ALIGNED_NOTHROW, MALLOCX, RALLOCX, DALLOCX, SDALLOCX,
    OPTIONAL_SYMBOLS
};

static const char *const optional_names[OPTIONAL_SYMBOLS] = {
    [NEW] = "_Znwm",
    [NEW_ARRAY] = "_Znam",
    [NEW_NOTHROW] = "_ZnwmRKSt9nothrow_t",
    [NEW_ARRAY_NOTHROW] = "_ZnamRKSt9nothrow_t",
    [NEW_ALIGNED] = "_ZnwmSt11align_val_t",
    [NEW_ARRAY_ALIGNED] = "_ZnamSt11align_val_t",
    [NEW_ALIGNED_NOTHROW] = "_ZnwmSt11align_val_tRKSt9nothrow_t",
    [NEW_ARRAY_ALIGNED_NOTHROW] = "_ZnamSt11align_val_tRKSt9nothrow_t",
    [DELETE] = "_ZdlPv",
    [DELETE_ARRAY] = "_ZdaPv",
    [DELETE_SIZED] = "_ZdlPvm",
    [DELETE_ARRAY_SIZED] = "_ZdaPvm",
    [DELETE_NOTHROW] = "_ZdlPvRKSt9nothrow_t",
    [DELETE_ARRAY_NOTHROW] = "_ZdaPvRKSt9nothrow_t",
    [DELETE_ALIGNED] = "_ZdlPvSt11align_val_t",
    [DELETE_ARRAY_ALIGNED] = "_ZdaPvSt11align_val_t",
    [DELETE_SIZED_ALIGNED] = "_ZdlPvmSt11align_val_t",
    [DELETE_ARRAY_SIZED_ALIGNED] = "_ZdaPvmSt11align_val_t",
    [DELETE_ALIGNED_NOTHROW] = "_ZdlPvSt11align_val_tRKSt9nothrow_t",
    [DELETE_ARRAY_ALIGNED_NOTHROW] = "_ZdaPvSt11align_val_tRKSt9nothrow_t",
    [MALLOCX] = "mallocx",
    [RALLOCX] = "rallocx",
    [DALLOCX] = "dallocx",
    [SDALLOCX] = "sdallocx",
};

static void *optional_next[OPTIONAL_SYMBOLS];

static void resolve(void) {
    /* Resolved; or being resolved, and re-entered from dlsym (a failed
     * lookup frees its previous error string): the callers' fallbacks
     * serve until it is done. */
    if (__atomic_load_n(&state, __ATOMIC_ACQUIRE) != 0)
        return;
    state = 1;
    next.malloc = (malloc_fn)dlsym_base(RTLD_NEXT, "malloc");
    next.free = (free_fn)dlsym_base(RTLD_NEXT, "free");
    next.calloc = (calloc_fn)dlsym_base(RTLD_NEXT, "calloc");
    next.realloc = (realloc_fn)dlsym_base(RTLD_NEXT, "realloc");
    next.reallocarray = (reallocarray_fn)dlsym_base(RTLD_NEXT, "reallocarray");
    next.posix_memalign = (posix_memalign_fn)dlsym_base(RTLD_NEXT, "posix_memalign");
    next.aligned_alloc = (aligned_fn)dlsym_base(RTLD_NEXT, "aligned_alloc");
    next.memalign = (aligned_fn)dlsym_base(RTLD_NEXT, "memalign");
    next.valloc = (valloc_fn)dlsym_base(RTLD_NEXT, "valloc");
    next.pvalloc = (valloc_fn)dlsym_base(RTLD_NEXT, "pvalloc");
    next.mmap = (mmap_fn)dlsym_base(RTLD_NEXT, "mmap");
    next.mmap64 = (mmap_fn)dlsym_base(RTLD_NEXT, "mmap64");
    next.munmap = (munmap_fn)dlsym_base(RTLD_NEXT, "munmap");
    next.mremap = (mremap_fn)dlsym_base(RTLD_NEXT, "mremap");
    for (int i = 0; i < OPTIONAL_SYMBOLS; i++)
        optional_next[i] = dlsym_base(RTLD_NEXT, optional_names[i]);
    const char *configured = getenv_base("DDPROF_ALLOC_MEAN");
    if (configured) {
        int64_t value = 0;
        for (const char *c = configured; *c >= '0' && *c <= '9' && value < (1ll << 40); c++)
            value = value * 10 + (*c - '0');
        mean = value;
    }
    const char *live_mode = getenv_base("DDPROF_ALLOC_LIVE");
    if (live_mode && live_mode[0] == '1' && mean > 0) {
        /* Zeroed pages, touched as buckets are used; a fork copies them, so
         * a child frees its copies of its parent's sampled addresses (ddprof
         * ignores frees of addresses it never saw in that process). */
        void *table = system_mmap(0, sizeof(uintptr_t) * LIVE_BUCKETS * LIVE_SLOTS,
                                  PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (table != MAP_FAILED)
            live = table;
        long page = sysconf_base(_SC_PAGESIZE);
        if (page > 0 && (page & (page - 1)) == 0)
            page_size = (size_t)page;
        if (live) {
            void *followed = system_mmap(0, sizeof(struct sampled_mapping) * MAPPING_SLOTS,
                                         PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                                         -1, 0);
            if (followed != MAP_FAILED)
                mappings = followed;
        }
    }
    __atomic_store_n(&state, 2, __ATOMIC_RELEASE);
}

__attribute__((constructor)) static void on_load(void) { resolve(); }

/* Per thread: bytes left before the next sample (<= 0: draw one), and the
 * random generator's state (0: not seeded). */
static TLS int64_t bytes_left;
static TLS uint64_t random_state;

static uint64_t next_random(void) {
    if (random_state == 0) {
        uint64_t seed = (uint64_t)(uintptr_t)&random_state;
        uint32_t low, high;
#if defined(__x86_64__)
        __asm__ volatile("rdtsc" : "=a"(low), "=d"(high));
#else
        uint64_t ticks;
        __asm__ volatile("mrs %0, cntvct_el0" : "=r"(ticks));
        low = (uint32_t)ticks;
        high = (uint32_t)(ticks >> 32);
#endif
        seed ^= ((uint64_t)high << 32 | low) * 0x9e3779b97f4a7c15ull;
        random_state = seed ? seed : 1;
    }
    /* xorshift64* */
    random_state ^= random_state >> 12;
    random_state ^= random_state << 25;
    random_state ^= random_state >> 27;
    return random_state * 0x2545f4914f6cdd1dull;
}

/* ln(x) for x in (0, 1], without libm: x = m * 2^e with m in [1, 2), and
 * ln(m) = 2 atanh((m - 1) / (m + 1)) by its series (|t| <= 1/3: eight terms
 * are within 1e-9). */
static double natural_log(double x) {
    union {
        double value;
        uint64_t bits;
    } u = {x};
    int exponent = (int)((u.bits >> 52) & 0x7ff) - 1023;
    u.bits = (u.bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull;
    double t = (u.value - 1.0) / (u.value + 1.0), t2 = t * t, term = t, sum = 0.0;
    for (int k = 1; k <= 17; k += 2) {
        sum += term / k;
        term *= t2;
    }
    return 2.0 * sum + exponent * 0.69314718055994530942;
}

/* Bytes until the next sample: exponential with mean `mean`. */
static int64_t draw_interval(void) {
    /* 53 random bits: u in (0, 1]. */
    double u = ((next_random() >> 11) + 1) * (1.0 / 9007199254740992.0);
    double interval = -natural_log(u) * (double)mean;
    return interval < 1.0 ? 1 : (int64_t)interval;
}

/* Whether the allocation of `size` bytes is sampled. Inlined into each hook,
 * so that the marker's caller is the hook and the hook's caller the program
 * (ddprof drops the first two frames). */
static inline __attribute__((always_inline)) int sampled(size_t size) {
    if (mean <= 0)
        return 0;
    /* A thread's first allocation: its first interval. */
    if (__builtin_expect(random_state == 0, 0))
        bytes_left = draw_interval();
    bytes_left -= (int64_t)(size > (size_t)INT64_MAX ? INT64_MAX : size);
    if (__builtin_expect(bytes_left > 0, 1))
        return 0;
    /* The points of the process that fall inside this allocation sample it
     * once; the next point comes an exponential interval after its end (the
     * process has no memory). */
    bytes_left = draw_interval();
    return 1;
}

/* Set while the outermost hook of C++'s operator new runs the next
 * operator new: libstdc++'s calls malloc, and its array, aligned and
 * nothrow forms call the plain one, whose hooks must not sample that
 * allocation a second time (the outermost hook samples it, with the
 * program's function as the leaf). No exception crosses that hook while it
 * is set (see the operators' hooks). */
static TLS int in_operator_new;

/* Above zero while a hook runs the next allocator (nested hooks count
 * again): the mappings an allocator makes for itself (jemalloc, tcmalloc
 * and mimalloc call mmap, and so this library's hook) are not sampled a
 * second time, as mappings, after the allocation that made them. */
static TLS unsigned in_allocator;
#define FORWARD(call)                                                                              \
    ({                                                                                             \
        in_allocator++;                                                                            \
        __typeof__(call) forwarded_ = (call);                                                      \
        in_allocator--;                                                                            \
        forwarded_;                                                                                \
    })

/* FORWARD for a call that returns nothing (a free: tcmalloc builds a
 * thread's cache at its first call, which may be a free). */
#define FORWARD_VOID(call)                                                                         \
    do {                                                                                           \
        in_allocator++;                                                                            \
        call;                                                                                      \
        in_allocator--;                                                                            \
    } while (0)

/* Calls the marker for a sampled block: its address when followed for the
 * live heap, 0 when not (sum mode, or no room left in its bucket); `mapped`
 * for memory the program mapped itself. Inlined: the marker's caller must
 * be the hook. */
static inline __attribute__((always_inline)) void mark_sampled(size_t size, void *pointer,
                                                               size_t mapped) {
    int followed = mapped ? mapping_insert(pointer, size) : live && live_insert(pointer);
    ddprof_sampled_allocation(size, followed ? pointer : (void *)0, mapped);
}

/* Reports an allocation, if it is sampled. */
#define REPORT(size, pointer)                                                                      \
    do {                                                                                           \
        if ((pointer) && !in_operator_new && sampled(size))                                        \
            mark_sampled((size), (pointer), 0);                                                    \
    } while (0)

EXPORT void *malloc(size_t size) {
    if (__builtin_expect(state != 2, 0)) {
        if (state == 1)
            return arena_alloc(size);
        resolve();
    }
    void *pointer = FORWARD(next.malloc(size));
    REPORT(size, pointer);
    return pointer;
}

EXPORT void free(void *pointer) {
    if (__builtin_expect(in_arena(pointer), 0))
        return;
    if (__builtin_expect(state != 2, 0)) {
        resolve();
        if (!next.free)
            return;
    }
    live_forget(pointer);
    FORWARD_VOID(next.free(pointer));
}

EXPORT void *calloc(size_t count, size_t size) {
    if (__builtin_expect(state != 2, 0)) {
        if (state == 1) {
            size_t bytes;
            if (__builtin_mul_overflow(count, size, &bytes))
                return NULL;
            /* The arena is zeroed and never reused. */
            return arena_alloc(bytes);
        }
        resolve();
    }
    void *pointer = FORWARD(next.calloc(count, size));
    size_t bytes;
    if (!__builtin_mul_overflow(count, size, &bytes))
        REPORT(bytes, pointer);
    return pointer;
}

EXPORT void *realloc(void *old, size_t size) {
    if (__builtin_expect(state != 2, 0))
        resolve();
    if (__builtin_expect(in_arena(old) || !next.realloc, 0)) {
        if (old && !in_arena(old))
            return NULL;
        /* Out of the arena (into it, while being resolved): copy what it
         * held (at most the rest of it). */
        void *pointer = next.malloc ? next.malloc(size) : arena_alloc(size);
        if (pointer && old) {
            size_t available = (size_t)(arena + sizeof arena - (char *)old);
            size_t copied = size < available ? size : available;
            for (size_t i = 0; i < copied; i++)
                ((char *)pointer)[i] = ((const char *)old)[i];
        }
        return pointer;
    }
    /* Forgotten before the allocator may reuse it. (A realloc that fails
     * leaves the old block allocated: it is then counted freed.) */
    live_forget(old);
    void *pointer = FORWARD(next.realloc(old, size));
    REPORT(size, pointer);
    return pointer;
}

EXPORT void *reallocarray(void *old, size_t count, size_t size) {
    if (__builtin_expect(state != 2, 0))
        resolve();
    size_t bytes;
    if (__builtin_mul_overflow(count, size, &bytes)) {
        errno = ENOMEM;
        return NULL;
    }
    if (!next.reallocarray || in_arena(old))
        return realloc(old, bytes);
    live_forget(old);
    void *pointer = FORWARD(next.reallocarray(old, count, size));
    REPORT(bytes, pointer);
    return pointer;
}

EXPORT int posix_memalign(void **out, size_t alignment, size_t size) {
    if (__builtin_expect(state != 2, 0))
        resolve();
    if (!next.posix_memalign)
        return ENOMEM;
    int error = FORWARD(next.posix_memalign(out, alignment, size));
    if (error == 0)
        REPORT(size, *out);
    return error;
}

EXPORT void *aligned_alloc(size_t alignment, size_t size) {
    if (__builtin_expect(state != 2, 0))
        resolve();
    if (!next.aligned_alloc)
        return NULL;
    void *pointer = FORWARD(next.aligned_alloc(alignment, size));
    REPORT(size, pointer);
    return pointer;
}

EXPORT void *memalign(size_t alignment, size_t size) {
    if (__builtin_expect(state != 2, 0))
        resolve();
    if (!next.memalign)
        return NULL;
    void *pointer = FORWARD(next.memalign(alignment, size));
    REPORT(size, pointer);
    return pointer;
}

EXPORT void *valloc(size_t size) {
    if (__builtin_expect(state != 2, 0))
        resolve();
    if (!next.valloc)
        return NULL;
    void *pointer = FORWARD(next.valloc(size));
    REPORT(size, pointer);
    return pointer;
}

EXPORT void *pvalloc(size_t size) {
    if (__builtin_expect(state != 2, 0))
        resolve();
    if (!next.pvalloc)
        return NULL;
    void *pointer = FORWARD(next.pvalloc(size));
    REPORT(size, pointer);
    return pointer;
}

/*
 * C++'s operators new and delete. libstdc++'s call malloc and free, but
 * tcmalloc, jemalloc and mimalloc define their own, which never do: without
 * these hooks a C++ program under them had no allocation sampled, and its
 * deletes never reached the live heap.
 *
 * The outermost hook of a thread samples; the hooks entered while it runs
 * (libstdc++'s new calls malloc, and its array, aligned and nothrow forms
 * call the plain one) only forward. No exception may cross the outermost
 * hook while `in_operator_new` is set: it would stay set, and the thread
 * would sample nothing again. So a throwing form asks the next nothrow
 * form of its kind (libstdc++'s catches what the throwing one throws); when
 * that gives nothing (out of memory, the new_handler run), the flag is
 * cleared and the next throwing form is called, which throws
 * std::bad_alloc (or returns what a new_handler freed, not sampled). Only
 * an allocator that defines a throwing form without its nothrow one is
 * called directly (none of those above). With no next definition (see
 * optional_next), the next malloc serves, and a throwing form that gets
 * nothing aborts: it must not return NULL.
 */

/* The next definition of `which`, or NULL when there is none (or while
 * the library is being resolved: the fallbacks serve). */
static inline __attribute__((always_inline)) void *optional_lookup(enum optional_symbol which) {
    if (__builtin_expect(state != 2, 0)) {
        if (state == 1)
            return 0;
        resolve();
    }
    return optional_next[which];
}

/* Memory for an operator new or jemalloc's mallocx with no next
 * definition: the next malloc's (16-byte aligned already), aligned when
 * asked. */
static void *fallback_alloc(size_t size, size_t alignment) {
    if (__builtin_expect(!next.malloc, 0))
        return alignment <= 64 ? arena_alloc(size) : 0;
    if (alignment <= 16)
        return next.malloc(size ? size : 1);
    void *pointer = 0;
    return next.posix_memalign(&pointer, alignment, size ? size : 1) == 0 ? pointer : 0;
}

/* What a throwing operator new with no next definition returns. */
static void *or_abort(void *pointer) {
    if (__builtin_expect(!pointer, 0))
        __builtin_abort();
    return pointer;
}

/* The std::nothrow_t a nothrow form is given (empty: never read). */
static const char nothrow_tag;

typedef void *(*new_fn)(size_t);
typedef void *(*new_nothrow_fn)(size_t, const void *);
typedef void *(*new_aligned_fn)(size_t, size_t);
typedef void *(*new_aligned_nothrow_fn)(size_t, size_t, const void *);

#define NOTHROW_NEW_HOOK(symbol, which, call, alignment, ...)                                      \
    EXPORT void *symbol(__VA_ARGS__) {                                                             \
        void *forward = optional_lookup(which);                                                    \
        if (in_operator_new)                                                                       \
            return forward ? call : fallback_alloc(size, alignment);                               \
        in_operator_new = 1;                                                                       \
        void *pointer = FORWARD(forward ? call : fallback_alloc(size, alignment));                 \
        in_operator_new = 0;                                                                       \
        REPORT(size, pointer);                                                                     \
        return pointer;                                                                            \
    }

#define THROWING_NEW_HOOK(symbol, which, call, quiet_which, quiet_call, alignment, ...)            \
    EXPORT void *symbol(__VA_ARGS__) {                                                             \
        void *forward = optional_lookup(which);                                                    \
        if (in_operator_new)                                                                       \
            return forward ? call : or_abort(fallback_alloc(size, alignment));                     \
        void *quiet = optional_lookup(quiet_which);                                                \
        void *pointer;                                                                             \
        in_operator_new = 1;                                                                       \
        in_allocator++;                                                                            \
        if (quiet)                                                                                 \
            pointer = quiet_call;                                                                  \
        else if (forward)                                                                          \
            pointer = call;                                                                        \
        else                                                                                       \
            pointer = fallback_alloc(size, alignment);                                             \
        in_allocator--;                                                                            \
        in_operator_new = 0;                                                                       \
        if (__builtin_expect(!pointer, 0))                                                         \
            return forward ? call : or_abort(pointer);                                             \
        REPORT(size, pointer);                                                                     \
        return pointer;                                                                            \
    }

THROWING_NEW_HOOK(_Znwm, NEW, ((new_fn)forward)(size), NEW_NOTHROW,
                  ((new_nothrow_fn)quiet)(size, &nothrow_tag), 0, size_t size)
THROWING_NEW_HOOK(_Znam, NEW_ARRAY, ((new_fn)forward)(size), NEW_ARRAY_NOTHROW,
                  ((new_nothrow_fn)quiet)(size, &nothrow_tag), 0, size_t size)
THROWING_NEW_HOOK(_ZnwmSt11align_val_t, NEW_ALIGNED, ((new_aligned_fn)forward)(size, alignment),
                  NEW_ALIGNED_NOTHROW,
                  ((new_aligned_nothrow_fn)quiet)(size, alignment, &nothrow_tag), alignment,
                  size_t size, size_t alignment)
THROWING_NEW_HOOK(_ZnamSt11align_val_t, NEW_ARRAY_ALIGNED,
                  ((new_aligned_fn)forward)(size, alignment), NEW_ARRAY_ALIGNED_NOTHROW,
                  ((new_aligned_nothrow_fn)quiet)(size, alignment, &nothrow_tag), alignment,
                  size_t size, size_t alignment)
NOTHROW_NEW_HOOK(_ZnwmRKSt9nothrow_t, NEW_NOTHROW, ((new_nothrow_fn)forward)(size, tag), 0,
                 size_t size, const void *tag)
NOTHROW_NEW_HOOK(_ZnamRKSt9nothrow_t, NEW_ARRAY_NOTHROW, ((new_nothrow_fn)forward)(size, tag), 0,
                 size_t size, const void *tag)
NOTHROW_NEW_HOOK(_ZnwmSt11align_val_tRKSt9nothrow_t, NEW_ALIGNED_NOTHROW,
                 ((new_aligned_nothrow_fn)forward)(size, alignment, tag), alignment, size_t size,
                 size_t alignment, const void *tag)
NOTHROW_NEW_HOOK(_ZnamSt11align_val_tRKSt9nothrow_t, NEW_ARRAY_ALIGNED_NOTHROW,
                 ((new_aligned_nothrow_fn)forward)(size, alignment, tag), alignment, size_t size,
                 size_t alignment, const void *tag)

typedef void (*delete_fn)(void *);
typedef void (*delete_with_fn)(void *, size_t);
typedef void (*delete_nothrow_fn)(void *, const void *);
typedef void (*delete_sized_aligned_fn)(void *, size_t, size_t);
typedef void (*delete_aligned_nothrow_fn)(void *, size_t, const void *);

/* Forgets a sampled address before the next operator delete may reuse it
 * (libstdc++'s then calls free, whose hook finds nothing more). */
#define DELETE_HOOK(symbol, which, call, ...)                                                      \
    EXPORT void symbol(__VA_ARGS__) {                                                              \
        if (__builtin_expect(in_arena(pointer), 0))                                                \
            return;                                                                                \
        void *forward = optional_lookup(which);                                                         \
        live_forget(pointer);                                                                      \
        if (__builtin_expect(forward == 0, 0))                                                     \
            FORWARD_VOID(next.free(pointer));                                                      \
        else                                                                                       \
            FORWARD_VOID(call);                                                                    \
    }

DELETE_HOOK(_ZdlPv, DELETE, ((delete_fn)forward)(pointer), void *pointer)
DELETE_HOOK(_ZdaPv, DELETE_ARRAY, ((delete_fn)forward)(pointer), void *pointer)
DELETE_HOOK(_ZdlPvm, DELETE_SIZED, ((delete_with_fn)forward)(pointer, size), void *pointer,
            size_t size)
DELETE_HOOK(_ZdaPvm, DELETE_ARRAY_SIZED, ((delete_with_fn)forward)(pointer, size), void *pointer,
            size_t size)
DELETE_HOOK(_ZdlPvRKSt9nothrow_t, DELETE_NOTHROW, ((delete_nothrow_fn)forward)(pointer, tag),
            void *pointer, const void *tag)
DELETE_HOOK(_ZdaPvRKSt9nothrow_t, DELETE_ARRAY_NOTHROW,
            ((delete_nothrow_fn)forward)(pointer, tag), void *pointer, const void *tag)
DELETE_HOOK(_ZdlPvSt11align_val_t, DELETE_ALIGNED, ((delete_with_fn)forward)(pointer, alignment),
            void *pointer, size_t alignment)
DELETE_HOOK(_ZdaPvSt11align_val_t, DELETE_ARRAY_ALIGNED,
            ((delete_with_fn)forward)(pointer, alignment), void *pointer, size_t alignment)
DELETE_HOOK(_ZdlPvmSt11align_val_t, DELETE_SIZED_ALIGNED,
            ((delete_sized_aligned_fn)forward)(pointer, size, alignment), void *pointer,
            size_t size, size_t alignment)
DELETE_HOOK(_ZdaPvmSt11align_val_t, DELETE_ARRAY_SIZED_ALIGNED,
            ((delete_sized_aligned_fn)forward)(pointer, size, alignment), void *pointer,
            size_t size, size_t alignment)
DELETE_HOOK(_ZdlPvSt11align_val_tRKSt9nothrow_t, DELETE_ALIGNED_NOTHROW,
            ((delete_aligned_nothrow_fn)forward)(pointer, alignment, tag), void *pointer,
            size_t alignment, const void *tag)
DELETE_HOOK(_ZdaPvSt11align_val_tRKSt9nothrow_t, DELETE_ARRAY_ALIGNED_NOTHROW,
            ((delete_aligned_nothrow_fn)forward)(pointer, alignment, tag), void *pointer,
            size_t alignment, const void *tag)

/*
 * jemalloc's own API, which a program linked with jemalloc may call instead
 * of malloc and free (jemalloc's mallocx never calls malloc): sampled and
 * forgotten as malloc, realloc and free are. xallocx resizes in place (the
 * address stays) and is not hooked. With no jemalloc after this library (a
 * program that looks mallocx up to find out whether jemalloc is there finds
 * this one), the calls are served by the next malloc: MALLOCX_LG_ALIGN's
 * alignment (the flags' low 6 bits) and MALLOCX_ZERO (0x40) honoured, any
 * other flag (arenas, tcaches) ignored, and an aligned or zeroed rallocx
 * fails (NULL, the block left as it was), as jemalloc's does when out of
 * memory.
 */
#define MALLOCX_LG_ALIGN_MASK 0x3f
#define MALLOCX_ZERO_FLAG 0x40

typedef void *(*mallocx_fn)(size_t, int);
typedef void *(*rallocx_fn)(void *, size_t, int);
typedef void (*dallocx_fn)(void *, int);
typedef void (*sdallocx_fn)(void *, size_t, int);

/* mallocx without jemalloc. */
static void *mallocx_fallback(size_t size, int flags) {
    int lg_alignment = flags & MALLOCX_LG_ALIGN_MASK;
    if (lg_alignment >= 63)
        return 0;
    void *pointer = fallback_alloc(size, lg_alignment ? (size_t)1 << lg_alignment : 0);
    if (pointer && (flags & MALLOCX_ZERO_FLAG))
        __builtin_memset(pointer, 0, size);
    return pointer;
}

EXPORT void *mallocx(size_t size, int flags) {
    void *forward = optional_lookup(MALLOCX);
    void *pointer =
        FORWARD(forward ? ((mallocx_fn)forward)(size, flags) : mallocx_fallback(size, flags));
    REPORT(size, pointer);
    return pointer;
}

EXPORT void *rallocx(void *old, size_t size, int flags) {
    void *forward = optional_lookup(RALLOCX);
    if (!forward && (flags & (MALLOCX_LG_ALIGN_MASK | MALLOCX_ZERO_FLAG)))
        return 0;
    /* Forgotten before the allocator may reuse it (a failed rallocx leaves
     * the old block allocated: it is then counted freed, as realloc's). */
    live_forget(old);
    void *pointer =
        FORWARD(forward ? ((rallocx_fn)forward)(old, size, flags) : next.realloc(old, size));
    REPORT(size, pointer);
    return pointer;
}

EXPORT void dallocx(void *pointer, int flags) {
    void *forward = optional_lookup(DALLOCX);
    live_forget(pointer);
    if (forward)
        FORWARD_VOID(((dallocx_fn)forward)(pointer, flags));
    else
        FORWARD_VOID(next.free(pointer));
}

EXPORT void sdallocx(void *pointer, size_t size, int flags) {
    void *forward = optional_lookup(SDALLOCX);
    live_forget(pointer);
    if (forward)
        FORWARD_VOID(((sdallocx_fn)forward)(pointer, size, flags));
    else
        FORWARD_VOID(next.free(pointer));
}

/*
 * Memory a program maps for itself: an anonymous mapping it asks mmap (or
 * mmap64) for without an address is an allocation of its length (Python's
 * arenas, which hold its small objects; buffers a program maps directly).
 * Not sampled: file mappings, reservations (PROT_NONE: a JVM's heap, a
 * coroutine library's stacks, an allocator linked into the program:
 * address space, not memory), mappings at an address the program chose (it
 * manages that space itself), the mappings an allocator makes inside its
 * own calls (the allocation is sampled; see in_allocator), and what mremap
 * grows a mapping by (its hook cannot tell an anonymous mapping from a
 * file's, and SQLite grows its database's mapping so). glibc's malloc maps
 * its large blocks without these names, so they are never seen twice.
 *
 * In live mode, munmap, mremap and MAP_FIXED mappings take from the sampled
 * mappings what they unmap, move or cover (see `mappings`): a mapping
 * trimmed or partly unmapped is held for what is left of it, one moved
 * follows its new address, one wholly unmapped is freed. A mapping moved
 * by an mremap of only a part of it keeps the rest (the part moved is
 * counted freed).
 *
 * The marker's third argument says it was a mapping: ddprof keeps this
 * hook's frame (`mmap`, `mmap64`) as the sample's leaf, so that mapped
 * memory reads as such in the profile.
 */
static inline __attribute__((always_inline)) void report_mapping(size_t length, void *pointer) {
    if (!in_allocator && !in_operator_new && sampled(length))
        mark_sampled(length, pointer, 1);
}

static inline __attribute__((always_inline)) void *
mapping_hook(mmap_fn *forward, void *address, size_t length, int protection, int flags, int fd,
             long offset) {
    if (__builtin_expect(state != 2, 0)) {
        if (state == 1)
            return system_mmap(address, length, protection, flags, fd, offset);
        resolve();
    }
    /* A mapping put over sampled ones takes their place: what it covers of
     * them is unmapped. */
    if (address != 0 && (flags & MAP_FIXED))
        mappings_unmap(address, length);
    void *pointer = *forward ? (*forward)(address, length, protection, flags, fd, offset)
                             : system_mmap(address, length, protection, flags, fd, offset);
    if (pointer == MAP_FAILED)
        return pointer;
    if (address == 0 && (flags & MAP_ANONYMOUS) && protection != PROT_NONE)
        report_mapping(length, pointer);
    return pointer;
}

EXPORT void *mmap(void *address, size_t length, int protection, int flags, int fd, long offset) {
    return mapping_hook(&next.mmap, address, length, protection, flags, fd, offset);
}

EXPORT void *mmap64(void *address, size_t length, int protection, int flags, int fd,
                    long offset) {
    return mapping_hook(&next.mmap64, address, length, protection, flags, fd, offset);
}

EXPORT int munmap(void *address, size_t length) {
    if (__builtin_expect(state != 2, 0)) {
        if (state == 1)
            return system_munmap(address, length);
        resolve();
    }
    /* Reported before the range may be mapped again. */
    mappings_unmap(address, length);
    return next.munmap ? next.munmap(address, length) : system_munmap(address, length);
}

#define MREMAP_FIXED_FLAG 2

EXPORT void *mremap(void *old, size_t old_length, size_t length, int flags, ...) {
    void *wanted = 0;
    if (flags & MREMAP_FIXED_FLAG) {
        __builtin_va_list arguments;
        __builtin_va_start(arguments, flags);
        wanted = __builtin_va_arg(arguments, void *);
        __builtin_va_end(arguments);
    }
    if (__builtin_expect(state != 2, 0)) {
        if (state == 1)
            return system_mremap(old, old_length, length, flags, wanted);
        resolve();
    }
    /* The table's lock is held across the call when it follows mappings:
     * the old range, free once the call returns, cannot be mapped and
     * sampled by another thread before the mapping that left it is
     * renamed. */
    int following = old_length != 0 && __atomic_load_n(&mappings_used, __ATOMIC_RELAXED) != 0 &&
                    mappings_enter();
    void *moved = next.mremap ? next.mremap(old, old_length, length, flags, wanted)
                              : system_mremap(old, old_length, length, flags, wanted);
    if (following) {
        if (moved != MAP_FAILED)
            mappings_remap(old, old_length, moved, length);
        mappings_leave();
    }
    return moved;
}

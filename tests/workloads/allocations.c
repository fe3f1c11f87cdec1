/*
 * allocations: allocates with known proportions, in known functions, and
 * prints the exact totals, for the sALLOC tests.
 *
 *   alloc_small   malloc, 64-256 bytes          (mostly below the mean: the
 *                                               sampler's weights matter)
 *   alloc_medium  calloc, 4-64 KiB
 *   alloc_large   posix_memalign + realloc, 1-4 MiB (above the 512 KiB mean)
 *   alloc_aligned aligned_alloc / memalign, 1-8 KiB
 * each called from `main` (or from `thread_body` in THREADS short threads
 * started a few at a time, or in a forked child: `child_allocs`), with a
 * byte budget each (a share of MEGABYTES). Every block is freed.
 *
 * Usage: allocations MEGABYTES [THREADS] [fork]
 * Prints, per function: "total FUNCTION BYTES COUNT" (the child's under
 * child_allocs, the threads' also under thread_body), and for realloc the
 * new size counts, as the sampler sees it.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>
#include <malloc.h>

#include "allocation_workload.h"

KEEP_FRAME void alloc_small(unsigned long long budget, uint64_t *seed, struct totals *t) {
    while (t->bytes < budget) {
        size_t size = 64 + lcg(seed) % 193;
        char *p = malloc(size);
        touch(p, size);
        free(p);
        t->bytes += size;
        t->count++;
    }
}

KEEP_FRAME void alloc_medium(unsigned long long budget, uint64_t *seed, struct totals *t) {
    while (t->bytes < budget) {
        size_t count = 1 + lcg(seed) % 16, size = 4096;
        char *p = calloc(count, size);
        touch(p, count * size);
        free(p);
        t->bytes += count * size;
        t->count++;
    }
}

KEEP_FRAME void alloc_large(unsigned long long budget, uint64_t *seed, struct totals *t) {
    while (t->bytes < budget) {
        size_t size = (1 + lcg(seed) % 3) << 20;
        void *p = NULL;
        if (posix_memalign(&p, 64, size) != 0)
            abort();
        touch(p, size);
        size_t grown = size + (1 << 20);
        char *q = realloc(p, grown);
        touch(q, grown);
        free(q);
        t->bytes += size + grown;
        t->count += 2;
    }
}

KEEP_FRAME void alloc_aligned(unsigned long long budget, uint64_t *seed, struct totals *t) {
    while (t->bytes < budget) {
        size_t size = 1024 * (1 + lcg(seed) % 8);
        char *p = (t->count & 1) ? aligned_alloc(64, size) : memalign(256, size);
        touch(p, size);
        free(p);
        t->bytes += size;
        t->count++;
    }
}

static unsigned long long megabytes;
static struct totals small, medium, large, aligned, in_threads;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* Shares of the budget: small 20 %, medium 30 %, large 40 %, aligned 10 %. */
static void run_all(unsigned long long bytes, uint64_t seed, int in_thread) {
    struct totals s = {0, 0}, m = {0, 0}, l = {0, 0}, a = {0, 0};
    alloc_small(bytes / 5, &seed, &s);
    alloc_medium(bytes * 3 / 10, &seed, &m);
    alloc_large(bytes * 2 / 5, &seed, &l);
    alloc_aligned(bytes / 10, &seed, &a);
    pthread_mutex_lock(&lock);
    if (in_thread) {
        in_threads.bytes += s.bytes + m.bytes + l.bytes + a.bytes;
        in_threads.count += s.count + m.count + l.count + a.count;
    }
    small.bytes += s.bytes, small.count += s.count;
    medium.bytes += m.bytes, medium.count += m.count;
    large.bytes += l.bytes, large.count += l.count;
    aligned.bytes += a.bytes, aligned.count += a.count;
    pthread_mutex_unlock(&lock);
}

static unsigned long long per_thread;

KEEP_FRAME void *thread_body(void *argument) {
    run_all(per_thread, (uint64_t)(uintptr_t)argument * 7919 + 1, 1);
    return NULL;
}

KEEP_FRAME void child_allocs(unsigned long long bytes) {
    struct totals t = {0, 0};
    uint64_t seed = 99;
    alloc_small(bytes, &seed, &t);
    printf("total child_allocs %llu %llu\n", t.bytes, t.count);
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: allocations MEGABYTES [THREADS] [fork]\n");
        return 2;
    }
    /* stdout's buffer is static: glibc would otherwise malloc it at the
     * first printf, an allocation outside the four functions that the
     * sampler takes about once a hundred runs. */
    static char stdout_buffer[BUFSIZ];
    setvbuf(stdout, stdout_buffer, _IOFBF, sizeof stdout_buffer);
    megabytes = strtoull(argv[1], NULL, 10);
    int threads = argc > 2 ? atoi(argv[2]) : 0;
    int fork_child = argc > 3 && strcmp(argv[3], "fork") == 0;
    unsigned long long total = megabytes << 20;
    if (fork_child) {
        pid_t child = fork();
        if (child == 0) {
            child_allocs(total / 2);
            _exit(0);
        }
        int status = 0;
        waitpid(child, &status, 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            return 3;
    }
    if (threads > 0) {
        /* Half in the main thread, half in short threads, 8 at a time. */
        run_all(total / 2, 12345, 0);
        per_thread = total / 2 / threads;
        for (int started = 0; started < threads; started += 8) {
            pthread_t ids[8];
            int n = threads - started < 8 ? threads - started : 8;
            for (int i = 0; i < n; i++)
                if (pthread_create(&ids[i], NULL, thread_body, (void *)(uintptr_t)(started + i)))
                    return 4;
            for (int i = 0; i < n; i++)
                pthread_join(ids[i], NULL);
        }
    } else {
        run_all(total, 12345, 0);
    }
    printf("total alloc_small %llu %llu\n", small.bytes, small.count);
    printf("total alloc_medium %llu %llu\n", medium.bytes, medium.count);
    printf("total alloc_large %llu %llu\n", large.bytes, large.count);
    printf("total alloc_aligned %llu %llu\n", aligned.bytes, aligned.count);
    if (threads > 0)
        printf("total thread_body %llu %llu\n", in_threads.bytes, in_threads.count);
    return 0;
}

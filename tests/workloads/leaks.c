/*
 * leaks: a program that leaks in one function and frees everything else,
 * for the live heap (sALLOC mode=l). For SECONDS seconds:
 *   - leak_records keeps LEAK_MB_PER_S MiB a second in blocks of 1-32 KiB
 *     (never freed): what the live heap must show;
 *   - churn allocates ~8 times as much in blocks of 16 B-256 KiB and frees
 *     each at once (malloc, calloc, realloc growth);
 *   - queue_messages allocates 4 KiB messages that a second thread frees
 *     (frees in another thread than the allocation).
 * Every 100 ms it prints `live REALTIME_NS BYTES`: what the allocator holds
 * (mallinfo2: in its arenas plus its mmap'd blocks), the true live heap.
 *
 * Expected stacks of the live heap (innermost first):
 *   leak_records, main
 *
 * Usage: leaks SECONDS [LEAK_MB_PER_S]
 */
#define _GNU_SOURCE
#include <malloc.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

static uint64_t random_state = 88172645463325252ull;
static uint64_t next_random(void) {
    random_state ^= random_state << 13;
    random_state ^= random_state >> 7;
    random_state ^= random_state << 17;
    return random_state;
}

static double now(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* The leaked blocks, chained through their first word. */
static void *leaked;
volatile uint64_t leaks_sink;

KEEP_FRAME void leak_records(size_t bytes) {
    for (size_t done = 0; done < bytes;) {
        size_t size = 1024 + next_random() % (31 * 1024);
        void **block = malloc(size);
        memset(block, 0x5a, size < 256 ? size : 256);
        *block = leaked;
        leaked = block;
        done += size;
    }
}

KEEP_FRAME void churn(size_t bytes) {
    for (size_t done = 0; done < bytes;) {
        size_t size = 16 + next_random() % (256 * 1024);
        char *block;
        switch (next_random() % 3) {
        case 0:
            block = malloc(size);
            break;
        case 1:
            block = calloc(1, size);
            break;
        default:
            block = malloc(size / 4 + 1);
            block = realloc(block, size);
            break;
        }
        block[0] = 1;
        leaks_sink += (uintptr_t)block[0];
        free(block);
        done += size;
    }
}

/* Messages from the main thread, freed by the consumer. */
#define QUEUE 1024
static void *queue[QUEUE];
static unsigned head, tail;
static int done_producing;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t more = PTHREAD_COND_INITIALIZER;

KEEP_FRAME void queue_messages(int count) {
    for (int i = 0; i < count; i++) {
        char *message = malloc(4096);
        message[0] = (char)i;
        pthread_mutex_lock(&lock);
        if (head - tail < QUEUE) {
            queue[head++ % QUEUE] = message;
            message = NULL;
            pthread_cond_signal(&more);
        }
        pthread_mutex_unlock(&lock);
        free(message); /* queue full */
    }
}

static void *consume(void *unused) {
    (void)unused;
    pthread_mutex_lock(&lock);
    for (;;) {
        while (head == tail && !done_producing)
            pthread_cond_wait(&more, &lock);
        if (head == tail)
            break;
        void *message = queue[tail++ % QUEUE];
        pthread_mutex_unlock(&lock);
        free(message);
        pthread_mutex_lock(&lock);
    }
    pthread_mutex_unlock(&lock);
    return NULL;
}

static size_t live_bytes(void) {
    struct mallinfo2 info = mallinfo2();
    return info.uordblks + info.hblkhd;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? atof(argv[1]) : 10;
    double leak_rate = (argc > 2 ? atof(argv[2]) : 30) * 1024 * 1024;
    pthread_t consumer;
    if (pthread_create(&consumer, NULL, consume, NULL) != 0)
        return 1;
    double start = now(CLOCK_MONOTONIC), next_print = start;
    for (int step = 0;; step++) {
        double t = now(CLOCK_MONOTONIC);
        if (t >= next_print) {
            printf("live %.0f %zu\n", now(CLOCK_REALTIME) * 1e9, live_bytes());
            fflush(stdout);
            next_print += 0.1;
        }
        if (t - start >= seconds)
            break;
        /* 10 ms worth of each, then wait for the wall clock to catch up. */
        leak_records((size_t)(leak_rate / 100));
        churn((size_t)(leak_rate * 8 / 100));
        queue_messages(64);
        double due = start + (step + 1) * 0.01;
        while (now(CLOCK_MONOTONIC) < due) {
            struct timespec pause = {0, 1000000};
            nanosleep(&pause, NULL);
        }
    }
    pthread_mutex_lock(&lock);
    done_producing = 1;
    pthread_cond_signal(&more);
    pthread_mutex_unlock(&lock);
    pthread_join(consumer, NULL);
    printf("live %.0f %zu\n", now(CLOCK_REALTIME) * 1e9, live_bytes());
    return 0;
}

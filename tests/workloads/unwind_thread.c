/* A worker thread runs thread_main -> thread_outer -> thread_inner and spins
 * there, while the main thread waits in pthread_join. The thread's stack
 * ends in glibc's start_thread / clone3 (its root), not in main.
 * Prints "ready <worker tid>" once the worker runs; runs until killed. */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

static volatile unsigned long sink;

#define NOINLINE __attribute__((noinline, noclone))

NOINLINE unsigned long thread_inner(unsigned long x) {
    for (int i = 0; i < 50000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    return x;
}

NOINLINE unsigned long thread_outer(unsigned long x) {
    volatile unsigned long local[3];
    local[0] = x;
    unsigned long r = thread_inner(x + local[0]);
    return r ^ local[0];
}

NOINLINE void *thread_main(void *arg) {
    (void)arg;
    printf("ready %d\n", gettid());
    fflush(stdout);
    for (unsigned long i = 0;; i++)
        sink += thread_outer(i);
    return NULL;
}

int main(void) {
    pthread_t worker;
    if (pthread_create(&worker, NULL, thread_main, NULL) != 0)
        return 1;
    pthread_join(worker, NULL);
    return 0;
}

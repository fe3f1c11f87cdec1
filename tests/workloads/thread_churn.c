/*
 * thread_churn: a server that starts a thread per request. THREADS threads
 * are alive at any time, each living 50-250 ms (asleep) and replaced as it
 * ends. Prints "ready" once THREADS run; then, at a line on stdin, one
 * thread started at the beginning burns BURN_MS of its own CPU time in
 * thread_churn_busy; when it is done, no thread is replaced any more and
 * the program exits once they have all ended.
 *
 * Expected stacks of the burn (innermost first):
 *   thread_churn_busy, thread_churn_burner, (libc: start_thread, clone3)
 *
 * Usage: thread_churn THREADS BURN_MS
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

static atomic_int alive;
static atomic_int stop;
static long burn_ms = 1000;
volatile unsigned long thread_churn_sink;

static double thread_cpu_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void *request(void *argument) {
    long ms = (long)argument;
    struct timespec nap = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&nap, NULL);
    atomic_fetch_sub(&alive, 1);
    return NULL;
}

KEEP_FRAME void thread_churn_busy(void) {
    double end = thread_cpu_seconds() + burn_ms / 1000.0;
    while (thread_cpu_seconds() < end)
        for (int i = 0; i < 1000; i++)
            thread_churn_sink += i;
}

KEEP_FRAME void *thread_churn_burner(void *argument) {
    (void)argument;
    char line[16];
    if (fgets(line, sizeof line, stdin) != NULL)
        thread_churn_busy();
    atomic_store(&stop, 1);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1000;
    burn_ms = argc > 2 ? atol(argv[2]) : 1000;
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setstacksize(&attributes, 64 << 10);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_t burner;
    if (pthread_create(&burner, NULL, thread_churn_burner, NULL) != 0)
        return 1;
    unsigned seed = 1;
    int ready = 0;
    while (!atomic_load(&stop)) {
        while (atomic_load(&alive) < threads) {
            pthread_t thread;
            long ms = 50 + rand_r(&seed) % 200;
            atomic_fetch_add(&alive, 1);
            if (pthread_create(&thread, &attributes, request, (void *)ms) != 0) {
                atomic_fetch_sub(&alive, 1);
                break;
            }
        }
        if (!ready) {
            printf("ready\n");
            fflush(stdout);
            ready = 1;
        }
        struct timespec tick = {0, 1000000L};
        nanosleep(&tick, NULL);
    }
    pthread_join(burner, NULL);
    while (atomic_load(&alive) > 0) {
        struct timespec tick = {0, 1000000L};
        nanosleep(&tick, NULL);
    }
    return 0;
}

/*
 * switcher: two threads pass a token back and forth through two pipes, so
 * that each blocks in read(2) for every message: two context switches per
 * round trip. Both threads are pinned to the CPU the program starts on, so
 * that each switch is a direct hand-over from one thread to the other
 * (about 10^6 switches a second on the project's VM) and the rate does not
 * depend on where the scheduler puts them (unpinned, it varied from 6 to
 * 11 x 10^4 a second run to run, and a profiler's own activity moved it).
 * The cost of anything that runs at every context switch (a scheduler
 * tracepoint) shows as a longer run.
 *
 * Expected stacks (innermost first), on CPU and while blocked:
 *   "switcher_ping": switcher_ping_work, switcher_thread, (libc thread start)
 *   "switcher_pong": switcher_pong_work, switcher_thread, (libc thread start)
 *
 * Usage: switcher --work N (fixed work for benchmarks: N units of 500,000
 * round trips each, about a second of CPU), or switcher SECONDS; with
 * `--spin NS` after either, each thread computes NS nanoseconds with the
 * token before passing it on (8000: ~10^5 switches a second, the rate of
 * the wall-time event's cost bar; a unit of work is then 50,000 round
 * trips, again about a second). At the end it prints one line:
 * `switcher: R round trips, S context switches (V voluntary) in W s, C s of
 * CPU: X switches/s`.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

static int ping_to_pong[2];
static int pong_to_ping[2];
static long rounds_wanted;
static long spin_ns;
static double deadline;
static volatile long rounds_done;

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Computes for spin_ns nanoseconds of this thread's CPU time. */
static void spin(void) {
    if (spin_ns <= 0)
        return;
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    long long end = ts.tv_sec * 1000000000LL + ts.tv_nsec + spin_ns;
    do {
        clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    } while (ts.tv_sec * 1000000000LL + ts.tv_nsec < end);
}

static void must_read(int fd, char *byte) {
    if (read(fd, byte, 1) != 1) {
        perror("switcher: read");
        exit(1);
    }
}

static void must_write(int fd, char byte) {
    if (write(fd, &byte, 1) != 1) {
        perror("switcher: write");
        exit(1);
    }
}

/* Sends the token and waits for it back; a zero byte tells pong to stop. */
KEEP_FRAME void switcher_ping_work(void) {
    char byte = 1;
    long round = 0;
    for (;;) {
        int last = rounds_wanted > 0 ? round + 1 >= rounds_wanted
                                     : (round % 1024 == 0 && now_seconds() >= deadline);
        must_write(ping_to_pong[1], last ? 0 : 1);
        if (last)
            break;
        must_read(pong_to_ping[0], &byte);
        spin();
        round++;
    }
    rounds_done = round + 1;
}

/* Returns the token until told to stop. */
KEEP_FRAME void switcher_pong_work(void) {
    char byte = 1;
    for (;;) {
        must_read(ping_to_pong[0], &byte);
        if (byte == 0)
            break;
        spin();
        must_write(pong_to_ping[1], 1);
    }
}

KEEP_FRAME void *switcher_thread(void *is_ping) {
    prctl(PR_SET_NAME, is_ping ? "switcher_ping" : "switcher_pong");
    if (is_ping)
        switcher_ping_work();
    else
        switcher_pong_work();
    return NULL;
}

int main(int argc, char **argv) {
    if (argc >= 3 && strcmp(argv[argc - 2], "--spin") == 0) {
        spin_ns = atol(argv[argc - 1]);
        argc -= 2;
    }
    if (argc == 3 && strcmp(argv[1], "--work") == 0) {
        rounds_wanted = atol(argv[2]) * (spin_ns > 0 ? 50000L : 500000L);
    } else if (argc == 2) {
        deadline = now_seconds() + atof(argv[1]);
    } else {
        fprintf(stderr, "usage: switcher --work N | switcher SECONDS, then --spin NS\n");
        return 2;
    }
    if (pipe(ping_to_pong) != 0 || pipe(pong_to_ping) != 0) {
        perror("switcher: pipe");
        return 1;
    }
    int start_cpu = sched_getcpu();
    cpu_set_t one_cpu;
    CPU_ZERO(&one_cpu);
    CPU_SET(start_cpu < 0 ? 0 : start_cpu, &one_cpu);
    if (sched_setaffinity(0, sizeof(one_cpu), &one_cpu) != 0) {
        perror("switcher: sched_setaffinity");
        return 1;
    }
    double started = now_seconds();
    pthread_t ping, pong;
    if (pthread_create(&pong, NULL, switcher_thread, NULL) != 0 ||
        pthread_create(&ping, NULL, switcher_thread, (void *)1) != 0) {
        fprintf(stderr, "switcher: cannot start its threads\n");
        return 1;
    }
    pthread_join(ping, NULL);
    pthread_join(pong, NULL);
    double elapsed = now_seconds() - started;
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    long switches = usage.ru_nvcsw + usage.ru_nivcsw;
    double cpu = usage.ru_utime.tv_sec + usage.ru_utime.tv_usec / 1e6 + usage.ru_stime.tv_sec +
                 usage.ru_stime.tv_usec / 1e6;
    printf("switcher: %ld round trips, %ld context switches (%ld voluntary) in %.3f s, "
           "%.3f s of CPU: %.0f switches/s\n",
           (long)rounds_done, switches, (long)usage.ru_nvcsw, elapsed, cpu, switches / elapsed);
    return 0;
}

// Threads that wait in known ways, each measuring its own truth, for
// sWALL (wall time): `waits SECONDS [all|sleeper|long] [go]` (`sleeper`:
// that thread alone, with a CPU to itself on a 2-CPU machine; `long`: one
// thread that computes for ~0.2 s, sleeps SECONDS in one call of
// long_sleep(), then computes for ~4 ms; `go`: print `pid N`, then start
// the threads once a byte comes on stdin, for a profiler to attach first).
//
// - `sleeper`: computes ~4 ms in compute_half(), then sleeps ~4 ms in
//   sleep_half() (nanosleep), so half of its wall time is off the CPU.
// - `holder` and `waiter`: the holder takes a mutex and computes ~6 ms in
//   hold_lock(), then ~2 ms outside it; the waiter wants the mutex in
//   wait_for_lock() (pthread_mutex_lock, a futex wait) each time the
//   holder has it, then computes ~1 ms in use_lock().
// - `reader` and `writer`: the writer computes ~3 ms in make_message()
//   then writes a byte to a pipe; the reader blocks in read_pipe() (read).
//
// Each thread moves to the other CPU every ten rounds (pinned alternately),
// so that a wait that starts on one CPU ends on another. At the end each
// prints `truth THREAD wait_ns=N cpu_ns=N` (its time off the CPU in its
// wait, measured around the call; its CPU time from CLOCK_THREAD_CPUTIME_ID;
// its time from start to end, `alive_ns`).
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double seconds;
static volatile uint64_t sink;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int pipe_fds[2];
static volatile int stop;

static uint64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

__attribute__((noinline)) static void spin_ns(uint64_t ns) {
    uint64_t end = now_ns(CLOCK_THREAD_CPUTIME_ID) + ns;
    uint64_t x = sink;
    while (now_ns(CLOCK_THREAD_CPUTIME_ID) < end) {
        for (int i = 0; i < 1000; i++)
            x = x * 6364136223846793005ull + 1442695040888963407ull;
    }
    sink = x;
}

static void move_every_ten(int round) {
    if (round % 10 != 0)
        return;
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 2)
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((round / 10) % 2, &set);
    sched_setaffinity(0, sizeof(set), &set);
}

struct truth {
    const char *name;
    uint64_t wait_ns;
    uint64_t started_ns;
};

static void report(struct truth *truth) {
    printf("truth %s wait_ns=%llu cpu_ns=%llu alive_ns=%llu\n", truth->name,
           (unsigned long long)truth->wait_ns,
           (unsigned long long)now_ns(CLOCK_THREAD_CPUTIME_ID),
           (unsigned long long)(now_ns(CLOCK_MONOTONIC) - truth->started_ns));
}

__attribute__((noinline)) void compute_half(void) {
    spin_ns(4000000);
    sink++; // not a tail call: the frame stays
}

__attribute__((noinline)) uint64_t sleep_half(void) {
    uint64_t start = now_ns(CLOCK_MONOTONIC);
    struct timespec ts = {0, 4000000};
    nanosleep(&ts, NULL);
    return now_ns(CLOCK_MONOTONIC) - start;
}

static void *sleeper(void *arg) {
    struct truth *truth = arg;
    truth->started_ns = now_ns(CLOCK_MONOTONIC);
    uint64_t end = now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    for (int round = 0; now_ns(CLOCK_MONOTONIC) < end; round++) {
        move_every_ten(round);
        compute_half();
        truth->wait_ns += sleep_half();
    }
    report(truth);
    return NULL;
}

__attribute__((noinline)) void hold_lock(void) {
    spin_ns(6000000);
    sink++;
}

static void *holder(void *arg) {
    struct truth *truth = arg;
    truth->started_ns = now_ns(CLOCK_MONOTONIC);
    uint64_t end = now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    for (int round = 0; now_ns(CLOCK_MONOTONIC) < end; round++) {
        move_every_ten(round);
        pthread_mutex_lock(&lock);
        hold_lock();
        pthread_mutex_unlock(&lock);
        spin_ns(2000000);
    }
    stop = 1;
    report(truth);
    return NULL;
}

__attribute__((noinline)) uint64_t wait_for_lock(void) {
    uint64_t start = now_ns(CLOCK_MONOTONIC);
    pthread_mutex_lock(&lock);
    return now_ns(CLOCK_MONOTONIC) - start;
}

__attribute__((noinline)) void use_lock(void) {
    spin_ns(1000000);
    sink++;
}

static void *waiter(void *arg) {
    struct truth *truth = arg;
    truth->started_ns = now_ns(CLOCK_MONOTONIC);
    for (int round = 0; !stop; round++) {
        move_every_ten(round);
        truth->wait_ns += wait_for_lock();
        pthread_mutex_unlock(&lock);
        use_lock();
    }
    report(truth);
    return NULL;
}

__attribute__((noinline)) void make_message(void) {
    spin_ns(3000000);
    sink++;
}

static void *writer(void *arg) {
    struct truth *truth = arg;
    truth->started_ns = now_ns(CLOCK_MONOTONIC);
    uint64_t end = now_ns(CLOCK_MONOTONIC) + (uint64_t)(seconds * 1e9);
    char byte = 1;
    for (int round = 0; now_ns(CLOCK_MONOTONIC) < end; round++) {
        move_every_ten(round);
        make_message();
        if (write(pipe_fds[1], &byte, 1) != 1)
            break;
    }
    close(pipe_fds[1]);
    report(truth);
    return NULL;
}

__attribute__((noinline)) uint64_t read_pipe(char *byte, ssize_t *got) {
    uint64_t start = now_ns(CLOCK_MONOTONIC);
    *got = read(pipe_fds[0], byte, 1);
    return now_ns(CLOCK_MONOTONIC) - start;
}

__attribute__((noinline)) uint64_t long_sleep(void) {
    uint64_t start = now_ns(CLOCK_MONOTONIC);
    struct timespec ts = {(time_t)seconds, (long)((seconds - (time_t)seconds) * 1e9)};
    nanosleep(&ts, NULL);
    return now_ns(CLOCK_MONOTONIC) - start;
}

static void *long_sleeper(void *arg) {
    struct truth *truth = arg;
    truth->started_ns = now_ns(CLOCK_MONOTONIC);
    // A process's first switch-outs may come before the profiler has
    // described it (its stacks then end in libc): run a while first.
    for (int i = 0; i < 50; i++)
        compute_half();
    truth->wait_ns = long_sleep();
    compute_half();
    report(truth);
    return NULL;
}

static void *reader(void *arg) {
    struct truth *truth = arg;
    truth->started_ns = now_ns(CLOCK_MONOTONIC);
    char byte;
    ssize_t got = 1;
    for (int round = 0; got == 1; round++) {
        move_every_ten(round);
        truth->wait_ns += read_pipe(&byte, &got);
    }
    report(truth);
    return NULL;
}

int main(int argc, char **argv) {
    seconds = argc > 1 ? atof(argv[1]) : 3.0;
    if (argc > 3 && strcmp(argv[3], "go") == 0) {
        printf("pid %d\n", (int)getpid());
        fflush(stdout);
        char go;
        if (read(0, &go, 1) != 1)
            return 1;
    }
    int sleeper_alone = argc > 2 && strcmp(argv[2], "sleeper") == 0;
    if (argc > 2 && strcmp(argv[2], "long") == 0) {
        pthread_t id;
        struct truth truth = {"long_sleeper", 0, 0};
        pthread_create(&id, NULL, long_sleeper, &truth);
        pthread_setname_np(id, "long_sleeper");
        pthread_join(id, NULL);
        fflush(stdout);
        return 0;
    }
    if (pipe(pipe_fds) != 0)
        return 1;
    struct {
        const char *name;
        void *(*run)(void *);
    } threads[] = {{"sleeper", sleeper}, {"holder", holder}, {"waiter", waiter},
                   {"writer", writer},   {"reader", reader}};
    enum { ALL = sizeof(threads) / sizeof(threads[0]) };
    int count = sleeper_alone ? 1 : ALL;
    pthread_t ids[ALL];
    struct truth truths[ALL];
    for (int i = 0; i < count; i++) {
        truths[i] = (struct truth){threads[i].name, 0};
        pthread_create(&ids[i], NULL, threads[i].run, &truths[i]);
        pthread_setname_np(ids[i], threads[i].name);
    }
    for (int i = 0; i < count; i++)
        pthread_join(ids[i], NULL);
    fflush(stdout);
    return 0;
}

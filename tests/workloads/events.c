/*
 * events: known page faults and known context switches, for the tests of
 * the non-CPU events (sPF, sCS, sched:sched_switch). Prints what
 * getrusage counted around each part, on one line to stdout:
 *   faults=<minor+major faults in events_touch_pages> switches=<voluntary+
 *   involuntary switches in events_sleep_often> pages=<pages touched>
 *   sleeps=<sleeps>
 *
 * events_touch_pages touches each 4 KiB page of a fresh anonymous mapping
 * once (huge pages refused): one page fault per page. events_sleep_often
 * sleeps 200 us at a time: one voluntary context switch per sleep.
 *
 * Expected stacks (innermost first):
 *   events_touch_pages, events_fault_part, main, (libc start)
 *   (libc's clock_nanosleep), events_sleep_often, events_switch_part, main
 *
 * Usage: events SECONDS [PAGES [SLEEPS]]   (SECONDS is ignored: the work
 * is fixed; defaults 20000 pages, 1000 sleeps)
 */
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <time.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

static long faults_now(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_minflt + usage.ru_majflt;
}

static long switches_now(void) {
    struct rusage usage;
    getrusage(RUSAGE_SELF, &usage);
    return usage.ru_nvcsw + usage.ru_nivcsw;
}

KEEP_FRAME void events_touch_pages(volatile char *memory, long pages) {
    for (long page = 0; page < pages; page++) {
        memory[page * 4096] = (char)page;
    }
}

KEEP_FRAME long events_fault_part(long pages) {
    char *memory = mmap(NULL, (size_t)pages * 4096, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) {
        perror("mmap");
        exit(1);
    }
    madvise(memory, (size_t)pages * 4096, MADV_NOHUGEPAGE);
    long before = faults_now();
    events_touch_pages(memory, pages);
    long faults = faults_now() - before;
    munmap(memory, (size_t)pages * 4096);
    return faults;
}

KEEP_FRAME void events_sleep_often(long sleeps) {
    struct timespec pause = {0, 200 * 1000};
    for (long i = 0; i < sleeps; i++) {
        nanosleep(&pause, NULL);
    }
}

KEEP_FRAME long events_switch_part(long sleeps) {
    long before = switches_now();
    events_sleep_often(sleeps);
    return switches_now() - before;
}

int main(int argc, char **argv) {
    long pages = argc > 2 ? atol(argv[2]) : 20000;
    long sleeps = argc > 3 ? atol(argv[3]) : 1000;
    /* The switches first: their ~0.25 s of sleeps give a profiler the
     * time to describe the process before the burst of faults (~30 ms of
     * CPU), which would otherwise come before it has (see tests/events.rs). */
    long switches = events_switch_part(sleeps);
    long faults = events_fault_part(pages);
    printf("faults=%ld switches=%ld pages=%ld sleeps=%ld\n", faults, switches, pages, sleeps);
    return 0;
}

/*
 * provenance SECONDS LIBRARY: spends its CPU time in thirds, in code of
 * each provenance: its own (`app_work`), a library shipped with it
 * (LIBRARY's `shipped_work`, dlopen'ed), and the system's (glibc's memcpy,
 * and the kernel's read of /dev/zero).
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

__attribute__((noinline)) uint64_t app_work(uint64_t rounds) {
    volatile uint64_t x = 7;
    for (uint64_t i = 0; i < rounds; i++)
        x = (x ^ i) * 0x9e3779b97f4a7c15ull;
    return x;
}

static char from[1 << 20], to[1 << 20];

__attribute__((noinline)) void system_work(int zero, int rounds) {
    for (int i = 0; i < rounds; i++) {
        memcpy(to, from, sizeof to);
        __asm__ volatile("" : : "r"(to) : "memory");
        if (read(zero, to, sizeof to) < 0)
            exit(1);
    }
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: provenance SECONDS LIBRARY\n");
        return 2;
    }
    double seconds = atof(argv[1]);
    void *library = dlopen(argv[2], RTLD_NOW);
    uint64_t (*shipped_work)(uint64_t) = library ? dlsym(library, "shipped_work") : NULL;
    int zero = open("/dev/zero", O_RDONLY);
    if (!shipped_work || zero < 0) {
        fprintf(stderr, "provenance: %s\n", dlerror());
        return 1;
    }
    double end = now() + seconds;
    uint64_t sum = 0;
    while (now() < end) {
        sum += app_work(2000000);
        sum += shipped_work(2000000);
        system_work(zero, 20);
    }
    printf("%llu\n", (unsigned long long)(sum & 1));
    return 0;
}

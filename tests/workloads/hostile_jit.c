/*
 * hostile_jit: a minimal JIT. Copies a counting loop into an anonymous
 * RWX page and runs it for SECONDS of wall time; once the code is in place
 * it writes "PID ADDRESS" (hexadecimal, no 0x) to ADDRESS_FILE (written
 * under another name and renamed, so a reader sees all of it or nothing).
 * No ELF file describes the page: only a perf map (/tmp/perf-PID.map) can
 * name it.
 *
 * Expected stacks (innermost first): [the anonymous page], main, (libc start)
 *
 * Usage: hostile_jit SECONDS ADDRESS_FILE
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    double seconds = atof(argv[1]);
    /* mov rax, rdi; 1: dec rax; jnz 1b; ret */
    static const unsigned char code[] = {0x48, 0x89, 0xf8, 0x48, 0xff, 0xc8, 0x75, 0xfb, 0xc3};
    unsigned char *page = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                               MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED)
        return 1;
    memcpy(page, code, sizeof code);
    char temporary[4096];
    snprintf(temporary, sizeof temporary, "%s.tmp", argv[2]);
    FILE *out = fopen(temporary, "w");
    if (!out)
        return 1;
    fprintf(out, "%d %lx\n", (int)getpid(), (unsigned long)page);
    if (fclose(out) != 0 || rename(temporary, argv[2]) != 0)
        return 1;
    long (*jitted)(long) = (long (*)(long))page;
    double end = now_seconds() + seconds;
    while (now_seconds() < end)
        jitted(2000000);
    return 0;
}

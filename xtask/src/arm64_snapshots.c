/*
 * arm64_snapshots: runs PROGRAM ARGS, stops it COUNT times at random
 * moments (PTRACE_INTERRUPT), and writes to OUT what a perf sample with a
 * user-stack copy would hold at each stop: the registers (X0-X30, SP, PC,
 * PSTATE) and the stack bytes from SP (at most 16 KiB, never past the
 * stack's mapping), after the process's /proc/PID/maps. Run in the arm64
 * guest by `cargo xtask test-arm64`; the differential test
 * (tests/unwind_diff.rs) unwinds every snapshot with ddprof's walker and
 * framehop's aarch64 unwinder and compares.
 *
 * OUT: "DDSNAP1\n", u64 maps length, the maps text, then per stop
 * u64 registers[34], u64 stack length, the stack bytes (little-endian).
 *
 * Usage: arm64_snapshots COUNT OUT PROGRAM ARGS...
 */
#define _GNU_SOURCE
#include <elf.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MAX_STACK (16 * 1024)

static void put_u64(FILE *out, uint64_t value) { fwrite(&value, 8, 1, out); }

/* The end of the mapping holding ADDRESS, from /proc/PID/maps. */
static uint64_t mapping_end(const char *maps, uint64_t address) {
    const char *line = maps;
    while (line && *line) {
        unsigned long long start, end;
        if (sscanf(line, "%llx-%llx", &start, &end) == 2 && address >= start && address < end)
            return end;
        line = strchr(line, '\n');
        if (line)
            line++;
    }
    return address;
}

static char *read_maps(pid_t pid, size_t *length) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    FILE *file = fopen(path, "r");
    if (!file)
        return NULL;
    size_t capacity = 1 << 16;
    char *text = malloc(capacity + 1);
    *length = fread(text, 1, capacity, file);
    text[*length] = 0;
    fclose(file);
    return text;
}

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: %s COUNT OUT PROGRAM ARGS...\n", argv[0]);
        return 2;
    }
    int count = atoi(argv[1]);
    FILE *out = fopen(argv[2], "wb");
    if (!out) {
        perror(argv[2]);
        return 1;
    }
    pid_t pid = fork();
    if (pid == 0) {
        execv(argv[3], argv + 3);
        perror(argv[3]);
        _exit(127);
    }
    /* Past the dynamic loader: the libraries are mapped. */
    usleep(300 * 1000);
    if (ptrace(PTRACE_SEIZE, pid, 0, 0) != 0) {
        perror("PTRACE_SEIZE");
        return 1;
    }
    size_t maps_length = 0;
    char *maps = read_maps(pid, &maps_length);
    if (!maps) {
        perror("maps");
        return 1;
    }
    fwrite("DDSNAP1\n", 1, 8, out);
    put_u64(out, maps_length);
    fwrite(maps, 1, maps_length, out);
    static unsigned char stack[MAX_STACK];
    uint64_t random = (uint64_t)time(NULL) ^ 0x9e3779b97f4a7c15ull;
    int taken = 0;
    for (int i = 0; i < count; i++) {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        usleep(200 + random % 3000);
        if (ptrace(PTRACE_INTERRUPT, pid, 0, 0) != 0)
            break;
        int status;
        if (waitpid(pid, &status, __WALL) != pid || !WIFSTOPPED(status))
            break;
        uint64_t registers[34];
        struct iovec regset = {registers, sizeof registers};
        if (ptrace(PTRACE_GETREGSET, pid, (void *)NT_PRSTATUS, &regset) != 0) {
            perror("PTRACE_GETREGSET");
            break;
        }
        uint64_t sp = registers[31];
        uint64_t end = mapping_end(maps, sp);
        size_t length = end - sp < MAX_STACK ? (size_t)(end - sp) : MAX_STACK;
        struct iovec local = {stack, length};
        struct iovec remote = {(void *)sp, length};
        ssize_t read = process_vm_readv(pid, &local, 1, &remote, 1, 0);
        if (read < 0)
            read = 0;
        for (int r = 0; r < 34; r++)
            put_u64(out, registers[r]);
        put_u64(out, (uint64_t)read);
        fwrite(stack, 1, (size_t)read, out);
        taken++;
        ptrace(PTRACE_CONT, pid, 0, 0);
    }
    kill(pid, SIGKILL);
    waitpid(pid, NULL, __WALL);
    fclose(out);
    fprintf(stderr, "arm64_snapshots: %d snapshots of %s\n", taken, argv[3]);
    return taken == count ? 0 : 1;
}

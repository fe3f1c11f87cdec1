/*
 * exec_stamp FILE COMMAND [ARGS...]: writes CLOCK_MONOTONIC (nanoseconds)
 * to FILE, then execs COMMAND in its place (the same process). The bench
 * runs each program through it, under every tool, to time the program's
 * own run (from this exec to its exit) apart from what the tool made it
 * wait before it started. No allocation: it may run with the allocation
 * sampler preloaded.
 */
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    unsigned long long nanos = (unsigned long long)now.tv_sec * 1000000000ull + now.tv_nsec;
    char text[32];
    int at = sizeof text;
    text[--at] = '\n';
    do {
        text[--at] = (char)('0' + nanos % 10);
        nanos /= 10;
    } while (nanos);
    int fd = open(argv[1], O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, text + at, sizeof text - at) != (ssize_t)(sizeof text - at))
        return 2;
    close(fd);
    execvp(argv[2], argv + 2);
    return 127;
}

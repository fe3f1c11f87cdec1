/*
 * syscall_probe: makes each system call named by number on the command line
 * with all-zero arguments and prints "NUMBER ERRNO" (0 when it succeeded),
 * one line each. The old-kernel tests use it to see which calls a seccomp
 * filter lets through; zero arguments make most real calls fail quickly
 * with EFAULT, EBADF or EINVAL, never ENOSYS.
 *
 * Usage: syscall_probe NUMBER...
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        long number = strtol(argv[i], NULL, 10);
        errno = 0;
        long result = syscall(number, 0, 0, 0, 0, 0, 0);
        printf("%ld %d\n", number, result < 0 ? errno : 0);
    }
    return 0;
}

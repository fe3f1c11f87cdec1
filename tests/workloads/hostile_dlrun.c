/*
 * hostile_dlrun: dlopens LIBRARY and calls its `entry(seconds)`. With
 * CHILDREN, runs that many short-lived children one after another instead
 * (each re-execs argv[0], which must be an absolute path, so that each maps
 * LIBRARY anew), 20 ms apart.
 *
 * Expected stacks (innermost first): what LIBRARY's entry calls, entry,
 * main, (libc start).
 *
 * Usage: hostile_dlrun LIBRARY SECONDS [CHILDREN]
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 3)
        return 2;
    if (argc > 3) {
        int children = atoi(argv[3]);
        for (int i = 0; i < children; i++) {
            pid_t pid = fork();
            if (pid == 0) {
                execl(argv[0], argv[0], argv[1], argv[2], (char *)NULL);
                _exit(127);
            }
            if (pid > 0)
                waitpid(pid, NULL, 0);
            usleep(20000);
        }
        return 0;
    }
    void *library = dlopen(argv[1], RTLD_NOW);
    if (!library) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    void (*entry)(double) = (void (*)(double))dlsym(library, "entry");
    if (!entry)
        return 1;
    entry(atof(argv[2]));
    return 0;
}

/*
 * lazy_binding: a program whose time goes to ld.so's lazy binding. For
 * SECONDS it loads PLUGIN_PATH (lazy_binding_plugin.c, linked `-z lazy`)
 * with dlopen(RTLD_LAZY), calls its entry, which calls 2,000 functions of
 * its own through its PLT, each bound at that first call, and unloads it,
 * so that the next cycle binds them all again.
 *
 * Expected stacks (innermost first), most samples in ld.so:
 *   strcmp / check_match / do_lookup_x, _dl_lookup_symbol_x, _dl_fixup,
 *   _dl_runtime_resolve_xsavec (or _xsave, _fxsave), lazy_binding_plugin_run,
 *   lazy_binding_cycle, main, (libc start)
 * `_dl_runtime_resolve_*` keeps its frame's base in RBX (`mov %rsp,%rbx`:
 * it realigns the stack for the register save area) and `_dl_fixup`, below
 * it, saves RBX: a walk gets past the trampoline only by restoring RBX
 * from `_dl_fixup`'s frame.
 *
 * Usage: lazy_binding SECONDS PLUGIN_PATH
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

KEEP_FRAME int lazy_binding_cycle(const char *path, int acc) {
    void *plugin = dlopen(path, RTLD_LAZY | RTLD_LOCAL);
    if (!plugin) {
        fprintf(stderr, "lazy_binding: dlopen: %s\n", dlerror());
        exit(1);
    }
    int (*run)(int) = (int (*)(int))dlsym(plugin, "lazy_binding_plugin_run");
    if (!run) {
        fprintf(stderr, "lazy_binding: dlsym: %s\n", dlerror());
        exit(1);
    }
    acc = run(acc);
    dlclose(plugin);
    return acc;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: lazy_binding SECONDS PLUGIN_PATH\n");
        return 2;
    }
    double end = now_seconds() + atof(argv[1]);
    int acc = 0;
    long cycles = 0;
    while (now_seconds() < end) {
        acc = lazy_binding_cycle(argv[2], acc);
        cycles++;
    }
    printf("%ld cycles (%d)\n", cycles, acc);
    return 0;
}

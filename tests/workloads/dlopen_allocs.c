/*
 * dlopen_allocs: loads zlib with dlopen, compresses a buffer with it
 * (deflate allocates its ~270 KiB state through malloc inside the library),
 * unloads it with dlclose, ROUNDS times: allocations of a library that is
 * no longer mapped when the profile is written, for the sALLOC tests.
 *
 * Expected allocation stacks (innermost first):
 *   deflateInit2_, compress2, compress_once, main
 *
 * Usage: dlopen_allocs ROUNDS
 * Prints "rounds N" at the end.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

typedef int (*compress2_fn)(unsigned char *, unsigned long *, const unsigned char *,
                            unsigned long, int);

KEEP_FRAME int compress_once(compress2_fn compress2, const unsigned char *input, size_t size) {
    unsigned long out_size = size + size / 100 + 1024;
    unsigned char *out = malloc(out_size);
    int status = compress2(out, &out_size, input, size, 6);
    free(out);
    return status;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 200;
    size_t size = 64 * 1024;
    unsigned char *input = malloc(size);
    for (size_t i = 0; i < size; i++)
        input[i] = (unsigned char)(i * 7 % 251);
    for (int round = 0; round < rounds; round++) {
        void *zlib = dlopen("libz.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!zlib) {
            fprintf(stderr, "dlopen: %s\n", dlerror());
            return 1;
        }
        compress2_fn compress2 = (compress2_fn)dlsym(zlib, "compress2");
        if (!compress2 || compress_once(compress2, input, size) != 0)
            return 1;
        dlclose(zlib);
    }
    free(input);
    printf("rounds %d\n", rounds);
    return 0;
}

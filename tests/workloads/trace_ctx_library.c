/*
 * trace_ctx_library MODE LIBRARY SECONDS THREADS: serves fake requests on
 * THREADS threads for SECONDS, each request publishing its span ids
 * through a library that defines the OTEP 4947 TLS pointer
 * (trace_ctx_tlsdesc_plugin.c): MODE `preloaded`, the library was loaded
 * at start (LD_PRELOAD=LIBRARY), static TLS; MODE `dlopen`, it is
 * dlopen'ed 300 ms in, its TLS found through each thread's DTV, and the
 * requests start 200 ms later (the profiler reads where the library's
 * TLS lies once the loader has relocated it).
 *
 * A request spins in `request_work` (~15 ms) with its record published,
 * then the thread spins in `idle_work` (~5 ms) with none. Request k of the
 * thread with id tid has span id tid << 24 | k, and its record's key 0
 * (libdatadog's local root span id) is that with bit 62 set, in hex. Each
 * thread's record is only as long as what it holds (48 bytes, not the
 * OTEP's 640) and ends where an unmapped page starts: a reader that reads
 * a whole record's bytes at once must read it again in parts.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "otel_thread_ctx.h"
#include "request_work.h"

static void (*publish)(struct otel_thread_ctx_record *);
static double until;

static void big_endian(uint8_t *out, uint64_t value) {
    for (int i = 7; i >= 0; i--, value >>= 8)
        out[i] = (uint8_t)value;
}

static void *serve(void *unused) {
    (void)unused;
    uint64_t tid = (uint64_t)syscall(SYS_gettid), sum = 0;
    long page = sysconf(_SC_PAGESIZE);
    uint8_t *pages = mmap(NULL, 2 * (size_t)page, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages == MAP_FAILED || mprotect(pages + page, (size_t)page, PROT_NONE) != 0)
        abort();
    /* 28 bytes of ids and state, 18 of attributes (key 0, 16 hex digits). */
    struct otel_thread_ctx_record *record = (void *)(pages + page - 48);
    for (uint64_t request = 1; now() < until; request++) {
        uint64_t span = tid << 24 | request, root = span | 1ull << 62;
        record->valid = 0;
        big_endian(record->trace_id, tid);
        big_endian(record->trace_id + 8, request);
        big_endian(record->span_id, span);
        record->attrs_data[0] = 0;
        record->attrs_data[1] = 16;
        snprintf((char *)record->attrs_data + 2, 17, "%016llx", (unsigned long long)root);
        record->attrs_data_size = 18;
        record->valid = 1;
        publish(record);
        sum += request_work(span);
        publish(NULL);
        sum += idle_work(request);
    }
    return (void *)(uintptr_t)sum;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: trace_ctx_library preloaded|dlopen LIBRARY SECONDS THREADS\n");
        return 2;
    }
    until = now() + atof(argv[3]);
    if (strcmp(argv[1], "dlopen") == 0) {
        idle_work(0);
        spin(0.3, 1);
        void *library = dlopen(argv[2], RTLD_NOW | RTLD_LOCAL);
        if (!library) {
            fprintf(stderr, "%s\n", dlerror());
            return 1;
        }
        publish = (void (*)(struct otel_thread_ctx_record *))dlsym(library, "plugin_publish");
        spin(0.2, 2);
    } else {
        publish = (void (*)(struct otel_thread_ctx_record *))dlsym(RTLD_DEFAULT, "plugin_publish");
    }
    if (!publish) {
        fprintf(stderr, "no plugin_publish in %s\n", argv[2]);
        return 1;
    }
    int threads = atoi(argv[4]);
    serve_on_threads(threads, serve);
    return 0;
}

/*
 * go124_labels_standin SECONDS THREADS: a C program laid out, for a
 * profiler, as a Go 1.24 program linked with the C library whose
 * goroutines set pprof labels: no Go 1.24 toolchain is at hand here, and
 * Go 1.24 keeps a goroutine's labels in a slice where earlier releases
 * keep a map. What a profiler reads is Go 1.24's, from its runtime's
 * source (x86-64):
 *  - a `.go.buildinfo` section: magic, pointer size, flags (2: inline
 *    strings), then at byte 32 the version "go1.24.0" (length-prefixed);
 *  - the running goroutine's pointer `g` in the program's TLS block, its
 *    only 8 bytes (as `runtime.tlsg` is): 8 bytes below the thread pointer;
 *  - `g.m` at 48, `m.curg` at 192, `g.labels` at 352, pointing to a
 *    `labelMap` whose first field is the sorted slice (array, length,
 *    capacity) of {key, value} strings, each a pointer and a length.
 * No DWARF of `runtime.g` is there: the offsets come from the release's
 * known layout.
 *
 * Each thread serves requests as go_trace_requests does: ~15 ms in
 * `request_work` with labels "local root span id", "span id" (decimal)
 * and "trace endpoint" ("GET /thread/TID"), then ~5 ms in `idle_work` with
 * none (`g.labels` null). Request k of thread tid has span id
 * tid << 24 | k, its local root span id that with bit 62 set.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "request_work.h"

__attribute__((section(".go.buildinfo"), used, aligned(16)))
static const unsigned char build_info[64] = {
    0xff, ' ', 'G', 'o', ' ', 'b', 'u', 'i', 'l', 'd', 'i', 'n', 'f', ':',
    8,  /* pointer size */
    2,  /* flags: inline strings */
    [32] = 8, 'g', 'o', '1', '.', '2', '4', '.', '0',
    0,  /* no module information */
};

/* The program's only TLS variable: `runtime.tlsg`'s place. */
__thread void *current_g;

enum { G_M = 48, M_CURG = 192, G_LABELS = 352, STRUCT_BYTES = 512 };

struct go_string {
    const char *data;
    int64_t length;
};

struct label {
    struct go_string key, value;
};

struct label_map {
    struct label *array;
    int64_t length, capacity;
};

static double until;

static void set_string(struct go_string *s, const char *text) {
    s->data = text;
    s->length = (int64_t)strlen(text);
}

static void *serve(void *unused) {
    (void)unused;
    uint64_t tid = (uint64_t)syscall(SYS_gettid), sum = 0;
    unsigned char *g = calloc(1, STRUCT_BYTES), *m = calloc(1, STRUCT_BYTES);
    if (!g || !m)
        abort();
    memcpy(g + G_M, &m, sizeof m);
    memcpy(m + M_CURG, &g, sizeof g);
    current_g = g;
    char root_text[24], span_text[24], endpoint[48];
    struct label labels[3];
    struct label_map map = {labels, 3, 3};
    struct label_map *published = &map, *none = NULL;
    set_string(&labels[0].key, "local root span id");
    set_string(&labels[1].key, "span id");
    set_string(&labels[2].key, "trace endpoint");
    snprintf(endpoint, sizeof endpoint, "GET /thread/%llu", (unsigned long long)tid);
    set_string(&labels[2].value, endpoint);
    for (uint64_t request = 1; now() < until; request++) {
        uint64_t span = tid << 24 | request, root = span | 1ull << 62;
        snprintf(root_text, sizeof root_text, "%llu", (unsigned long long)root);
        snprintf(span_text, sizeof span_text, "%llu", (unsigned long long)span);
        set_string(&labels[0].value, root_text);
        set_string(&labels[1].value, span_text);
        __atomic_store((struct label_map **)(g + G_LABELS), &published, __ATOMIC_RELEASE);
        sum += request_work(span);
        __atomic_store((struct label_map **)(g + G_LABELS), &none, __ATOMIC_RELEASE);
        sum += idle_work(request);
    }
    current_g = NULL;
    return (void *)(uintptr_t)sum;
}

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: go124_labels_standin SECONDS THREADS\n");
        return 2;
    }
    until = now() + atof(argv[1]);
    int threads = atoi(argv[2]);
    serve_on_threads(threads, serve);
    return build_info[0] == 0xff ? 0 : 1;
}

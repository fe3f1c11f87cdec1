/*
 * otel_process_ctx SECONDS SERVICE ENV VERSION INSTANCE: publishes an
 * OpenTelemetry process context (OTEP 4719, written from the spec: a memfd
 * named OTEL_CTX, mapped shared and the descriptor closed, MADV_DONTFORK,
 * the header "OTEL_CTX", version 2, payload size, publication time and a
 * pointer to the payload, the payload a ProcessContext in protobuf (its
 * OTLP Resource in field 1) after the header, the signature written last, the mapping named by prctl),
 * then spins in `published_work` for SECONDS.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef PR_SET_VMA
#define PR_SET_VMA 0x53564d41
#define PR_SET_VMA_ANON_NAME 0
#endif

struct header {
    char signature[8];
    uint32_t version;
    uint32_t payload_size;
    uint64_t published_at_ns;
    uint64_t payload;
} __attribute__((packed, aligned(8)));

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

/* Appends a length-delimited field (lengths below 16384). */
static size_t field(uint8_t *out, unsigned number, const void *bytes, size_t length) {
    size_t at = 0;
    out[at++] = (uint8_t)(number << 3 | 2);
    if (length >= 128) {
        out[at++] = (uint8_t)(length | 0x80);
        out[at++] = (uint8_t)(length >> 7);
    } else {
        out[at++] = (uint8_t)length;
    }
    memmove(out + at, bytes, length);
    return at + length;
}

/* Resource.attributes: KeyValue { key = 1, value = 2: AnyValue { string_value = 1 } }. */
static size_t attribute(uint8_t *out, const char *key, const char *value) {
    uint8_t any[128], key_value[256];
    size_t any_length = field(any, 1, value, strlen(value));
    size_t length = field(key_value, 1, key, strlen(key));
    length += field(key_value + length, 2, any, any_length);
    return field(out, 1, key_value, length);
}

__attribute__((noinline)) uint64_t published_work(uint64_t rounds) {
    volatile uint64_t x = 3;
    for (uint64_t i = 0; i < rounds; i++)
        x = x * 2862933555777941757ull + i;
    return x;
}

int main(int argc, char **argv) {
    if (argc != 6) {
        fprintf(stderr, "usage: otel_process_ctx SECONDS SERVICE ENV VERSION INSTANCE\n");
        return 2;
    }
    size_t size = (size_t)sysconf(_SC_PAGESIZE);
    int fd = (int)syscall(SYS_memfd_create, "OTEL_CTX", 1u /* MFD_CLOEXEC */);
    uint8_t *mapping;
    if (fd >= 0) {
        if (ftruncate(fd, (off_t)size) != 0)
            return 1;
        mapping = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        close(fd);
    } else {
        mapping = mmap(NULL, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    }
    if (mapping == MAP_FAILED)
        return 1;
    madvise(mapping, size, MADV_DONTFORK);
    struct header *header = (struct header *)mapping;
    uint8_t *payload = mapping + sizeof *header;
    uint8_t resource[2048];
    size_t resource_length = attribute(resource, "service.name", argv[2]);
    resource_length += attribute(resource + resource_length, "deployment.environment.name", argv[3]);
    resource_length += attribute(resource + resource_length, "service.version", argv[4]);
    resource_length += attribute(resource + resource_length, "service.instance.id", argv[5]);
    /* ProcessContext.resource = 1 */
    size_t length = field(payload, 1, resource, resource_length);
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    header->version = 2;
    header->payload_size = (uint32_t)length;
    header->published_at_ns = (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
    header->payload = (uint64_t)(uintptr_t)payload;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    memcpy(header->signature, "OTEL_CTX", 8);
    prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME, mapping, size, "OTEL_CTX");

    double end = now() + atof(argv[1]);
    uint64_t sum = 0;
    while (now() < end)
        sum += published_work(1000000);
    printf("%llu\n", (unsigned long long)(sum & 1));
    return 0;
}

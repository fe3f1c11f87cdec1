/* The OTEP 4947 thread context record (its first 28 bytes fixed, then up
 * to 612 bytes of attributes: key index, length, value), shared by the
 * trace context workloads. */
#ifndef OTEL_THREAD_CTX_H
#define OTEL_THREAD_CTX_H
#include <stdint.h>

struct otel_thread_ctx_record {
    uint8_t trace_id[16];
    uint8_t span_id[8];
    uint8_t valid;
    uint8_t trace_flags;
    uint16_t attrs_data_size;
    uint8_t attrs_data[612];
};
#endif

/* trace_ctx_dynamic_tlsdesc_plugin.c built by musl-gcc
 * (-mtls-dialect=gnu2: a TLS descriptor) for trace_ctx_library_musl.c to
 * dlopen. */
#define BIG_TLS 1
#include "trace_ctx_tlsdesc_plugin.c"

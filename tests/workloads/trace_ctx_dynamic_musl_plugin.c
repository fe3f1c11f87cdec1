/* trace_ctx_dynamic_gd_plugin.c built by musl-gcc (-fPIC: __tls_get_addr)
 * for trace_ctx_library_musl.c to dlopen. */
#define BIG_TLS 1
#include "trace_ctx_tlsdesc_plugin.c"

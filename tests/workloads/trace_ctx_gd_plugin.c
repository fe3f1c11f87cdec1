/* trace_ctx_tlsdesc_plugin.c built as gcc builds a shared library by
 * default (-fPIC, -mtls-dialect=gnu): its accesses to otel_thread_ctx_v1
 * call __tls_get_addr with a GOT pair {module, offset}
 * (R_X86_64_DTPMOD64, R_X86_64_DTPOFF64), which ddprof reads through each
 * thread's DTV. */
#include "trace_ctx_tlsdesc_plugin.c"

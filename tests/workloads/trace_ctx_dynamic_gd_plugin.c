/* The dlopen'ed variant of trace_ctx_gd_plugin.c: a TLS block too big for
 * static TLS, allocated by each thread at its first __tls_get_addr. */
#define BIG_TLS 1
#include "trace_ctx_tlsdesc_plugin.c"

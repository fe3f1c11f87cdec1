/* The dlopen'ed variant of trace_ctx_tlsdesc_plugin.c: a TLS block too big
 * for static TLS (found through each thread's DTV). */
#define BIG_TLS 1
#include "trace_ctx_tlsdesc_plugin.c"

/* trace_ctx_library.c built by musl-gcc: a program of musl's dynamic
 * loader (ld-musl-x86_64.so.1), which dlopen's a library built by musl-gcc
 * too (trace_ctx_dynamic_musl_plugin.c, trace_ctx_dynamic_musl_tlsdesc_plugin.c):
 * its TLS block is found through musl's DTV. */
#include "trace_ctx_library.c"

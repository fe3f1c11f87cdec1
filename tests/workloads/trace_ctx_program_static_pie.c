/*
 * trace_ctx_library.c's requests with the OTEP 4947 TLS pointer defined by
 * the program itself (trace_ctx_tlsdesc_plugin.c's code linked in): a
 * static PIE (gcc -static-pie: no interpreter, `DF_1_PIE`), as Rust
 * builds programs for its musl targets.
 * Run as `trace_ctx_program_static_pie preloaded - SECONDS THREADS`.
 */
#include <dlfcn.h>

#include "trace_ctx_tlsdesc_plugin.c"

/* The publisher is linked in: no loader to ask. */
#define dlsym(handle, name) ((void *)plugin_publish)
#define dlopen(path, flags) ((void *)1)
#define dlerror() "linked in"
#include "trace_ctx_library.c"

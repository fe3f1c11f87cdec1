/*
 * trace_ctx_library.c's requests with the OTEP 4947 TLS pointer defined by
 * the program itself (trace_ctx_tlsdesc_plugin.c's code linked in): linked
 * statically with musl (musl-gcc -static), whose layout puts the
 * program's TLS block below the thread pointer as glibc's does.
 * Run as `trace_ctx_program_musl_static preloaded - SECONDS THREADS`.
 */
#include <dlfcn.h>

#include "trace_ctx_tlsdesc_plugin.c"

/* The publisher is linked in: no loader to ask. */
#define dlsym(handle, name) ((void *)plugin_publish)
#define dlopen(path, flags) ((void *)1)
#define dlerror() "linked in"
#include "trace_ctx_library.c"

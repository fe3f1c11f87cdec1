/*
 * A library that publishes OTEP 4947 thread contexts itself: it defines
 * the TLS pointer `otel_thread_ctx_v1` (built -mtls-dialect=gnu2, so that
 * its own accesses go through a TLS descriptor, as the OTEP asks of a
 * library) and `plugin_publish` sets it. `trace_ctx_library` loads it at
 * start (LD_PRELOAD: static TLS) or with dlopen (BIG_TLS: a block too big
 * for glibc's static TLS reserve, so that each thread's copy is allocated
 * on demand and found through its DTV).
 */
#include <stdint.h>

#include "otel_thread_ctx.h"

__attribute__((visibility("default"))) __thread struct otel_thread_ctx_record *otel_thread_ctx_v1;

#ifdef BIG_TLS
/* Beyond glibc's static TLS surplus for dlopen (a few hundred bytes). */
__attribute__((visibility("default"))) __thread char plugin_scratch[1 << 16];
#endif

__attribute__((visibility("default"))) void plugin_publish(struct otel_thread_ctx_record *record) {
#ifdef BIG_TLS
    plugin_scratch[0]++;
#endif
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
    otel_thread_ctx_v1 = record;
    __atomic_signal_fence(__ATOMIC_SEQ_CST);
}

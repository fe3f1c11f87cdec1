/*
 * lazy_binding_plugin: 2,000 exported functions and one entry that calls
 * each of them once. Built -fPIC and linked `-z lazy`, so each call goes
 * through the library's PLT and is bound at its first call, by
 * `_dl_runtime_resolve_*` and `_dl_fixup` (ld.so): loaded afresh by each
 * dlopen cycle of lazy_binding.c, every call of the entry binds them all.
 */
#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

#define FN(n) KEEP_FRAME int lazy_fn_##n(int x) { return x * 3 + n; }
#define FN10(n) FN(n##0) FN(n##1) FN(n##2) FN(n##3) FN(n##4) FN(n##5) FN(n##6) FN(n##7) FN(n##8) FN(n##9)
#define FN100(n) FN10(n##0) FN10(n##1) FN10(n##2) FN10(n##3) FN10(n##4) FN10(n##5) FN10(n##6) FN10(n##7) FN10(n##8) FN10(n##9)
#define FN1000(n) FN100(n##0) FN100(n##1) FN100(n##2) FN100(n##3) FN100(n##4) FN100(n##5) FN100(n##6) FN100(n##7) FN100(n##8) FN100(n##9)

#define CALL(n) acc = lazy_fn_##n(acc);
#define CALL10(n) CALL(n##0) CALL(n##1) CALL(n##2) CALL(n##3) CALL(n##4) CALL(n##5) CALL(n##6) CALL(n##7) CALL(n##8) CALL(n##9)
#define CALL100(n) CALL10(n##0) CALL10(n##1) CALL10(n##2) CALL10(n##3) CALL10(n##4) CALL10(n##5) CALL10(n##6) CALL10(n##7) CALL10(n##8) CALL10(n##9)
#define CALL1000(n) CALL100(n##0) CALL100(n##1) CALL100(n##2) CALL100(n##3) CALL100(n##4) CALL100(n##5) CALL100(n##6) CALL100(n##7) CALL100(n##8) CALL100(n##9)

FN1000(1)
FN1000(2)

KEEP_FRAME int lazy_binding_plugin_run(int acc) {
    CALL1000(1)
    CALL1000(2)
    return acc;
}

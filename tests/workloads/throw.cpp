/*
 * throw.cpp: a C++ program that throws and catches exceptions in a loop,
 * through a few frames with destructors to run (landing pads, then
 * _Unwind_Resume), so that many samples land in libgcc's unwinder
 * (_Unwind_RaiseException, uw_frame_state_for, uw_install_context,
 * _Unwind_Resume) and in the landing pads.
 *
 * Expected stacks (innermost first), most samples:
 *   ... libgcc_s / libstdc++ unwinder frames ...
 *   throw_leaf(unsigned long) / throw_middle / throw_outer
 *   throw_round(unsigned long)
 *   main
 *   (libc start)
 * Every stack reaches main; none may be marked complete without reaching
 * the thread's entry (_start).
 *
 * Usage: throw SECONDS (default 2).
 */
#include <chrono>
#include <cstdlib>
#include <stdexcept>
#include <string>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

volatile unsigned long throw_sink;

struct Guard {
    unsigned long value;
    explicit Guard(unsigned long v) : value(v) {}
    ~Guard() { throw_sink += value; }
};

KEEP_FRAME void throw_leaf(unsigned long x) {
    Guard guard(x);
    for (unsigned long i = 0; i < (x & 63); i++)
        throw_sink = throw_sink * 6364136223846793005UL + i;
    throw std::runtime_error("round " + std::to_string(x));
}

KEEP_FRAME void throw_middle(unsigned long x) {
    Guard guard(x + 1);
    std::string text(32, 'm');
    throw_leaf(x + text.size());
}

KEEP_FRAME void throw_outer(unsigned long x) {
    Guard guard(x + 2);
    throw_middle(x * 3);
}

KEEP_FRAME unsigned long throw_round(unsigned long x) {
    try {
        throw_outer(x);
    } catch (const std::runtime_error &error) {
        return error.what()[0] + x;
    }
    return 0;
}

int main(int argc, char **argv) {
    double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(seconds));
    unsigned long x = 1;
    while (std::chrono::steady_clock::now() < until) {
        for (int i = 0; i < 64; i++)
            x = throw_round(x);
    }
    return static_cast<int>(throw_sink & 1);
}

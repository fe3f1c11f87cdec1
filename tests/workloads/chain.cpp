/*
 * chain.cpp: a C++ call chain through a namespace, a class and a template.
 *
 * Expected stacks (innermost first), most samples:
 *   workload_cpp::leaf_burn<3>(unsigned long)
 *   workload_cpp::ChainRunner::stage_three(unsigned long)
 *   workload_cpp::ChainRunner::stage_two(unsigned long)
 *   workload_cpp::ChainRunner::stage_one(unsigned long)
 *   workload_cpp::ChainRunner::run(double)
 *   main
 *   (libc start)
 * Mangled names contain "workload_cpp", "ChainRunner", "stage_one" ... and
 * "leaf_burn".
 *
 * Usage: chain_cpp SECONDS (default 2).
 */
#include <chrono>
#include <cstdlib>

#ifdef __clang__
#define KEEP_FRAME __attribute__((noinline))
#else
#define KEEP_FRAME __attribute__((noipa))
#endif

namespace workload_cpp {

volatile unsigned long sink;

template <int Rounds>
KEEP_FRAME unsigned long leaf_burn(unsigned long x) {
    for (long i = 0; i < Rounds * 20000L; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    sink = x;
    return x;
}

class ChainRunner {
public:
    KEEP_FRAME unsigned long run(double seconds);
    KEEP_FRAME unsigned long stage_one(unsigned long x);
    KEEP_FRAME unsigned long stage_two(unsigned long x);
    KEEP_FRAME unsigned long stage_three(unsigned long x);

private:
    unsigned long calls_ = 0;
};

unsigned long ChainRunner::stage_three(unsigned long x) {
    calls_++;
    return leaf_burn<3>(x) + calls_;
}

unsigned long ChainRunner::stage_two(unsigned long x) { return stage_three(x ^ 2) + 1; }
unsigned long ChainRunner::stage_one(unsigned long x) { return stage_two(x ^ 1) + 1; }

unsigned long ChainRunner::run(double seconds) {
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    unsigned long x = 1;
    while (std::chrono::steady_clock::now() < end)
        x = stage_one(x);
    return x;
}

}  // namespace workload_cpp

int main(int argc, char **argv) {
    double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
    workload_cpp::ChainRunner runner;
    workload_cpp::sink = runner.run(seconds);
    return 0;
}

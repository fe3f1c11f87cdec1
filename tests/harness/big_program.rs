//! The generated big program of the corpus and of `cargo xtask bench`
//! (issue 32): a statically linked C++ binary with 205 MB of text in
//! 400,000 functions (2.4 M unwind rows), whose main calls a chain 48
//! deep, 1 KiB of stack per frame (a 48 KiB stack, beyond a 32 KiB copy),
//! spread over the whole text. Shared as source (`xtask` includes this
//! file with `#[path]`): std only.
use std::path::Path;
use std::process::Command;

/// Functions of the generated big program: each is 512 bytes apart, so
/// that 400,000 make 205 MB of text.
pub const BIG_FUNCTIONS: usize = 400_000;
/// Frames of the deep chain (1 KiB each: a 48 KiB stack, beyond a 32 KiB
/// stack copy), spread over the whole text.
pub const BIG_DEPTH: usize = 48;

/// The generated functions, in assembly (GNU as expands them): each has a
/// 1 KiB frame described by CFI and no frame pointer; given a depth in
/// `%rdi`, it calls the function `BIG_FUNCTIONS / BIG_DEPTH` ahead with one
/// less, and at 0 calls `big_leaf`.
pub fn assembly() -> String {
    let stride = BIG_FUNCTIONS / BIG_DEPTH;
    format!(
        r#"    .text
    .altmacro
    .macro big_function n
    .globl big_fn_\n
    .type big_fn_\n, @function
    .balign 512
big_fn_\n:
    .cfi_startproc
    push %rbp
    .cfi_def_cfa_offset 16
    .cfi_offset %rbp, -16
    sub $1008, %rsp
    .cfi_def_cfa_offset 1024
    movq %rdi, (%rsp)
    test %rdi, %rdi
    jz 1f
    dec %rdi
    call big_fn_0 + (\n + {stride}) * 512
    jmp 2f
1:
    call big_leaf
2:
    add $1008, %rsp
    .cfi_def_cfa_offset 16
    pop %rbp
    .cfi_def_cfa_offset 8
    ret
    .cfi_endproc
    .size big_fn_\n, . - big_fn_\n
    .endm
    .set i, 0
    .rept {BIG_FUNCTIONS}
    big_function %i
    .set i, i + 1
    .endr
    .section .note.GNU-stack,"",@progbits
"#
    )
}

pub const MAIN_CPP: &str = r#"// The big program's C++ side: main calls the generated chain 48 deep
// for the given seconds; the leaf burns CPU.
#include <chrono>
#include <cstdlib>
#include <cstring>

// Calls of the chain in a unit of `--work` (about a second of CPU).
#define WORK_UNIT_CALLS 3500L

extern "C" void big_fn_0(unsigned long depth);

volatile unsigned long big_sink;

extern "C" __attribute__((noinline)) void big_leaf() {
    unsigned long x = big_sink;
    for (long i = 0; i < 200000; i++)
        x = x * 6364136223846793005UL + 1442695040888963407UL;
    big_sink = x;
}

int main(int argc, char **argv) {
    // `--work N`: a fixed amount of work (N units of about a second of CPU
    // each), for benchmarks, where profiling overhead must show as a
    // longer run rather than as less work done.
    if (argc > 2 && std::strcmp(argv[1], "--work") == 0) {
        long calls = std::atol(argv[2]) * WORK_UNIT_CALLS;
        for (long i = 0; i < calls; i++)
            big_fn_0(47);
        return 0;
    }
    double seconds = argc > 1 ? std::atof(argv[1]) : 2.0;
    auto until = std::chrono::steady_clock::now() +
                 std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                     std::chrono::duration<double>(seconds));
    while (std::chrono::steady_clock::now() < until)
        big_fn_0(47);
    return 0;
}
"#;

/// The command that builds the program `out` from `main` ([`MAIN_CPP`])
/// and `assembly` ([`assembly`]): `g++ -O2 -g -static`, no frame pointers.
pub fn build_command(out: &Path, main: &Path, assembly: &Path) -> Command {
    let mut command = Command::new("g++");
    command
        .args(["-O2", "-g", "-static", "-fomit-frame-pointer", "-o"])
        .arg(out)
        .arg(main)
        .arg(assembly);
    command
}

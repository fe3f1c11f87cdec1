//! A Linux 4.15 syscall set without a Linux 4.15 kernel: a seccomp filter,
//! installed in a child just before its exec (and inherited by everything
//! it starts), under which every x86-64 system call added after 4.15 fails
//! with ENOSYS, as on such a kernel, and `bpf()` fails with EINVAL (4.15 has
//! `bpf()` but none of the program types, helpers and BTF ddprof's program
//! needs; EINVAL is what it answers for those).
//!
//! The table: in `arch/x86/entry/syscalls/syscall_64.tbl`, the last number
//! of Linux 4.11 through 4.17 is 332 (`statx`, 4.11); 333 (`io_pgetevents`)
//! and 334 (`rseq`) came with 4.18, and everything from 424
//! (`pidfd_send_signal`, 5.1) on is newer still. x32 numbers (bit 30 set)
//! are above 332 too and fail the same way. Only the test's child is
//! filtered: the test process itself (its glibc, `go tool pprof`) is not.
use std::os::unix::process::CommandExt;
use std::process::Command;

/// The highest x86-64 system call number Linux 4.15 has (`statx`).
pub const LAST_SYSCALL_OF_4_15: u32 = 332;
/// `bpf()` on x86-64.
pub const SYS_BPF: u32 = 321;

const AUDIT_ARCH_X86_64: u32 = 0xc000_003e;
const SECCOMP_RET_ALLOW: u32 = 0x7fff_0000;
const SECCOMP_RET_ERRNO: u32 = 0x0005_0000;
/// `offsetof(struct seccomp_data, nr)` and `arch`.
const DATA_NR: u32 = 0;
const DATA_ARCH: u32 = 4;

// Classic BPF opcodes (linux/filter.h).
const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JMP_JEQ_K: u16 = 0x15;
const BPF_JMP_JGE_K: u16 = 0x35;
const BPF_RET_K: u16 = 0x06;

fn statement(code: u16, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code,
        jt: 0,
        jf: 0,
        k,
    }
}

fn jump(code: u16, k: u32, jt: u8, jf: u8) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// The filter program: other architectures (i386 through int 0x80) are
/// left alone; `bpf` → EINVAL; numbers above 332 → ENOSYS; the rest runs.
pub fn filter_program() -> Vec<libc::sock_filter> {
    vec![
        statement(BPF_LD_W_ABS, DATA_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        statement(BPF_RET_K, SECCOMP_RET_ALLOW),
        statement(BPF_LD_W_ABS, DATA_NR),
        jump(BPF_JMP_JEQ_K, SYS_BPF, 0, 1),
        statement(BPF_RET_K, SECCOMP_RET_ERRNO | libc::EINVAL as u32),
        jump(BPF_JMP_JGE_K, LAST_SYSCALL_OF_4_15 + 1, 0, 1),
        statement(BPF_RET_K, SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        statement(BPF_RET_K, SECCOMP_RET_ALLOW),
    ]
}

/// A filter under which system call `number` fails with `errno` and every
/// other one runs.
pub fn refusing_program(number: u32, errno: i32) -> Vec<libc::sock_filter> {
    vec![
        statement(BPF_LD_W_ABS, DATA_ARCH),
        jump(BPF_JMP_JEQ_K, AUDIT_ARCH_X86_64, 1, 0),
        statement(BPF_RET_K, SECCOMP_RET_ALLOW),
        statement(BPF_LD_W_ABS, DATA_NR),
        jump(BPF_JMP_JEQ_K, number, 0, 1),
        statement(BPF_RET_K, SECCOMP_RET_ERRNO | errno as u32),
        statement(BPF_RET_K, SECCOMP_RET_ALLOW),
    ]
}

/// Makes `command` run (with everything it starts) under the 4.15 syscall
/// set.
pub fn with_linux_4_15_syscalls(command: &mut Command) -> &mut Command {
    with_filter(command, filter_program())
}

/// Makes `command` (and everything it starts) see `perf_event_open` fail
/// with EACCES, as where perf events are forbidden.
pub fn with_perf_event_open_refused(command: &mut Command) -> &mut Command {
    with_filter(
        command,
        refusing_program(libc::SYS_perf_event_open as u32, libc::EACCES),
    )
}

/// Installs `program` in the child before its exec. `no_new_privs` is set
/// first, as seccomp requires of unprivileged callers; it only stops
/// set-user-ID programs from gaining privileges.
fn with_filter(command: &mut Command, program: Vec<libc::sock_filter>) -> &mut Command {
    // SAFETY: the hook runs in the forked child before exec and only makes
    // two prctl calls (async-signal-safe) on memory owned by the closure.
    unsafe {
        command.pre_exec(move || {
            let filter = libc::sock_fprog {
                len: program.len() as u16,
                filter: program.as_ptr() as *mut libc::sock_filter,
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::prctl(
                libc::PR_SET_SECCOMP,
                libc::SECCOMP_MODE_FILTER,
                &filter as *const libc::sock_fprog,
            ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        })
    }
}

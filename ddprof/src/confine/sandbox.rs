//! The profiler can neither signal nor stop the processes it profiles.
//!
//! Dropping `CAP_KILL` is not enough: the kernel lets a process signal any
//! process of its own user, and the profiler usually runs as the target's
//! user (often root). So once its events are in place, the profiler installs
//! a seccomp filter (with `no_new_privs`) that refuses, with EPERM:
//! - `kill`, `tgkill`, `rt_sigqueueinfo`, `rt_tgsigqueueinfo` aimed at any
//!   process other than itself (its own PID, or 0 = its own process group,
//!   which after `setsid` holds only itself);
//! - `tkill` and `pidfd_send_signal` (it uses neither);
//! - `ptrace` (attaching would stop the target) and `process_vm_writev`
//!   (reading target memory with `process_vm_readv` stays allowed);
//! - every x32 or 32-bit system call (a way around the above), and on
//!   arm64 every AArch32 one.
//!
//! The filter is inherited by any child the profiler might start.
use std::io;

use super::AUDIT_ARCH;

/// x32 system calls have this bit set in their number (no arm64 call
/// number has it: the check refuses nothing there).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

/// `seccomp_data` offsets.
const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;
/// Low 32 bits of the first argument (little endian): a `pid_t`.
const OFFSET_ARG0_LOW: u32 = 16;

const LOAD_WORD: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JUMP_EQUAL: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JUMP_GREATER_OR_EQUAL: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const RETURN: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const DENY: u32 = libc::SECCOMP_RET_ERRNO | (libc::EPERM as u32 & libc::SECCOMP_RET_DATA);

/// Signals aimed at a PID in the first argument: allowed only at itself.
const SIGNALS_BY_PID: [libc::c_long; 4] = [
    libc::SYS_kill,
    libc::SYS_tgkill,
    libc::SYS_rt_sigqueueinfo,
    libc::SYS_rt_tgsigqueueinfo,
];
/// Always refused.
const FORBIDDEN: [libc::c_long; 4] = [
    libc::SYS_tkill,
    libc::SYS_pidfd_send_signal,
    libc::SYS_ptrace,
    libc::SYS_process_vm_writev,
];

/// Number of instructions of [`filter`].
pub const FILTER_LENGTH: usize = 4 + SIGNALS_BY_PID.len() + FORBIDDEN.len() + 1 + 5;

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

/// The filter for a profiler whose PID is `own_pid` (built without
/// allocating, so that it can be installed right after a fork).
pub fn filter(own_pid: i32) -> [libc::sock_filter; FILTER_LENGTH] {
    let mut program = [statement(RETURN, ALLOW); FILTER_LENGTH];
    let mut at = 0;
    let mut push = |instruction: libc::sock_filter| {
        program[at] = instruction;
        at += 1;
    };
    // Layout (classic BPF only jumps forward): 0 load arch; 1 foreign arch →
    // deny; 2 load nr; 3 x32 → deny; the PID-checked calls (→ PID check) and
    // the forbidden calls (→ deny); allow; PID check: load the first
    // argument, itself or 0 → allow, else deny.
    let checks = SIGNALS_BY_PID.len() + FORBIDDEN.len();
    let first_check = 4;
    let check_pid_at = first_check + checks + 1;
    let deny_at = check_pid_at + 3;
    let allow_pid_at = deny_at + 1;
    let to = |from: usize, target: usize| (target - from - 1) as u8;
    push(statement(LOAD_WORD, OFFSET_ARCH));
    push(jump(JUMP_EQUAL, AUDIT_ARCH, 0, to(1, deny_at)));
    push(statement(LOAD_WORD, OFFSET_NR));
    push(jump(
        JUMP_GREATER_OR_EQUAL,
        X32_SYSCALL_BIT,
        to(3, deny_at),
        0,
    ));
    for (i, nr) in SIGNALS_BY_PID.iter().enumerate() {
        let here = first_check + i;
        push(jump(JUMP_EQUAL, *nr as u32, to(here, check_pid_at), 0));
    }
    for (i, nr) in FORBIDDEN.iter().enumerate() {
        let here = first_check + SIGNALS_BY_PID.len() + i;
        push(jump(JUMP_EQUAL, *nr as u32, to(here, deny_at), 0));
    }
    push(statement(RETURN, ALLOW));
    push(statement(LOAD_WORD, OFFSET_ARG0_LOW));
    push(jump(
        JUMP_EQUAL,
        own_pid as u32,
        to(check_pid_at + 1, allow_pid_at),
        0,
    ));
    push(jump(JUMP_EQUAL, 0, to(check_pid_at + 2, allow_pid_at), 0));
    push(statement(RETURN, DENY));
    push(statement(RETURN, ALLOW));
    debug_assert_eq!(at, FILTER_LENGTH);
    program
}

/// Installs [`filter`] for this process (see the module documentation).
pub fn forbid_touching_other_processes() -> io::Result<()> {
    install(&filter(std::process::id() as i32))
}

/// Installs a filter; does not allocate.
pub fn install(program: &[libc::sock_filter]) -> io::Result<()> {
    let fprog = libc::sock_fprog {
        len: program.len() as u16,
        filter: program.as_ptr().cast_mut(),
    };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integers; seccomp(SET_MODE_FILTER)
    // reads the program, which outlives the call, and copies it.
    unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        if libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            0,
            &fprog as *const libc::sock_fprog,
        ) != 0
        {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a forked child (which only makes system calls, so forking the
    /// multi-threaded test runner is safe): after the filter, signalling the
    /// parent fails with EPERM, signalling itself still works.
    #[test]
    fn the_profiler_cannot_signal_or_trace_others() {
        // Built before the fork: the child must not allocate.
        let parent = std::process::id() as i32;
        // SAFETY: the child only makes system calls and _exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: getpid, kill, ptrace and _exit are plain system calls.
            let code = unsafe {
                let me = libc::getpid();
                let program = filter(me);
                if install(&program).is_err() {
                    libc::_exit(10);
                }
                let errno = || *libc::__errno_location();
                if libc::kill(parent, 0) != -1 || errno() != libc::EPERM {
                    libc::_exit(11);
                }
                if libc::kill(-1, 0) != -1 || errno() != libc::EPERM {
                    libc::_exit(12);
                }
                if libc::ptrace(libc::PTRACE_ATTACH, parent, 0, 0) != -1 || errno() != libc::EPERM {
                    libc::_exit(13);
                }
                if libc::kill(me, 0) != 0 || libc::kill(0, 0) != 0 {
                    libc::_exit(14);
                }
                if libc::getppid() != parent {
                    libc::_exit(15);
                }
                0
            };
            // SAFETY: ends the child.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert!(libc::WIFEXITED(status), "status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "see the _exit codes above");
    }
}

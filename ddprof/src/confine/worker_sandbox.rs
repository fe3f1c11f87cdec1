//! The profiler worker's seccomp filter: an allow-list.
//!
//! The worker parses whatever the profiled processes map (ELF, DWARF, CFI,
//! perf maps), any of which another user may have crafted. It keeps the
//! capabilities that let it read what it profiles (`CAP_SYS_PTRACE`,
//! `CAP_DAC_READ_SEARCH`, `CAP_CHECKPOINT_RESTORE`, see `capabilities`) and
//! nothing that would let a parser bug turn into more than reading: every
//! system call not on the list below answers `EPERM` (a few `ENOSYS`, so
//! that callers fall back), and those on it are limited by their arguments:
//! - files are opened for reading only (`openat` without `O_WRONLY`,
//!   `O_RDWR`, `O_CREAT` or `O_TRUNC`; `openat2`, whose flags a filter cannot
//!   see, answers `ENOSYS` and the resolution walk takes over); nothing is
//!   created, renamed, removed, linked or changed on disk: the worker's
//!   cache writes go to the parent (`files::cache_dir`);
//! - no program is run, no process made (`clone` only with `CLONE_THREAD`,
//!   `clone3` answers `ENOSYS`), no socket but a Unix datagram one (syslog),
//!   no signal but to itself, no `ptrace`, no write into another process;
//! - no memory becomes executable (`mmap`, `mprotect` without `PROT_EXEC`);
//! - `ioctl` only the perf events' (`'$'`) and the terminal queries
//!   (`TCGETS`, `FIONREAD`: not `TIOCSTI`, which types into a terminal);
//! - `bpf` only to create maps (an unwind table's, with `CAP_BPF`, BPF
//!   engine only) and use the maps it holds (lookup, update, delete, next
//!   key, object info): no program is loaded or attached, no object pinned
//!   or fetched by id; `prctl` only its name, `prlimit64` only to read.
//!
//! The list is what the worker's code, the standard library, glibc or musl
//! and blazesym call (traced with `strace -f` on both engines, with
//! symbolization, the stores and restarts), and `tests/hostile_targets.rs`
//! runs the suite's workloads under it.
use std::io;

use super::AUDIT_ARCH;
/// x32 system calls have this bit set in their number (x86-64 only).
const X32_SYSCALL_BIT: u32 = 0x4000_0000;

const OFFSET_NR: u32 = 0;
const OFFSET_ARCH: u32 = 4;

/// The offset of the low 32 bits of argument `index` in `seccomp_data`
/// (little endian; the high 32 bits are 4 bytes further).
const fn arg_low(index: u32) -> u32 {
    16 + 8 * index
}

const LOAD: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const JGE: u16 = (libc::BPF_JMP | libc::BPF_JGE | libc::BPF_K) as u16;
const JSET: u16 = (libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K) as u16;
const AND: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
const RSH: u16 = (libc::BPF_ALU | libc::BPF_RSH | libc::BPF_K) as u16;
const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;

const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const fn errno(value: i32) -> u32 {
    libc::SECCOMP_RET_ERRNO | (value as u32 & libc::SECCOMP_RET_DATA)
}
const DENY: u32 = errno(libc::EPERM);

/// What a listed system call may do.
#[derive(Debug, Clone, Copy)]
enum Rule {
    Allow,
    /// Answer this errno (callers that know `ENOSYS` fall back).
    Errno(i32),
    /// Allowed when none of these bits of argument `.0` (low word) is set.
    NoBits(u32, u32),
    /// Allowed when these bits of argument `.0` (low word) are all set.
    AllBits(u32, u32),
    /// Allowed when argument `.0` (low word) is one of the values.
    OneOf(u32, &'static [u32]),
    /// Allowed when argument `.0` (both words) is 0.
    Zero(u32),
    /// `socket`: a Unix datagram socket only.
    UnixDatagram,
    /// `ioctl`: the perf events' (type `'$'`) and terminal queries.
    PerfOrTerminalQuery,
    /// Signals: only to this process (its PID in argument 0).
    OwnProcess,
}

/// `O_WRONLY | O_RDWR | O_CREAT | O_TRUNC`.
const WRITE_FLAGS: u32 = (libc::O_WRONLY | libc::O_RDWR | libc::O_CREAT | libc::O_TRUNC) as u32;
const PROT_EXEC_BIT: u32 = libc::PROT_EXEC as u32;
const CLONE_THREAD_BIT: u32 = libc::CLONE_THREAD as u32;
/// `BPF_MAP_CREATE`, `BPF_MAP_LOOKUP_ELEM`, `UPDATE_ELEM`, `DELETE_ELEM`,
/// `GET_NEXT_KEY`, `BPF_OBJ_GET_INFO_BY_FD`.
const BPF_MAP_COMMANDS: &[u32] = &[0, 1, 2, 3, 4, 15];
const PRCTL_NAME: &[u32] = &[libc::PR_SET_NAME as u32, libc::PR_GET_NAME as u32];

/// The allow-list: `(system call, rule)`.
fn rules() -> Vec<(libc::c_long, Rule)> {
    use libc::*;
    use Rule::*;
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_mut))]
    let mut rules = vec![
        // Reading and writing descriptors it holds.
        (SYS_read, Allow),
        (SYS_readv, Allow),
        (SYS_pread64, Allow),
        (SYS_preadv, Allow),
        (SYS_write, Allow),
        (SYS_writev, Allow),
        (SYS_close, Allow),
        (SYS_lseek, Allow),
        (SYS_fstat, Allow),
        (SYS_newfstatat, Allow),
        (SYS_statx, Allow),
        (SYS_getdents64, Allow),
        (SYS_fcntl, Allow),
        (SYS_dup, Allow),
        (SYS_dup3, Allow),
        (SYS_readlinkat, Allow),
        (SYS_faccessat, Allow),
        (SYS_faccessat2, Allow),
        (SYS_openat, NoBits(2, WRITE_FLAGS)),
        (SYS_openat2, Errno(ENOSYS)),
        (SYS_memfd_create, Allow),
        // Memory.
        (SYS_brk, Allow),
        (SYS_mmap, NoBits(2, PROT_EXEC_BIT)),
        (SYS_mprotect, NoBits(2, PROT_EXEC_BIT)),
        (SYS_munmap, Allow),
        (SYS_mremap, Allow),
        (SYS_madvise, Allow),
        (SYS_membarrier, Allow),
        // Threads, time, signals.
        (SYS_clone, AllBits(0, CLONE_THREAD_BIT)),
        (SYS_clone3, Errno(ENOSYS)),
        (SYS_futex, Allow),
        (SYS_set_robust_list, Allow),
        (SYS_rseq, Allow),
        (SYS_set_tid_address, Allow),
        (SYS_sched_yield, Allow),
        (SYS_sched_getaffinity, Allow),
        (SYS_getrandom, Allow),
        (SYS_clock_gettime, Allow),
        (SYS_clock_getres, Allow),
        (SYS_clock_nanosleep, Allow),
        (SYS_nanosleep, Allow),
        (SYS_gettimeofday, Allow),
        (SYS_rt_sigaction, Allow),
        (SYS_rt_sigprocmask, Allow),
        (SYS_rt_sigreturn, Allow),
        (SYS_sigaltstack, Allow),
        (SYS_restart_syscall, Allow),
        (SYS_setitimer, Allow),
        (SYS_getitimer, Allow),
        (SYS_kill, OwnProcess),
        (SYS_tgkill, OwnProcess),
        (SYS_exit, Allow),
        (SYS_exit_group, Allow),
        // Who it is, what it used.
        (SYS_getpid, Allow),
        (SYS_gettid, Allow),
        (SYS_getppid, Allow),
        (SYS_getuid, Allow),
        (SYS_geteuid, Allow),
        (SYS_getgid, Allow),
        (SYS_getegid, Allow),
        (SYS_getrusage, Allow),
        (SYS_capget, Allow),
        (SYS_uname, Allow),
        (SYS_prlimit64, Zero(2)),
        (SYS_prctl, OneOf(0, PRCTL_NAME)),
        // Waiting on its buffers, the parent's sockets.
        (SYS_epoll_create1, Allow),
        (SYS_epoll_ctl, Allow),
        (SYS_epoll_pwait, Allow),
        (SYS_ppoll, Allow),
        (SYS_recvfrom, Allow),
        (SYS_recvmsg, Allow),
        (SYS_sendto, Allow),
        (SYS_sendmsg, Allow),
        (SYS_socket, UnixDatagram),
        (SYS_connect, Allow),
        (SYS_ioctl, PerfOrTerminalQuery),
        (SYS_bpf, OneOf(0, BPF_MAP_COMMANDS)),
    ];
    // Older calls that only x86-64 has (arm64 has their `*at` and
    // `p*` forms only).
    #[cfg(target_arch = "x86_64")]
    rules.extend([
        (SYS_open, NoBits(1, WRITE_FLAGS)),
        (SYS_access, Allow),
        (SYS_stat, Allow),
        (SYS_lstat, Allow),
        (SYS_poll, Allow),
        (SYS_epoll_wait, Allow),
        (SYS_alarm, Allow),
        (SYS_time, Allow),
        (SYS_dup2, Allow),
        (SYS_readlink, Allow),
        (SYS_getdents, Allow),
    ]);
    rules
}

/// A growing classic BPF program.
struct Program(Vec<libc::sock_filter>);

impl Program {
    fn statement(&mut self, code: u16, k: u32) {
        self.0.push(libc::sock_filter {
            code,
            jt: 0,
            jf: 0,
            k,
        });
    }

    fn jump(&mut self, code: u16, k: u32, jt: u8, jf: u8) {
        self.0.push(libc::sock_filter { code, jt, jf, k });
    }
}

/// The instructions that decide for a call of `rule`'s system call (the
/// syscall number is in the accumulator; each path ends in a return).
fn body(rule: Rule, own_pid: u32) -> Vec<libc::sock_filter> {
    let mut p = Program(Vec::new());
    match rule {
        Rule::Allow => p.statement(RET, ALLOW),
        Rule::Errno(value) => p.statement(RET, errno(value)),
        Rule::NoBits(arg, bits) => {
            p.statement(LOAD, arg_low(arg));
            p.jump(JSET, bits, 1, 0);
            p.statement(RET, ALLOW);
            p.statement(RET, DENY);
        }
        Rule::AllBits(arg, bits) => {
            p.statement(LOAD, arg_low(arg));
            p.statement(AND, bits);
            p.jump(JEQ, bits, 0, 1);
            p.statement(RET, ALLOW);
            p.statement(RET, DENY);
        }
        Rule::OneOf(arg, values) => {
            p.statement(LOAD, arg_low(arg));
            let count = values.len();
            for (index, value) in values.iter().enumerate() {
                // To the ALLOW after the last comparison.
                p.jump(JEQ, *value, (count - index) as u8, 0);
            }
            p.statement(RET, DENY);
            p.statement(RET, ALLOW);
        }
        Rule::Zero(arg) => {
            p.statement(LOAD, arg_low(arg));
            p.jump(JEQ, 0, 0, 2);
            p.statement(LOAD, arg_low(arg) + 4);
            p.jump(JEQ, 0, 1, 0);
            p.statement(RET, DENY);
            p.statement(RET, ALLOW);
        }
        Rule::UnixDatagram => {
            p.statement(LOAD, arg_low(0));
            p.jump(JEQ, libc::AF_UNIX as u32, 0, 3);
            p.statement(LOAD, arg_low(1));
            // The type without SOCK_NONBLOCK | SOCK_CLOEXEC.
            p.statement(AND, 0xf);
            p.jump(JEQ, libc::SOCK_DGRAM as u32, 1, 0);
            p.statement(RET, DENY);
            p.statement(RET, ALLOW);
        }
        Rule::PerfOrTerminalQuery => {
            p.statement(LOAD, arg_low(1));
            p.jump(JEQ, libc::TCGETS as u32, 5, 0);
            p.jump(JEQ, libc::FIONREAD as u32, 4, 0);
            // The request's type byte.
            p.statement(RSH, 8);
            p.statement(AND, 0xff);
            p.jump(JEQ, u32::from(b'$'), 1, 0);
            p.statement(RET, DENY);
            p.statement(RET, ALLOW);
        }
        Rule::OwnProcess => {
            // Not 0 (its process group): the parent is in it.
            p.statement(LOAD, arg_low(0));
            p.jump(JEQ, own_pid, 1, 0);
            p.statement(RET, DENY);
            p.statement(RET, ALLOW);
        }
    }
    p.0
}

/// The worker's filter, for a worker whose PID is `own_pid`.
pub fn filter(own_pid: u32) -> Vec<libc::sock_filter> {
    let mut program = Program(Vec::new());
    program.statement(LOAD, OFFSET_ARCH);
    // Another architecture's calls (a 32-bit int 0x80 on x86-64): denied.
    program.jump(JEQ, AUDIT_ARCH, 1, 0);
    program.statement(RET, DENY);
    program.statement(LOAD, OFFSET_NR);
    if cfg!(target_arch = "x86_64") {
        program.jump(JGE, X32_SYSCALL_BIT, 0, 1);
        program.statement(RET, DENY);
    }
    for (number, rule) in rules() {
        let body = body(rule, own_pid);
        // Not this call: over its body, to the next comparison.
        program.jump(JEQ, number as u32, 0, body.len() as u8);
        program.0.extend(body);
    }
    program.statement(RET, DENY);
    program.0
}

/// Installs the worker's filter on this process (its one thread: the
/// worker calls it before it starts any).
pub fn install() -> io::Result<()> {
    super::sandbox::install(&filter(std::process::id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In a forked child (which only makes system calls until it `_exit`s,
    /// so forking the multi-threaded test runner is safe): what the filter
    /// lets through and what it refuses.
    #[test]
    fn the_worker_reads_and_cannot_write_run_or_reach_out() {
        let program = filter(0);
        assert!(program.len() < 4096, "{} instructions", program.len());
        let parent = std::process::id() as i32;
        let scratch = std::env::temp_dir().join(format!("ddprof-worker-sandbox-{parent}"));
        let _ = std::fs::remove_dir_all(&scratch);
        std::fs::create_dir_all(&scratch).unwrap();
        std::fs::write(scratch.join("file"), b"x").unwrap();
        let path = |name: &str| {
            std::ffi::CString::new(scratch.join(name).as_os_str().as_encoded_bytes()).unwrap()
        };
        let (file, new_file, new_dir, renamed) =
            (path("file"), path("new"), path("dir"), path("renamed"));
        let shell = c"/bin/true";
        // SAFETY: the child makes system calls only, then _exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            // SAFETY: plain system calls on data prepared before the fork.
            let code = unsafe {
                let program = filter(libc::getpid() as u32);
                let failed_with = |result: libc::c_long, expected: i32| {
                    result == -1 && *libc::__errno_location() == expected
                };
                if super::super::sandbox::install(&program).is_err() {
                    libc::_exit(10);
                }
                // Reading: allowed.
                let fd = libc::openat(libc::AT_FDCWD, file.as_ptr(), libc::O_RDONLY);
                if fd < 0 {
                    libc::_exit(11);
                }
                let mut byte = 0u8;
                if libc::read(fd, (&mut byte as *mut u8).cast(), 1) != 1 {
                    libc::_exit(12);
                }
                // Writing, creating, renaming, removing: refused.
                let checks: [(libc::c_long, i32, i32); 9] = [
                    (
                        libc::openat(libc::AT_FDCWD, file.as_ptr(), libc::O_WRONLY) as _,
                        libc::EPERM,
                        20,
                    ),
                    (
                        libc::openat(
                            libc::AT_FDCWD,
                            new_file.as_ptr(),
                            libc::O_RDONLY | libc::O_CREAT,
                            0o600,
                        ) as _,
                        libc::EPERM,
                        21,
                    ),
                    (
                        libc::mkdirat(libc::AT_FDCWD, new_dir.as_ptr(), 0o700) as _,
                        libc::EPERM,
                        22,
                    ),
                    (
                        libc::renameat(
                            libc::AT_FDCWD,
                            file.as_ptr(),
                            libc::AT_FDCWD,
                            renamed.as_ptr(),
                        ) as _,
                        libc::EPERM,
                        23,
                    ),
                    (
                        libc::unlinkat(libc::AT_FDCWD, file.as_ptr(), 0) as _,
                        libc::EPERM,
                        24,
                    ),
                    // Running a program, making a process.
                    (
                        libc::execve(
                            shell.as_ptr(),
                            [shell.as_ptr(), std::ptr::null()].as_ptr(),
                            std::ptr::null(),
                        ) as _,
                        libc::EPERM,
                        25,
                    ),
                    (
                        libc::syscall(libc::SYS_clone, libc::SIGCHLD, 0, 0, 0, 0),
                        libc::EPERM,
                        26,
                    ),
                    // Reaching out: a network socket, another process.
                    (
                        libc::socket(libc::AF_INET, libc::SOCK_STREAM, 0) as _,
                        libc::EPERM,
                        27,
                    ),
                    (libc::kill(parent, 0) as _, libc::EPERM, 28),
                ];
                for (result, expected, code) in checks {
                    if !failed_with(result, expected) {
                        libc::_exit(code);
                    }
                }
                // Executable memory, a terminal's input.
                let map = libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_EXEC,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                if map != libc::MAP_FAILED || *libc::__errno_location() != libc::EPERM {
                    libc::_exit(30);
                }
                if !failed_with(
                    libc::ioctl(0, libc::TIOCSTI, c"x".as_ptr()) as _,
                    libc::EPERM,
                ) {
                    libc::_exit(31);
                }
                // openat2 answers ENOSYS: the walk takes over.
                if !failed_with(
                    libc::syscall(libc::SYS_openat2, libc::AT_FDCWD, file.as_ptr(), 0, 0),
                    libc::ENOSYS,
                ) {
                    libc::_exit(32);
                }
                // What it needs: memory, an anonymous file, its own signals,
                // a syslog socket.
                let map = libc::mmap(
                    std::ptr::null_mut(),
                    4096,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                );
                if map == libc::MAP_FAILED {
                    libc::_exit(40);
                }
                if libc::memfd_create(c"x".as_ptr(), libc::MFD_CLOEXEC) < 0 {
                    libc::_exit(41);
                }
                if libc::kill(libc::getpid(), 0) != 0 {
                    libc::_exit(42);
                }
                let syslog = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
                if syslog < 0 {
                    libc::_exit(43);
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
        assert!(scratch.join("file").exists() && !scratch.join("renamed").exists());
        std::fs::remove_dir_all(&scratch).unwrap();
    }
}

//! What the profiler's processes may do, and what they may not: the
//! capabilities each keeps ([`capabilities`]) and the seccomp filters that
//! bound them: the parent's, which keeps it from signalling or tracing
//! another process ([`sandbox`]), and the worker's allow-list, which keeps
//! what parses the profiled programs' files from writing, running a program
//! or reaching out ([`worker_sandbox`]). Used by the launcher (the set-up)
//! and the profiler (each worker confines itself once forked).
pub mod capabilities;
pub mod sandbox;
pub mod worker_sandbox;

/// `seccomp_data.arch` of this build's own system calls (linux/audit.h):
/// both filters refuse every other architecture's (a 32-bit `int 0x80` on
/// x86-64, an AArch32 call on arm64), which would be a way around them.
#[cfg(target_arch = "x86_64")]
pub(crate) const AUDIT_ARCH: u32 = 0xC000_003E;
/// `AUDIT_ARCH_AARCH64`.
#[cfg(target_arch = "aarch64")]
pub(crate) const AUDIT_ARCH: u32 = 0xC000_00B7;

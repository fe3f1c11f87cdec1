//! Linux capabilities: what the command must not get (`--drop-capabilities`)
//! and what the profiler keeps.
//!
//! The profiler keeps, at most, these capabilities (and only those it already
//! had; it never gains any):
//!
//! | capability            | why                                                               | until                |
//! |-----------------------|-------------------------------------------------------------------|----------------------|
//! | `CAP_SYS_PTRACE`      | read `/proc/PID/maps` of a target whose permitted set is larger than the profiler's (ptrace access mode check), or that belongs to another user | the end (a worker's) |
//! | `CAP_DAC_READ_SEARCH` | open the target's binaries through `/proc/PID/root` when they are not readable by the profiler's user | the end (a worker's) |
//! | `CAP_CHECKPOINT_RESTORE` | read `/proc/PID/map_files/` links (deleted or replaced binaries) without `CAP_SYS_ADMIN` | the end (a worker's) |
//! | `CAP_BPF`, `CAP_PERFMON` | load the BPF program and attach it to the perf events        | [`drop_after_setup`] |
//! | `CAP_BPF` (BPF engine only) | create a map for each unwind table a worker loads (`bpf::TableMaps`); the worker's filter allows map commands only | the end (a worker's) |
//! | `CAP_SYS_ADMIN`       | BPF and perf on kernels older than 5.8, which lack `CAP_BPF`/`CAP_PERFMON` | [`drop_after_setup`] |
//! | `CAP_IPC_LOCK`        | lock BPF maps on kernels that charge them to `RLIMIT_MEMLOCK` (before 5.11) | [`drop_after_setup`] |
//! | `CAP_SYSLOG` (only with `--include-kernel` or `sWALL`) | copy `/proc/kallsyms` with its addresses (hidden without it when `perf_event_paranoid` > 1) | [`drop_after_setup`] |
//!
//! After the set-up, the three kept for the end are only the workers'
//! ([`raise_for_worker`]): the parent, which neither reads the profiled
//! processes nor parses their files (it writes outputs and caches and
//! uploads), keeps them permitted but not effective, only so that the
//! workers it forks can have them; a worker, which reads what the profiled
//! processes map, has them effective under an allow-list of system calls
//! that leaves it no way to write, run a program or reach out (see
//! `worker_sandbox`): they are read-only powers there.
//!
//! Everything else, including `CAP_KILL` (the profiler must not be able to
//! signal a target of another user) and `CAP_SETUID`/`CAP_SETGID`, goes as
//! soon as the events are in place ([`drop_for_profiler`]): from the
//! effective, permitted, inheritable and ambient sets, and from the bounding
//! set, so not even an exec could bring them back.
use std::io;

/// Capability numbers (`linux/capability.h`).
pub mod cap {
    pub const DAC_READ_SEARCH: u32 = 2;
    pub const KILL: u32 = 5;
    pub const SETPCAP: u32 = 8;
    pub const IPC_LOCK: u32 = 14;
    pub const SYS_PTRACE: u32 = 19;
    pub const SYSLOG: u32 = 34;
    pub const SYS_ADMIN: u32 = 21;
    pub const PERFMON: u32 = 38;
    pub const BPF: u32 = 39;
    pub const CHECKPOINT_RESTORE: u32 = 40;
}

/// What `--drop-capabilities` removes from the command.
pub const DROPPED_FROM_COMMAND: &[u32] = &[cap::SYS_ADMIN, cap::PERFMON, cap::BPF];

/// What the profiler keeps for its whole life (if it had them).
pub const KEPT_BY_PROFILER: &[u32] = &[
    cap::SYS_PTRACE,
    cap::DAC_READ_SEARCH,
    cap::CHECKPOINT_RESTORE,
];

/// Also kept by the profiler, for its workers, when the BPF engine runs:
/// a worker creates a map for each unwind table it loads (its seccomp
/// filter lets `bpf(2)` create and use maps, never load a program).
pub const KEPT_FOR_TABLE_MAPS: u32 = cap::BPF;

/// What the profiler keeps only until its engine is set up.
pub const KEPT_FOR_SETUP: &[u32] = &[cap::BPF, cap::PERFMON, cap::SYS_ADMIN, cap::IPC_LOCK];

/// Also kept until the set-up ends with `--include-kernel`: to copy the
/// kernel's symbols (`symbolize::KallsymsSnapshot`).
pub const KEPT_FOR_KERNEL_SYMBOLS: u32 = cap::SYSLOG;

#[derive(Debug, thiserror::Error)]
pub enum CapabilityError {
    #[error("cannot read the capabilities of this process: {0}")]
    Read(io::Error),
    #[error("cannot change the capabilities of this process: {0}")]
    Write(io::Error),
    #[error(
        "cannot remove capability {cap} from the bounding set ({source}); \
         this needs CAP_SETPCAP"
    )]
    Bounding { cap: u32, source: io::Error },
    #[error("cannot clear the ambient capabilities: {0}")]
    Ambient(io::Error),
}

/// A set of capabilities as a bit mask (bit N = capability N).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CapSet(pub u64);

impl CapSet {
    pub fn of(caps: &[u32]) -> CapSet {
        CapSet(caps.iter().fold(0, |mask, cap| mask | (1u64 << cap)))
    }

    pub fn contains(self, cap: u32) -> bool {
        self.0 & (1u64 << cap) != 0
    }

    pub fn without(self, other: CapSet) -> CapSet {
        CapSet(self.0 & !other.0)
    }

    pub fn intersect(self, other: CapSet) -> CapSet {
        CapSet(self.0 & other.0)
    }
}

/// The three per-thread sets `capget`/`capset` handle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ProcessCaps {
    pub effective: CapSet,
    pub permitted: CapSet,
    pub inheritable: CapSet,
}

const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// The calling thread's effective, permitted and inheritable sets.
pub fn current() -> Result<ProcessCaps, CapabilityError> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    // SAFETY: version 3 capget writes two CapData structs, which `data` holds.
    let result = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
    if result != 0 {
        return Err(CapabilityError::Read(io::Error::last_os_error()));
    }
    let join = |low: u32, high: u32| CapSet(u64::from(low) | (u64::from(high) << 32));
    Ok(ProcessCaps {
        effective: join(data[0].effective, data[1].effective),
        permitted: join(data[0].permitted, data[1].permitted),
        inheritable: join(data[0].inheritable, data[1].inheritable),
    })
}

/// Sets the calling thread's effective, permitted and inheritable sets
/// (a process ddprof runs in is single-threaded when it calls this).
pub fn set(caps: ProcessCaps) -> Result<(), CapabilityError> {
    let mut header = CapHeader {
        version: LINUX_CAPABILITY_VERSION_3,
        pid: 0,
    };
    let split = |set: CapSet| (set.0 as u32, (set.0 >> 32) as u32);
    let (effective_low, effective_high) = split(caps.effective);
    let (permitted_low, permitted_high) = split(caps.permitted);
    let (inheritable_low, inheritable_high) = split(caps.inheritable);
    let data = [
        CapData {
            effective: effective_low,
            permitted: permitted_low,
            inheritable: inheritable_low,
        },
        CapData {
            effective: effective_high,
            permitted: permitted_high,
            inheritable: inheritable_high,
        },
    ];
    // SAFETY: version 3 capset reads two CapData structs from `data`.
    let result = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
    if result != 0 {
        return Err(CapabilityError::Write(io::Error::last_os_error()));
    }
    Ok(())
}

/// The highest capability number this kernel knows.
pub fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|text| text.trim().parse().ok())
        .unwrap_or(40)
}

/// The bounding set (what an exec can ever grant).
pub fn bounding() -> CapSet {
    let mut set = CapSet::default();
    for cap in 0..=last_cap().min(63) {
        // SAFETY: PR_CAPBSET_READ takes a capability number and touches no memory.
        if unsafe { libc::prctl(libc::PR_CAPBSET_READ, cap as libc::c_ulong, 0, 0, 0) } == 1 {
            set.0 |= 1u64 << cap;
        }
    }
    set
}

/// The ambient set (what an exec keeps without file capabilities).
pub fn ambient() -> CapSet {
    let mut set = CapSet::default();
    for cap in 0..=last_cap().min(63) {
        // SAFETY: PR_CAP_AMBIENT_IS_SET takes a capability number and touches no memory.
        let is_set = unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_IS_SET as libc::c_ulong,
                cap as libc::c_ulong,
                0,
                0,
            )
        };
        if is_set == 1 {
            set.0 |= 1u64 << cap;
        }
    }
    set
}

fn drop_from_bounding(caps: CapSet) -> Result<(), CapabilityError> {
    let bounding = bounding();
    for cap in 0..=last_cap().min(63) {
        if !caps.contains(cap) || !bounding.contains(cap) {
            continue;
        }
        // SAFETY: PR_CAPBSET_DROP takes a capability number and touches no memory.
        if unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) } != 0 {
            return Err(CapabilityError::Bounding {
                cap,
                source: io::Error::last_os_error(),
            });
        }
    }
    Ok(())
}

fn lower_ambient(caps: CapSet) -> Result<(), CapabilityError> {
    let ambient = ambient();
    for cap in 0..=last_cap().min(63) {
        if !caps.contains(cap) || !ambient.contains(cap) {
            continue;
        }
        // SAFETY: PR_CAP_AMBIENT_LOWER takes a capability number and touches no memory.
        let result = unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_LOWER as libc::c_ulong,
                cap as libc::c_ulong,
                0,
                0,
            )
        };
        if result != 0 {
            return Err(CapabilityError::Ambient(io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Removes `caps` from every set of this process: bounding (first, while
/// `CAP_SETPCAP` may still be effective), ambient, inheritable, permitted
/// and effective.
pub fn remove(caps: CapSet) -> Result<(), CapabilityError> {
    drop_from_bounding(caps)?;
    lower_ambient(caps)?;
    let current = current()?;
    set(ProcessCaps {
        effective: current.effective.without(caps),
        permitted: current.permitted.without(caps),
        inheritable: current.inheritable.without(caps),
    })
}

/// `--drop-capabilities`: removes CAP_SYS_ADMIN, CAP_PERFMON and CAP_BPF from
/// the launcher just before it execs the command.
pub fn drop_from_command() -> Result<(), CapabilityError> {
    remove(CapSet::of(DROPPED_FROM_COMMAND))
}

/// Called by the profiler once its events are in place: keeps only
/// [`KEPT_BY_PROFILER`] and [`KEPT_FOR_SETUP`] (those it has), everywhere,
/// and [`KEPT_FOR_KERNEL_SYMBOLS`] when `kernel_symbols`.
pub fn drop_for_profiler(kernel_symbols: bool) -> Result<(), CapabilityError> {
    let mut kept = CapSet(CapSet::of(KEPT_BY_PROFILER).0 | CapSet::of(KEPT_FOR_SETUP).0);
    if kernel_symbols {
        kept = CapSet(kept.0 | CapSet::of(&[KEPT_FOR_KERNEL_SYMBOLS]).0);
    }
    let everything_else = CapSet(!kept.0);
    // The ambient set is cleared whole: the profiler never execs.
    // SAFETY: PR_CAP_AMBIENT_CLEAR_ALL touches no memory.
    let cleared = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0,
            0,
            0,
        )
    };
    if cleared != 0 {
        return Err(CapabilityError::Ambient(io::Error::last_os_error()));
    }
    // The bounding set needs CAP_SETPCAP: without it (an unprivileged
    // profiler) there is nothing in the permitted set to worry about.
    let current = current()?;
    if current.effective.contains(cap::SETPCAP) {
        drop_from_bounding(everything_else)?;
    }
    set(ProcessCaps {
        effective: current.effective.intersect(kept),
        permitted: current.permitted.intersect(kept),
        inheritable: CapSet::default(),
    })
}

/// Called by the profiler loop once its engine is set up (BPF program loaded
/// and attached, ring buffers mapped): keeps only [`KEPT_BY_PROFILER`]
/// (and [`KEPT_FOR_TABLE_MAPS`] when `bpf_maps`), and those only
/// permitted, for the workers (see the module documentation); none is
/// effective.
pub fn drop_after_setup(bpf_maps: bool) -> Result<(), CapabilityError> {
    let mut kept = CapSet::of(KEPT_BY_PROFILER);
    if bpf_maps {
        kept = CapSet(kept.0 | CapSet::of(&[KEPT_FOR_TABLE_MAPS]).0);
    }
    let current = current()?;
    set(ProcessCaps {
        effective: CapSet::default(),
        permitted: current.permitted.intersect(kept),
        inheritable: CapSet::default(),
    })
}

/// Called by a worker (forked from the parent after the set-up): makes the
/// [`KEPT_BY_PROFILER`] and [`KEPT_FOR_TABLE_MAPS`] capabilities the
/// parent holds permitted effective.
pub fn raise_for_worker() -> Result<(), CapabilityError> {
    let kept = CapSet(CapSet::of(KEPT_BY_PROFILER).0 | CapSet::of(&[KEPT_FOR_TABLE_MAPS]).0);
    let current = current()?;
    set(ProcessCaps {
        effective: current.permitted.intersect(kept),
        permitted: current.permitted.intersect(kept),
        inheritable: CapSet::default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cap_sets_are_bit_masks() {
        let set = CapSet::of(DROPPED_FROM_COMMAND);
        assert_eq!(set.0, (1 << 21) | (1 << 38) | (1 << 39));
        assert!(set.contains(cap::BPF));
        assert!(!set.contains(cap::KILL));
        assert_eq!(
            set.without(CapSet::of(&[cap::BPF])).0,
            (1 << 21) | (1 << 38)
        );
    }

    #[test]
    fn reads_this_process_capabilities() {
        let caps = current().unwrap();
        // The effective set is always within the permitted set.
        assert_eq!(caps.effective.without(caps.permitted), CapSet::default());
        // So is the ambient set, within permitted and inheritable.
        assert_eq!(
            ambient().without(caps.permitted.intersect(caps.inheritable)),
            CapSet::default()
        );
        assert!(last_cap() >= 37);
    }
}

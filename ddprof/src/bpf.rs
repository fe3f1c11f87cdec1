//! The eBPF sampling engine: user stacks unwound in the kernel.
//!
//! The BPF object is embedded in the binary at build time (`cargo xtask
//! build-ebpf`). Its perf_event program is attached to descriptors opened
//! elsewhere (the launcher's hand-off, `-p`, `--global`) with the
//! `PERF_EVENT_IOC_SET_BPF` ioctl, which also works on kernels older than BPF
//! links.
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd};

use aya::maps::PerCpuHashMap;
use aya::programs::PerfEvent;
use aya::Ebpf;
use ddprof_common::sample::BpfCounter;
use perf_event_open_sys as sys;

use crate::events::EventFd;

/// The BPF object built by `cargo xtask build-ebpf`, when this binary has one.
#[cfg(ddprof_bpf)]
pub const BPF_OBJECT: Option<&[u8]> = Some(include_bytes!(env!("DDPROF_EBPF_OBJECT_PATH")));
#[cfg(not(ddprof_bpf))]
pub const BPF_OBJECT: Option<&[u8]> = None;

/// Name of the perf_event program in the object.
const PROGRAM: &str = "ddprof_sample";

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("BPF engine not built into this binary (build it with `cargo xtask build-ebpf`)")]
    NotBuilt,
    #[error("loading BPF is not permitted ({0}): run as root or grant CAP_BPF and CAP_PERFMON")]
    Permission(String),
    #[error("the kernel rejected the BPF program: {0}")]
    Rejected(String),
    #[error("cannot attach the BPF program to a perf event: {0}")]
    Attach(io::Error),
    #[error("cannot read BPF map {map}: {message}")]
    Map { map: &'static str, message: String },
}

/// The first line of an error chain that says why (aya puts the verifier
/// log after the cause; the first meaningful line is what a user needs).
fn first_line(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text = format!("{text}: {cause}");
        source = cause.source();
    }
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("unknown error")
        .to_string()
}

fn classify(error: &dyn std::error::Error) -> BpfError {
    let text = first_line(error);
    let lower = text.to_lowercase();
    if lower.contains("operation not permitted") || lower.contains("permission denied") {
        BpfError::Permission(text)
    } else {
        BpfError::Rejected(text)
    }
}

/// The loaded (verified) BPF program and its maps.
pub struct BpfProgram {
    ebpf: Ebpf,
}

impl BpfProgram {
    /// Loads the embedded object and its perf_event program into the kernel.
    pub fn load() -> Result<Self, BpfError> {
        let object = BPF_OBJECT.ok_or(BpfError::NotBuilt)?;
        // Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; newer ones
        // to the memory cgroup. Raising the limit may be refused (no
        // CAP_SYS_RESOURCE): that only matters on old kernels.
        let unlimited = libc::rlimit {
            rlim_cur: libc::RLIM_INFINITY,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: setrlimit reads a valid rlimit struct; failure is harmless.
        let _ = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
        let mut ebpf = Ebpf::load(object).map_err(|e| classify(&e))?;
        let program: &mut PerfEvent = ebpf
            .program_mut(PROGRAM)
            .ok_or_else(|| BpfError::Rejected(format!("the object has no program `{PROGRAM}`")))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| classify(&e))?;
        program.load().map_err(|e| classify(&e))?;
        Ok(Self { ebpf })
    }

    /// Attaches the program to one perf event opened elsewhere. The event's
    /// samples then go through the program, which decides what is kept.
    pub fn attach(&self, event: &EventFd) -> Result<(), BpfError> {
        let program: &PerfEvent = self
            .ebpf
            .program(PROGRAM)
            .ok_or_else(|| BpfError::Rejected(format!("the object has no program `{PROGRAM}`")))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| classify(&e))?;
        let program_fd = program
            .fd()
            .map_err(|e| BpfError::Rejected(first_line(&e)))?;
        let raw_program_fd = program_fd.as_fd().as_raw_fd();
        // SAFETY: both descriptors are open for the duration of the call;
        // SET_BPF takes the program fd by value and keeps its own reference.
        let result = unsafe { sys::ioctls::SET_BPF(event.fd.as_raw_fd(), raw_program_fd as u32) };
        if result < 0 {
            return Err(BpfError::Attach(io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Samples the program saw, per process (summed over CPUs).
    pub fn samples_per_process(&self) -> Result<HashMap<u32, u64>, BpfError> {
        const MAP: &str = "SAMPLES_PER_PROCESS";
        let map_error = |message: String| BpfError::Map { map: MAP, message };
        let map = self
            .ebpf
            .map(MAP)
            .ok_or_else(|| map_error("missing".into()))?;
        let map: PerCpuHashMap<_, u32, u64> =
            PerCpuHashMap::try_from(map).map_err(|e| map_error(e.to_string()))?;
        let mut counts = HashMap::new();
        for entry in map.iter() {
            let (pid, per_cpu) = entry.map_err(|e| map_error(e.to_string()))?;
            counts.insert(pid, per_cpu.iter().sum());
        }
        Ok(counts)
    }

    /// One of the program's counters (summed over CPUs).
    pub fn counter(&self, counter: BpfCounter) -> Result<u64, BpfError> {
        const MAP: &str = "COUNTERS";
        let map_error = |message: String| BpfError::Map { map: MAP, message };
        let map = self
            .ebpf
            .map(MAP)
            .ok_or_else(|| map_error("missing".into()))?;
        let map: aya::maps::PerCpuArray<_, u64> =
            aya::maps::PerCpuArray::try_from(map).map_err(|e| map_error(e.to_string()))?;
        let values = map
            .get(&(counter as u32), 0)
            .map_err(|e| map_error(e.to_string()))?;
        Ok(values.iter().sum())
    }
}

//! The eBPF sampling engine: user stacks unwound in the kernel.
//!
//! The BPF object is embedded in the binary at build time (`cargo xtask
//! build-ebpf`). Its perf_event program is attached to descriptors opened
//! elsewhere (the launcher's hand-off, `-p`, `--global`) with the
//! `PERF_EVENT_IOC_SET_BPF` ioctl. For each sample it walks the user stack
//! with the unwind rows this module loads into its maps (see
//! `ddprof_common::bpf_maps`), and writes a record into a BPF ring buffer,
//! which [`BpfEngine::poll`] turns into [`Sample`]s.
//!
//! The maps are kept true by [`BpfEngine::on_process_event`] (exec, mmap,
//! exit) and by [`BpfEngine::poll`], which loads the tables of any process
//! of the table it has not seen yet (the initial `/proc` snapshot).
mod choose;
mod programs;
mod rows;
mod variant;

use std::collections::{HashMap, HashSet};
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};
use aya::programs::PerfEvent;
use aya::{Ebpf, EbpfLoader};
use ddprof_common::bpf_maps::{
    MappingEntry, ProcessMappings, MAX_PROCESS_MAPPINGS, ROWS_PER_CHUNK, TABLE_NOT_LOADED,
};
use ddprof_common::sample::{
    BpfCounter, RawSample, RawSampleHeader, StackEnd, RAW_SAMPLE_HEADER_SIZE,
};
use ddprof_common::unwind::ROW_SIZE;
use perf_event_open_sys as sys;

pub use choose::{choose_engine, choose_engine_with, Engine, EngineChoice, EngineDecision};
pub use rows::RowStore;
pub use variant::{choose_variant, kernel_has_bpf_loop, probe_variants, BpfVariant, VARIANT_ENV};

use crate::events::EventFd;
use crate::files::{ContentKey, MappedFile};
use crate::process::{ProcessEvent, ProcessTable};
use crate::sample::{LossCounters, Sample};
use crate::unwind::cache::TableCache;
use crate::unwind::LoadSegment;

/// The BPF object built by `cargo xtask build-ebpf`, when this binary has one.
#[cfg(ddprof_bpf)]
pub const BPF_OBJECT: Option<&[u8]> = Some(include_bytes!(env!("DDPROF_EBPF_OBJECT_PATH")));
#[cfg(not(ddprof_bpf))]
pub const BPF_OBJECT: Option<&[u8]> = None;

/// Bytes of the BPF ring buffer when the sampling rate is not known: room
/// for ~800 samples of 80 frames, several polls' worth at 999 Hz on a few
/// CPUs.
pub const DEFAULT_RING_BUFFER_BYTES: usize = 4 << 20;

/// The BPF ring buffer for `samples_per_second` (every CPU's): what that
/// rate writes while the reader is away (250 ms), at a typical record's
/// 2 KiB a sample, rounded up to a power of two (as the
/// kernel requires) within 256 KiB..4 MiB. Its pages are mapped twice into
/// the profiler (the kernel maps the data area back to back), so every byte
/// here is two bytes of resident memory once the buffer has wrapped: sized
/// from the rate rather than for the worst case. A burst that overflows it
/// is counted as lost, and the loss says to raise `--ring-buffer-kib`.
pub fn ring_buffer_bytes_for_rate(samples_per_second: u64) -> usize {
    /// The longest the profiler loop leaves the buffer unread, with margin
    /// (it waits on the buffer and wakes at least every 250 ms; the daemon
    /// is niced and pinned, so a busy CPU can delay it).
    const READER_AWAY_MILLIS: u64 = 250;
    /// A record of ~250 frames: most stacks are far shallower.
    const TYPICAL_RECORD_BYTES: u64 = 2048;
    let bytes = samples_per_second.saturating_mul(READER_AWAY_MILLIS * TYPICAL_RECORD_BYTES) / 1000;
    (bytes.max(1) as usize)
        .checked_next_power_of_two()
        .unwrap_or(DEFAULT_RING_BUFFER_BYTES)
        .clamp(256 << 10, DEFAULT_RING_BUFFER_BYTES)
}
/// Default cap on the memory of the unwind-row map.
pub const DEFAULT_MAX_TABLE_BYTES: usize = 256 << 20;
/// Rows reserved beyond what the workload needs at start, for libraries and
/// programs that appear later (dlopen, exec): 6 MiB.
pub const TABLE_HEADROOM_ROWS: u32 = 512 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("BPF engine not built into this binary (build it with `cargo xtask build-ebpf`)")]
    NotBuilt,
    #[error(
        "loading BPF is not permitted ({0}): run as root or grant CAP_BPF and CAP_PERFMON \
         (kernel.unprivileged_bpf_disabled forbids unprivileged BPF)"
    )]
    Permission(String),
    #[error("the kernel is too old for the BPF engine ({0}); it needs Linux 5.10 or newer")]
    KernelTooOld(String),
    #[error("bad BPF program variant: {0}")]
    BadVariant(String),
    #[error("the kernel rejected the BPF program: {0}")]
    Rejected(String),
    #[error("cannot attach the BPF program to a perf event: {0}")]
    Attach(io::Error),
    #[error("cannot use BPF map {map}: {message}")]
    Map { map: &'static str, message: String },
    #[error("the BPF engine needs at least one perf event")]
    NoEvents,
    #[error("poll on the BPF ring buffer failed: {0}")]
    Poll(io::Error),
}

/// The whole error chain on one line, then its first line (aya puts the
/// verifier log after the cause; the first line is what a user needs).
fn first_line(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        // aya repeats a cause's text in its parent's message.
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text = format!("{text}: {cause_text}");
        }
        source = cause.source();
    }
    text.lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("unknown error")
        .to_string()
}

/// The line of a verifier log that says why it refused the program: the
/// last one before the statistics the kernel appends.
fn verifier_reason(log: &str) -> Option<&str> {
    const STATS: [&str; 4] = [
        "processed ",
        "verification time",
        "stack depth",
        "mark_precise",
    ];
    log.lines()
        .map(str::trim)
        .rfind(|line| !line.is_empty() && !STATS.iter().any(|s| line.starts_with(s)))
}

/// A failed program load: the syscall's error and the verifier's reason.
fn classify_load(error: aya::programs::ProgramError) -> BpfError {
    if let aya::programs::ProgramError::LoadError {
        io_error,
        verifier_log,
    } = &error
    {
        let log = format!("{verifier_log:?}");
        let reason = verifier_reason(&log).unwrap_or("no verifier output");
        let text = format!("{io_error}: {reason}");
        return match io_error.raw_os_error() {
            Some(libc::EPERM | libc::EACCES) => BpfError::Permission(text),
            _ if reason.contains("unknown func bpf_loop") || reason.contains("#181") => {
                BpfError::KernelTooOld(text)
            }
            _ => BpfError::Rejected(text),
        };
    }
    classify(&error)
}

/// The running kernel's `(major, minor)`.
fn kernel_version() -> Option<(u32, u32)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

fn classify(error: &dyn std::error::Error) -> BpfError {
    let text = first_line(error);
    let lower = text.to_lowercase();
    if lower.contains("operation not permitted") || lower.contains("permission denied") {
        BpfError::Permission(text)
    } else if lower.contains("unknown func bpf_loop") || lower.contains("invalid func unknown#181")
    {
        BpfError::KernelTooOld(text)
    } else {
        BpfError::Rejected(text)
    }
}

/// Sizes of the maps, fixed when the program is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSizes {
    pub ring_buffer_bytes: usize,
    /// Unwind rows the row map holds (rounded up to whole chunks).
    pub table_rows: u32,
    /// Processes the process map holds.
    pub processes: u32,
}

impl MapSizes {
    /// The smallest maps (for a probe load).
    pub fn minimal() -> Self {
        MapSizes {
            ring_buffer_bytes: page_size(),
            table_rows: ROWS_PER_CHUNK,
            processes: 1,
        }
    }
}

/// Memory the engine's maps take (what the kernel allocates for them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapMemory {
    pub ring_buffer_bytes: usize,
    /// The unwind-row map (all of it, used or not).
    pub table_bytes: usize,
    /// Of which rows of loaded tables.
    pub table_used_bytes: usize,
    /// The per-process mapping map (preallocated).
    pub process_map_bytes: usize,
    /// Per-CPU scratch records and counters.
    pub per_cpu_bytes: usize,
}

impl MapMemory {
    pub fn total_bytes(&self) -> usize {
        self.ring_buffer_bytes + self.table_bytes + self.process_map_bytes + self.per_cpu_bytes
    }
}

impl std::fmt::Display for MapMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
        write!(
            f,
            "{:.1} MiB of BPF maps: unwind rows {:.1} MiB ({:.1} MiB used), processes {:.1} MiB, \
             ring buffer {:.1} MiB, per-CPU {:.2} MiB",
            mib(self.total_bytes()),
            mib(self.table_bytes),
            mib(self.table_used_bytes),
            mib(self.process_map_bytes),
            mib(self.ring_buffer_bytes),
            mib(self.per_cpu_bytes),
        )
    }
}

/// What the verifier said about the loaded program.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ProgramStats {
    /// Instructions the verifier processed (`verified_insns`, Linux 5.16+).
    pub verified_instructions: Option<u32>,
    /// Size of the program as the kernel runs it, in instructions.
    pub instructions: Option<u32>,
    /// Wall time of the load (verification included).
    pub load_time: Duration,
    /// The same figures for the tail-called program (tail-call variant).
    pub tail_verified_instructions: Option<u32>,
    pub tail_instructions: Option<u32>,
}

/// The loaded (verified) BPF program and its maps.
pub struct BpfProgram {
    ebpf: Ebpf,
    variant: BpfVariant,
    sizes: MapSizes,
    stats: ProgramStats,
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as usize }
}

fn online_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

impl BpfProgram {
    /// Loads the embedded object with maps of the given sizes and the
    /// program variant this kernel runs (see [`choose_variant`]).
    pub fn load(sizes: MapSizes, kernel_stacks: bool) -> Result<Self, BpfError> {
        let object = BPF_OBJECT.ok_or(BpfError::NotBuilt)?;
        let variant = variant::chosen_variant().map_err(programs::too_old)?;
        Self::load_object(object, sizes, kernel_stacks, variant).map_err(programs::too_old)
    }

    /// Loads the embedded object with the given program variant (its entry
    /// program, and for the tail-call variant the continuation, set in
    /// `WALK_PROGRAMS`).
    pub fn load_variant(
        sizes: MapSizes,
        kernel_stacks: bool,
        variant: BpfVariant,
    ) -> Result<Self, BpfError> {
        let object = BPF_OBJECT.ok_or(BpfError::NotBuilt)?;
        Self::load_object(object, sizes, kernel_stacks, variant).map_err(programs::too_old)
    }

    fn load_object(
        object: &[u8],
        sizes: MapSizes,
        kernel_stacks: bool,
        variant: BpfVariant,
    ) -> Result<Self, BpfError> {
        // Kernels before 5.11 charge BPF maps to RLIMIT_MEMLOCK; newer ones
        // to the memory cgroup. Raising the limit may be refused (no
        // CAP_SYS_RESOURCE): that only matters on old kernels.
        let unlimited = libc::rlimit {
            rlim_cur: libc::RLIM_INFINITY,
            rlim_max: libc::RLIM_INFINITY,
        };
        // SAFETY: setrlimit reads a valid rlimit struct; failure is harmless.
        let _ = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
        let page = page_size();
        let ring_bytes = sizes
            .ring_buffer_bytes
            .div_ceil(page)
            .max(1)
            .next_power_of_two()
            * page;
        let chunks = sizes.table_rows.div_ceil(ROWS_PER_CHUNK).max(1);
        let sizes = MapSizes {
            ring_buffer_bytes: ring_bytes,
            table_rows: chunks * ROWS_PER_CHUNK,
            processes: sizes.processes.max(1),
        };
        let kernel_stacks = u32::from(kernel_stacks);
        let started = Instant::now();
        let mut loader = EbpfLoader::new();
        // For diagnosing verifier rejections: DDPROF_BPF_VERIFIER_LOG=stats|verbose.
        match std::env::var("DDPROF_BPF_VERIFIER_LOG").as_deref() {
            Ok("stats") => {
                loader.verifier_log_level(aya::VerifierLogLevel::STATS);
            }
            Ok("verbose") => {
                loader.verifier_log_level(
                    aya::VerifierLogLevel::VERBOSE | aya::VerifierLogLevel::STATS,
                );
            }
            _ => {}
        }
        let mut ebpf = loader
            .map_max_entries("SAMPLES", ring_bytes as u32)
            .map_max_entries("ROWS", chunks)
            .map_max_entries("PROCESSES", sizes.processes)
            .override_global("KERNEL_STACKS", &kernel_stacks, true)
            .load(object)
            .map_err(|e| classify(&e))?;
        // The continuation first: the entry may only run once the
        // `WALK_PROGRAMS` slot holds it.
        let tail = match variant.tail_program() {
            Some(name) => programs::load_continuation(&mut ebpf, name)?,
            None => None,
        };
        let name = variant.entry_program();
        let program = programs::perf_program_mut(&mut ebpf, name)?;
        program.load().map_err(|e| programs::load_error(e, name))?;
        let load_time = started.elapsed();
        let info = program.info().ok();
        let stats = ProgramStats {
            verified_instructions: info.as_ref().and_then(|i| i.verified_instruction_count()),
            instructions: info
                .as_ref()
                .and_then(|i| i.size_translated())
                .map(|bytes| bytes / 8),
            load_time,
            tail_verified_instructions: tail.as_ref().and_then(|i| i.verified_instruction_count()),
            tail_instructions: tail
                .as_ref()
                .and_then(|i| i.size_translated())
                .map(|bytes| bytes / 8),
        };
        Ok(Self {
            ebpf,
            variant,
            sizes,
            stats,
        })
    }

    /// The variant loaded.
    pub fn variant(&self) -> BpfVariant {
        self.variant
    }

    pub fn sizes(&self) -> MapSizes {
        self.sizes
    }

    pub fn stats(&self) -> ProgramStats {
        self.stats
    }

    /// Attaches the program to one perf event opened elsewhere. The event's
    /// samples then go through the program, which decides what is kept.
    pub fn attach(&self, event: &EventFd) -> Result<(), BpfError> {
        let name = self.variant.entry_program();
        let program: &PerfEvent = self
            .ebpf
            .program(name)
            .ok_or_else(|| BpfError::Rejected(format!("the object has no program `{name}`")))?
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

    /// Time the program has run and how many times, while BPF run-time
    /// statistics are enabled (`aya::sys::enable_stats`, or the
    /// `kernel.bpf_stats_enabled` sysctl).
    /// (With the tail-call variant, the time of the tail-called runs is
    /// added; the count is of samples, the entry's runs.)
    pub fn run_stats(&self) -> Option<(Duration, u64)> {
        let info = |name: &str| {
            let program: &PerfEvent = self.ebpf.program(name)?.try_into().ok()?;
            program.info().ok()
        };
        let entry = info(self.variant.entry_program())?;
        let tail_time = self
            .variant
            .tail_program()
            .and_then(info)
            .map_or(Duration::ZERO, |tail| tail.run_time());
        Some((entry.run_time() + tail_time, entry.run_count()))
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

    /// Every counter, summed over CPUs.
    pub fn counters(&self) -> Result<BpfCounters, BpfError> {
        let mut counters = BpfCounters::default();
        for counter in BpfCounter::ALL {
            counters.values[counter as usize] = self.counter(counter)?;
        }
        Ok(counters)
    }

    fn take_ring(&mut self) -> Result<RingBuf<MapData>, BpfError> {
        const MAP: &str = "SAMPLES";
        let map = self.ebpf.take_map(MAP).ok_or(BpfError::Map {
            map: MAP,
            message: "missing".into(),
        })?;
        RingBuf::try_from(map).map_err(|e| BpfError::Map {
            map: MAP,
            message: e.to_string(),
        })
    }

    fn map_rows(&self) -> Result<RowStore, BpfError> {
        const MAP: &str = "ROWS";
        let map = self.ebpf.map(MAP).ok_or(BpfError::Map {
            map: MAP,
            message: "missing".into(),
        })?;
        let aya::maps::Map::Array(data) = map else {
            return Err(BpfError::Map {
                map: MAP,
                message: "not an array".into(),
            });
        };
        RowStore::map(data.fd().as_fd(), self.sizes.table_rows / ROWS_PER_CHUNK).map_err(|e| {
            BpfError::Map {
                map: MAP,
                message: format!("mmap: {e}"),
            }
        })
    }

    fn process_map(
        &mut self,
    ) -> Result<aya::maps::HashMap<&mut MapData, u32, PodProcessMappings>, BpfError> {
        const MAP: &str = "PROCESSES";
        let map = self.ebpf.map_mut(MAP).ok_or(BpfError::Map {
            map: MAP,
            message: "missing".into(),
        })?;
        aya::maps::HashMap::try_from(map).map_err(|e| BpfError::Map {
            map: MAP,
            message: e.to_string(),
        })
    }

    /// The processes the program handed samples of to the perf engine since
    /// the last call (and clears the list).
    fn take_handed_off(&mut self) -> Vec<u32> {
        let Some(map) = self.ebpf.map_mut("HANDED_OFF") else {
            return Vec::new();
        };
        let Ok(mut map) = aya::maps::HashMap::<&mut MapData, u32, u32>::try_from(map) else {
            return Vec::new();
        };
        let pids: Vec<u32> = map.keys().filter_map(Result::ok).collect();
        for pid in &pids {
            let _ = map.remove(pid);
        }
        pids
    }

    /// What the maps take in the kernel.
    pub fn memory(&self) -> MapMemory {
        let process_value = std::mem::size_of::<ProcessMappings>();
        // Preallocated hash elements: value, key and ~48 bytes of element header.
        let process_element = process_value + 8 + 48;
        MapMemory {
            ring_buffer_bytes: self.sizes.ring_buffer_bytes,
            table_bytes: self.sizes.table_rows as usize * ROW_SIZE,
            table_used_bytes: 0,
            process_map_bytes: self.sizes.processes as usize * process_element,
            per_cpu_bytes: online_cpus()
                * (std::mem::size_of::<RawSample>() + 8 * BpfCounter::ALL.len()),
        }
    }
}

// SAFETY: plain `repr(C)` integer structs without padding holes that matter
// to the kernel (it copies them byte for byte).
unsafe impl aya::Pod for PodProcessMappings {}

/// `ProcessMappings` as an aya map value (the type lives in a crate that does
/// not depend on aya).
#[repr(transparent)]
#[derive(Clone, Copy)]
struct PodProcessMappings(ProcessMappings);

/// The BPF program's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BpfCounters {
    values: [u64; BpfCounter::ALL.len()],
}

impl BpfCounters {
    pub fn get(&self, counter: BpfCounter) -> u64 {
        self.values[counter as usize]
    }
}

impl std::fmt::Display for BpfCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, counter) in BpfCounter::ALL.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{counter:?} {}", self.get(*counter))?;
        }
        Ok(())
    }
}

/// Options of the BPF engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BpfEngineOptions {
    pub ring_buffer_bytes: usize,
    /// Collect kernel stacks too.
    pub kernel_stacks: bool,
    /// Processes whose mappings size the maps (the target and its children,
    /// or every process for `--global`); read from `/proc`.
    pub workload_pids: Vec<u32>,
    /// Processes the process map holds; `None`: from the workload.
    pub max_processes: Option<u32>,
    /// Unwind rows the row map holds; `None`: from the workload.
    pub table_rows: Option<u32>,
    /// Upper bound of the row map's memory.
    pub max_table_bytes: usize,
    /// The program variant; `None`: the one the kernel runs (or
    /// `DDPROF_BPF_VARIANT`), see [`choose_variant`].
    pub variant: Option<BpfVariant>,
}

impl Default for BpfEngineOptions {
    fn default() -> Self {
        BpfEngineOptions {
            ring_buffer_bytes: DEFAULT_RING_BUFFER_BYTES,
            kernel_stacks: false,
            workload_pids: Vec::new(),
            max_processes: None,
            table_rows: None,
            max_table_bytes: DEFAULT_MAX_TABLE_BYTES,
            variant: None,
        }
    }
}

/// What [`BpfEngine::poll`] did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PollOutcome {
    pub samples: u64,
    /// Every workload process had exited before this poll drained the ring
    /// buffer: nothing more will come. (The main loop also learns this from
    /// the perf records of the same events, which see children too.)
    pub finished: bool,
}

/// Counters of the table loading, for reports and tests.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct TableStats {
    /// Distinct files whose rows are in the row map now.
    pub files_loaded: u64,
    /// Files with no usable table (no CFI, unreadable, not ELF).
    pub files_without_table: u64,
    /// Tables that did not fit in the row map (frame pointers used instead).
    pub tables_not_fitting: u64,
    /// Processes not in the process map because it was full.
    pub processes_not_tracked: u64,
    /// Processes with more executable mappings than a map entry holds.
    pub processes_truncated: u64,
}

/// A table in the row map.
struct LoadedTable {
    first_row: u32,
    row_count: u32,
    segments: Vec<LoadSegment>,
}

/// The table state of one mapped file.
#[derive(Clone)]
enum FileState {
    Loaded(ContentKey),
    /// The file has a table but the row map has no room for it: samples
    /// that need it are handed to the perf engine (`TABLE_NOT_LOADED`).
    NotLoaded,
    /// No table (no CFI, unreadable, not ELF): frame pointers, as the perf
    /// engine would use.
    Missing,
}

/// One loaded table, as reported by [`BpfEngine::load_file`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LoadedFileReport {
    pub rows: u32,
    pub bytes: usize,
    pub first_row: u32,
}

/// The eBPF engine: the program attached to every event, its ring buffer
/// read into [`Sample`]s, its maps kept in step with the processes.
pub struct BpfEngine {
    program: BpfProgram,
    /// Kept open: the program stays attached as long as they are.
    _events: Vec<EventFd>,
    workload_pids: Vec<u32>,
    ring: RingBuf<MapData>,
    rows: RowStore,
    compiler: TableCache,
    tables: HashMap<ContentKey, LoadedTable>,
    files: HashMap<Arc<MappedFile>, FileState>,
    /// Per process, the entries last written and the tables they use.
    synced: HashMap<u32, (Vec<MappingEntry>, Vec<ContentKey>)>,
    /// The tables of the entry being written by `sync_process` so far.
    syncing: Vec<ContentKey>,
    /// Processes the program handed to the perf engine, not synced yet.
    handed_off: HashSet<u32>,
    /// Per process, a fingerprint of the table's mappings when last synced
    /// (so that a sync of unchanged processes costs no table lookups).
    fingerprints: HashMap<u32, u64>,
    dirty: HashSet<u32>,
    /// `ProcessTable::generation` at the last full sync.
    synced_generation: Option<u64>,
    /// Processes read from `/proc` because a sample named them first.
    read_from_proc: HashSet<u32>,
    table_stats: TableStats,
    malformed: u64,
}

impl BpfEngine {
    /// Loads the program with maps sized for the workload, attaches it to
    /// every event and maps its ring buffer and row map.
    pub fn new(events: Vec<EventFd>, options: BpfEngineOptions) -> Result<Self, BpfError> {
        if events.is_empty() {
            return Err(BpfError::NoEvents);
        }
        let mut compiler = TableCache::with_limit(64 << 20);
        let (snapshot, table_rows, processes) = size_for_workload(&mut compiler, &options);
        let sizes = MapSizes {
            ring_buffer_bytes: options.ring_buffer_bytes,
            table_rows,
            processes,
        };
        let mut program = match options.variant {
            Some(variant) => BpfProgram::load_variant(sizes, options.kernel_stacks, variant)?,
            None => BpfProgram::load(sizes, options.kernel_stacks)?,
        };
        let ring = program.take_ring()?;
        let rows = program.map_rows()?;
        let stats = program.stats();
        log::info!(
            "BPF engine: {} verified ({} instructions, {} processed by the verifier, {:?}); {}",
            program.variant(),
            stats.instructions.unwrap_or(0),
            stats.verified_instructions.unwrap_or(0),
            stats.load_time,
            program.memory()
        );
        let mut engine = BpfEngine {
            program,
            _events: Vec::new(),
            workload_pids: options.workload_pids.clone(),
            ring,
            rows,
            compiler,
            tables: HashMap::new(),
            files: HashMap::new(),
            synced: HashMap::new(),
            syncing: Vec::new(),
            handed_off: HashSet::new(),
            fingerprints: HashMap::new(),
            dirty: HashSet::new(),
            synced_generation: None,
            read_from_proc: HashSet::new(),
            table_stats: TableStats::default(),
            malformed: 0,
        };
        // The workload's tables are in the maps before its first sample.
        engine.sync(&snapshot);
        for event in &events {
            engine.program.attach(event)?;
        }
        engine._events = events;
        Ok(engine)
    }

    pub fn program(&self) -> &BpfProgram {
        &self.program
    }

    /// The maps' memory, with the rows in use now.
    pub fn memory(&self) -> MapMemory {
        MapMemory {
            table_used_bytes: (self.rows.capacity_rows() - self.rows.free_rows()) as usize
                * ROW_SIZE,
            ..self.program.memory()
        }
    }

    pub fn table_stats(&self) -> TableStats {
        TableStats {
            files_loaded: self.tables.len() as u64,
            ..self.table_stats
        }
    }

    /// The processes whose mappings are in the process map.
    pub fn tracked_processes(&self) -> HashSet<u32> {
        self.synced.keys().copied().collect()
    }

    pub fn counters(&self) -> Result<BpfCounters, BpfError> {
        self.program.counters()
    }

    /// Samples the kernel could not deliver (ring buffer full) and records
    /// that could not be read.
    pub fn losses(&self) -> LossCounters {
        LossCounters {
            lost: self
                .program
                .counter(BpfCounter::BufferFull)
                .unwrap_or_default(),
            throttled: 0,
            malformed: self.malformed,
        }
    }

    /// Keeps the maps in step with a process event, after `processes` has
    /// applied it: exec and new mappings rewrite the process's entry (and
    /// load new files' tables), exit removes it.
    pub fn on_process_event(&mut self, event: &ProcessEvent, processes: &ProcessTable) {
        match event {
            ProcessEvent::Map(record) => {
                if record.prot & libc::PROT_EXEC as u32 != 0 {
                    self.dirty.insert(record.pid);
                }
            }
            ProcessEvent::Comm {
                pid, exec: true, ..
            } => {
                self.dirty.insert(*pid);
            }
            ProcessEvent::Comm { .. } => {}
            ProcessEvent::Fork { pid, ppid, .. } => {
                if pid != ppid {
                    self.dirty.insert(*pid);
                }
            }
            ProcessEvent::Exit { pid, tid } => {
                if pid == tid {
                    self.forget_process(*pid);
                }
            }
        }
        // Mapping changes apply at once: the next sample may run in them.
        self.sync_dirty(processes);
    }

    /// Makes the process map match `processes`: writes the entry of every
    /// process whose executable mappings (or their tables) changed or that
    /// is new, and removes the processes that have exited. (A process the
    /// table does not know yet keeps the entry of the engine's initial
    /// snapshot while it lives.) Only changed entries reach the kernel, so calling this on every
    /// poll is cheap; it is what keeps the maps true when the main loop does
    /// not call [`BpfEngine::on_process_event`].
    pub fn sync(&mut self, processes: &ProcessTable) {
        self.sync_with_young(processes, &HashSet::new());
    }

    /// [`BpfEngine::sync`], except for the `young` processes: those whose
    /// fork, exec or executable mmap has been read but not yet applied to
    /// `processes` (the perf engine holds records back to order them), so
    /// that the table's view of them is behind. They are read from `/proc`
    /// now, which shortens by the hold-back the time a new program runs
    /// with maps that do not describe it.
    pub fn sync_with_young(&mut self, processes: &ProcessTable, young: &HashSet<u32>) {
        if !self.sync_due(processes, young) {
            return;
        }
        // So are the processes whose samples the program handed to the
        // perf engine since the last sync.
        let mut young = young.clone();
        young.extend(self.handed_off.drain());
        self.synced_generation = Some(processes.generation());
        for &pid in &young {
            let mut fresh = ProcessTable::new();
            if fresh.load_from_proc(pid).is_ok() {
                self.sync_process(pid, &fresh);
            }
        }
        let gone: Vec<u32> = self
            .synced
            .keys()
            .copied()
            .filter(|&pid| processes.get(pid).is_none() && !is_alive(pid))
            .collect();
        for pid in gone {
            self.forget_process(pid);
        }
        self.dirty
            .extend(processes.pids().filter(|pid| !young.contains(pid)));
        self.sync_dirty(processes);
    }

    /// Whether [`BpfEngine::sync_with_young`] has anything to do: young
    /// processes, processes the program handed over since the last sync,
    /// or a table that changed. Cheap (one map walk), so that a caller can
    /// skip setting up for a sync that may be slow.
    pub fn sync_due(&mut self, processes: &ProcessTable, young: &HashSet<u32>) -> bool {
        self.handed_off.extend(self.program.take_handed_off());
        !young.is_empty()
            || !self.handed_off.is_empty()
            || self.synced_generation != Some(processes.generation())
    }

    fn sync_dirty(&mut self, processes: &ProcessTable) {
        let mut dirty: Vec<u32> = self.dirty.drain().collect();
        dirty.sort_unstable();
        for pid in dirty {
            self.sync_process(pid, processes);
        }
    }

    fn forget_process(&mut self, pid: u32) {
        self.dirty.remove(&pid);
        self.fingerprints.remove(&pid);
        if self.synced.remove(&pid).is_some() {
            if let Ok(mut map) = self.program.process_map() {
                let _ = map.remove(&pid);
            }
        }
    }

    /// Rewrites one process's entry from the table.
    fn sync_process(&mut self, pid: u32, processes: &ProcessTable) {
        let Some(process) = processes.get(pid) else {
            self.forget_process(pid);
            return;
        };
        let fingerprint = process
            .mappings
            .iter()
            .fold(process.mappings.len() as u64, |hash, m| {
                (hash ^ m.start ^ m.end.rotate_left(17) ^ m.file_offset.rotate_left(31))
                    .wrapping_mul(0x100_0000_01b3)
            });
        if self.synced.contains_key(&pid) && self.fingerprints.get(&pid) == Some(&fingerprint) {
            return;
        }
        self.fingerprints.insert(pid, fingerprint);
        if process.mappings.len() > MAX_PROCESS_MAPPINGS {
            self.table_stats.processes_truncated += 1;
        }
        let mut entries = Vec::with_capacity(process.mappings.len().min(MAX_PROCESS_MAPPINGS));
        // The tables this entry uses, as they are loaded: making room for a
        // later one must not free an earlier one (its rows would be handed
        // out again while this entry points at them).
        self.syncing.clear();
        for mapping in process.mappings.iter().take(MAX_PROCESS_MAPPINGS) {
            let mut entry = MappingEntry {
                start: mapping.start,
                end: mapping.end,
                ..MappingEntry::default()
            };
            let state = self.table_for(pid, &mapping.file, Some((mapping.start, mapping.end)));
            if let FileState::NotLoaded = state {
                entry.first_row = TABLE_NOT_LOADED;
            }
            if let FileState::Loaded(key) = state {
                if let Some(table) = self.tables.get(&key) {
                    if let Some(bias) = LoadSegment::bias_for_mapping(
                        &table.segments,
                        mapping.start,
                        mapping.file_offset,
                    ) {
                        entry.bias = bias;
                        entry.first_row = table.first_row;
                        entry.row_count = table.row_count;
                    }
                }
                self.syncing.push(key);
            }
            entries.push(entry);
        }
        if self
            .synced
            .get(&pid)
            .is_some_and(|(old, _)| *old == entries)
        {
            return;
        }
        let mut value = PodProcessMappings(ProcessMappings::default());
        value.0.count = entries.len() as u32;
        value.0.entries[..entries.len()].copy_from_slice(&entries);
        match self.program.process_map() {
            Ok(mut map) => {
                if let Err(error) = map.insert(pid, value, 0) {
                    log::debug!("process {pid} not tracked by the BPF engine: {error}");
                    self.table_stats.processes_not_tracked += 1;
                    return;
                }
            }
            Err(error) => {
                log::warn!("{error}");
                return;
            }
        }
        let keys = std::mem::take(&mut self.syncing);
        self.synced.insert(pid, (entries, keys));
    }

    /// The state of `file`'s table, loading it into the row map on first
    /// use. `range` is a mapping of the file in `pid` (to reach deleted
    /// files).
    fn table_for(
        &mut self,
        pid: u32,
        file: &Arc<MappedFile>,
        range: Option<(u64, u64)>,
    ) -> FileState {
        match self.files.get(file) {
            Some(FileState::Loaded(key)) if !self.tables.contains_key(key) => {}
            Some(state) => return state.clone(),
            None => {}
        }
        let state = self.load_table(pid, file, range);
        self.files.insert(file.clone(), state.clone());
        state
    }

    fn load_table(&mut self, pid: u32, file: &MappedFile, range: Option<(u64, u64)>) -> FileState {
        let table = match self.compiler.load(pid, file, range) {
            Ok(table) => table,
            Err(error) => {
                log::debug!("BPF engine: no unwind table: {error}");
                self.table_stats.files_without_table += 1;
                return FileState::Missing;
            }
        };
        if self.tables.contains_key(&table.key) {
            return FileState::Loaded(table.key.clone());
        }
        let rows = &table.table.rows;
        let first_row = match self.rows.store(rows) {
            Some(first) => first,
            None => {
                self.release_unused_tables();
                match self.rows.store(rows) {
                    Some(first) => first,
                    None => {
                        log::info!(
                            "BPF engine: no room for the {} unwind rows of {} in the row map \
                             ({} of {} rows free): its samples are unwound in userspace",
                            rows.len(),
                            file.path,
                            self.rows.free_rows(),
                            self.rows.capacity_rows()
                        );
                        self.table_stats.tables_not_fitting += 1;
                        return FileState::NotLoaded;
                    }
                }
            }
        };
        self.tables.insert(
            table.key.clone(),
            LoadedTable {
                first_row,
                row_count: rows.len() as u32,
                segments: table.table.segments.clone(),
            },
        );
        FileState::Loaded(table.key.clone())
    }

    /// Frees the rows of tables no tracked process uses any more.
    fn release_unused_tables(&mut self) {
        let used: HashSet<&ContentKey> = self
            .synced
            .values()
            .flat_map(|(_, keys)| keys.iter())
            .chain(&self.syncing)
            .collect();
        let unused: Vec<ContentKey> = self
            .tables
            .keys()
            .filter(|key| !used.contains(key))
            .cloned()
            .collect();
        for key in unused {
            if let Some(table) = self.tables.remove(&key) {
                self.rows.release(table.first_row, table.row_count);
            }
        }
        self.files.retain(
            |_, state| matches!(state, FileState::Loaded(key) if self.tables.contains_key(key)),
        );
    }

    /// Loads the table of one file into the row map now, as if a process
    /// mapped it (tests, and files known to be needed soon).
    pub fn load_file(&mut self, path: &str) -> Option<LoadedFileReport> {
        use std::os::unix::fs::MetadataExt;
        let metadata = std::fs::metadata(path).ok()?;
        let file = Arc::new(MappedFile {
            path: path.to_string(),
            dev: metadata.dev(),
            inode: metadata.ino(),
        });
        let FileState::Loaded(key) = self.table_for(std::process::id(), &file, None) else {
            return None;
        };
        let table = self.tables.get(&key)?;
        Some(LoadedFileReport {
            rows: table.row_count,
            bytes: table.row_count as usize * ROW_SIZE,
            first_row: table.first_row,
        })
    }

    /// The rows the row map holds at `first_row..first_row + rows`.
    pub fn stored_rows(
        &self,
        first_row: u32,
        rows: u32,
    ) -> Option<Vec<ddprof_common::unwind::UnwindRow>> {
        self.rows.rows(first_row, rows)
    }

    /// Waits up to `timeout` for samples and hands each to `on_sample`.
    /// Processes of `processes` the maps do not know yet are loaded first.
    pub fn poll(
        &mut self,
        processes: &mut ProcessTable,
        timeout: Duration,
        on_sample: &mut dyn FnMut(&ProcessTable, Sample),
    ) -> Result<PollOutcome, BpfError> {
        self.sync(processes);
        let (samples, finished) = self.read_samples(timeout)?;
        let mut outcome = PollOutcome {
            finished,
            ..PollOutcome::default()
        };
        for sample in samples {
            self.before_sample(processes, sample.pid);
            outcome.samples += 1;
            on_sample(processes, sample);
        }
        Ok(outcome)
    }

    /// Waits up to `timeout` for samples and returns them, in the order the
    /// program wrote them, without looking at any process table (for a loop
    /// that merges them with the perf records by time; call
    /// [`BpfEngine::sync`] and [`BpfEngine::before_sample`] around it).
    /// The flag says that every workload process had exited before.
    pub fn read_samples(&mut self, timeout: Duration) -> Result<(Vec<Sample>, bool), BpfError> {
        let finished = self.workload_gone();
        if !finished && !timeout.is_zero() {
            self.wait(timeout)?;
        }
        let mut samples = Vec::new();
        while let Some(item) = self.ring.next() {
            match decode(&item) {
                Some(sample) => samples.push(sample),
                None => self.malformed += 1,
            }
        }
        Ok((samples, finished))
    }

    /// A sample of a process the table does not know (its records were
    /// missed, e.g. written before the perf buffers were mapped): read it
    /// from `/proc` once, for this sample's symbolization and the maps of
    /// the next ones.
    pub fn before_sample(&mut self, processes: &mut ProcessTable, pid: u32) {
        if pid == 0 || processes.get(pid).is_some() || !self.read_from_proc.insert(pid) {
            return;
        }
        match processes.load_from_proc(pid) {
            Ok(()) => self.sync_process(pid, processes),
            Err(error) => log::debug!("BPF engine: cannot read /proc/{pid}: {error}"),
        }
    }

    /// The ring buffer's descriptor, for a caller that waits on it together
    /// with other descriptors (then calls [`BpfEngine::read_samples`] with
    /// a zero timeout).
    pub fn ring_fd(&self) -> std::os::fd::RawFd {
        self.ring.as_raw_fd()
    }

    /// poll(2) on the ring buffer. (A perf event without a mapped ring
    /// buffer always polls as hung up, so the events cannot be watched here.)
    fn wait(&mut self, timeout: Duration) -> Result<(), BpfError> {
        let mut fds = [libc::pollfd {
            fd: self.ring.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let timeout_ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        // SAFETY: `fds` is a valid array of pollfd for the call's duration.
        let ready = unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout_ms) };
        if ready < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(BpfError::Poll(error));
        }
        Ok(())
    }

    /// Every workload process has exited (none when there were none: a
    /// `--global` profile never finishes by itself).
    fn workload_gone(&self) -> bool {
        !self.workload_pids.is_empty() && self.workload_pids.iter().all(|&pid| !is_alive(pid))
    }
}

/// The process exists and is not a zombie.
fn is_alive(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state follows the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next())
            .is_some_and(|state| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

/// Decodes one ring-buffer record.
fn decode(bytes: &[u8]) -> Option<Sample> {
    let header_bytes = bytes.get(..RAW_SAMPLE_HEADER_SIZE)?;
    // SAFETY: RawSampleHeader is repr(C) plain integers; any bytes are a
    // valid value and read_unaligned needs no alignment.
    let header: RawSampleHeader = unsafe { std::ptr::read_unaligned(header_bytes.as_ptr().cast()) };
    let kernel = header.kernel_frames as usize;
    let user = header.user_frames as usize;
    let frames_bytes = bytes.get(RAW_SAMPLE_HEADER_SIZE..)?;
    if frames_bytes.len() < (kernel + user) * 8 {
        return None;
    }
    let word = |i: usize| {
        let mut raw = [0u8; 8];
        raw.copy_from_slice(&frames_bytes[i * 8..i * 8 + 8]);
        u64::from_le_bytes(raw)
    };
    Some(Sample {
        pid: header.pid,
        tid: header.tid,
        time: header.time_ns,
        cpu: header.cpu,
        weight: header.period,
        kernel_frames: (0..kernel).map(word).collect(),
        frames: (kernel..kernel + user).map(word).collect(),
        end: StackEnd::from_raw(header.stack_end),
    })
}

/// Row-map and process-map sizes for the workload: the tables its processes
/// map now, twice, plus room for what comes later, within the memory cap.
fn size_for_workload(
    compiler: &mut TableCache,
    options: &BpfEngineOptions,
) -> (ProcessTable, u32, u32) {
    let max_rows = (options.max_table_bytes / ROW_SIZE).min(u32::MAX as usize / 2) as u32;
    let mut processes = ProcessTable::new();
    for &pid in &options.workload_pids {
        if let Err(error) = processes.load_from_proc(pid) {
            log::debug!("BPF engine: cannot read /proc/{pid}: {error}");
        }
    }
    let table_rows = match options.table_rows {
        Some(rows) => rows.min(max_rows),
        None => {
            let mut seen = HashSet::new();
            let mut needed: u64 = 0;
            for pid in processes.pids().collect::<Vec<_>>() {
                let Some(process) = processes.get(pid) else {
                    continue;
                };
                for mapping in &process.mappings {
                    if let Ok(table) =
                        compiler.load(pid, &mapping.file, Some((mapping.start, mapping.end)))
                    {
                        if seen.insert(table.key.clone()) {
                            needed += table.table.rows.len() as u64;
                        }
                    }
                }
            }
            let needed = needed.min(u32::MAX as u64 / 4) as u32;
            (needed.saturating_mul(2).max(needed + TABLE_HEADROOM_ROWS)).min(max_rows)
        }
    };
    let process_count = options.workload_pids.len() as u32;
    let max_processes = options
        .max_processes
        .unwrap_or_else(|| (process_count.saturating_mul(2) + 64).clamp(128, 16384));
    (processes, table_rows, max_processes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_records_and_rejects_short_ones() {
        let header = RawSampleHeader {
            pid: 7,
            tid: 8,
            time_ns: 9,
            period: 10,
            cpu: 1,
            stack_end: StackEnd::Complete as u32,
            user_frames: 2,
            kernel_frames: 1,
        };
        let mut bytes = Vec::new();
        // SAFETY: viewing a repr(C) value as its bytes.
        bytes.extend_from_slice(unsafe {
            std::slice::from_raw_parts(
                (&header as *const RawSampleHeader).cast::<u8>(),
                RAW_SAMPLE_HEADER_SIZE,
            )
        });
        for frame in [0xffff_ffff_8100_0000u64, 0x401000, 0x402000] {
            bytes.extend_from_slice(&frame.to_le_bytes());
        }
        let sample = decode(&bytes).unwrap();
        assert_eq!(sample.kernel_frames, vec![0xffff_ffff_8100_0000]);
        assert_eq!(sample.frames, vec![0x401000, 0x402000]);
        assert_eq!((sample.pid, sample.tid, sample.weight), (7, 8, 10));
        assert!(!sample.truncated());
        assert!(decode(&bytes[..bytes.len() - 1]).is_none());
        assert!(decode(&bytes[..10]).is_none());
    }

    #[test]
    fn the_ring_buffer_follows_the_sampling_rate() {
        // 999 Hz on 2 CPUs: ~1 MB written in 250 ms of typical records.
        assert_eq!(ring_buffer_bytes_for_rate(2 * 999), 1 << 20);
        // The default 99 Hz: the 256 KiB floor.
        assert_eq!(ring_buffer_bytes_for_rate(2 * 99), 256 << 10);
        assert_eq!(ring_buffer_bytes_for_rate(0), 256 << 10);
        // Many CPUs at a high rate: capped.
        assert_eq!(
            ring_buffer_bytes_for_rate(64 * 999),
            DEFAULT_RING_BUFFER_BYTES
        );
        assert_eq!(
            ring_buffer_bytes_for_rate(u64::MAX),
            DEFAULT_RING_BUFFER_BYTES
        );
    }

    #[test]
    fn verifier_reason_is_the_last_line_before_the_statistics() {
        let log = "0: R1=ctx() R10=fp0\n12: (85) call bpf_loop#181\ninvalid indirect read from stack R2 off -8+0 size 8\nprocessed 120 insns (limit 1000000) max_states_per_insn 0\nverification time 20 usec\nstack depth 8\n";
        assert_eq!(
            verifier_reason(log),
            Some("invalid indirect read from stack R2 off -8+0 size 8")
        );
        assert_eq!(verifier_reason("\n"), None);
        assert!(kernel_version().is_some_and(|v| v >= (3, 0)));
    }
}

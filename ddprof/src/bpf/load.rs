//! Loading the BPF object: the embedded object, its maps sized, the chosen
//! variant's programs loaded and verified ([`BpfProgram`]), attached to perf
//! events, and every failure classified into a [`BpfError`].
use std::io;
use std::os::fd::{AsFd, AsRawFd};
use std::time::{Duration, Instant};

use aya::maps::{MapData, RingBuf};
use aya::programs::PerfEvent;
use aya::{Ebpf, EbpfLoader};
use ddprof_common::bpf_maps::{names, ProcessMappings};
use ddprof_common::sample::{BpfCounter, RawSample};
use perf_event_open_sys as sys;

use super::programs;
use super::rows::TableMaps;
use super::settings::ProgramSettings;
use super::variant::{self, BpfVariant};
use crate::events::EventFd;

/// The BPF object built by `cargo xtask build-ebpf`, when this binary has one.
#[cfg(ddprof_bpf)]
pub const BPF_OBJECT: Option<&[u8]> = Some(include_bytes!(env!("DDPROF_EBPF_OBJECT_PATH")));
#[cfg(not(ddprof_bpf))]
pub const BPF_OBJECT: Option<&[u8]> = None;

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
    #[error("cannot use BPF map {map}: {problem}")]
    Map {
        map: &'static str,
        #[source]
        problem: MapProblem,
    },
    #[error("the BPF engine needs at least one perf event")]
    NoEvents,
    #[error("poll on the BPF ring buffer failed: {0}")]
    Poll(io::Error),
}

/// What went wrong with one of the object's maps.
#[derive(Debug, thiserror::Error)]
pub enum MapProblem {
    #[error("the object has no such map")]
    Missing,
    #[error("not of the type the program declares")]
    NotAnArray,
    #[error(transparent)]
    Aya(#[from] aya::maps::MapError),
    #[error("{0}")]
    Io(io::Error),
}

/// The whole error chain on one line, then its first line (aya puts the
/// verifier log after the cause; the first line is what a user needs).
pub(super) fn first_line(error: &dyn std::error::Error) -> String {
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

/// A failed load of program `name`: the syscall's error and the verifier's
/// reason. A refusal of the `bpf_loop` variant by a kernel that the probe
/// says lacks `bpf_loop` (forced with `DDPROF_BPF_VARIANT`) is a kernel too
/// old for it.
pub(super) fn classify_load(error: aya::programs::ProgramError, name: &str) -> BpfError {
    let aya::programs::ProgramError::LoadError { io_error, .. } = &error else {
        return classify(&error);
    };
    let text = load_error_text(&error);
    let lacks_bpf_loop = || {
        name == BpfVariant::Loop.entry_program()
            && matches!(variant::kernel_has_bpf_loop(), Ok(false))
    };
    match io_error.raw_os_error() {
        Some(libc::EPERM | libc::EACCES) => BpfError::Permission(text),
        _ if lacks_bpf_loop() => BpfError::KernelTooOld(text),
        _ => BpfError::Rejected(text),
    }
}

/// The running kernel's `(major, minor)`.
pub(super) fn kernel_version() -> Option<(u32, u32)> {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").ok()?;
    let mut parts = release.trim().split(['.', '-']);
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// The errno the kernel answered, found in the error's chain of causes
/// (aya keeps each failed syscall's `io::Error` as a source).
fn kernel_errno(error: &(dyn std::error::Error + 'static)) -> Option<i32> {
    std::iter::successors(Some(error), |cause| cause.source())
        .find_map(|cause| cause.downcast_ref::<io::Error>()?.raw_os_error())
}

/// An aya error, by the errno the kernel answered: EPERM or EACCES is a
/// permission problem, anything else a refusal (worded by its first line).
pub(super) fn classify(error: &(dyn std::error::Error + 'static)) -> BpfError {
    let text = first_line(error);
    match kernel_errno(error) {
        Some(libc::EPERM | libc::EACCES) => BpfError::Permission(text),
        _ => BpfError::Rejected(text),
    }
}

/// Sizes of the maps, fixed when the program is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapSizes {
    pub ring_buffer_bytes: usize,
    /// Processes the process map holds.
    pub processes: u32,
}

impl MapSizes {
    /// The smallest maps (for a probe load).
    pub fn minimal() -> Self {
        MapSizes {
            ring_buffer_bytes: page_size(),
            processes: 1,
        }
    }
}

/// Memory the engine's maps take (what the kernel allocates for them).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MapMemory {
    pub ring_buffer_bytes: usize,
    /// The loaded unwind tables' maps (each sized for its file's rows,
    /// created as files are first needed).
    pub table_bytes: usize,
    /// The per-process mapping map, at most (its elements are allocated as
    /// processes are written, not in advance: see the map's definition).
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
            "{:.1} MiB of BPF maps: unwind tables {:.1} MiB, processes {:.1} MiB, ring buffer \
             {:.1} MiB, per-CPU {:.2} MiB",
            mib(self.total_bytes()),
            mib(self.table_bytes),
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
    /// Links take cookies here, and the program reads them
    /// (`EVENT_COOKIES`): events other than CPU time can be attached.
    event_cookies: bool,
    /// The `sWALL` program: loaded, or why not (`None`: not asked for).
    wall: Option<Result<(), String>>,
    /// The `sALLOC` uprobe program: loaded, or why not (`None`: not
    /// asked for).
    allocation: Option<Result<(), String>>,
}

/// Whether perf-event links carry a cookie the program can read
/// (`bpf_get_attach_cookie` for perf_event programs: Linux 5.15).
fn links_carry_cookies() -> bool {
    kernel_version().is_some_and(|version| version >= (5, 15))
}

/// A refused load in one line: the system call's error and the verifier's
/// reason.
pub(super) fn load_error_text(error: &aya::programs::ProgramError) -> String {
    let aya::programs::ProgramError::LoadError {
        io_error,
        verifier_log,
    } = error
    else {
        return first_line(error);
    };
    let log = format!("{verifier_log:?}");
    let reason = verifier_reason(&log).unwrap_or("no verifier output");
    format!("{io_error}: {reason}")
}

/// `BPF_LINK_CREATE`, `BPF_PERF_EVENT` (`linux/bpf.h`).
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_PERF_EVENT: u32 = 41;

/// `union bpf_attr`'s `link_create` for a perf event, up to its cookie.
#[repr(C)]
struct PerfEventLinkAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    bpf_cookie: u64,
}

/// The inode of the initial PID namespace (`PROC_PID_INIT_INO`).
const INITIAL_PID_NAMESPACE_INODE: u64 = 0xEFFF_FFFC;

/// The device and inode of the profiler's PID namespace when it is not
/// the initial one (the profiler runs in a container): the program then
/// numbers tasks in it, as the perf records and the process table do.
pub(super) fn own_pid_namespace() -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt;
    let namespace = std::fs::metadata("/proc/self/ns/pid").ok()?;
    (namespace.ino() != INITIAL_PID_NAMESPACE_INODE).then(|| (namespace.dev(), namespace.ino()))
}

pub(super) fn page_size() -> usize {
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
        Self::load_with(
            sizes,
            ProgramSettings::with_kernel_stacks(kernel_stacks),
            None,
        )
    }

    /// Loads the embedded object with the given program variant (its entry
    /// program, and for the tail-call variant the continuation, set in
    /// `WALK_PROGRAMS`).
    pub fn load_variant(
        sizes: MapSizes,
        kernel_stacks: bool,
        variant: BpfVariant,
    ) -> Result<Self, BpfError> {
        let settings = ProgramSettings::with_kernel_stacks(kernel_stacks);
        Self::load_with(sizes, settings, Some(variant))
    }

    /// Loads the embedded object with `settings`, and `variant` or else
    /// the variant this kernel runs.
    pub fn load_with(
        sizes: MapSizes,
        settings: ProgramSettings,
        variant: Option<BpfVariant>,
    ) -> Result<Self, BpfError> {
        let object = BPF_OBJECT.ok_or(BpfError::NotBuilt)?;
        let variant = match variant {
            Some(variant) => variant,
            None => variant::chosen_variant().map_err(programs::too_old)?,
        };
        Self::load_object(object, sizes, settings, variant).map_err(programs::too_old)
    }

    fn load_object(
        object: &[u8],
        sizes: MapSizes,
        settings: ProgramSettings,
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
        let sizes = MapSizes {
            ring_buffer_bytes: ring_bytes,
            processes: sizes.processes.max(1),
        };
        let kernel_stacks = u32::from(settings.kernel_stacks);
        let handoff_wakeup = u32::from(settings.wake_on_handoff);
        let tree_only = u32::from(settings.tree_only);
        // The tail-call variant calls no helper newer than 5.10.
        let event_cookies = variant == BpfVariant::Loop && links_carry_cookies();
        // Every CPU sampled, the CPU-time events get links with cookies too
        // (`attach_with_cookie`): a run without one is then an inherited
        // copy of another event (see the program's `EVENT_COOKIES`).
        let event_cookies_flag = match (event_cookies, settings.tree_only) {
            (false, _) => 0u32,
            (true, false) => 1,
            (true, true) => 2,
        };
        let (pid_ns_dev, pid_ns_ino) = own_pid_namespace().unwrap_or((0, 0));
        let wall_cookie = settings.wall.map_or(0u32, |wall| u32::from(wall.event) + 1);
        let allocation_cookie = settings
            .allocation
            .map_or(0u32, |event| u32::from(event) + 1);
        let wall_max_probability = settings
            .wall
            .map_or(ddprof_common::sample::WALL_PROBABILITY_ONE, |wall| {
                wall.max_probability
            });
        let wall_undescribed = u32::from(settings.undescribed_may_be_profiled);
        // `sWALL` reads the id of the thread switching in at this offset.
        let task_pid_offset = settings.wall.map(|_| super::kernel_btf::task_pid_offset());
        let task_pid = task_pid_offset.clone().and_then(Result::ok).unwrap_or(0u32);
        // Thread contexts (OTEP 4947, custom-labels) are read from the
        // thread pointer at this offset; 0 reads none.
        let task_fsbase = super::kernel_btf::task_fsbase_offset().unwrap_or_else(|error| {
            log::info!("trace context: {error}; samples will carry no span ids");
            0
        });
        let wall_walks_per_window = (crate::wall::WALKS_PER_CPU_SECOND
            * ddprof_common::sample::WALL_WINDOW_NS
            / 1_000_000_000)
            .max(1);
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
            .map_max_entries(names::SAMPLES, ring_bytes as u32)
            .map_max_entries(names::PROCESSES, sizes.processes)
            .override_global(names::KERNEL_STACKS, &kernel_stacks, true)
            .override_global(names::HANDOFF_WAKEUP, &handoff_wakeup, true)
            .override_global(names::TREE_ONLY, &tree_only, true)
            .override_global(names::EVENT_COOKIES, &event_cookies_flag, true)
            .override_global(names::PID_NS_DEV, &pid_ns_dev, true)
            .override_global(names::PID_NS_INO, &pid_ns_ino, true)
            .override_global(names::WALL_COOKIE, &wall_cookie, true)
            .override_global(names::ALLOCATION_COOKIE, &allocation_cookie, true)
            .override_global(names::WALL_MAX_PROBABILITY, &wall_max_probability, true)
            .override_global(names::WALL_WALKS_PER_WINDOW, &wall_walks_per_window, true)
            .override_global(names::WALL_UNDESCRIBED, &wall_undescribed, true)
            .override_global(names::TASK_PID_OFFSET, &task_pid, true)
            .override_global(names::TASK_FSBASE_OFFSET, &task_fsbase, true)
            .load(object)
            .map_err(|e| classify(&e))?;
        // The continuation first: the entry may only run once the
        // `WALK_PROGRAMS` slot holds it.
        let tail = match variant.tail_program() {
            Some(name) => programs::load_continuation(&mut ebpf, name)?,
            None => None,
        };
        if settings.tree_only {
            let name = names::IGNORE_PROGRAM;
            let program = programs::perf_program_mut(&mut ebpf, name)?;
            program.load().map_err(|e| programs::load_error(e, name))?;
        }
        let name = variant.entry_program();
        let allocation =
            programs::load_entry_beside_allocation(&mut ebpf, name, settings.allocation, variant)?;
        let load_time = started.elapsed();
        let info = programs::perf_program_mut(&mut ebpf, name)?.info().ok();
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
        let wall = task_pid_offset.map(|offset| match offset {
            Ok(_) => programs::load_wall_program(&mut ebpf, variant),
            Err(error) => Err(format!(
                "where a thread's id lies in a task is unknown: {error}"
            )),
        });
        Ok(Self {
            ebpf,
            variant,
            sizes,
            stats,
            event_cookies,
            wall,
            allocation,
        })
    }

    /// Attaches the `sALLOC` program to the allocation marker's uprobe
    /// event. The kernel keeps a uprobe's programs with the probe, not
    /// with the descriptor: one descriptor of the event takes it for all
    /// (its copies on other CPUs and in new threads, which a second attach
    /// would refuse). `Err`: why allocation samples keep the perf engine's
    /// path (stack copies), for one line.
    pub fn attach_allocation(&self, event: &EventFd) -> Result<(), String> {
        self.allocation_loaded()
            .unwrap_or_else(|| Err("the allocation program was not asked for".into()))?;
        self.attach_program(names::ALLOCATION_PROGRAM, event)
            .map_err(|error| format!("the uprobe refused the program: {error}"))
    }

    /// Whether the `sALLOC` program was loaded (`None`: not asked for).
    pub fn allocation_loaded(&self) -> Option<Result<(), String>> {
        self.allocation.clone()
    }

    /// Whether the `sWALL` program was loaded (`None`: not asked for).
    pub fn wall_loaded(&self) -> Option<Result<(), String>> {
        self.wall.clone()
    }

    /// Attaches the `sWALL` program to the `sched_switch` tracepoint, once
    /// the maps describe the profiled processes. `Err`: why wall time is
    /// not sampled (the program was not asked for, could not load on this
    /// kernel, or the tracepoint refused it), for one line.
    pub fn start_wall(&mut self) -> Result<(), String> {
        match &self.wall {
            None => return Err("sWALL was not asked for".into()),
            Some(Err(why)) => return Err(why.clone()),
            Some(Ok(())) => {}
        }
        let program: &mut aya::programs::BtfTracePoint = self
            .ebpf
            .program_mut(names::WALL_PROGRAM)
            .ok_or_else(|| format!("the object has no program `{}`", names::WALL_PROGRAM))?
            .try_into()
            .map_err(|e: aya::programs::ProgramError| first_line(&e))?;
        program
            .attach()
            .map(|_link| ())
            .map_err(|e| format!("cannot attach to sched_switch: {}", first_line(&e)))
    }

    /// Whether [`BpfProgram::attach_with_cookie`] can work here.
    pub fn takes_event_cookies(&self) -> bool {
        self.event_cookies
    }

    /// Attaches the program to one perf event through a link that carries
    /// `cookie`, which the program writes into each of the event's records
    /// (the event's index plus one). The link holds the attachment: it
    /// ends when the returned descriptor is closed.
    pub fn attach_with_cookie(
        &self,
        event: &EventFd,
        cookie: u64,
    ) -> Result<std::os::fd::OwnedFd, BpfError> {
        if !self.event_cookies {
            return Err(BpfError::Attach(io::Error::from(
                io::ErrorKind::Unsupported,
            )));
        }
        let attr = PerfEventLinkAttr {
            prog_fd: self.program_fd(self.variant.entry_program())? as u32,
            target_fd: event.fd.as_raw_fd() as u32,
            attach_type: BPF_PERF_EVENT,
            flags: 0,
            bpf_cookie: cookie,
        };
        // SAFETY: `attr` is a valid prefix of `union bpf_attr` for
        // BPF_LINK_CREATE, its size passed with it (the kernel zero-fills
        // the rest); both descriptors are open for the call, and the
        // returned one is owned below.
        let link = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_LINK_CREATE,
                &attr as *const PerfEventLinkAttr,
                std::mem::size_of::<PerfEventLinkAttr>(),
            )
        };
        if link < 0 {
            return Err(BpfError::Attach(io::Error::last_os_error()));
        }
        // SAFETY: the kernel returned a new descriptor nothing else owns.
        Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(link as i32) })
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
        self.attach_program(self.variant.entry_program(), event)
    }

    /// Attaches the program that drops every sample (loaded with
    /// `tree_only`): the event keeps counting and writing its process
    /// records, and its samples cost an interrupt and two instructions.
    pub fn attach_ignoring(&self, event: &EventFd) -> Result<(), BpfError> {
        self.attach_program(names::IGNORE_PROGRAM, event)
    }

    /// The descriptor of the loaded program `name` (the object keeps it
    /// open as long as `self` lives).
    fn program_fd(&self, name: &str) -> Result<std::os::fd::RawFd, BpfError> {
        let program = self
            .ebpf
            .program(name)
            .ok_or_else(|| BpfError::Rejected(format!("the object has no program `{name}`")))?;
        let program_fd = program
            .fd()
            .map_err(|e| BpfError::Rejected(first_line(&e)))?;
        Ok(program_fd.as_fd().as_raw_fd())
    }

    fn attach_program(&self, name: &str, event: &EventFd) -> Result<(), BpfError> {
        let raw_program_fd = self.program_fd(name)?;
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
        const MAP: &str = names::COUNTERS;
        let map_error = |problem: MapProblem| BpfError::Map { map: MAP, problem };
        let map = self
            .ebpf
            .map(MAP)
            .ok_or_else(|| map_error(MapProblem::Missing))?;
        let map: aya::maps::PerCpuArray<_, u64> =
            aya::maps::PerCpuArray::try_from(map).map_err(|e| map_error(e.into()))?;
        let values = map
            .get(&(counter as u32), 0)
            .map_err(|e| map_error(e.into()))?;
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

    pub(super) fn take_ring(&mut self) -> Result<RingBuf<MapData>, BpfError> {
        const MAP: &str = names::SAMPLES;
        let map = self.ebpf.take_map(MAP).ok_or(BpfError::Map {
            map: MAP,
            problem: MapProblem::Missing,
        })?;
        RingBuf::try_from(map).map_err(|e| BpfError::Map {
            map: MAP,
            problem: e.into(),
        })
    }

    /// The store of the `TABLES` array of maps, spending at most
    /// `budget_bytes` on tables.
    pub(super) fn table_maps(&self, budget_bytes: u64) -> Result<TableMaps, BpfError> {
        const MAP: &str = names::TABLES;
        let map = self.ebpf.map(MAP).ok_or(BpfError::Map {
            map: MAP,
            problem: MapProblem::Missing,
        })?;
        let aya::maps::Map::ArrayOfMaps(data) = map else {
            return Err(BpfError::Map {
                map: MAP,
                problem: MapProblem::NotAnArray,
            });
        };
        TableMaps::new(data.fd().as_fd(), budget_bytes).map_err(|e| BpfError::Map {
            map: MAP,
            problem: MapProblem::Io(e),
        })
    }

    pub(super) fn process_map(
        &mut self,
    ) -> Result<aya::maps::HashMap<&mut MapData, u32, ProcessMappings>, BpfError> {
        self.hash_map(names::PROCESSES)
    }

    /// The processes found not profiled (`TREE_ONLY`), whose samples the
    /// program drops.
    pub(super) fn not_profiled_map(
        &mut self,
    ) -> Result<aya::maps::HashMap<&mut MapData, u32, u32>, BpfError> {
        self.hash_map(names::NOT_PROFILED)
    }

    /// Makes `pid`'s next hand-off notice one of a process named before
    /// (`HANDED_OFF` at time 0, without an entry), which wakes the reader
    /// at any rate: one bpf(2) call, made once for the wrapped command.
    pub(super) fn mark_handed_off_long_ago(&mut self, pid: u32) -> Result<(), BpfError> {
        let mut handed_off: aya::maps::HashMap<&mut MapData, u32, [u64; 2]> =
            self.hash_map(names::HANDED_OFF)?;
        handed_off
            .insert(pid, [0, 0], 0)
            .map_err(|e| BpfError::Map {
                map: names::HANDED_OFF,
                problem: e.into(),
            })
    }

    /// The hash map `name` of the loaded object, typed.
    pub(super) fn hash_map<K: aya::Pod, V: aya::Pod>(
        &mut self,
        name: &'static str,
    ) -> Result<aya::maps::HashMap<&mut MapData, K, V>, BpfError> {
        let map = self.ebpf.map_mut(name).ok_or(BpfError::Map {
            map: name,
            problem: MapProblem::Missing,
        })?;
        aya::maps::HashMap::try_from(map).map_err(|e| BpfError::Map {
            map: name,
            problem: e.into(),
        })
    }

    /// What the maps take in the kernel.
    pub fn memory(&self) -> MapMemory {
        let process_value = std::mem::size_of::<ProcessMappings>();
        // Preallocated hash elements: value, key and ~48 bytes of element header.
        let process_element = process_value + 8 + 48;
        MapMemory {
            ring_buffer_bytes: self.sizes.ring_buffer_bytes,
            table_bytes: 0,
            process_map_bytes: self.sizes.processes as usize * process_element,
            per_cpu_bytes: online_cpus()
                * (std::mem::size_of::<RawSample>() + 8 * BpfCounter::COUNT),
        }
    }
}

/// The BPF program's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BpfCounters {
    values: [u64; BpfCounter::COUNT],
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_are_classified_by_the_kernels_errno_not_their_text() {
        let refused = aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
            call: "bpf_map_create",
            io_error: io::Error::from_raw_os_error(libc::EPERM),
        });
        assert!(matches!(classify(&refused), BpfError::Permission(_)));
        let denied = aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
            call: "bpf_prog_load",
            io_error: io::Error::from_raw_os_error(libc::EACCES),
        });
        assert!(matches!(classify(&denied), BpfError::Permission(_)));
        // A message that merely says "permission denied" is not a refusal
        // by the kernel.
        let worded = io::Error::other("permission denied by a message");
        assert!(matches!(classify(&worded), BpfError::Rejected(_)));
        let invalid = aya::programs::ProgramError::SyscallError(aya::sys::SyscallError {
            call: "bpf_prog_load",
            io_error: io::Error::from_raw_os_error(libc::EINVAL),
        });
        assert!(matches!(classify(&invalid), BpfError::Rejected(_)));
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

//! The wrapper launcher, the perf-fd hand-off and the detached profiler
//! daemon; `-p PID` and `--global` in the foreground.
//!
//! `ddprof [OPTIONS] -- COMMAND`, in order ([`run_command`]):
//! 1. the launcher forks the profiler daemon (a double-forked, `setsid`
//!    grandchild, see [`daemon`]) with one end of a `SOCK_SEQPACKET` pair;
//! 2. it opens the events on itself (`Scope::SelfOnExec`: disabled until the
//!    exec, inherited by the command's children), one per CPU per `-e` spec;
//! 3. it sends every descriptor to the daemon (`SCM_RIGHTS`, [`handoff`]) and
//!    waits, at most [`HANDOFF_TIMEOUT`], for the daemon to say it holds them,
//!    then, at most [`READY_TIMEOUT`], for its engine to be set up (so that
//!    the BPF program is attached before the command starts threads: an
//!    event inherited before the attach never runs the program);
//! 4. it applies `--drop-capabilities` / `--switch-user` and execs the command
//!    (PATH lookup like `execvp`), which keeps the launcher's PID, so the
//!    caller sees the command's own exit status.
//!
//! Any failure in 1–3, or a configuration problem from the environment or
//! the config file (steps 1–3 are then skipped), prints one warning naming
//! the cause and the command runs unprofiled. Only the command's own failures
//! end ddprof: not found (127), not executable (126), or an unusable
//! `--switch-user` / failed `--drop-capabilities` (1: running it otherwise
//! would give it more rights than asked for).
//!
//! The daemon cannot take the command down: it is not its parent or in its
//! process group, it drops `CAP_KILL` and every capability it does not use
//! ([`capabilities`]), a seccomp filter stops it from signalling or tracing
//! any other process ([`sandbox`]), it runs at `--nice` on one CPU, and the
//! launcher never waits for it longer than [`HANDOFF_TIMEOUT`].
//!
//! What the profiler ([`Profiler`]) gets from here, in every mode:
//! - the events, already open, one per CPU per `-e` spec (per thread for `-p`);
//! - the end of its target: a [`TargetWatch`] whose
//!   [`TargetWatch::poll_fd`] becomes readable when the process exits (for
//!   the launched command, over the pidfd the launcher opened before the
//!   command existed); `--global` has no target;
//! - stop requests: SIGINT/SIGTERM handlers ([`stop::install`]) are
//!   installed before it runs; its loop checks [`stop::requested`] and then
//!   flushes and returns;
//! - capabilities: once [`Profiler::start`] has set up the engine (BPF
//!   program loaded and attached, buffers mapped), the launcher drops those
//!   it only needed for that ([`capabilities::drop_after_setup`]) before
//!   [`Profiler::run`];
//! - at exit it logs one notice line containing `summary:` and `samples=N`
//!   (the integration tests read it).
pub mod daemon;
pub mod handoff;
mod init;
pub mod memory;
pub mod signals;

use std::ffi::CString;
use std::os::fd::AsRawFd;
use std::time::Duration;

use crate::confine::{capabilities, sandbox};
use crate::events::{self, EventFd, EventOptions, EventSpec, OpenError, Scope};
use crate::logging::{print_error, LogMode};
use crate::profiler::target::{self, Target, TargetWatch};
use crate::profiler::{stop, Profiler, ProfilerError, ProfilerOptions};
use crate::user;

/// What the launcher is asked to do, and what it hands to the profiler
/// (resolved once from the configuration by [`crate::config`]).
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// The command to run and its arguments (wrapper mode).
    pub command: Vec<String>,
    /// `--enable false` runs the command unprofiled.
    pub enabled: bool,
    /// `--switch-user`: run the command as this user.
    pub switch_user: Option<String>,
    /// `--drop-capabilities`: remove CAP_SYS_ADMIN, CAP_PERFMON and CAP_BPF
    /// from the command.
    pub drop_capabilities: bool,
    /// `--init`: run the command as ddprof's child, ddprof staying as its
    /// init (see [`init`]).
    pub init: bool,
    /// `--nice`: the profiler's niceness.
    pub nice: Option<i32>,
    /// Where the logs go (the daemon keeps stderr or stdout open for them).
    pub log_mode: LogMode,
    /// The events to open, one per CPU per spec.
    pub events: Vec<EventSpec>,
    pub event_options: EventOptions,
    pub profiler: ProfilerOptions,
}

/// How long the launcher waits for the daemon to take the events before
/// running the command unprofiled.
pub const HANDOFF_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest the command waits for the profiler to set its engine up
/// (loading and attaching the BPF program takes ~30–150 ms here).
pub const READY_TIMEOUT: Duration = Duration::from_secs(1);

/// Exit status when the command cannot be found (as in a shell).
pub const EXIT_NOT_FOUND: u8 = 127;
/// Exit status when the command exists but cannot be run (as in a shell).
pub const EXIT_NOT_EXECUTABLE: u8 = 126;

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error(transparent)]
    User(#[from] user::UserError),
    #[error("--drop-capabilities: {0}")]
    DropCapabilities(capabilities::CapabilityError),
    #[error("cannot profile process {pid}: {source}")]
    Attach { pid: i32, source: OpenError },
    #[error("no process with PID {0} (check the PID; has it exited?)")]
    NoSuchProcess(i32),
    #[error("cannot profile process {pid}: {source}")]
    Threads { pid: i32, source: std::io::Error },
    #[error("cannot profile the whole machine: {0}")]
    Global(OpenError),
    #[error("cannot install the SIGINT/SIGTERM handlers: {0}")]
    StopSignals(#[source] std::io::Error),
    #[error(
        "the kernel refuses the profiler its seccomp filter ({0}); it does not run without it \
         (--no-sandbox: run it anyway)"
    )]
    Sandbox(#[source] std::io::Error),
    #[error(transparent)]
    Profiler(#[from] ProfilerError),
}

/// Why the command runs unprofiled (the one warning the launcher prints).
#[derive(Debug, thiserror::Error)]
enum NotProfiled {
    #[error(transparent)]
    Events(#[from] OpenError),
    #[error(transparent)]
    Spawn(#[from] daemon::SpawnError),
    #[error(transparent)]
    Handoff(#[from] handoff::HandoffError),
}

/// Runs `options.command`, profiled unless `--enable false` or `not_profiled`
/// gives a reason not to (a configuration problem, said in the one warning).
/// Returns only when the command could not be started, with ddprof's exit
/// status.
pub fn run_command(options: &LaunchOptions, not_profiled: Option<String>) -> u8 {
    let Some(program) = options.command.first() else {
        print_error(format_args!("no command given"));
        return 2;
    };
    let argv: Result<Vec<CString>, _> = options
        .command
        .iter()
        .map(|arg| CString::new(arg.as_bytes()))
        .collect();
    let Ok(argv) = argv else {
        print_error(format_args!(
            "cannot run `{program}`: an argument contains a NUL byte"
        ));
        return EXIT_NOT_EXECUTABLE;
    };
    // A warning written to a closed stderr must not kill the launcher (the
    // command would never run); the caller's disposition is back for the exec.
    let caller_sigpipe = signals::SavedDisposition::replace(libc::SIGPIPE, libc::SIG_IGN).ok();
    let switch_user = match options
        .switch_user
        .as_deref()
        .map(user::resolve)
        .transpose()
    {
        Ok(user) => user,
        // Running it as the caller instead would give it more privileges
        // than asked.
        Err(error) => {
            print_error(format_args!(
                "--switch-user: {error}: the command does not run (not as the caller either: \
                 it must not run with more privileges than asked)"
            ));
            return 1;
        }
    };
    if options.enabled && not_profiled.is_none() {
        // Before `--init` forks the command: it inherits the library's
        // descriptor and the variables.
        preload_allocation_sampler(&options.events, program);
    }
    if options.init {
        return init::run(
            options,
            not_profiled,
            &argv,
            switch_user.as_ref(),
            caller_sigpipe,
        );
    }
    if options.enabled {
        warn_if_pid_1();
        let profiled = match not_profiled {
            Some(reason) => Err(reason),
            None => profile(options, Profiled::Launcher).map_err(|cause| cause.to_string()),
        };
        if let Err(cause) = profiled {
            log::warn!("running the command without profiling: {cause}");
        }
    }
    become_command(options, switch_user.as_ref(), caller_sigpipe);
    exec_command(program, &argv)
}

/// With `sALLOC`, prepares the allocation sampler and names it in the
/// command's `LD_PRELOAD` (first, before what the caller preloads), with
/// its mean in [`events::allocation::MEAN_VARIABLE`]. Not prepared (an old
/// kernel, a ddprof built without it), the event is left out when it is
/// opened, with the reason, and the others are sampled.
fn preload_allocation_sampler(specs: &[EventSpec], program: &str) {
    let Some(mean) = specs.iter().find_map(|spec| match spec.weighing.value {
        events::EventValue::AllocationSize { mean } => Some(mean),
        _ => None,
    }) else {
        return;
    };
    if events::allocation::statically_linked(program) == Some(true) {
        // Said once, when the event is left out.
        events::allocation::decline(format!(
            "{program} is statically linked, and the allocation sampler is a library that the \
             dynamic loader preloads (it has none)"
        ));
        return;
    }
    let Ok(sampler) = events::allocation::prepare() else {
        return;
    };
    if let Some(why) = &sampler.not_on_disk {
        log::warn!(
            "sALLOC: the allocation sampler is preloaded from a descriptor, not from a file in \
             {} ({why}): programs started with their descriptors closed (Python's subprocess \
             closes them) print a loader error and are not sampled{}",
            events::allocation::LIBRARY_DIRS.join(" or "),
            if nix::unistd::geteuid().is_root() {
                ""
            } else {
                "; run ddprof as root"
            }
        );
    }
    let existing = std::env::var("LD_PRELOAD").ok();
    // The launcher runs no other thread that reads the environment.
    std::env::set_var("LD_PRELOAD", sampler.ld_preload(existing.as_deref()));
    std::env::set_var(events::allocation::MEAN_VARIABLE, mean.to_string());
    if specs
        .iter()
        .any(|spec| matches!(spec.kind, events::EventKind::Allocation { live: true, .. }))
    {
        std::env::set_var(events::allocation::LIVE_VARIABLE, "1");
    }
}

/// A command that will be PID 1 of its PID namespace (a container's entry
/// point) takes the profiler with it when it exits: the kernel ends every
/// process of the namespace. Said once, with what to do.
fn warn_if_pid_1() {
    if std::process::id() == 1 {
        log::warn!(
            "the command is PID 1 of its PID namespace: when it exits, the kernel ends every \
             process of the namespace, the profiler too, before it writes its last period (up \
             to --upload-period of samples) and its summary; to keep them, run `ddprof --init \
             -- COMMAND` (ddprof stays PID 1 as a minimal init and waits for the profiler)"
        );
    }
}

/// `--drop-capabilities`, `--switch-user` and the caller's SIGPIPE
/// disposition, just before the exec; exits 1 when the command must not run.
fn become_command(
    options: &LaunchOptions,
    switch_user: Option<&user::TargetUser>,
    caller_sigpipe: Option<signals::SavedDisposition>,
) {
    if options.drop_capabilities {
        if let Err(error) = capabilities::drop_from_command() {
            print_error(format_args!("{}", LaunchError::DropCapabilities(error)));
            std::process::exit(1);
        }
    }
    if let Some(user) = switch_user {
        if let Err(error) = user::switch_to(user) {
            print_error(format_args!("{error}"));
            std::process::exit(1);
        }
    }
    // main.rs does not let the Rust runtime ignore SIGPIPE, so this is the
    // caller's own disposition.
    if let Some(saved) = caller_sigpipe {
        saved.restore();
    }
}

/// Execs the command (PATH lookup like `execvp`); returns only when it
/// cannot, with the shell's exit status for that.
fn exec_command(program: &str, argv: &[CString]) -> u8 {
    let error = nix::unistd::execvp(&argv[0], argv).unwrap_err();
    match error {
        nix::errno::Errno::ENOENT if !program.contains('/') => {
            print_error(format_args!("{program}: command not found"));
            EXIT_NOT_FOUND
        }
        nix::errno::Errno::ENOENT => {
            print_error(format_args!("{program}: {}", error.desc()));
            EXIT_NOT_FOUND
        }
        other => {
            print_error(format_args!("{program}: cannot run it: {}", other.desc()));
            EXIT_NOT_EXECUTABLE
        }
    }
}

/// Which process runs the command (and is profiled from its exec).
#[derive(Debug, Clone, Copy)]
enum Profiled {
    /// The launcher itself, which execs the command.
    Launcher,
    /// A child of the launcher (`--init`), stopped before its exec.
    Child(i32),
}

/// Steps 1–3 of the launch: on success the daemon holds every event; its
/// PID, when known.
fn profile(options: &LaunchOptions, profiled: Profiled) -> Result<Option<i32>, NotProfiled> {
    let (launcher_socket, daemon_socket) = handoff::channel()?;
    let (target_pid, scope) = match profiled {
        Profiled::Launcher => (std::process::id() as i32, Scope::SelfOnExec),
        Profiled::Child(pid) => (pid, Scope::ChildOnExec(pid)),
    };
    // Opened before the fork so that the daemon's watch refers to this very
    // process even if the PID were reused; close-on-exec, so the command
    // never sees it.
    let target_pidfd = target::pidfd_open(target_pid).ok().flatten();
    let daemon = daemon::spawn(daemon::DaemonSetup {
        options,
        target_pid,
        target_pidfd,
        socket: daemon_socket,
        launcher_socket: launcher_socket.as_raw_fd(),
    })?;
    // Dropping `launcher_socket` on failure tells the daemon to exit.
    let events = events::open_all(&options.events, scope, &options.event_options)?;
    handoff::send_events(&launcher_socket, &events, HANDOFF_TIMEOUT)?;
    handoff::wait_for_ack(&launcher_socket, HANDOFF_TIMEOUT)?;
    events::warn_if_kernel_time_refused();
    // Past the deadline, or if the engine could not be set up, the command
    // starts anyway: it is profiled all the same, its early threads by the
    // perf engine.
    if let Err(error) = handoff::wait_for_ready(&launcher_socket, READY_TIMEOUT) {
        log::debug!("launcher: not waiting for the profiler's engine: {error}");
    }
    // The launcher's copies close at the exec anyway; the daemon's keep the
    // events alive.
    drop(events);
    // What the launcher and the intermediate process it reaped spent is the
    // profiler's too (the command's CPU counts from its exec): all of this
    // process's time so far, ddprof's start before `main` (~2-3 ms of
    // loading) included, and whatever the process did before it exec'd
    // ddprof (nothing, for a shell's fork or a container's entry point).
    handoff::send_launcher_cpu(&launcher_socket, crate::overhead::own_cpu_time());
    Ok(daemon)
}

/// `-p PID` or `--global`: opens the events and runs the profiler in the
/// foreground until the process exits or SIGINT/SIGTERM.
pub fn attach(options: &LaunchOptions, target: Target) -> Result<(), LaunchError> {
    // Log lines written to a closed pipe must not kill the profiler.
    let _ = signals::SavedDisposition::replace(libc::SIGPIPE, libc::SIG_IGN);
    let specs = &options.events;
    let event_options = &options.event_options;
    raise_descriptor_limit();
    let (events, watched) = match target {
        Target::Pid(pid) => (
            open_process_events(specs, pid as i32, event_options)?,
            Some(pid),
        ),
        Target::Global => (
            events::open_all(specs, Scope::Global, event_options).map_err(LaunchError::Global)?,
            None,
        ),
        // A launched command is attached to by the launcher, not here; should
        // a caller ask, it is a running process like any other.
        Target::Launched { pid } => (
            open_process_events(specs, pid as i32, event_options)?,
            Some(pid),
        ),
    };
    // Stop requests must not kill the process before the last period is
    // flushed: the loop checks `stop::requested()`.
    let stop_signals = stop::install().map_err(LaunchError::StopSignals)?;
    settle_profiler(options)?;
    log::info!(
        "profiler started: pid={} target={:?} events={} {}",
        std::process::id(),
        target,
        events.len(),
        describe_capabilities()
    );
    let watch = watched.and_then(|pid| TargetWatch::new(pid as i32).ok());
    let result = run_profiler(&options.profiler, target, events, watch, None, || {
        Duration::ZERO
    });
    drop(stop_signals);
    Ok(result?)
}

/// Starts the profiler's engine, drops the capabilities only that set-up
/// needed, and runs the profiler to its end (both modes: the daemon and
/// `-p`/`--global` in the foreground).
/// `started` is called once the engine is set up (or has failed to be), and
/// says what the profiler spent before this process (the launcher's CPU).
/// `executable` is the file a launched command will run: its stored unwind
/// table is read while the engine is set up and put in the BPF engine's
/// maps once the command was told to start, before the worker is, so that
/// a big static program's first samples find it (the worker took 60-70 ms
/// more to read and load the 2.4 M rows of the corpus's 246 MB binary).
fn run_profiler(
    options: &ProfilerOptions,
    target: Target,
    events: Vec<EventFd>,
    watch: Option<TargetWatch>,
    executable: Option<std::path::PathBuf>,
    started: impl FnOnce() -> Duration,
) -> Result<(), ProfilerError> {
    memory::one_malloc_arena();
    let starting = std::time::Instant::now();
    // (The perf engine reads its tables in the worker, where a sample
    // needs them.)
    let read_ahead = executable
        .filter(|_| options.sampler.engine != crate::bpf::EngineChoice::Perf)
        .zip(options.sampler.table_store.clone())
        .and_then(|(path, store)| crate::unwind::cache::StoredTableRead::start(&path, store));
    let profiler = Profiler::start(options, target, events);
    let spent_before = started();
    let mut profiler = profiler?.spent_before(spent_before);
    if let Some(read) = read_ahead {
        profiler.preload_table(read);
    }
    memory::release_free_memory();
    // `cargo xtask bench` reads the CPU of the start-up at this line.
    log::info!(
        "start-up: done in {:.0} ms; profiler CPU so far {:.0} ms",
        starting.elapsed().as_secs_f64() * 1e3,
        crate::overhead::own_cpu_time().as_secs_f64() * 1e3
    );
    // (-p and --global opened the events in this process.)
    events::warn_if_kernel_time_refused();
    // The BPF engine's worker creates a map for each unwind table it loads.
    let bpf_maps = profiler.engine_name() == "bpf";
    if let Err(error) = capabilities::drop_after_setup(bpf_maps) {
        log::warn!("profiler: {error}");
    }
    profiler.run(watch)
}

/// Opens the events for every thread of `pid` (with `inherit`, each event
/// follows its thread and the threads and processes it creates later): the
/// main thread's first, so that every thread it starts from then on
/// inherits them, then those of the threads listed once after that.
///
/// Listed once, as the C++ ddprof and `perf record -p` do: a thread that
/// appears in a second listing may have inherited its creator's events
/// already, and a second event would count it twice; and a process that
/// starts threads all the time never lets the listing settle (1,000s of
/// threads started at once kept the listing going for 6 s of CPU, until
/// the process ended unprofiled). What one listing misses: threads that
/// threads other than the main one start while the events are being
/// opened (milliseconds).
fn open_process_events(
    specs: &[EventSpec],
    pid: i32,
    options: &EventOptions,
) -> Result<Vec<EventFd>, LaunchError> {
    let mut events = match events::open_all(specs, Scope::Process(pid), options) {
        Ok(opened) => opened,
        Err(OpenError::NoSuchProcess { .. }) => return Err(LaunchError::NoSuchProcess(pid)),
        Err(source) => return Err(LaunchError::Attach { pid, source }),
    };
    let mut threads: Vec<i32> = target::threads(pid)
        .map_err(|source| match source.kind() {
            std::io::ErrorKind::NotFound => LaunchError::NoSuchProcess(pid),
            _ => LaunchError::Threads { pid, source },
        })?
        .into_iter()
        .filter(|&tid| tid != pid)
        .collect();
    // The events that opened on the main thread, on every other thread.
    let opened: Vec<EventSpec> = specs
        .iter()
        .filter(|spec| {
            events
                .iter()
                .any(|event| event.spec.index() == spec.index())
        })
        .cloned()
        .collect();
    let budget = thread_budget(events.len());
    if threads.len() > budget {
        target::busiest_and_oldest_first(pid, &mut threads);
    }
    let mut not_profiled: Vec<(i32, OpenError)> = Vec::new();
    for &tid in threads.iter().take(budget) {
        match events::open_all(&opened, Scope::Process(tid), options) {
            Ok(more) => events.extend(more),
            // A thread that ended in the meantime needs no events.
            Err(OpenError::NoSuchProcess { .. }) => {}
            Err(error) => not_profiled.push((tid, error)),
        }
    }
    let total = threads.len() + 1;
    if threads.len() > budget {
        log::warn!(
            "{} of the {total} threads of process {pid} are not profiled: each takes an event \
             per CPU and event, and theirs would pass the descriptor limit (ulimit -n, {}); the \
             threads that used the most CPU, then the oldest, are profiled; raise it to \
             profile them all",
            threads.len() - budget,
            descriptor_limit()
        );
    }
    if let Some((tid, error)) = not_profiled.first() {
        log::warn!(
            "{} of the {total} threads of process {pid} are not profiled: thread {tid}: {error}",
            not_profiled.len()
        );
    }
    Ok(events)
}

/// Descriptors kept free for the rest of the profiler: files, BPF maps and
/// programs, sockets, the per-CPU events of the BPF engine.
const RESERVED_DESCRIPTORS: u64 = 256;

/// How many more threads' events fit in the descriptor limit, each taking
/// `per_thread` descriptors, and as many again for the sampler's duplicate
/// of each (`Sampler::start`). Without a bound, a target with more threads
/// than that made the attach fail (too many open files), or the sampler's
/// duplicates after it.
fn thread_budget(per_thread: usize) -> usize {
    let in_use = std::fs::read_dir("/proc/self/fd").map_or(0, |entries| entries.count()) as u64;
    // The events opened so far are in use, and are duplicated too.
    let free = descriptor_limit()
        .saturating_sub(in_use.saturating_mul(2))
        .saturating_sub(RESERVED_DESCRIPTORS);
    let per_thread = (per_thread as u64).max(1) * 2;
    usize::try_from(free / per_thread).unwrap_or(usize::MAX)
}

/// This process's soft limit on open descriptors.
fn descriptor_limit() -> u64 {
    nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft)
}

/// Descriptors: one per CPU per event per thread add up; the profiler may
/// use up to the hard limit (the launcher never raises it for the command).
fn raise_descriptor_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    if let Ok((soft, hard)) = getrlimit(Resource::RLIMIT_NOFILE) {
        if soft < hard {
            let _ = setrlimit(Resource::RLIMIT_NOFILE, hard, hard);
        }
    }
}

/// The profiler's own settings once its events are in place: `--nice`, one
/// CPU, only the capabilities it uses, and no way to signal or trace other
/// processes ([`sandbox`]); an error when that filter cannot be installed
/// (unless `--no-sandbox`).
fn settle_profiler(options: &LaunchOptions) -> Result<(), LaunchError> {
    if let Some(nice) = options.nice {
        // SAFETY: setpriority on this process only.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, nice) } != 0 {
            log::warn!(
                "profiler: cannot set niceness {nice} ({}); a negative one needs CAP_SYS_NICE",
                std::io::Error::last_os_error()
            );
        }
    }
    pin_to_one_cpu();
    // Wall time's waits are named by a kernel frame.
    let kernel_symbols =
        options.profiler.sampler.kernel_stacks || options.profiler.sampler.wall.is_some();
    if let Err(error) = capabilities::drop_for_profiler(kernel_symbols) {
        log::warn!("profiler: {error}");
    }
    if let Err(error) = sandbox::forbid_touching_other_processes() {
        if options.profiler.require_sandbox {
            return Err(LaunchError::Sandbox(error));
        }
        log::warn!(
            "profiler: running without its seccomp filter ({error}), as --no-sandbox allows"
        );
    }
    Ok(())
}

/// Pins the profiler to the last CPU it may run on: it competes with the
/// profiled work on one CPU only.
fn pin_to_one_cpu() {
    use nix::sched::{sched_getaffinity, sched_setaffinity, CpuSet};
    let this = nix::unistd::Pid::from_raw(0);
    let Ok(allowed) = sched_getaffinity(this) else {
        return;
    };
    let Some(cpu) = (0..CpuSet::count())
        .rev()
        .find(|&cpu| allowed.is_set(cpu).unwrap_or(false))
    else {
        return;
    };
    let mut one = CpuSet::new();
    if one.set(cpu).is_ok() {
        if let Err(error) = sched_setaffinity(this, &one) {
            log::debug!("profiler: cannot pin itself to CPU {cpu}: {error}");
        }
    }
}

/// This process's capability sets and seccomp mode (2 = filtered), for the
/// start-up log line.
pub fn describe_capabilities() -> String {
    let caps = capabilities::current().unwrap_or_default();
    let seccomp = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|line| line.strip_prefix("Seccomp:").map(|v| v.trim().to_string()))
        })
        .unwrap_or_else(|| "unknown".to_string());
    format!(
        "capabilities: effective={:#x} permitted={:#x} bounding={:#x} seccomp={seccomp}",
        caps.effective.0,
        caps.permitted.0,
        capabilities::bounding().0
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_events_for_every_thread_of_a_process() {
        // This test process has several threads (the test runner's).
        let (ready_sender, ready) = std::sync::mpsc::channel();
        let (stop, stopped) = std::sync::mpsc::channel::<()>();
        let helper = std::thread::spawn(move || {
            ready_sender.send(()).unwrap();
            stopped.recv().ok();
        });
        ready.recv().unwrap();
        let pid = std::process::id() as i32;
        let threads = target::threads(pid).unwrap();
        assert!(threads.len() >= 2, "{threads:?}");
        let specs = events::parse_events("sCPU").unwrap();
        let options = EventOptions {
            stack_sample_size: 8192,
            include_kernel: false,
            kernel_stacks: false,
        };
        let events = open_process_events(&specs, pid, &options).unwrap();
        let cpus = events::online_cpus().len();
        // At least the threads alive before and after (the other tests'
        // threads of this process come and go meanwhile).
        let after = target::threads(pid).unwrap();
        let alive_throughout = threads.iter().filter(|tid| after.contains(tid)).count();
        assert!(alive_throughout >= 2, "{threads:?} then {after:?}");
        assert!(
            events.len() >= alive_throughout * cpus,
            "{} events for {alive_throughout} threads alive throughout",
            events.len()
        );
        assert_eq!(events.len() % cpus, 0);
        stop.send(()).unwrap();
        helper.join().unwrap();

        assert!(matches!(
            open_process_events(&specs, i32::MAX, &options),
            Err(LaunchError::NoSuchProcess(_))
        ));
    }
}

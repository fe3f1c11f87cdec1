//! The second step of the configuration: from what was typed ([`Cli`]) to
//! what it means for each stage, resolved once. No stage sees [`Cli`].
use crate::aggregate::AggregatorOptions;
use crate::events::{
    parse_events, unavailable_events, EventOptions, EventSpec, EventSpecError, SampleRate,
};
use crate::launch::LaunchOptions;
use crate::perf::{default_ring_buffer_bytes, PerfEngineOptions, MAX_USER_FRAMES};
use crate::profile::ProfiledEvent;
use crate::profiler::{ProfilerOptions, WorkerOptions};
use crate::sampler::SamplerOptions;
use crate::statsd::StatsdAddress;
use crate::symbolize::SymbolizerOptions;
use crate::unwind::TableStore;

use super::export::{export_options, ExportConfigError};
use super::Cli;

/// A setting that passed its own check but cannot be used as a whole.
#[derive(Debug, thiserror::Error)]
pub enum ResolveError {
    #[error("--event: {0}")]
    Events(#[from] EventSpecError),
    #[error("--internal-stats: {0}")]
    InternalStats(String),
}

/// Everything the configuration resolves to.
#[derive(Debug)]
pub struct Resolved {
    /// What every stage is asked to do (the export settings in
    /// `options.profiler.export`).
    pub options: LaunchOptions,
    /// Export settings that cannot be used (a bad API key, site, …): like
    /// a bad variable, a one-line problem — the command still runs,
    /// unprofiled; `-p`/`--global` stop with it.
    pub export_problem: Option<ExportConfigError>,
    /// Events asked for that this ddprof does not sample yet (`sALLOC
    /// (allocations)`), left out: a warning.
    pub unavailable_events: Vec<String>,
    /// None of the events asked for is sampled here: like a bad variable,
    /// the command runs unprofiled.
    pub events_problem: Option<EventSpecError>,
    /// Events left out in this mode, each with why: a warning line each.
    pub left_out: Vec<String>,
}

/// `-p` and `--global` attach to processes already running: `sALLOC`,
/// sampled by a library loaded into the command ddprof starts, is left out
/// (CPU time alone when nothing else is left), with a line that says so.
fn leave_out_what_attaching_cannot_sample(
    events: Vec<EventSpec>,
    attached: bool,
) -> Result<(Vec<EventSpec>, Vec<String>), ResolveError> {
    if !attached {
        return Ok((events, Vec::new()));
    }
    let (allocations, mut kept): (Vec<EventSpec>, Vec<EventSpec>) =
        events.into_iter().partition(EventSpec::is_allocation);
    let left_out = allocations
        .iter()
        .map(|spec| {
            format!(
                "{} is not sampled: allocations are sampled by a library that ddprof preloads \
                 into the command it starts (`ddprof -- COMMAND`), and -p and --global attach \
                 to processes already running; {}",
                spec.label,
                if kept.is_empty() {
                    "CPU time is sampled instead"
                } else {
                    "the other events are sampled"
                }
            )
        })
        .collect();
    if kept.is_empty() {
        kept = parse_events(DEFAULT_EVENTS)?;
    }
    // Each event's index is its place in the list.
    for (index, spec) in kept.iter_mut().enumerate() {
        spec.weighing.event = index as u16;
    }
    Ok((kept, left_out))
}

/// The allocation probe watches every CPU and writes no process records
/// (mappings, names, forks), and wall time (`sWALL`) opens no perf event:
/// with only those, CPU time is sampled too, its per-task events writing
/// the records, and a line says so. Wall time is CPU time plus the time off
/// a CPU, so `sWALL` always comes with CPU time.
fn with_process_records(mut events: Vec<EventSpec>, said: &mut Vec<String>) -> Vec<EventSpec> {
    let wall = events.iter().any(EventSpec::is_wall_time);
    if events.is_empty() || events.iter().any(EventSpec::is_cpu_time) {
        return events;
    }
    if wall {
        said.push(
            "sWALL without sCPU: CPU time (sCPU) is sampled too, for the wall time that \
             threads spend on a CPU"
                .into(),
        );
    } else if events.iter().all(EventSpec::is_allocation) {
        said.push(
            "sALLOC alone: CPU time (sCPU) is sampled too, for the process records that \
             allocation stacks are unwound with"
                .into(),
        );
    } else {
        return events;
    }
    let mut cpu = EventSpec::cpu_time(SampleRate::Frequency(crate::events::DEFAULT_CPU_FREQUENCY));
    cpu.weighing.event = events.len() as u16;
    events.push(cpu);
    events
}

/// What the BPF engine needs to sample `sWALL`, if asked for.
fn wall_sampling(events: &[EventSpec]) -> Option<crate::wall::WallSampling> {
    events.iter().find_map(|spec| match spec.kind {
        crate::events::EventKind::WallTime {
            max_probability,
            threshold_ns,
        } => Some(crate::wall::WallSampling {
            event: spec.index(),
            max_probability,
            threshold_ns,
        }),
        _ => None,
    })
}

/// The events when neither `--event` nor `--preset` is given.
pub const DEFAULT_EVENTS: &str = "sCPU";

/// What every stage is asked to do, from this process's environment for
/// the export settings (each call draws a new `runtime-id`: call it once).
pub fn resolve(cli: &Cli) -> Result<Resolved, ResolveError> {
    resolve_with(cli, &|name| std::env::var(name).ok())
}

/// [`resolve`], with `environment` reading the variables.
pub fn resolve_with(
    cli: &Cli,
    environment: &dyn Fn(&str) -> Option<String>,
) -> Result<Resolved, ResolveError> {
    let events_text = match (&cli.events, cli.preset) {
        (Some(text), _) => text.as_str(),
        (None, Some(preset)) => preset.events(cli.pid.is_some() || cli.global),
        (None, None) => DEFAULT_EVENTS,
    };
    let unavailable_events = unavailable_events(events_text);
    let (events, events_problem) = match parse_events(events_text) {
        Ok(events) => (events, None),
        Err(problem @ EventSpecError::NoneAvailable(_)) => {
            (parse_events(DEFAULT_EVENTS)?, Some(problem))
        }
        Err(error) => return Err(error.into()),
    };
    let (events, mut left_out) =
        leave_out_what_attaching_cannot_sample(events, cli.pid.is_some() || cli.global)?;
    let events = with_process_records(events, &mut left_out);
    let internal_stats = cli
        .internal_stats
        .as_deref()
        .map(str::parse::<StatsdAddress>)
        .transpose()
        .map_err(ResolveError::InternalStats)?;
    let kernel_stacks = kernel_stacks(cli);
    // Time in the kernel is sampled where permitted (as `perf record`
    // does), each such sample attributed to the user stack that made the
    // system call.
    let event_options = EventOptions {
        stack_sample_size: cli.stack_sample_size,
        include_kernel: true,
        kernel_stacks,
    };
    // --ring-buffer-kib sizes whichever buffer receives the samples.
    let ring_buffer_bytes = cli.ring_buffer_kib.map(|kib| kib as usize * 1024);
    let (export, export_problem) = match export_options(cli, environment) {
        Ok(export) => (export, None),
        Err(problem) => (None, Some(problem)),
    };
    let profiler = ProfilerOptions {
        sampler: SamplerOptions {
            engine: cli.engine,
            perf: PerfEngineOptions {
                ring_buffer_bytes: ring_buffer_bytes.unwrap_or_else(|| {
                    default_ring_buffer_bytes(
                        cli.stack_sample_size,
                        samples_per_task_second(&events),
                    )
                }),
                allocation_ring_buffer_bytes: match ring_buffer_bytes {
                    Some(_) => None,
                    None => allocation_buffers(&events, cli.stack_sample_size),
                },
                max_frames: MAX_USER_FRAMES,
            },
            bpf_ring_buffer_bytes: ring_buffer_bytes.unwrap_or_else(|| {
                crate::bpf::ring_buffer_bytes_for_rate(
                    samples_per_second(&events)
                        + wall_stacks_per_second(&events)
                        + allocation_samples_per_second(&events),
                )
            }),
            wall: wall_sampling(&events),
            bpf_table_bytes: cli.bpf_table_mib as usize * (1 << 20),
            bpf_wake_on_handoff: crate::bpf::wakes_on_handoff_at(samples_per_task_second(&events)),
            kernel_stacks,
            // `--global` samples every CPU already.
            sample_every_cpu: (!cli.global).then_some(event_options),
            // Beside the debug copies: one directory of ddprof's caches.
            table_store: cli
                .debug_cache_dir()
                .map(|dir| TableStore::new(dir.join("unwind"))),
            bpf_variant: None,
        },
        aggregator: AggregatorOptions::new(cli.timeline),
        symbolizer: SymbolizerOptions {
            inlined_functions: cli.inlined_functions,
            debug_cache: cli.debug_cache_dir(),
            symbol_store: cli.debug_cache_dir().map(|dir| dir.join("symbols")),
            symbol_index: cli.debug_cache_dir().map(|dir| dir.join("symbol-index")),
            ..SymbolizerOptions::default()
        },
        upload_period: cli.upload_period(),
        sampling_period_nanos: sampling_period_nanos(&events),
        events: events.iter().flat_map(ProfiledEvent::of).collect(),
        service: cli.service_name(),
        output_dir: cli.output_dir(),
        export,
        internal_stats,
        show_samples: cli.show_samples,
        require_sandbox: !cli.no_sandbox,
        worker: WorkerOptions {
            restart_every_periods: cli.worker_period,
            max_rss_kib: u64::from(cli.worker_max_rss_mib) * 1024,
        },
    };
    let options = LaunchOptions {
        command: cli.command.clone(),
        enabled: cli.enabled,
        switch_user: cli.switch_user.clone(),
        drop_capabilities: cli.drop_capabilities,
        init: cli.init,
        nice: cli.nice,
        log_mode: cli.log_mode.clone(),
        events,
        event_options,
        profiler,
    };
    Ok(Resolved {
        options,
        export_problem,
        unavailable_events,
        left_out,
        events_problem,
    })
}

/// `--include-kernel`, by default on for the whole machine only: kernel
/// frames are what a whole-machine profile is about; a command's profile is
/// about its own code.
pub(super) fn kernel_stacks(cli: &Cli) -> bool {
    cli.include_kernel.unwrap_or(cli.global)
}

/// Samples a second of a busy task's CPU time: the events' rates summed
/// (the default event's when none is given), but `sALLOC`'s, whose probes
/// have perf buffers of their own ([`allocation_buffers`]) and whose
/// share of the BPF ring buffer is counted apart
/// ([`allocation_samples_per_second`]).
fn samples_per_task_second(events: &[EventSpec]) -> u64 {
    let rates = events.iter().filter(|spec| !spec.is_allocation());
    match rates.map(EventSpec::per_second).sum() {
        0 => crate::events::DEFAULT_CPU_FREQUENCY,
        sum => sum,
    }
}

/// The buffers of the allocation probes, by their own rate: the
/// allocations' with their stack copies, the frees' with 8 bytes.
fn allocation_buffers(
    events: &[EventSpec],
    stack_sample_size: u32,
) -> Option<crate::perf::AllocationBuffers> {
    let spec = events.iter().find(|spec| spec.is_allocation())?;
    let stack = spec.stack_sample_size.unwrap_or(stack_sample_size);
    Some(crate::perf::AllocationBuffers {
        allocations: default_ring_buffer_bytes(stack, spec.per_second()),
        frees: default_ring_buffer_bytes(8, spec.per_second()),
    })
}

/// Samples a second the events can produce at most: each event's rate on
/// every online CPU (CPU-time events sample only running tasks, so at most
/// one at a time per CPU).
fn samples_per_second(events: &[EventSpec]) -> u64 {
    let cpus = crate::events::online_cpus().len().max(1) as u64;
    samples_per_task_second(events).saturating_mul(cpus)
}

/// The allocation samples the BPF engine's uprobe program may write a
/// second ([`EventSpec::per_second`]'s program allocating 1 GB a second,
/// on every online CPU): they share the ring buffer with the CPU samples.
fn allocation_samples_per_second(events: &[EventSpec]) -> u64 {
    let cpus = crate::events::online_cpus().len().max(1) as u64;
    events
        .iter()
        .filter(|spec| spec.is_allocation())
        .map(|spec| spec.per_second().saturating_mul(cpus))
        .sum()
}

/// The wall-time stacks the BPF program may write a second on every online
/// CPU (with `sWALL`), each with its end-of-wait record.
fn wall_stacks_per_second(events: &[EventSpec]) -> u64 {
    if !events.iter().any(EventSpec::is_wall_time) {
        return 0;
    }
    let cpus = crate::events::online_cpus().len().max(1) as u64;
    2 * crate::wall::WALKS_PER_CPU_SECOND * cpus
}

/// pprof's `period`: the CPU time a sample stands for at the CPU-time
/// event's rate.
fn sampling_period_nanos(events: &[EventSpec]) -> u64 {
    match events
        .iter()
        .find(|spec| spec.is_cpu_time())
        .map(|spec| spec.rate)
    {
        Some(SampleRate::Frequency(hz)) => 1_000_000_000 / hz.max(1),
        Some(SampleRate::Period(period)) => period,
        None => 1_000_000_000 / crate::events::DEFAULT_CPU_FREQUENCY,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn resolved(args: &[&str]) -> LaunchOptions {
        let cli = Cli::parse_from(args);
        resolve_with(&cli, &|_| None).unwrap().options
    }

    #[test]
    fn the_sampling_period_follows_the_first_event() {
        let options = resolved(&["ddprof", "-e", "sCPU freq=1000", "--", "x"]);
        assert_eq!(options.profiler.sampling_period_nanos, 1_000_000);
        let options = resolved(&["ddprof", "-e", "sCPU period=123456", "--", "x"]);
        assert_eq!(options.profiler.sampling_period_nanos, 123_456);
        let options = resolved(&["ddprof", "--", "x"]);
        assert_eq!(options.profiler.sampling_period_nanos, 1_000_000_000 / 99);
    }

    #[test]
    fn kernel_stacks_are_on_for_the_whole_machine_unless_turned_off() {
        let kernel_stacks = |args: &[&str]| {
            let options = resolved(args);
            assert_eq!(
                options.event_options.kernel_stacks,
                options.profiler.sampler.kernel_stacks
            );
            options.profiler.sampler.kernel_stacks
        };
        assert!(!kernel_stacks(&["ddprof", "--", "x"]));
        assert!(kernel_stacks(&["ddprof", "--include-kernel", "--", "x"]));
        assert!(kernel_stacks(&["ddprof", "--global"]));
        assert!(!kernel_stacks(&[
            "ddprof",
            "--global",
            "--include-kernel",
            "false"
        ]));
        assert!(!kernel_stacks(&["ddprof", "-p", "1"]));
    }

    #[test]
    fn ring_buffer_kib_sizes_both_engines_buffers() {
        let options = resolved(&["ddprof", "--ring-buffer-kib", "64", "--", "x"]);
        assert_eq!(options.profiler.sampler.perf.ring_buffer_bytes, 64 * 1024);
        assert_eq!(options.profiler.sampler.bpf_ring_buffer_bytes, 64 * 1024);
        // Without it, the BPF ring buffer follows the sampling rate.
        let default_rate = resolved(&["ddprof", "--", "x"]);
        let high_rate = resolved(&["ddprof", "-e", "sCPU freq=999", "--", "x"]);
        let (low, high) = (
            default_rate.profiler.sampler.bpf_ring_buffer_bytes,
            high_rate.profiler.sampler.bpf_ring_buffer_bytes,
        );
        assert!(low >= 256 << 10 && low <= high, "{low} {high}");
        assert!(high <= crate::bpf::DEFAULT_RING_BUFFER_BYTES, "{high}");
        assert_eq!(
            high,
            crate::bpf::ring_buffer_bytes_for_rate(999 * crate::events::online_cpus().len() as u64)
        );
    }

    /// The allocation probes' buffers follow their own rate: CPU time's
    /// buffers, the BPF ring and the hand-off wake-up stay as they are
    /// without `sALLOC` (with it, they were all sized for ~2,000 samples a
    /// second of 32 KB: 4 MiB each), and the frees' carry no stack.
    #[test]
    fn allocation_probes_have_buffers_of_their_own() {
        let cpu = resolved(&["ddprof", "-e", "sCPU", "--", "x"])
            .profiler
            .sampler;
        let both = resolved(&["ddprof", "-e", "sCPU;sALLOC mode=sl", "--", "x"])
            .profiler
            .sampler;
        assert_eq!(both.perf.ring_buffer_bytes, cpu.perf.ring_buffer_bytes);
        // The BPF engine's allocation program writes its samples into the
        // ring buffer the CPU samples use: it grows for them (to its cap).
        assert!(
            both.bpf_ring_buffer_bytes > cpu.bpf_ring_buffer_bytes
                && both.bpf_ring_buffer_bytes <= crate::bpf::DEFAULT_RING_BUFFER_BYTES,
            "{} against {}",
            both.bpf_ring_buffer_bytes,
            cpu.bpf_ring_buffer_bytes
        );
        assert_eq!(both.bpf_wake_on_handoff, cpu.bpf_wake_on_handoff);
        assert_eq!(cpu.perf.allocation_ring_buffer_bytes, None);
        let buffers = both.perf.allocation_ring_buffer_bytes.unwrap();
        // 1 GB a second at the 512 KiB mean: 1,907 samples of 32 KB.
        assert_eq!(buffers.allocations, 4 << 20);
        assert_eq!(buffers.frees, 256 << 10);
        let sized = resolved(&[
            "ddprof",
            "-e",
            "sALLOC",
            "--ring-buffer-kib",
            "64",
            "--",
            "x",
        ]);
        assert_eq!(
            sized.profiler.sampler.perf.allocation_ring_buffer_bytes,
            None
        );
    }

    #[test]
    fn hand_off_notices_wake_the_bpf_reader_from_the_rate_on() {
        let sampler = |args: &[&str]| resolved(args).profiler.sampler.bpf_wake_on_handoff;
        assert!(!sampler(&["ddprof", "--", "x"]));
        assert!(!sampler(&["ddprof", "-e", "sCPU freq=99", "--", "x"]));
        assert!(sampler(&["ddprof", "-e", "sCPU freq=999", "--", "x"]));
        // A period of 1 ms is 1000 samples a second.
        assert!(sampler(&["ddprof", "-e", "sCPU period=1000000", "--", "x"]));
    }

    #[test]
    fn worker_options_default_to_240_periods_and_256_mib() {
        let options = resolved(&["ddprof", "--", "x"]);
        assert_eq!(options.profiler.worker, WorkerOptions::default());
        assert_eq!(options.profiler.worker.restart_every_periods, 240);
        assert_eq!(options.profiler.worker.max_rss_kib, 256 * 1024);
        let options = resolved(&[
            "ddprof",
            "--worker-period",
            "3",
            "--worker-max-rss",
            "16",
            "--",
            "x",
        ]);
        assert_eq!(
            options.profiler.worker,
            WorkerOptions {
                restart_every_periods: 3,
                max_rss_kib: 16 * 1024
            }
        );
        for bad in [
            ["--worker-period", "0"],
            ["--worker-max-rss", "3"],
            ["--worker-period", "x"],
        ] {
            let args = ["ddprof", bad[0], bad[1], "--", "x"];
            assert!(Cli::try_parse_from(args).is_err(), "{bad:?}");
        }
    }
}

//! ddprof: a native CPU profiler for Linux.
//!
//! The modules follow the data flow:
//! launch → sample (bpf | perf) → unwind → (live heap, wall time) → aggregate → symbolize → profile → export.
//!
//! - [`check`]: `ddprof --check`, what this machine allows and which engine would sample.
//! - [`config`]: command line, environment and config file, resolved into each stage's options.
//! - [`confine`]: what the profiler's processes may do: capabilities, seccomp filters.
//! - [`launch`]: the wrapper (fd hand-off, detached profiler), `-p` and `--global`.
//! - [`logging`]: the `log` logger (`--log-level`, `--log-mode`).
//! - [`events`]: perf_event_open and the perf event attributes both engines use.
//! - [`perf`]: the perf ring-buffer engine (user-side DWARF unwinding).
//! - [`bpf`]: the eBPF engine (in-kernel unwinding).
//! - [`merge`]: the one merge of the sample sources by time, the process records applied first.
//! - [`sampler`]: one sampler in front of both engines (the BPF samples merged with the perf records).
//! - [`unwind`]: unwind tables compiled from `.eh_frame`/`.debug_frame` and the user-side unwinder.
//! - [`files`]: file identity (mapping key, content key, build id) and opening mapped files through `/proc`.
//! - [`process`]: processes, threads and mappings as the kernel reports them.
//! - [`sample`]: the sample stream between engines and aggregation.
//! - [`live_heap`]: the allocations still held (`sALLOC mode=l`), added to each period.
//! - [`wall`]: wall time (`sWALL`): switch-out stacks held until their thread runs again, weighed by the time off a CPU.
//! - [`aggregate`]: folds samples per period into counted stacks.
//! - [`symbolize`]: addresses to functions, files and lines (blazesym).
//! - [`profile`]: pprof encoding.
//! - [`export`]: uploads to the Datadog agent or intake (bounded queue, retries).
//! - [`output`]: local pprof files, flame graph and folded stacks.
//! - [`overhead`]: what profiling costs (own CPU and memory, samples lost), per period and for the run.
//! - [`profiler`]: the profiler's main loop that wires the stages together; what is profiled and stop requests.
//! - [`user`]: users and groups (`--switch-user`).
pub mod aggregate;
pub mod bpf;
pub mod carried;
pub mod check;
pub mod config;
pub mod confine;
pub mod container;
pub mod events;
pub mod export;
pub mod files;
pub mod identity;
pub mod launch;
pub mod live_heap;
pub mod logging;
pub mod merge;
pub mod output;
pub mod overhead;
pub mod perf;
pub mod process;
pub mod profile;
pub mod profiler;
pub mod provenance;
pub mod sample;
pub mod sampler;
pub mod statsd;
pub mod symbolize;
pub mod timestamp;
pub mod trace_context;
pub mod unwind;
pub mod user;
pub mod wall;

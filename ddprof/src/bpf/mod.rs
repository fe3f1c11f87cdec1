//! The eBPF sampling engine: user stacks unwound in the kernel.
//!
//! The BPF object is embedded in the binary at build time (`cargo xtask
//! build-ebpf`). Its perf_event program is attached to descriptors opened
//! elsewhere (the launcher's hand-off, `-p`, `--global`) with the
//! `PERF_EVENT_IOC_SET_BPF` ioctl. For each sample it walks the user stack
//! with the unwind rows this module loads into its maps (see
//! `ddprof_common::bpf_maps`), and writes a record into a BPF ring buffer.
//!
//! By job, in the order a sample meets them:
//! - `choose`: which engine runs (`auto` falls back to perf with a reason);
//! - `variant`, `programs`: which program variant this kernel runs, and
//!   loading its programs;
//! - `settings`: what the program is loaded with ([`ProgramSettings`]);
//! - `load`: [`BpfProgram`] (the object loaded with its maps sized,
//!   attached to events, its counters) and [`BpfError`];
//! - `engine`: [`BpfEngine`], the ring buffer read into samples;
//! - `sync`: the maps kept in step with the process table;
//! - `rows`: the unwind tables' maps, one per loaded file, created on
//!   demand within a budget and written through short-lived mmaps
//!   ([`TableMaps`]);
//! - `trace_contexts`: the processes that publish request contexts, where
//!   their threads keep them (`TRACE_CONTEXTS`) and their keys' names;
//! - `record`: one ring-buffer record decoded into a `Sample`.
mod choose;
mod engine;
mod kernel_btf;
mod load;
mod not_profiled;
mod parked;
mod programs;
mod record;
mod rows;
mod settings;
mod sync;
mod table_btf;
mod trace_contexts;
mod variant;

pub use choose::{choose_engine, choose_engine_with, Engine, EngineChoice, EngineDecision};
pub use engine::{
    ring_buffer_bytes_for_rate, BpfEngine, BpfEngineOptions, DEFAULT_MAX_TABLE_BYTES,
    DEFAULT_RING_BUFFER_BYTES,
};
pub use load::{
    BpfCounters, BpfError, BpfProgram, MapMemory, MapProblem, MapSizes, ProgramStats, BPF_OBJECT,
};
pub use rows::{StoreError, TableMaps};
pub use settings::{wakes_on_handoff_at, ProgramSettings, HANDOFF_WAKEUP_MIN_HZ};
pub use sync::{LoadedFileReport, TableStats};
pub use variant::{choose_variant, kernel_has_bpf_loop, probe_variants, BpfVariant, VARIANT_ENV};

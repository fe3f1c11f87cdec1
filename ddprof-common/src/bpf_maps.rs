//! The layout of the BPF maps the userspace engine fills and the BPF
//! program reads to unwind user stacks in the kernel.
//!
//! - `TABLES`: an array of maps, one slot per loaded file's unwind table.
//!   Each table is an array map of its own, created by userspace when the
//!   file is first needed and sized for exactly its rows, so that the
//!   kernel memory follows what the processes map (within a budget) and a
//!   table of millions of rows (libLLVM, a static service) fits as well as
//!   libc's. Rows are grouped 16 to a map element ([`RowChunk`]) so that
//!   the array (which the kernel rounds to 8-byte elements) wastes nothing
//!   on 12-byte rows. Processes mapping the same file share its slot.
//! - `PROCESSES`: per process (tgid), its executable mappings sorted by start,
//!   each with the load bias of its file and its table's slot and row count.
use crate::unwind::UnwindRow;

/// The names the BPF object gives its maps, programs and globals: the
/// loader finds them by these, and the BPF program declares them with the
/// same names (aya-ebpf's `#[map]` and `#[link_section]` take only
/// literals: a unit test checks its source against this list).
pub mod names {
    /// Per-CPU counters, indexed by `BpfCounter`.
    pub const COUNTERS: &str = "COUNTERS";
    /// The ring buffer of sample records.
    pub const SAMPLES: &str = "SAMPLES";
    /// Per-CPU record under construction.
    pub const SCRATCH: &str = "SCRATCH";
    /// tgid → `ProcessMappings`.
    pub const PROCESSES: &str = "PROCESSES";
    /// The unwind tables: an array of maps, each inner map one file's rows
    /// in `RowChunk`s.
    pub const TABLES: &str = "TABLES";
    /// Processes whose samples went to the perf engine.
    pub const HANDED_OFF: &str = "HANDED_OFF";
    /// Per-CPU walk state.
    pub const WALKS: &str = "WALKS";
    /// The tail-call variant's continuation (slot 0).
    pub const WALK_PROGRAMS: &str = "WALK_PROGRAMS";
    /// With `TREE_ONLY`: processes userspace found not profiled (tgid →
    /// 1), whose samples the program drops.
    pub const NOT_PROFILED: &str = "NOT_PROFILED";
    /// `sWALL`: the threads whose switch-out stack was emitted, by task
    /// (the `task_struct`'s address) → `ParkedThread`, until they run again.
    pub const PARKED: &str = "PARKED";
    /// `sWALL`: per-CPU `WallRate`, the switch-outs of the current window
    /// and the probability they are sampled with.
    pub const WALL_RATES: &str = "WALL_RATES";
    /// `sWALL`: per-CPU copy of the outgoing thread's saved user registers.
    pub const SAVED_REGS: &str = "SAVED_REGS";
    /// tgid → `TraceContextSlots`: where the processes that publish a
    /// thread context (OTEP 4947, `custom-labels`, Go's pprof labels) keep
    /// each thread's pointer to it.
    pub const TRACE_CONTEXTS: &str = "TRACE_CONTEXTS";
    /// `sALLOC`: per CPU, the task whose allocation sample holds the
    /// CPU's allocation slot of `SCRATCH` and `WALKS` (0: none).
    pub const ALLOCATION_OWNERS: &str = "ALLOCATION_OWNERS";
    /// Every map of the object.
    pub const MAPS: [&str; 14] = [
        COUNTERS,
        SAMPLES,
        SCRATCH,
        PROCESSES,
        TABLES,
        HANDED_OFF,
        WALKS,
        WALK_PROGRAMS,
        NOT_PROFILED,
        PARKED,
        WALL_RATES,
        SAVED_REGS,
        TRACE_CONTEXTS,
        ALLOCATION_OWNERS,
    ];
    /// Global set by the loader: collect kernel stacks (non-zero) or not.
    pub const KERNEL_STACKS: &str = "KERNEL_STACKS";
    /// Global set by the loader: hand-off notices wake the reader at once
    /// (non-zero) or wait for its next wake-up.
    pub const HANDOFF_WAKEUP: &str = "HANDOFF_WAKEUP";
    /// Global set by the loader: the program samples every task of a CPU
    /// and keeps only the profiled processes' samples (non-zero), dropping
    /// those of the processes in `NOT_PROFILED`.
    pub const TREE_ONLY: &str = "TREE_ONLY";
    /// Global set by the loader where links carry cookies (Linux 5.15+) and
    /// the `bpf_loop` variant runs: the program reads its link's cookie
    /// (the event's index plus one) into each record (non-zero); else it
    /// never calls the helper.
    pub const EVENT_COOKIES: &str = "EVENT_COOKIES";
    /// Globals set by the loader when the profiler runs in a PID namespace
    /// other than the initial one: its `/proc/self/ns/pid` device and
    /// inode, in which the program numbers the sampled task.
    pub const PID_NS_DEV: &str = "PID_NS_DEV";
    pub const PID_NS_INO: &str = "PID_NS_INO";
    /// Globals set by the loader for `sWALL`: its cookie (the event's index
    /// plus one), the highest probability of sampling a switch-out (in
    /// `WALL_PROBABILITY_ONE`ths) and the walks per CPU per window.
    pub const WALL_COOKIE: &str = "WALL_COOKIE";
    pub const WALL_MAX_PROBABILITY: &str = "WALL_MAX_PROBABILITY";
    pub const WALL_WALKS_PER_WINDOW: &str = "WALL_WALKS_PER_WINDOW";
    /// Global set by the loader for `sALLOC`: its cookie (the event's
    /// index plus one), written into the allocation uprobe's records.
    pub const ALLOCATION_COOKIE: &str = "ALLOCATION_COOKIE";
    /// Global set by the loader for `sWALL`: a process the maps do not
    /// describe may be profiled (non-zero).
    pub const WALL_UNDESCRIBED: &str = "WALL_UNDESCRIBED";
    /// Global set by the loader for `sWALL`: the offset of `pid` in the
    /// kernel's `struct task_struct` (from its BTF).
    pub const TASK_PID_OFFSET: &str = "TASK_PID_OFFSET";
    /// Global set by the loader: the offset of the thread pointer (x86-64
    /// `thread.fsbase`) in `struct task_struct`, from the kernel's BTF; 0
    /// when unknown, and the program then reads no thread context.
    pub const TASK_FSBASE_OFFSET: &str = "TASK_FSBASE_OFFSET";
    /// The `bpf_loop` variant's program (Linux 5.17+).
    pub const LOOP_ENTRY_PROGRAM: &str = "ddprof_sample";
    /// `sALLOC`: the program on the allocation marker's uprobe (beside the
    /// `bpf_loop` variant).
    pub const ALLOCATION_PROGRAM: &str = "ddprof_allocation";
    /// The tail-call variant's entry program (Linux 5.10+).
    pub const TAIL_CALL_ENTRY_PROGRAM: &str = "ddprof_sample_tail";
    /// The tail-call variant's continuation, tail-called through
    /// `WALK_PROGRAMS`.
    pub const TAIL_CALL_WALK_PROGRAM: &str = "ddprof_walk_tail";
    /// Returns 0 for every sample: attached to the per-task events, which
    /// then only count and report process events, while per-CPU events
    /// sample (`TREE_ONLY`).
    pub const IGNORE_PROGRAM: &str = "ddprof_ignore";
    /// `sWALL`: the `tp_btf/sched_switch` program (Linux 5.17+: it walks
    /// with `bpf_loop`).
    pub const WALL_PROGRAM: &str = "ddprof_switch";
    /// Every program of the object.
    pub const PROGRAMS: [&str; 6] = [
        LOOP_ENTRY_PROGRAM,
        TAIL_CALL_ENTRY_PROGRAM,
        TAIL_CALL_WALK_PROGRAM,
        IGNORE_PROGRAM,
        WALL_PROGRAM,
        ALLOCATION_PROGRAM,
    ];
}

/// `sWALL`: threads parked at once (their switch-out stack emitted, their
/// switch-in not yet seen). The map is an LRU: beyond this, the longest
/// parked thread's switch-in goes unreported, and the reader ends its wait
/// at the thread's next CPU sample or its process's end (or drops the
/// rest of it at the thread's next stack).
pub const MAX_PARKED: u32 = 16384;

/// Rows per element of a table's map.
pub const ROWS_PER_CHUNK: u32 = 16;

/// Slots of the `TABLES` array of maps: files whose tables are loaded at
/// once (a process maps at most `MAX_PROCESS_MAPPINGS` of them).
pub const MAX_TABLES: u32 = 8192;

/// The flags of every table's map: userspace writes it through an mmap
/// (`BPF_F_MMAPABLE`), and tables differ in size (`BPF_F_INNER_MAP`:
/// the kernel then checks each index against the map's own size). An
/// inner map must have the flags of the template in the program.
pub const TABLE_MAP_FLAGS: u32 = (1 << 10) | (1 << 12);

/// One element of a table's map.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RowChunk {
    pub rows: [UnwindRow; ROWS_PER_CHUNK as usize],
}
const _: () = assert!(core::mem::size_of::<RowChunk>() == 192);

/// Executable mappings kept per process (the rest are dropped, lowest
/// addresses first kept). A power of two: lookups mask the index with it.
pub const MAX_PROCESS_MAPPINGS: usize = 256;
/// Binary-search steps that cover `MAX_PROCESS_MAPPINGS` entries.
pub const MAPPING_SEARCH_STEPS: u32 = 9;

/// One executable mapping of a process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MappingEntry {
    pub start: u64,
    pub end: u64,
    /// Subtracted from a PC to get the ELF virtual address the rows use.
    pub bias: u64,
    /// The slot of the file's table in `TABLES`; [`TABLE_NOT_LOADED`] (with
    /// `row_count` 0) when the file has a table that is not loaded.
    pub table: u32,
    /// Rows of the table; 0 when the file has none (frame pointers are used,
    /// as the perf engine would) or it is not loaded.
    pub row_count: u32,
}

/// `MappingEntry::table` of a file whose unwind table exists but is not
/// loaded (it did not fit the budget): the program hands samples that need it to
/// the perf engine, which unwinds them in userspace with the whole table,
/// rather than guess with frame pointers.
pub const TABLE_NOT_LOADED: u32 = u32::MAX;

/// Entries of `NOT_PROFILED` (an LRU hash: a process evicted from it has
/// its next sample handed to the perf engine, and userspace names it
/// again).
pub const MAX_NOT_PROFILED: u32 = 16384;

/// The value of the `PROCESSES` map.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessMappings {
    pub count: u32,
    /// Changed by userspace at each write of the entry: the program names
    /// a process whose entry was rewritten since its last hand-off notice
    /// again at once (it was described since, and hands over again: its
    /// code changed again), not after `HANDOFF_NOTICE_INTERVAL_NS`.
    pub version: u32,
    /// Sorted by `start`, not overlapping; only `count` are used.
    pub entries: [MappingEntry; MAX_PROCESS_MAPPINGS],
}

const _: () = assert!(core::mem::size_of::<MappingEntry>() == 3 * 8 + 2 * 4);
const _: () = assert!(
    core::mem::size_of::<ProcessMappings>()
        == 2 * 4 + MAX_PROCESS_MAPPINGS * core::mem::size_of::<MappingEntry>()
);

// SAFETY: `#[repr(C)]` structs of integers whose sizes are the sums of their
// fields' (asserted above): no padding, so every byte aya copies to or from
// the kernel is initialised, and any bytes are a valid value.
#[cfg(feature = "user")]
unsafe impl aya::Pod for MappingEntry {}
// SAFETY: as for `MappingEntry`: `#[repr(C)]`, integers and an array of
// `MappingEntry`, no padding (asserted above).
#[cfg(feature = "user")]
unsafe impl aya::Pod for ProcessMappings {}

impl Default for ProcessMappings {
    fn default() -> Self {
        ProcessMappings {
            count: 0,
            version: 0,
            entries: [MappingEntry::default(); MAX_PROCESS_MAPPINGS],
        }
    }
}

/// How the BPF program finds a thread's context pointer (the TLS variable
/// a publisher exports) from the thread pointer: [`TraceContextSlot::access`].
pub mod tls_access {
    /// The process publishes no context of this kind.
    pub const NONE: u32 = 0;
    /// The variable is in the static TLS block: at the thread pointer plus
    /// `offset` (negative on x86-64, whose TLS blocks lie below it).
    pub const STATIC: u32 = 1;
    /// The variable is in a module's dynamically allocated block (a
    /// library `dlopen`ed after start): the block's address is the
    /// `module`th entry of the thread's DTV (its address is the second word
    /// at the thread pointer in glibc, each entry two words), the variable
    /// at `offset` in it.
    pub const DTV: u32 = 2;
    /// As [`DTV`], in musl's layout: the DTV at the same place, but each
    /// entry one word (the block's address), and the first entry the count
    /// of the others.
    pub const DTV_MUSL: u32 = 3;
}

/// Where one kind of thread context's pointer lies in each thread of a
/// process.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceContextSlot {
    /// A [`tls_access`] value.
    pub access: u32,
    pub reserved: u32,
    /// With [`tls_access::DTV`]: the module's index in the DTV.
    pub module: u64,
    /// From the thread pointer ([`tls_access::STATIC`]) or the module's
    /// block ([`tls_access::DTV`]).
    pub offset: i64,
}

/// How a Go release keeps a goroutine's labels: [`GoLabelsSlot::layout`].
pub mod go_labels_layout {
    /// Go 1.18 to 1.23: `g.labels` points to a `map[string]string`'s
    /// pointer to its header (`runtime.hmap`).
    pub const MAP: u16 = 0;
    /// Go 1.24 on: `g.labels` points to a sorted slice of `{key, value}`
    /// strings (`runtime/pprof.labelMap`'s `LabelSet.list`).
    pub const SLICE: u16 = 1;
}

/// Where a Go program's threads keep the pprof labels of the goroutine
/// they run: the goroutine the thread runs (`g`, at `g_offset` from the
/// thread pointer), its `m` (the thread's), the `m`'s user goroutine
/// `curg` (`g` may be the thread's system or signal goroutine), then
/// `curg.labels`. Offsets in bytes, as the program's Go version lays its
/// runtime's structures out.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GoLabelsSlot {
    /// From the thread pointer; 0: the process is no Go program whose
    /// labels are read.
    pub g_offset: i64,
    /// `runtime.g.m`.
    pub m: u16,
    /// `runtime.m.curg`.
    pub curg: u16,
    /// `runtime.g.labels`.
    pub labels: u16,
    /// A [`go_labels_layout`] value.
    pub layout: u16,
}

/// A Go map's header (`runtime.hmap`, Go 1.18 to 1.23): its entry count,
/// its log2 of buckets, its buckets' address.
pub const GO_HMAP_COUNT: u64 = 0;
pub const GO_HMAP_LOG2_BUCKETS: u64 = 9;
pub const GO_HMAP_BUCKETS: u64 = 16;
/// A `map[string]string` bucket: 8 top hash bytes, then 8 keys and 8
/// values, each string two words (pointer, length).
pub const GO_BUCKET_KEYS: u64 = 8;
pub const GO_BUCKET_VALUES: u64 = 8 + 8 * 16;
/// A top hash byte below this marks an empty (or moved) entry.
pub const GO_MIN_TOP_HASH: u8 = 5;

/// The value of `TRACE_CONTEXTS`: a process's OTEP 4947 context slot, its
/// `custom-labels` one (either may be [`tls_access::NONE`]) and, for a Go
/// program, where its goroutines' pprof labels are.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TraceContextSlots {
    pub otel: TraceContextSlot,
    pub labels: TraceContextSlot,
    pub go: GoLabelsSlot,
}

const _: () = assert!(core::mem::size_of::<GoLabelsSlot>() == 16);
const _: () = assert!(core::mem::size_of::<TraceContextSlots>() == 64);

/// Processes whose thread contexts the program reads at once.
pub const MAX_TRACE_CONTEXT_PROCESSES: u32 = 4096;

// SAFETY: `#[repr(C)]`, integers only, 24, 16 and 64 bytes (the sums of
// their fields, asserted above): no padding, any bytes are a valid value.
#[cfg(feature = "user")]
unsafe impl aya::Pod for TraceContextSlots {}

/// Frames the tail-call program variant (kernels without `bpf_loop`) walks
/// per program run before it tail-calls itself for the next ones.
pub const FRAMES_PER_TAIL_CALL_RUN: u32 = 16;
/// Tail calls one chain may make on every kernel the tail-call variant is
/// for: 32 before Linux 5.17 (`MAX_TAIL_CALL_CNT`, 33 since). The entry
/// program plus that many runs must reach `MAX_USER_FRAMES`, so that the
/// variant walks as deep as the `bpf_loop` one.
pub const MAX_TAIL_CALLS: u32 = 32;
const _: () = assert!(
    FRAMES_PER_TAIL_CALL_RUN * (MAX_TAIL_CALLS + 1) >= crate::sample::MAX_USER_FRAMES as u32
);

#[cfg(test)]
mod tests {
    extern crate std;
    use std::string::String;
    use std::vec::Vec;

    use super::names;

    /// The BPF program's source, as the object is built from it.
    fn bpf_source() -> String {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../ddprof-ebpf/src/main.rs");
        std::fs::read_to_string(path).expect("ddprof-ebpf/src/main.rs is readable")
    }

    #[test]
    fn the_bpf_program_declares_exactly_the_names_userspace_uses() {
        let source = bpf_source();
        // Every `#[map]` and `#[btf_map]` static, by its name (aya-ebpf
        // names the map after it).
        let lines: Vec<&str> = source.lines().map(str::trim).collect();
        let mut declared: Vec<&str> = lines
            .windows(2)
            .filter(|pair| pair[0] == "#[map]" || pair[0] == "#[btf_map]")
            .filter_map(|pair| {
                let rest = pair[1].strip_prefix("static ")?;
                rest.split(':').next()
            })
            .collect();
        declared.sort_unstable();
        let mut expected = names::MAPS.to_vec();
        expected.sort_unstable();
        assert_eq!(declared, expected, "maps of ddprof-ebpf/src/main.rs");
        for program in names::PROGRAMS {
            let definition = std::format!("pub fn {program}(");
            assert!(source.contains(&definition), "no program `{program}`");
        }
        for name in [
            names::KERNEL_STACKS,
            names::HANDOFF_WAKEUP,
            names::TREE_ONLY,
            names::EVENT_COOKIES,
            names::ALLOCATION_COOKIE,
        ] {
            let global = std::format!("static {name}: u32");
            assert!(source.contains(&global), "no global {name}");
        }
    }
}

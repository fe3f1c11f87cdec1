//! The layout of the BPF maps the userspace engine fills and the BPF
//! program reads to unwind user stacks in the kernel.
//!
//! - `ROWS`: one array of [`RowChunk`]s holding the unwind rows of every
//!   loaded file back to back. A file's table is the row range
//!   `first_row..first_row + row_count`; processes mapping the same file share
//!   it. Rows are grouped 16 to a map element so that the array (which the
//!   kernel rounds to 8-byte elements) wastes nothing on 12-byte rows.
//! - `PROCESSES`: per process (tgid), its executable mappings sorted by start,
//!   each with the load bias of its file and its table's row range.
use crate::unwind::UnwindRow;

/// Rows per `ROWS` map element.
pub const ROWS_PER_CHUNK: u32 = 16;

/// One element of the `ROWS` array map.
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
    /// First row of the file's table in `ROWS`; [`TABLE_NOT_LOADED`] (with
    /// `row_count` 0) when the file has a table that is not in `ROWS`.
    pub first_row: u32,
    /// Rows of the table; 0 when the file has none (frame pointers are used,
    /// as the perf engine would) or it is not loaded.
    pub row_count: u32,
}

/// `MappingEntry::first_row` of a file whose unwind table exists but is not
/// in `ROWS` (it did not fit): the program hands samples that need it to
/// the perf engine, which unwinds them in userspace with the whole table,
/// rather than guess with frame pointers.
pub const TABLE_NOT_LOADED: u32 = u32::MAX;

/// The value of the `PROCESSES` map.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct ProcessMappings {
    pub count: u32,
    pub _reserved: u32,
    /// Sorted by `start`, not overlapping; only `count` are used.
    pub entries: [MappingEntry; MAX_PROCESS_MAPPINGS],
}

impl Default for ProcessMappings {
    fn default() -> Self {
        ProcessMappings {
            count: 0,
            _reserved: 0,
            entries: [MappingEntry::default(); MAX_PROCESS_MAPPINGS],
        }
    }
}

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

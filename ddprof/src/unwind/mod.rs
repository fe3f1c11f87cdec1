//! Unwind tables compiled from .eh_frame / .debug_frame, and the user-side unwinder.
//!
//! - [`compile`]: ELF CFI → sorted [`UnwindRow`] tables (the format the BPF
//!   program walks too; see `ddprof_common::unwind` for the address space).
//! - [`cache`]: tables built once per file content, shared by every process
//!   that maps the file, within a memory budget.
//! - [`Unwinder`]: walks a stack the kernel copied, with those tables and
//!   frame pointers where a range has no usable row.
mod aarch64;
pub mod cache;
pub mod compile;
pub(crate) mod plt;
pub mod store;

pub use cache::{CachedTable, TableCache};
pub use compile::{compile_elf, CompileError, LoadSegment, UnwindTable};
pub use ddprof_common::unwind::{Regs, RowKind, StepResult, UnwindRow};
pub use store::TableStore;

use crate::process::{Mapping, ProcessTable};
use crate::sample::StackEnd;
use ddprof_common::unwind::{Advance, FrameRule, Isa, LastStep, Walker, NATIVE};
use std::sync::Arc;

/// The user registers a sample carries (x86_64): IP, SP, RBP and the other
/// general-purpose registers when the sample has them.
pub type UserRegs = Regs;

/// Counters of how frames were unwound, for reports and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UnwindStats {
    /// Frames stepped with a table row.
    pub table_steps: u64,
    /// Frames stepped with frame pointers (no table, no row, or a row the
    /// format could not express).
    pub frame_pointer_steps: u64,
    /// Of those, frames whose row was unsupported (CFI the format cannot
    /// express, or a CFA based on a register not known in that frame).
    pub unsupported_steps: u64,
}

/// Walks user stacks copied by the kernel, with tables built once per file
/// and shared by every process that maps the file.
pub struct Unwinder {
    tables: TableCache,
    stats: UnwindStats,
    rows: RowCache,
    /// The conventions of the programs it walks: this build's
    /// architecture's, but for tests that walk another's recorded stacks.
    isa: Isa,
}

/// Whether a walk may look for the tables of files it meets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TableLoading {
    /// Reads (and may compile) a file's table on its first frame.
    Allowed,
    /// Stops at a file whose table was not looked for yet: reading one may
    /// compile it (cc1's takes ~55 ms), which a caller that holds the
    /// kernel's buffers cannot wait for.
    KnownOnly,
}

/// The rules of recently unwound addresses, direct-mapped by (table,
/// address): the same stacks come back sample after sample, and a binary
/// search of libc's 23,532 rows per frame was the largest part of the perf
/// engine's unwinding (framehop keeps such a cache too).
struct RowCache {
    slots: Vec<RowCacheSlot>,
}

#[derive(Clone, Copy, Default)]
struct RowCacheSlot {
    /// [`CachedTable::id`]; 0: empty.
    table: u64,
    vaddr: u64,
    /// `None`: no row, or a `NoInfo` row (frame pointers).
    row: Option<UnwindRow>,
}

impl RowCache {
    const SLOTS: usize = 1024;

    fn index(table: u64, vaddr: u64) -> usize {
        let mixed = (vaddr ^ table.rotate_left(32)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (mixed >> 54) as usize % Self::SLOTS
    }

    fn rule(&mut self, table: &CachedTable, vaddr: u64) -> Option<UnwindRow> {
        let index = Self::index(table.id, vaddr);
        let slot = self.slots[index];
        if slot.table == table.id && slot.vaddr == vaddr {
            return slot.row;
        }
        let row = table
            .table
            .row_for(vaddr)
            .filter(|row| row.row_kind() != RowKind::NoInfo)
            .copied();
        self.slots[index] = RowCacheSlot {
            table: table.id,
            vaddr,
            row,
        };
        row
    }
}

impl Default for RowCache {
    fn default() -> Self {
        Self {
            slots: vec![RowCacheSlot::default(); Self::SLOTS],
        }
    }
}

/// What the unwinder found for one frame's PC.
enum Lookup {
    /// How to step it.
    Rule(FrameRule),
    /// The PC is in no executable mapping of a known process.
    Unmapped,
    /// The mapping's file has no table looked for yet, and the walk may
    /// not look ([`TableLoading::KnownOnly`]).
    TableNotLookedFor,
}

/// The table of the mapping the previous frame was in (consecutive frames
/// are often in the same file).
struct MappingMemo {
    start: u64,
    end: u64,
    table: Option<(Arc<CachedTable>, u64)>,
}

impl Default for Unwinder {
    fn default() -> Self {
        Unwinder {
            tables: TableCache::default(),
            stats: UnwindStats::default(),
            rows: RowCache::default(),
            isa: NATIVE,
        }
    }
}

impl Unwinder {
    pub fn new() -> Self {
        Self::default()
    }

    /// An unwinder whose table cache holds at most `bytes` of tables.
    pub fn with_cache_limit(bytes: usize) -> Self {
        Unwinder {
            tables: TableCache::with_limit(bytes),
            stats: UnwindStats::default(),
            rows: RowCache::default(),
            isa: NATIVE,
        }
    }

    /// An unwinder of another architecture's stacks (the arm64 ones the
    /// differential test records in an emulated guest).
    pub fn for_isa(isa: Isa) -> Self {
        Unwinder {
            isa,
            ..Self::default()
        }
    }

    pub fn tables(&mut self) -> &mut TableCache {
        &mut self.tables
    }

    /// The table cache, to report on it.
    pub fn table_cache(&self) -> &TableCache {
        &self.tables
    }

    pub fn stats(&self) -> UnwindStats {
        self.stats
    }

    /// Unwinds one sample of process `pid`. `stack` holds the bytes the kernel
    /// copied starting at `regs.sp`. Pushes the PCs, innermost first, into
    /// `frames` (at most `max_frames`) and says how the walk ended.
    ///
    /// Nothing outside `stack` is read: a rule that needs memory past its end
    /// ends the walk with [`StackEnd::StackExhausted`], below its start (or
    /// on an unmapped PC) with [`StackEnd::BadAddress`].
    pub fn unwind(
        &mut self,
        processes: &ProcessTable,
        pid: u32,
        regs: &UserRegs,
        stack: &[u8],
        max_frames: usize,
        frames: &mut Vec<u64>,
    ) -> StackEnd {
        // Only a walk limited to known tables stops short (`None`).
        self.unwind_with(
            processes,
            pid,
            regs,
            stack,
            max_frames,
            frames,
            TableLoading::Allowed,
        )
        .unwrap_or(StackEnd::NoUnwindInfo)
    }

    /// [`Unwinder::unwind`] with `loading` said; `None` (and `frames` left
    /// to clear) when it is [`TableLoading::KnownOnly`] and a frame is in a
    /// file whose table was not looked for.
    #[allow(clippy::too_many_arguments)]
    pub fn unwind_with(
        &mut self,
        processes: &ProcessTable,
        pid: u32,
        regs: &UserRegs,
        stack: &[u8],
        max_frames: usize,
        frames: &mut Vec<u64>,
        loading: TableLoading,
    ) -> Option<StackEnd> {
        let stack_start = regs.sp;
        let read = |addr: u64| -> Option<u64> {
            let offset = usize::try_from(addr.checked_sub(stack_start)?).ok()?;
            let bytes = stack.get(offset..offset.checked_add(8)?)?;
            Some(u64::from_le_bytes(bytes.try_into().ok()?))
        };
        // A rule reading past the copied bytes means the copy was too short;
        // one reading below SP means a wrong CFA.
        let fault_end = |addr: u64| {
            if addr >= stack_start {
                StackEnd::StackExhausted
            } else {
                StackEnd::BadAddress
            }
        };

        let process = processes.get(pid);
        let mut memo: Option<MappingMemo> = None;
        let mut walker = Walker::new(*regs);
        let mut pushed = 0usize;
        loop {
            if pushed >= max_frames {
                return Some(StackEnd::DepthLimit);
            }
            frames.push(walker.regs.ip);
            pushed += 1;

            let rule = match process {
                Some(process) => {
                    match self.rule_for(pid, process, walker.lookup_pc(), loading, &mut memo) {
                        Lookup::Rule(rule) => rule,
                        Lookup::Unmapped => return Some(StackEnd::BadAddress),
                        Lookup::TableNotLookedFor => return None,
                    }
                }
                None => FrameRule::FramePointer,
            };
            let mut fault = None;
            let advance = walker.advance_for(self.isa, rule, |addr: u64| {
                let value = read(addr);
                if value.is_none() {
                    fault = Some(addr);
                }
                value
            });
            match walker.last_step {
                LastStep::Row => self.stats.table_steps += 1,
                LastStep::FramePointer => self.stats.frame_pointer_steps += 1,
                LastStep::UnsupportedRow => {
                    self.stats.unsupported_steps += 1;
                    self.stats.frame_pointer_steps += 1;
                }
            }
            match advance {
                Advance::Next => {}
                Advance::End(end) => return Some(end),
                // A frame-pointer chain that leaves the copy upwards is a
                // plausible chain cut by the copy; anything else means RBP
                // was not a frame pointer here.
                Advance::ReadFault {
                    frame_pointer: true,
                } => {
                    return Some(match fault.map(fault_end) {
                        Some(StackEnd::StackExhausted) => StackEnd::StackExhausted,
                        _ => StackEnd::NoUnwindInfo,
                    });
                }
                Advance::ReadFault {
                    frame_pointer: false,
                } => return Some(fault.map_or(StackEnd::BadAddress, fault_end)),
            }
        }
    }

    fn rule_for(
        &mut self,
        pid: u32,
        process: &crate::process::Process,
        pc: u64,
        loading: TableLoading,
        memo: &mut Option<MappingMemo>,
    ) -> Lookup {
        let in_memo = memo.as_ref().is_some_and(|m| pc >= m.start && pc < m.end);
        if !in_memo {
            let Some(mapping) = process.find_mapping(pc) else {
                return Lookup::Unmapped;
            };
            if loading == TableLoading::KnownOnly && !self.tables.knows(&mapping.file) {
                return Lookup::TableNotLookedFor;
            }
            *memo = Some(self.memo_for(pid, mapping));
        }
        let Some(MappingMemo {
            table: Some((table, bias)),
            ..
        }) = memo.as_ref()
        else {
            return Lookup::Rule(FrameRule::FramePointer);
        };
        Lookup::Rule(match self.rows.rule(table, pc.wrapping_sub(*bias)) {
            Some(row) => FrameRule::Row(row),
            None => FrameRule::FramePointer,
        })
    }

    fn memo_for(&mut self, pid: u32, mapping: &Mapping) -> MappingMemo {
        MappingMemo {
            start: mapping.start,
            end: mapping.end,
            table: self.tables.table_for_mapping(pid, mapping),
        }
    }
}

#[cfg(test)]
mod tests;

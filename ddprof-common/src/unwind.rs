//! Unwind-table rows and the step function that applies one row to a
//! register set. Compiled for the BPF program and for userspace.
//!
//! # Addresses
//!
//! A table belongs to one ELF file. [`UnwindRow::start`] is an ELF *virtual
//! address* of that file (the address space of its symbols, section headers
//! and FDEs, "SVMA"), so a table does not depend on where a process maps the
//! file. Files whose code lies at or above 4 GiB get no table.
//!
//! A PC in a process maps to that space through the mapping that contains it
//! and the `PT_LOAD` segment that contains the mapped file offset:
//!
//! ```text
//! file_offset = pc - mapping.start + mapping.file_offset
//! segment     = the PT_LOAD with p_offset <= file_offset < p_offset + p_filesz
//! elf_vaddr   = file_offset - segment.p_offset + segment.p_vaddr
//! ```
//!
//! i.e. one constant per mapping, `bias = mapping.start - mapping.file_offset
//! + p_offset - p_vaddr`, and `elf_vaddr = pc - bias`.
//!
//! # Rows
//!
//! A table is a slice of rows sorted by `start`; a row covers the addresses
//! from its `start` up to the next row's `start`. Code without unwind
//! information (between FDEs, after the last one) is covered by a
//! [`RowKind::NoInfo`] row, where the unwinder falls back to frame pointers.
//!
//! Everything here is plain integer math over `Copy` values: no allocation,
//! no recursion, no panics, no unchecked indexing, loops bounded by
//! constants, so the BPF verifier accepts the same code.

/// What a row says about the caller's frame. Stored as a `u8` in
/// [`UnwindRow::kind`]; unknown values decode to [`RowKind::Unsupported`].
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowKind {
    /// No unwind information for this range: use frame pointers.
    NoInfo = 0,
    /// `CFA = SP + cfa_offset`.
    CfaSp = 1,
    /// `CFA = RBP + cfa_offset`.
    CfaFp = 2,
    /// `CFA = *(RBP + cfa_offset)`: GCC's dynamic stack realignment (DRAP)
    /// frames (`DW_OP_breg6 off; DW_OP_deref`), where the caller's SP was
    /// saved in the realigned frame. The caller's RBP is always read, at
    /// `RBP + rbp_offset` (relative to RBP, not to the CFA: GCC describes it
    /// as `DW_CFA_expression rbp (DW_OP_breg6 0)`).
    CfaFpDeref = 3,
    /// A PLT entry: `CFA = SP + cfa_offset + 8` when `(IP & 15) >=
    /// rbp_offset` and `SP + cfa_offset` otherwise (the DWARF expression
    /// glibc's linker emits for `.plt`: the second half of each 16-byte entry
    /// runs after the `push` of the relocation index). The saved RBP is
    /// never set in a PLT: `rbp_offset` holds the threshold instead.
    Plt = 4,
    /// A signal trampoline (`__restore_rt`): SP points at the `ucontext_t`
    /// the kernel pushed, and the interrupted registers are read from it:
    /// `SP' = *(SP + cfa_offset)`, `IP' = *(SP + ra_offset * 8)`,
    /// `RBP' = *(SP + rbp_offset)`. The new IP is the exact interrupted
    /// instruction, not a return address.
    Signal = 5,
    /// The outermost frame of a thread (`_start`, clone's child: the
    /// return address is undefined). The walk is complete.
    Stop = 6,
    /// The CFI uses rules this format cannot express; try frame pointers.
    Unsupported = 7,
}

impl RowKind {
    pub const fn from_raw(raw: u8) -> RowKind {
        match raw {
            0 => RowKind::NoInfo,
            1 => RowKind::CfaSp,
            2 => RowKind::CfaFp,
            3 => RowKind::CfaFpDeref,
            4 => RowKind::Plt,
            5 => RowKind::Signal,
            6 => RowKind::Stop,
            _ => RowKind::Unsupported,
        }
    }
}

/// The return address is at `CFA - 8` on x86_64 (the `call` pushed it).
pub const DEFAULT_RA_OFFSET_BY_8: i8 = -1;

/// One row of an unwind table: 12 bytes, 4-byte aligned.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnwindRow {
    /// First ELF virtual address this row covers (see the module docs).
    pub start: u32,
    /// The CFA offset (meaning depends on [`RowKind`]).
    pub cfa_offset: i32,
    /// Where the caller's RBP is saved: at `CFA + rbp_offset`; 0 means RBP
    /// is unchanged. For [`RowKind::Plt`], the `IP & 15` threshold; for
    /// [`RowKind::Signal`], the offset from SP; for [`RowKind::CfaFpDeref`],
    /// the offset from RBP.
    pub rbp_offset: i16,
    /// Where the return address is, in units of 8 bytes: at
    /// `CFA + ra_offset_by_8 * 8` (normally -1). For [`RowKind::Signal`],
    /// relative to SP.
    pub ra_offset_by_8: i8,
    /// A [`RowKind`] value.
    pub kind: u8,
}

/// Size in bytes of one row, as stored in BPF maps and in memory.
pub const ROW_SIZE: usize = core::mem::size_of::<UnwindRow>();
const _: () = assert!(ROW_SIZE == 12);

impl UnwindRow {
    pub const fn row_kind(&self) -> RowKind {
        RowKind::from_raw(self.kind)
    }

    /// A row with the same rule as `self` (the start is ignored).
    pub fn same_rule(&self, other: &UnwindRow) -> bool {
        self.kind == other.kind
            && self.cfa_offset == other.cfa_offset
            && self.rbp_offset == other.rbp_offset
            && self.ra_offset_by_8 == other.ra_offset_by_8
    }

    pub const fn with_kind(start: u32, kind: RowKind) -> UnwindRow {
        UnwindRow {
            start,
            cfa_offset: 0,
            rbp_offset: 0,
            ra_offset_by_8: 0,
            kind: kind as u8,
        }
    }
}

/// The registers the unwinder tracks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// What [`step`] did.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepResult {
    /// `regs` now hold the caller's registers; `regs.ip` is a return
    /// address (look it up as `ip - 1`).
    Caller = 0,
    /// `regs` now hold the registers a signal interrupted; `regs.ip` is the
    /// exact interrupted instruction (look it up as is).
    Interrupted = 1,
    /// This is the outermost frame: the walk is complete.
    Outermost = 2,
    /// The row has no information ([`RowKind::NoInfo`]); use frame pointers.
    NoInfo = 3,
    /// The row's rule is not expressible; try frame pointers.
    Unsupported = 4,
    /// A memory read failed; `regs` are unchanged.
    ReadFailed = 5,
}

#[inline(always)]
fn add_signed(base: u64, offset: i64) -> u64 {
    base.wrapping_add(offset as u64)
}

/// Applies `row` (the row covering `regs.ip`, or `regs.ip - 1` for a return
/// address) to `regs`. `read_u64` reads 8 bytes of the thread's memory.
/// On anything but `Caller`/`Interrupted`, `regs` are left unchanged.
/// The caller checks progress (SP must grow).
#[inline(always)]
pub fn step<F: FnMut(u64) -> Option<u64>>(
    row: &UnwindRow,
    regs: &mut Regs,
    mut read_u64: F,
) -> StepResult {
    let cfa_offset = row.cfa_offset as i64;
    let cfa = match row.row_kind() {
        RowKind::CfaSp => add_signed(regs.sp, cfa_offset),
        RowKind::CfaFp => add_signed(regs.bp, cfa_offset),
        RowKind::CfaFpDeref => match read_u64(add_signed(regs.bp, cfa_offset)) {
            Some(cfa) => cfa,
            None => return StepResult::ReadFailed,
        },
        RowKind::Plt => {
            let second_half = (regs.ip & 15) >= (row.rbp_offset as u64 & 15);
            let pushed = if second_half { 8 } else { 0 };
            add_signed(regs.sp, cfa_offset).wrapping_add(pushed)
        }
        RowKind::Signal => {
            let ip = read_u64(add_signed(regs.sp, row.ra_offset_by_8 as i64 * 8));
            let sp = read_u64(add_signed(regs.sp, cfa_offset));
            let bp = if row.rbp_offset == 0 {
                Some(regs.bp)
            } else {
                read_u64(add_signed(regs.sp, row.rbp_offset as i64))
            };
            return match (ip, sp, bp) {
                (Some(ip), Some(sp), Some(bp)) => {
                    *regs = Regs { ip, sp, bp };
                    StepResult::Interrupted
                }
                _ => StepResult::ReadFailed,
            };
        }
        RowKind::Stop => return StepResult::Outermost,
        RowKind::NoInfo => return StepResult::NoInfo,
        RowKind::Unsupported => return StepResult::Unsupported,
    };
    let Some(ip) = read_u64(add_signed(cfa, row.ra_offset_by_8 as i64 * 8)) else {
        return StepResult::ReadFailed;
    };
    let saved_bp_at = match row.row_kind() {
        RowKind::CfaFpDeref => Some(add_signed(regs.bp, row.rbp_offset as i64)),
        RowKind::Plt => None,
        _ if row.rbp_offset == 0 => None,
        _ => Some(add_signed(cfa, row.rbp_offset as i64)),
    };
    let bp = match saved_bp_at {
        None => regs.bp,
        // Saved below SP: an epilogue already popped it back into RBP (the
        // CFI of `pop` sequences often keeps the stale save rule), and a
        // stack copy that starts at SP does not hold it anyway.
        Some(addr) if addr < regs.sp => regs.bp,
        Some(addr) => match read_u64(addr) {
            Some(bp) => bp,
            None => return StepResult::ReadFailed,
        },
    };
    *regs = Regs { ip, sp: cfa, bp };
    StepResult::Caller
}

/// One frame-pointer step (`push rbp; mov rbp, rsp` frames): the caller's
/// RBP is at `RBP`, the return address at `RBP + 8`, and its SP is
/// `RBP + 16`. A zero RBP ends the chain (the ABI's outermost frame).
#[inline(always)]
pub fn step_frame_pointer<F: FnMut(u64) -> Option<u64>>(
    regs: &mut Regs,
    mut read_u64: F,
) -> StepResult {
    if regs.bp == 0 {
        return StepResult::Outermost;
    }
    let Some(ip) = read_u64(regs.bp.wrapping_add(8)) else {
        return StepResult::ReadFailed;
    };
    let Some(bp) = read_u64(regs.bp) else {
        return StepResult::ReadFailed;
    };
    *regs = Regs {
        ip,
        sp: regs.bp.wrapping_add(16),
        bp,
    };
    StepResult::Caller
}

/// Binary-search steps enough for any table (2^32 rows).
pub const MAX_LOOKUP_STEPS: u32 = 32;

/// Index of the last row whose start is `<= addr` among `len` rows sorted by
/// start, where `start_of(i)` reads row `i`'s start (a map lookup in BPF).
/// `None` when `addr` is before the first row or a read fails. At most
/// [`MAX_LOOKUP_STEPS`] iterations.
#[inline(always)]
pub fn find_row_index<F: FnMut(u32) -> Option<u32>>(
    len: u32,
    addr: u32,
    mut start_of: F,
) -> Option<u32> {
    // Invariant: rows [0, low) start <= addr, rows [high, len) start > addr.
    let mut low = 0u32;
    let mut high = len;
    let mut steps = 0;
    while low < high && steps < MAX_LOOKUP_STEPS {
        let mid = low + (high - low) / 2;
        if start_of(mid)? <= addr {
            low = mid + 1;
        } else {
            high = mid;
        }
        steps += 1;
    }
    low.checked_sub(1)
}

/// The row covering `addr` in a sorted row slice.
pub fn find_row(rows: &[UnwindRow], addr: u32) -> Option<&UnwindRow> {
    let len = u32::try_from(rows.len()).unwrap_or(u32::MAX);
    let index = find_row_index(len, addr, |i| rows.get(i as usize).map(|r| r.start))?;
    rows.get(index as usize)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fake stack: 8-byte words starting at `base`.
    struct Stack {
        base: u64,
        words: [u64; 64],
    }

    impl Stack {
        fn new(base: u64) -> Self {
            Stack {
                base,
                words: [0; 64],
            }
        }
        fn set(&mut self, addr: u64, value: u64) {
            self.words[((addr - self.base) / 8) as usize] = value;
        }
        fn read(&self, addr: u64) -> Option<u64> {
            if addr < self.base || !addr.is_multiple_of(8) {
                return None;
            }
            self.words.get(((addr - self.base) / 8) as usize).copied()
        }
    }

    fn row(kind: RowKind, cfa_offset: i32, rbp_offset: i16) -> UnwindRow {
        UnwindRow {
            start: 0,
            cfa_offset,
            rbp_offset,
            ra_offset_by_8: DEFAULT_RA_OFFSET_BY_8,
            kind: kind as u8,
        }
    }

    #[test]
    fn sp_based_row_pops_frame_and_restores_rbp() {
        let mut stack = Stack::new(0x1000);
        // Frame of 0x20 bytes below the return address; RBP pushed at CFA-16.
        stack.set(0x1000 + 0x20 - 8, 0xdead_beef);
        stack.set(0x1000 + 0x20 - 16, 0x7777);
        let mut regs = Regs {
            ip: 0x400100,
            sp: 0x1000,
            bp: 1,
        };
        let r = step(&row(RowKind::CfaSp, 0x20, -16), &mut regs, |a| {
            stack.read(a)
        });
        assert_eq!(r, StepResult::Caller);
        assert_eq!(
            regs,
            Regs {
                ip: 0xdead_beef,
                sp: 0x1020,
                bp: 0x7777
            }
        );
    }

    #[test]
    fn sp_based_row_without_saved_rbp_keeps_it() {
        let mut stack = Stack::new(0x1000);
        stack.set(0x1000, 0x1234);
        let mut regs = Regs {
            ip: 1,
            sp: 0x1000,
            bp: 42,
        };
        assert_eq!(
            step(&row(RowKind::CfaSp, 8, 0), &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(
            regs,
            Regs {
                ip: 0x1234,
                sp: 0x1008,
                bp: 42
            }
        );
    }

    #[test]
    fn rbp_saved_below_sp_was_already_popped() {
        // Epilogue after `pop rbp`: CFA = SP + 24 and the stale rule says RBP
        // is at CFA - 48, below SP; RBP already holds the caller's value.
        let mut stack = Stack::new(0x1000);
        stack.set(0x1010, 0x4444);
        let mut regs = Regs {
            ip: 1,
            sp: 0x1000,
            bp: 0x5150,
        };
        assert_eq!(
            step(&row(RowKind::CfaSp, 24, -48), &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(
            regs,
            Regs {
                ip: 0x4444,
                sp: 0x1018,
                bp: 0x5150
            }
        );
    }

    #[test]
    fn fp_based_row_uses_rbp() {
        let mut stack = Stack::new(0x1000);
        // rbp points at the saved rbp; CFA = rbp + 16.
        stack.set(0x1040, 0x5555);
        stack.set(0x1048, 0x4242);
        let mut regs = Regs {
            ip: 1,
            sp: 0x1000,
            bp: 0x1040,
        };
        assert_eq!(
            step(&row(RowKind::CfaFp, 16, -16), &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(
            regs,
            Regs {
                ip: 0x4242,
                sp: 0x1050,
                bp: 0x5555
            }
        );
    }

    #[test]
    fn fp_deref_row_reads_cfa_from_frame() {
        let mut stack = Stack::new(0x1000);
        stack.set(0x1038, 0x1100); // *(rbp - 8) = CFA
        stack.set(0x10f8, 0x9999); // RA at CFA - 8
        stack.set(0x1040, 0x3333); // saved rbp at RBP + 0
        let mut regs = Regs {
            ip: 1,
            sp: 0x1000,
            bp: 0x1040,
        };
        let r = step(&row(RowKind::CfaFpDeref, -8, 0), &mut regs, |a| {
            stack.read(a)
        });
        assert_eq!(r, StepResult::Caller);
        assert_eq!(
            regs,
            Regs {
                ip: 0x9999,
                sp: 0x1100,
                bp: 0x3333
            }
        );
    }

    #[test]
    fn plt_row_depends_on_ip_alignment() {
        let mut stack = Stack::new(0x1000);
        stack.set(0x1000, 0xaaaa);
        stack.set(0x1008, 0xbbbb);
        let plt = row(RowKind::Plt, 8, 11);
        // First half of the entry: RA at SP.
        let mut regs = Regs {
            ip: 0x1020,
            sp: 0x1000,
            bp: 7,
        };
        assert_eq!(step(&plt, &mut regs, |a| stack.read(a)), StepResult::Caller);
        assert_eq!((regs.ip, regs.sp, regs.bp), (0xaaaa, 0x1008, 7));
        // After `push`: RA at SP + 8.
        let mut regs = Regs {
            ip: 0x102b,
            sp: 0x1000,
            bp: 7,
        };
        assert_eq!(step(&plt, &mut regs, |a| stack.read(a)), StepResult::Caller);
        assert_eq!((regs.ip, regs.sp, regs.bp), (0xbbbb, 0x1010, 7));
    }

    #[test]
    fn signal_row_reads_ucontext() {
        let mut stack = Stack::new(0x1000);
        stack.set(0x1000 + 160, 0x7000); // rsp
        stack.set(0x1000 + 168, 0x401234); // rip
        stack.set(0x1000 + 120, 0x6000); // rbp
        let signal = UnwindRow {
            start: 0,
            cfa_offset: 160,
            rbp_offset: 120,
            ra_offset_by_8: 21,
            kind: RowKind::Signal as u8,
        };
        let mut regs = Regs {
            ip: 1,
            sp: 0x1000,
            bp: 0,
        };
        assert_eq!(
            step(&signal, &mut regs, |a| stack.read(a)),
            StepResult::Interrupted
        );
        assert_eq!(
            regs,
            Regs {
                ip: 0x401234,
                sp: 0x7000,
                bp: 0x6000
            }
        );
    }

    #[test]
    fn stop_noinfo_unsupported_and_faults_leave_regs_alone() {
        let stack = Stack::new(0x1000);
        let start = Regs {
            ip: 1,
            sp: 0x1000,
            bp: 2,
        };
        for (kind, expected) in [
            (RowKind::Stop, StepResult::Outermost),
            (RowKind::NoInfo, StepResult::NoInfo),
            (RowKind::Unsupported, StepResult::Unsupported),
        ] {
            let mut regs = start;
            assert_eq!(
                step(&row(kind, 8, 0), &mut regs, |a| stack.read(a)),
                expected
            );
            assert_eq!(regs, start);
        }
        // Unknown kinds decode as unsupported.
        let mut regs = start;
        let mut bogus = row(RowKind::CfaSp, 8, 0);
        bogus.kind = 200;
        assert_eq!(
            step(&bogus, &mut regs, |a| stack.read(a)),
            StepResult::Unsupported
        );
        // CFA below the stack: the read fails.
        let mut regs = start;
        assert_eq!(
            step(&row(RowKind::CfaSp, -64, 0), &mut regs, |a| stack.read(a)),
            StepResult::ReadFailed
        );
        assert_eq!(regs, start);
        // Extreme offsets wrap instead of panicking.
        let mut regs = Regs {
            ip: 0,
            sp: u64::MAX,
            bp: u64::MAX,
        };
        assert_eq!(
            step(&row(RowKind::CfaSp, i32::MAX, i16::MIN), &mut regs, |a| {
                stack.read(a)
            }),
            StepResult::ReadFailed
        );
    }

    #[test]
    fn frame_pointer_step_follows_chain_and_stops_at_zero() {
        let mut stack = Stack::new(0x1000);
        stack.set(0x1010, 0x1030); // saved rbp
        stack.set(0x1018, 0x400500); // return address
        let mut regs = Regs {
            ip: 1,
            sp: 0x1000,
            bp: 0x1010,
        };
        assert_eq!(
            step_frame_pointer(&mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(
            regs,
            Regs {
                ip: 0x400500,
                sp: 0x1020,
                bp: 0x1030
            }
        );
        regs.bp = 0;
        assert_eq!(
            step_frame_pointer(&mut regs, |a| stack.read(a)),
            StepResult::Outermost
        );
    }

    #[test]
    fn lookup_finds_covering_row() {
        let rows: [UnwindRow; 4] = [
            UnwindRow::with_kind(0x100, RowKind::CfaSp),
            UnwindRow::with_kind(0x104, RowKind::CfaFp),
            UnwindRow::with_kind(0x200, RowKind::NoInfo),
            UnwindRow::with_kind(0x300, RowKind::Stop),
        ];
        assert_eq!(find_row(&rows, 0xff), None);
        assert_eq!(find_row(&rows, 0x100).unwrap().start, 0x100);
        assert_eq!(find_row(&rows, 0x103).unwrap().start, 0x100);
        assert_eq!(find_row(&rows, 0x104).unwrap().start, 0x104);
        assert_eq!(find_row(&rows, 0x1ff).unwrap().start, 0x104);
        assert_eq!(find_row(&rows, 0x250).unwrap().start, 0x200);
        assert_eq!(find_row(&rows, u32::MAX).unwrap().start, 0x300);
        assert_eq!(find_row(&[], 5), None);
        // A failing map read aborts the lookup.
        assert_eq!(find_row_index(4, 0x150, |_| None), None);
    }
}

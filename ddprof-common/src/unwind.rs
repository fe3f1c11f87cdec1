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
//! # Registers
//!
//! The walk tracks IP, SP and RBP through every frame, and RBX where a
//! row says where it was saved. The other general-purpose registers are
//! known in the first frame (from the sample) and keep their values in a
//! caller as long as no frame stepped through had a rule for them (DWARF's
//! "same value"): hand-written assembly such as OpenSSL's uses them as the
//! CFA's base (`CFA = RAX + 8`), also across calls to its own helpers that
//! leave them alone. RBX is tracked further because ld.so's lazy-binding
//! trampoline (`_dl_runtime_resolve_*`) keeps its CFA in RBX and calls
//! `_dl_fixup`, which saves RBX: without RBX restored from `_dl_fixup`'s
//! frame, no walk from the binder gets past the trampoline.
//!
//! # Architectures
//!
//! The rows and the walk serve x86-64 and arm64 ([`Isa`]); a profiler only
//! ever unwinds its own architecture's programs ([`NATIVE`]), but both
//! conventions are compiled everywhere so that the host's tests check
//! them. On arm64 a row's registers 7 and 6 name SP and the frame pointer
//! X29 ([`DWARF_RSP`], [`DWARF_RBP`]: the compiler maps DWARF 31 and 29 to
//! them), and [`UnwindRow::slot_by_8`] says where the link register X30,
//! the return address, was saved (0: it is still in X30, as in a leaf
//! function or a prologue; [`LR_BESIDE_FP`] and [`LR_AT_FP_FIELD`] for a
//! save beyond the byte's reach, in frames over 1 KiB). Return addresses
//! signed by pointer authentication are stripped to
//! [`AARCH64_ADDRESS_BITS`] bits.
//!
//! Everything here is plain integer math over `Copy` values: no allocation,
//! no recursion, no panics, no unchecked indexing, loops bounded by
//! constants, so the BPF verifier accepts the same code.

/// What a row says about the caller's frame. Stored in the low three bits
/// of [`UnwindRow::kind_bits`]; every value decodes to a kind.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RowKind {
    /// No unwind information for this range: use frame pointers.
    NoInfo = 0,
    /// `CFA = R + cfa_offset`, `R` being [`UnwindRow::cfa_register`]
    /// (RSP or RBP in compiled code; any register in hand-written code).
    Cfa = 1,
    /// `CFA = *(R + offset) + addend` ([`UnwindRow::deref_offsets`]): the
    /// caller's SP was saved in the frame. OpenSSL's perlasm
    /// (`.cfi_cfa_expression %rsp+40,deref,+8`) for frames of variable size.
    CfaDeref = 2,
    /// As [`RowKind::CfaDeref`], but the caller's RBP is at `RBP +
    /// rbp_offset` (relative to RBP, not to the CFA, and always read): GCC's
    /// dynamic stack realignment (DRAP) frames, `CFA = *(RBP - 8)` and
    /// `DW_CFA_expression rbp (DW_OP_breg6 0)`.
    CfaDerefDrap = 3,
    /// A PLT entry: `CFA = SP + cfa_offset + 8` when `(IP & 15) >=
    /// rbp_offset` and `SP + cfa_offset` otherwise: a 16-byte entry whose
    /// `push` (of the relocation index, or of `GOT[1]` in the header) ends
    /// at byte `rbp_offset`, as in the DWARF expression GNU ld emits for
    /// `.plt` (`DW_OP_lit15; DW_OP_and; DW_OP_lit11; DW_OP_ge; ...`). The
    /// saved RBP is never set in a PLT: `rbp_offset` holds the threshold.
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
        match raw & KIND_MASK {
            0 => RowKind::NoInfo,
            1 => RowKind::Cfa,
            2 => RowKind::CfaDeref,
            3 => RowKind::CfaDerefDrap,
            4 => RowKind::Plt,
            5 => RowKind::Signal,
            6 => RowKind::Stop,
            _ => RowKind::Unsupported,
        }
    }
}

/// The instruction-set conventions a walk follows.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// The return address at `CFA - 8` (`call` pushed it); RBX tracked.
    X86_64 = 0,
    /// The return address in X30 (the link register) until a prologue
    /// saves it; frame records `{X29, X30}`; pointer authentication.
    Aarch64 = 1,
}

/// The architecture this crate is compiled for (the BPF program's is the
/// one it reads `pt_regs` for, `bpf_target_arch`).
pub const NATIVE: Isa = if cfg!(any(target_arch = "aarch64", bpf_target_arch = "aarch64")) {
    Isa::Aarch64
} else {
    Isa::X86_64
};

/// The bits of an arm64 user address (Linux's 48-bit user address space,
/// what Debian, Ubuntu and Amazon Linux kernels configure): the bits above
/// hold a pointer-authentication code in a signed return address, or a
/// tag (top-byte ignore).
pub const AARCH64_ADDRESS_BITS: u32 = 48;

/// A return address without its pointer-authentication code (arm64), as
/// is (x86-64).
#[inline(always)]
pub const fn strip_return_address(isa: Isa, address: u64) -> u64 {
    match isa {
        Isa::X86_64 => address,
        Isa::Aarch64 => address & ((1 << AARCH64_ADDRESS_BITS) - 1),
    }
}

/// The return address is at `CFA - 8` on x86_64 (the `call` pushed it);
/// every row but a [`RowKind::Signal`] one says so.
pub const DEFAULT_RA_OFFSET_BY_8: i8 = -1;

/// arm64's [`UnwindRow::slot_by_8`] when X30 is saved beside X29, at
/// `CFA + rbp_offset + 8` (a frame record `stp x29, x30`), however far
/// from the CFA: a frame of more than 1 KiB saves its record beyond the
/// byte's reach.
pub const LR_BESIDE_FP: i8 = i8::MIN;

/// arm64's [`UnwindRow::slot_by_8`] when X30 is saved out of the byte's
/// reach and X29 is not saved (code without frame pointers with a frame
/// over 1 KiB: `sub sp, sp, #0x660; str x30, [sp, #16]`): X30 is at
/// `CFA + rbp_offset`, a field X29 then has no use for.
pub const LR_AT_FP_FIELD: i8 = i8::MIN + 1;

/// [`UnwindRow::slot_by_8`] of a row whose rule for RBX the format cannot
/// express (or whose slot is out of reach): the caller's RBX is unknown.
pub const RBX_UNKNOWN: i8 = i8::MIN;

/// DWARF register numbers (x86_64 psABI): 0 RAX, 1 RDX, 2 RCX, 3 RBX,
/// 4 RSI, 5 RDI, 6 RBP, 7 RSP, 8-15 R8-R15.
pub const DWARF_RBX: u8 = 3;
pub const DWARF_RBP: u8 = 6;
pub const DWARF_RSP: u8 = 7;
/// General-purpose registers have DWARF numbers below this.
pub const GPR_COUNT: usize = 16;
const RBX_KNOWN: u16 = 1 << DWARF_RBX;

/// [`UnwindRow::kind_bits`]: the [`RowKind`].
const KIND_MASK: u8 = 0b0111;
/// [`UnwindRow::kind_bits`]: the row has a rule for a general-purpose
/// register other than RSP and RBP (the function saves registers, so it may
/// change the caller-saved ones too): the caller's values of those are not
/// the current ones, RBX's but where [`UnwindRow::saved_rbx`] says.
const SAVES_OTHERS: u8 = 0b1000;
/// [`UnwindRow::kind_bits`]: the CFA's base register (DWARF number).
const REGISTER_SHIFT: u8 = 4;

/// One row of an unwind table: 12 bytes, 4-byte aligned.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct UnwindRow {
    /// First ELF virtual address this row covers (see the module docs).
    pub start: u32,
    /// The CFA offset (meaning depends on [`RowKind`]; for the `CfaDeref`
    /// kinds two `i16`, see [`UnwindRow::deref_offsets`]).
    pub cfa_offset: i32,
    /// Where the caller's RBP is saved: at `CFA + rbp_offset`; 0 means RBP
    /// is unchanged. For [`RowKind::Plt`], the `IP & 15` threshold; for
    /// [`RowKind::Signal`], the offset from SP; for
    /// [`RowKind::CfaDerefDrap`], the offset from RBP.
    pub rbp_offset: i16,
    /// A slot of the stack, in units of 8 bytes. For [`RowKind::Signal`],
    /// the interrupted IP, at `SP + slot_by_8 * 8`. For the other kinds,
    /// the caller's RBX, at `CFA + slot_by_8 * 8`; 0 means RBX is
    /// unchanged, [`RBX_UNKNOWN`] that it is not known (the return address
    /// of those kinds is always at `CFA - 8`, see
    /// [`UnwindRow::ra_offset_by_8`]).
    pub slot_by_8: i8,
    /// Bits 0-2: a [`RowKind`]; bit 3: other registers saved (see
    /// [`UnwindRow::saves_other_registers`]); bits 4-7: the CFA's base
    /// register. Packed so that a row stays 12 bytes (rows are most of the
    /// BPF maps' memory).
    pub kind_bits: u8,
}

/// Size in bytes of one row, as stored in BPF maps and in memory.
pub const ROW_SIZE: usize = core::mem::size_of::<UnwindRow>();
const _: () = assert!(ROW_SIZE == 12);
const _: () = assert!(core::mem::align_of::<UnwindRow>() == 4);

/// The bytes of `rows`, as the BPF maps and the table store hold them
/// (each field little-endian, in declaration order, no padding).
#[cfg(target_endian = "little")]
pub fn rows_as_bytes(rows: &[UnwindRow]) -> &[u8] {
    // SAFETY: `UnwindRow` is `repr(C)` integers without padding (its size
    // is the sum of its fields' sizes, asserted above), so all its bytes
    // are initialised; the slice covers exactly the rows' memory, borrowed
    // for as long as `rows`.
    unsafe { core::slice::from_raw_parts(rows.as_ptr().cast::<u8>(), core::mem::size_of_val(rows)) }
}

/// `bytes` seen as rows (the inverse of [`rows_as_bytes`]), if they are a
/// whole number of rows and aligned for them; no copy.
#[cfg(target_endian = "little")]
pub fn rows_from_bytes(bytes: &[u8]) -> Option<&[UnwindRow]> {
    if !bytes.len().is_multiple_of(ROW_SIZE)
        || bytes
            .as_ptr()
            .align_offset(core::mem::align_of::<UnwindRow>())
            != 0
    {
        return None;
    }
    // SAFETY: checked just above: the pointer is aligned for `UnwindRow` and
    // the length is a whole number of rows; every bit pattern is a valid
    // `UnwindRow` (integers only, no padding), and the rows borrow `bytes`.
    Some(unsafe {
        core::slice::from_raw_parts(bytes.as_ptr().cast::<UnwindRow>(), bytes.len() / ROW_SIZE)
    })
}

impl UnwindRow {
    pub const fn row_kind(&self) -> RowKind {
        RowKind::from_raw(self.kind_bits)
    }

    /// DWARF number of the register the CFA (or, for the `CfaDeref` kinds,
    /// the address the CFA is read from) is relative to.
    pub const fn cfa_register(&self) -> u8 {
        self.kind_bits >> REGISTER_SHIFT
    }

    /// The row has a rule for a general-purpose register other than RSP
    /// and RBP (a callee-saved register pushed, or one it cannot describe):
    /// the caller's values of those registers are unknown from here on,
    /// but for RBX where [`UnwindRow::saved_rbx`] finds it.
    pub const fn saves_other_registers(&self) -> bool {
        self.kind_bits & SAVES_OTHERS != 0
    }

    /// For the `CfaDeref` kinds: `(offset, addend)` of `CFA = *(R + offset)
    /// + addend`, packed in `cfa_offset` (low and high 16 bits).
    pub const fn deref_offsets(&self) -> (i16, i16) {
        (self.cfa_offset as i16, (self.cfa_offset >> 16) as i16)
    }

    /// A row with the same rule as `self` (the start is ignored).
    pub fn same_rule(&self, other: &UnwindRow) -> bool {
        self.kind_bits == other.kind_bits
            && self.cfa_offset == other.cfa_offset
            && self.rbp_offset == other.rbp_offset
            && self.slot_by_8 == other.slot_by_8
    }

    /// Where the return address is, in units of 8 bytes: at
    /// `CFA + ra_offset_by_8 * 8`, or for [`RowKind::Signal`] at
    /// `SP + ra_offset_by_8 * 8`. On arm64, where the row saved X30
    /// (0: still in X30).
    pub const fn ra_offset_by_8(&self, isa: Isa) -> i8 {
        match (isa, self.row_kind()) {
            (_, RowKind::Signal) | (Isa::Aarch64, _) => self.slot_by_8,
            _ => DEFAULT_RA_OFFSET_BY_8,
        }
    }

    /// arm64: the return address (X30) saved at `CFA + offset_by_8 * 8`
    /// (0: not saved, still in X30; [`LR_BESIDE_FP`]: beside the saved X29).
    pub const fn with_saved_lr_by_8(self, offset_by_8: i8) -> UnwindRow {
        UnwindRow {
            slot_by_8: offset_by_8,
            ..self
        }
    }

    /// Where the caller's RBX is (not meaningful for [`RowKind::Signal`],
    /// whose registers other than IP, SP and RBP are all unknown).
    pub const fn saved_rbx(&self) -> SavedRbx {
        match self.slot_by_8 {
            0 => SavedRbx::Unchanged,
            RBX_UNKNOWN => SavedRbx::Unknown,
            by_8 => SavedRbx::AtCfa(by_8 as i64 * 8),
        }
    }

    pub const fn with_kind(start: u32, kind: RowKind) -> UnwindRow {
        UnwindRow {
            start,
            cfa_offset: 0,
            rbp_offset: 0,
            slot_by_8: 0,
            kind_bits: kind as u8,
        }
    }

    /// `CFA = register + offset`, return address at `CFA - 8`, RBP and RBX
    /// unchanged.
    pub const fn cfa(register: u8, offset: i32) -> UnwindRow {
        UnwindRow {
            start: 0,
            cfa_offset: offset,
            rbp_offset: 0,
            slot_by_8: 0,
            kind_bits: RowKind::Cfa as u8 | (register & 15) << REGISTER_SHIFT,
        }
    }

    /// `CFA = *(register + offset) + addend` ([`RowKind::CfaDeref`] or
    /// [`RowKind::CfaDerefDrap`]), return address at `CFA - 8`.
    pub const fn cfa_deref(kind: RowKind, register: u8, offset: i16, addend: i16) -> UnwindRow {
        UnwindRow {
            start: 0,
            cfa_offset: (offset as u16 as u32 | (addend as u16 as u32) << 16) as i32,
            rbp_offset: 0,
            slot_by_8: 0,
            kind_bits: kind as u8 | (register & 15) << REGISTER_SHIFT,
        }
    }

    /// A PLT entry ([`RowKind::Plt`]): `CFA = SP + cfa_offset`, plus 8
    /// from byte `push_end` of the 16-byte entry on.
    pub const fn plt(cfa_offset: i32, push_end: u8) -> UnwindRow {
        UnwindRow {
            start: 0,
            cfa_offset,
            rbp_offset: (push_end & 15) as i16,
            slot_by_8: 0,
            kind_bits: RowKind::Plt as u8 | DWARF_RSP << REGISTER_SHIFT,
        }
    }

    pub const fn at(self, start: u32) -> UnwindRow {
        UnwindRow { start, ..self }
    }

    pub const fn with_rbp_offset(self, rbp_offset: i16) -> UnwindRow {
        UnwindRow { rbp_offset, ..self }
    }

    /// The caller's RBX saved at `CFA + offset_by_8 * 8` (0: unchanged,
    /// [`RBX_UNKNOWN`]: unknown).
    pub const fn with_saved_rbx_by_8(self, offset_by_8: i8) -> UnwindRow {
        UnwindRow {
            slot_by_8: offset_by_8,
            ..self
        }
    }

    /// A [`RowKind::Signal`] row: the ucontext at SP holds the interrupted
    /// SP at `SP + sp_slot`, IP at `SP + ip_slot_by_8 * 8`, and RBP at
    /// `SP + rbp_slot` (0: RBP unchanged).
    pub const fn signal(sp_slot: i32, ip_slot_by_8: i8, rbp_slot: i16) -> UnwindRow {
        UnwindRow {
            start: 0,
            cfa_offset: sp_slot,
            rbp_offset: rbp_slot,
            slot_by_8: ip_slot_by_8,
            kind_bits: RowKind::Signal as u8,
        }
    }

    pub const fn saving_other_registers(self) -> UnwindRow {
        UnwindRow {
            kind_bits: self.kind_bits | SAVES_OTHERS,
            ..self
        }
    }
}

/// Where a row says the caller's RBX is ([`UnwindRow::saved_rbx`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SavedRbx {
    /// Not saved: the caller's RBX is this frame's.
    Unchanged,
    /// Saved at `CFA + offset`.
    AtCfa(i64),
    /// The rule is one the format cannot express.
    Unknown,
}

/// The registers the unwinder tracks.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Regs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
    /// The other general-purpose registers by DWARF number (entries 6 and 7
    /// are not used: see `bp` and `sp`), each valid while its bit of
    /// `known` is set.
    pub others: [u64; GPR_COUNT],
    /// Bit `n`: `others[n]` holds this frame's value of register `n`: the
    /// sample's, unchanged by every frame stepped through since, or (RBX)
    /// restored from where a frame saved it.
    pub known: u16,
    /// arm64: the link register X30 (the return address of a function
    /// that has not saved it), known in the sampled frame only; 0 where
    /// unknown. Not used on x86-64, where it keeps whatever it was given
    /// (the BPF program gives it the PC: see `forget_link_register`).
    pub lr: u64,
}

impl Regs {
    /// [`Regs::known`] when every general-purpose register's value is
    /// known (the sampled registers of the first frame).
    pub const ALL_KNOWN: u16 = u16::MAX;

    /// Registers where only IP, SP and RBP are known.
    pub const fn new(ip: u64, sp: u64, bp: u64) -> Regs {
        Regs {
            ip,
            sp,
            bp,
            others: [0; GPR_COUNT],
            known: 0,
            lr: 0,
        }
    }

    /// The value of the register with DWARF number `register` in this
    /// frame, if known.
    #[inline(always)]
    pub fn register(&self, register: u8) -> Option<u64> {
        match register {
            DWARF_RSP => Some(self.sp),
            DWARF_RBP => Some(self.bp),
            _ if u32::from(self.known) >> (register & 15) & 1 != 0 => {
                self.others.get(usize::from(register)).copied()
            }
            _ => None,
        }
    }
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
    /// The row's rule is not expressible, or its CFA is based on a
    /// register whose value is not known here; try frame pointers.
    Unsupported = 4,
    /// A memory read failed; `regs` are unchanged.
    ReadFailed = 5,
}

#[inline(always)]
fn add_signed(base: u64, offset: i64) -> u64 {
    base.wrapping_add(offset as u64)
}

/// Applies `row` (the row covering `regs.ip`, or `regs.ip - 1` for a return
/// address) to `regs`, by [`NATIVE`]'s conventions. `read_u64` reads 8
/// bytes of the thread's memory. On anything but `Caller`/`Interrupted`,
/// `regs` are left unchanged. The caller checks progress (SP must grow).
#[inline(always)]
pub fn step<F: FnMut(u64) -> Option<u64>>(
    row: &UnwindRow,
    regs: &mut Regs,
    read_u64: F,
) -> StepResult {
    step_for(NATIVE, row, regs, read_u64)
}

/// [`step`] by `isa`'s conventions.
#[inline(always)]
pub fn step_for<F: FnMut(u64) -> Option<u64>>(
    isa: Isa,
    row: &UnwindRow,
    regs: &mut Regs,
    mut read_u64: F,
) -> StepResult {
    let kind = row.row_kind();
    let cfa = match kind {
        RowKind::Cfa => match regs.register(row.cfa_register()) {
            Some(base) => add_signed(base, row.cfa_offset as i64),
            None => return StepResult::Unsupported,
        },
        RowKind::CfaDeref | RowKind::CfaDerefDrap => {
            let Some(base) = regs.register(row.cfa_register()) else {
                return StepResult::Unsupported;
            };
            let (offset, addend) = row.deref_offsets();
            match read_u64(add_signed(base, offset as i64)) {
                Some(saved_sp) => add_signed(saved_sp, addend as i64),
                None => return StepResult::ReadFailed,
            }
        }
        RowKind::Plt => {
            let second_half = (regs.ip & 15) >= (row.rbp_offset as u64 & 15);
            let pushed = if second_half { 8 } else { 0 };
            add_signed(regs.sp, row.cfa_offset as i64).wrapping_add(pushed)
        }
        RowKind::Signal => {
            let ip = read_u64(add_signed(regs.sp, row.ra_offset_by_8(isa) as i64 * 8));
            let sp = read_u64(add_signed(regs.sp, row.cfa_offset as i64));
            let bp = if row.rbp_offset == 0 {
                Some(regs.bp)
            } else {
                read_u64(add_signed(regs.sp, row.rbp_offset as i64))
            };
            return match (ip, sp, bp) {
                (Some(ip), Some(sp), Some(bp)) => {
                    regs.ip = ip;
                    regs.sp = sp;
                    regs.bp = bp;
                    // (The ucontext holds them too; nothing needs them yet.)
                    regs.known = 0;
                    forget_link_register(isa, regs);
                    StepResult::Interrupted
                }
                _ => StepResult::ReadFailed,
            };
        }
        RowKind::Stop => return StepResult::Outermost,
        RowKind::NoInfo => return StepResult::NoInfo,
        RowKind::Unsupported => return StepResult::Unsupported,
    };
    let ip = match (isa, row.ra_offset_by_8(isa)) {
        // arm64, X30 not saved by this frame: the return address is in it,
        // known in the sampled frame only.
        (Isa::Aarch64, 0) if regs.lr == 0 => return StepResult::Unsupported,
        (Isa::Aarch64, 0) => regs.lr,
        (Isa::Aarch64, LR_BESIDE_FP | LR_AT_FP_FIELD) => {
            let beside = if row.slot_by_8 == LR_BESIDE_FP { 8 } else { 0 };
            match read_u64(add_signed(cfa, row.rbp_offset as i64 + beside)) {
                Some(ip) => ip,
                None => return StepResult::ReadFailed,
            }
        }
        (_, by_8) => match read_u64(add_signed(cfa, by_8 as i64 * 8)) {
            Some(ip) => ip,
            None => return StepResult::ReadFailed,
        },
    };
    let saved_bp_at = match kind {
        RowKind::CfaDerefDrap => Some(add_signed(regs.bp, row.rbp_offset as i64)),
        RowKind::Plt => None,
        _ if row.rbp_offset == 0 => None,
        _ if isa == Isa::Aarch64 && row.slot_by_8 == LR_AT_FP_FIELD => None,
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
    forget_link_register(isa, regs);
    if isa == Isa::Aarch64 {
        regs.ip = strip_return_address(isa, ip);
        regs.sp = cfa;
        regs.bp = bp;
        if row.saves_other_registers() {
            regs.known = 0;
        }
        return StepResult::Caller;
    }
    // Unlike the return address, an RBX that cannot be read only makes
    // RBX unknown: few callers need it.
    let rbx = match row.saved_rbx() {
        SavedRbx::Unchanged => regs.register(DWARF_RBX),
        // Below SP: popped already, as RBP above.
        SavedRbx::AtCfa(offset) if add_signed(cfa, offset) < regs.sp => regs.register(DWARF_RBX),
        SavedRbx::AtCfa(offset) => read_u64(add_signed(cfa, offset)),
        SavedRbx::Unknown => None,
    };
    regs.ip = ip;
    regs.sp = cfa;
    regs.bp = bp;
    if row.saves_other_registers() {
        regs.known = 0;
    }
    match rbx {
        Some(value) => {
            regs.others[DWARF_RBX as usize] = value;
            regs.known |= RBX_KNOWN;
        }
        None => regs.known &= !RBX_KNOWN,
    }
    StepResult::Caller
}

/// One frame-pointer step (`push rbp; mov rbp, rsp` frames, and arm64's
/// frame records `stp x29, x30, [sp, #-N]!; mov x29, sp`): the caller's
/// RBP (X29) is at `RBP`, the return address at `RBP + 8`, and its SP is
/// `RBP + 16`. A zero RBP ends the chain (the ABI's outermost frame).
/// Nothing says what the frame did with the other registers.
#[inline(always)]
pub fn step_frame_pointer<F: FnMut(u64) -> Option<u64>>(
    regs: &mut Regs,
    read_u64: F,
) -> StepResult {
    step_frame_pointer_for(NATIVE, regs, read_u64)
}

/// [`step_frame_pointer`] by `isa`'s conventions.
#[inline(always)]
pub fn step_frame_pointer_for<F: FnMut(u64) -> Option<u64>>(
    isa: Isa,
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
    regs.ip = strip_return_address(isa, ip);
    regs.sp = regs.bp.wrapping_add(16);
    regs.bp = bp;
    regs.known = 0;
    forget_link_register(isa, regs);
    StepResult::Caller
}

/// A caller's X30 is not known (arm64). On x86-64 the field is not used and
/// is left as it is: a constant stored there made the states of the BPF
/// program's `bpf_loop` callback differ from the first frame's (X30 the
/// sampled PC, unknown to the verifier), which stopped their pruning: the
/// verifier processed 128,312 instructions instead of 27,140, and the
/// wrapper's start-up took 250 ms instead of 75 (the BPF engine's
/// `verified (…)` line).
#[inline(always)]
fn forget_link_register(isa: Isa, regs: &mut Regs) {
    if isa == Isa::Aarch64 {
        regs.lr = 0;
    }
}

/// How to step one frame, as the walk's caller found it for the frame's
/// lookup PC ([`Walker::lookup_pc`]).
#[derive(Clone, Copy, Debug)]
pub enum FrameRule {
    /// The table's row covering the PC.
    Row(UnwindRow),
    /// No row (no table, or code between FDEs): frame pointers.
    FramePointer,
}

/// What one [`Walker::advance`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Advance {
    /// The walker holds the caller's frame: record its PC, look up its
    /// rule, advance again.
    Next,
    /// The walk ends here, so.
    End(crate::sample::StackEnd),
    /// A read of the thread's memory failed; `frame_pointer`: in a
    /// frame-pointer step. What that means is the reader's to say (past
    /// the end of a stack copy, or a bad address).
    ReadFault { frame_pointer: bool },
}

/// One stack walk, frame by frame: the one state machine that the BPF
/// program and the perf engine's unwinder both drive. The caller records
/// each frame's PC (`regs.ip`), finds the rule for [`Walker::lookup_pc`]
/// (from a map, or from a file's table) and calls [`Walker::advance`];
/// everything that decides how a walk ends is here.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct Walker {
    /// The current frame's registers.
    pub regs: Regs,
    /// Non-zero: `regs.ip` is exact (the first frame's, or one a signal
    /// interrupted), looked up as is; else a return address, looked up at
    /// the call (`ip - 1`).
    pub exact_pc: u32,
    /// Non-zero: RBP was restored from the stack (by a frame-pointer step
    /// or a row that saves it) rather than being the sampled register,
    /// which code built without frame pointers uses as it likes. Only a
    /// restored RBP of 0 (or a zero return address found through it)
    /// proves that frame pointers reached the thread's root.
    pub bp_restored: u32,
    /// How the last [`Walker::advance`] stepped.
    pub last_step: LastStep,
}

/// How a walker's last step went ([`Walker::last_step`]). `Row` is 0, so
/// that the zeroed memory of a map slot holding a walker is a valid one.
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LastStep {
    /// With a table row.
    Row = 0,
    /// With frame pointers: no row there.
    FramePointer = 1,
    /// With frame pointers, after a row whose rule the format cannot
    /// express (or whose CFA register is not known in that frame).
    UnsupportedRow = 2,
}

impl Walker {
    /// A walk from the sampled registers.
    pub const fn new(regs: Regs) -> Walker {
        Walker {
            regs,
            exact_pc: 1,
            bp_restored: 0,
            last_step: LastStep::Row,
        }
    }

    /// The address whose rule steps the current frame.
    #[inline(always)]
    pub fn lookup_pc(&self) -> u64 {
        if self.exact_pc != 0 {
            self.regs.ip
        } else {
            self.regs.ip.wrapping_sub(1)
        }
    }

    /// Steps from the current frame to its caller with `rule`, reading the
    /// thread's memory with `read_u64`; frame pointers where the rule says
    /// nothing or what the rows cannot express.
    #[inline(always)]
    pub fn advance<F: FnMut(u64) -> Option<u64>>(
        &mut self,
        rule: FrameRule,
        read_u64: F,
    ) -> Advance {
        self.advance_for(NATIVE, rule, read_u64)
    }

    /// [`Walker::advance`] by `isa`'s conventions.
    #[inline(always)]
    pub fn advance_for<F: FnMut(u64) -> Option<u64>>(
        &mut self,
        isa: Isa,
        rule: FrameRule,
        mut read_u64: F,
    ) -> Advance {
        use crate::sample::StackEnd;
        let mut next = self.regs;
        // A zero return address proves a root only when read relative to
        // the stack registers: `_dl_runtime_resolve_xsavec`'s CFA is in
        // RBX, and RBX's sampled value there made one clang sample in
        // ~8,000 read a zero and end "complete" in lazy binding.
        let mut cfa_from_stack = true;
        self.last_step = LastStep::Row;
        let mut result = match rule {
            FrameRule::Row(row) => {
                if matches!(
                    row.row_kind(),
                    RowKind::Cfa | RowKind::CfaDeref | RowKind::CfaDerefDrap
                ) {
                    let base = row.cfa_register();
                    cfa_from_stack = base == DWARF_RSP || base == DWARF_RBP;
                }
                step_for(isa, &row, &mut next, &mut read_u64)
            }
            FrameRule::FramePointer => StepResult::NoInfo,
        };
        let mut used_frame_pointer = false;
        if matches!(result, StepResult::NoInfo | StepResult::Unsupported) {
            // Code the CFI describes in rules the rows cannot express
            // (a CFA based on a register unknown here) is no thread's
            // root, whatever its RBP holds.
            let described = matches!(result, StepResult::Unsupported);
            self.last_step = if described {
                LastStep::UnsupportedRow
            } else {
                LastStep::FramePointer
            };
            used_frame_pointer = true;
            cfa_from_stack = true;
            // (`step` left `next` as it was: these results change nothing.)
            result = step_frame_pointer_for(isa, &mut next, &mut read_u64);
            if (self.bp_restored == 0 || described) && matches!(result, StepResult::Outermost) {
                return Advance::End(StackEnd::NoUnwindInfo);
            }
        }
        let root_credible = (self.bp_restored != 0 || !used_frame_pointer) && cfa_from_stack;
        if used_frame_pointer || next.bp != self.regs.bp {
            self.bp_restored = 1;
        }
        match result {
            StepResult::Caller => self.exact_pc = 0,
            StepResult::Interrupted => self.exact_pc = 1,
            StepResult::Outermost => return Advance::End(StackEnd::Complete),
            StepResult::NoInfo | StepResult::Unsupported => {
                return Advance::End(StackEnd::NoUnwindInfo)
            }
            StepResult::ReadFailed => {
                return Advance::ReadFault {
                    frame_pointer: used_frame_pointer,
                }
            }
        }
        if next.ip == 0 {
            // A zero return address ends a thread that its CFI does not
            // mark (Go's `runtime.goexit`, described by `.debug_frame`).
            return Advance::End(if root_credible {
                StackEnd::Complete
            } else {
                StackEnd::NoUnwindInfo
            });
        }
        // SP must grow, but for an arm64 leaf (or a function before its
        // prologue saved X30), whose caller's SP is its own: the return
        // address came from X30, which a walk uses once.
        let from_link_register =
            isa == Isa::Aarch64 && self.regs.lr != 0 && next.lr == 0 && next.ip != self.regs.ip;
        if next.sp < self.regs.sp || (next.sp == self.regs.sp && !from_link_register) {
            return Advance::End(StackEnd::NoProgress);
        }
        self.regs = next;
        Advance::Next
    }
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

    const RAX: u8 = 0;
    const RBX: u8 = 3;
    const R9: u8 = 9;

    fn sp_row(cfa_offset: i32, rbp_offset: i16) -> UnwindRow {
        UnwindRow::cfa(DWARF_RSP, cfa_offset).with_rbp_offset(rbp_offset)
    }

    fn fp_row(cfa_offset: i32, rbp_offset: i16) -> UnwindRow {
        UnwindRow::cfa(DWARF_RBP, cfa_offset).with_rbp_offset(rbp_offset)
    }

    /// IP, SP, RBP and the other registers, all known.
    fn all_known(ip: u64, sp: u64, bp: u64, others: &[(u8, u64)]) -> Regs {
        let mut regs = Regs::new(ip, sp, bp);
        regs.known = Regs::ALL_KNOWN;
        for &(register, value) in others {
            regs.others[register as usize] = value;
        }
        regs
    }

    /// The PCs a walk recorded (the crate has no `Vec`).
    struct Pcs {
        pcs: [u64; 16],
        len: usize,
    }

    impl PartialEq<[u64]> for Pcs {
        fn eq(&self, other: &[u64]) -> bool {
            &self.pcs[..self.len] == other
        }
    }

    impl core::fmt::Debug for Pcs {
        fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
            self.pcs[..self.len].fmt(f)
        }
    }

    /// Walks from `regs` with `rules` (one per frame, the last reused),
    /// over `stack`; the PCs recorded and how the walk ended.
    fn walk(regs: Regs, rules: &[FrameRule], stack: &Stack) -> (Pcs, Advance) {
        let mut walker = Walker::new(regs);
        let mut pcs = Pcs {
            pcs: [0; 16],
            len: 0,
        };
        for frame in 0..16 {
            pcs.pcs[frame] = walker.regs.ip;
            pcs.len += 1;
            let rule = rules[frame.min(rules.len() - 1)];
            match walker.advance(rule, |addr| stack.read(addr)) {
                Advance::Next => {}
                end => return (pcs, end),
            }
        }
        (pcs, Advance::Next)
    }

    #[test]
    fn the_walker_ends_complete_on_a_zero_return_address_read_through_the_stack_pointer() {
        // Go's goroutine root: `CFA = RSP + 8`, and a zero there.
        let mut stack = Stack::new(0x1000);
        stack.set(0x1000, 0x5000); // leaf's return address
        stack.set(0x1008, 0); // its caller's: none
        let (pcs, end) = walk(
            Regs::new(0x4000, 0x1000, 0),
            &[FrameRule::Row(sp_row(8, 0))],
            &stack,
        );
        assert_eq!(pcs, [0x4000, 0x5000][..]);
        assert_eq!(end, Advance::End(crate::sample::StackEnd::Complete));
    }

    #[test]
    fn the_walker_proves_no_root_with_a_zero_read_through_another_register() {
        // `_dl_runtime_resolve_xsavec`: `CFA = RBX + 16`, RBX known in the
        // first frame, a zero where the rule finds the return address.
        let mut stack = Stack::new(0x1000);
        stack.set(0x1018, 0);
        let regs = all_known(0x4000, 0x1000, 0, &[(RBX, 0x1010)]);
        let (pcs, end) = walk(regs, &[FrameRule::Row(UnwindRow::cfa(RBX, 16))], &stack);
        assert_eq!(pcs, [0x4000][..]);
        assert_eq!(end, Advance::End(crate::sample::StackEnd::NoUnwindInfo));
    }

    #[test]
    fn the_walker_trusts_a_zero_frame_pointer_only_once_restored() {
        use crate::sample::StackEnd;
        // The sampled RBP of code without frame pointers is 0: no root.
        let stack = Stack::new(0x1000);
        let (_, end) = walk(
            Regs::new(0x4000, 0x1000, 0),
            &[FrameRule::FramePointer],
            &stack,
        );
        assert_eq!(end, Advance::End(StackEnd::NoUnwindInfo));
        // A chain of two frames whose last saved RBP is 0: the root.
        let mut stack = Stack::new(0x1000);
        stack.set(0x1010, 0x1040); // frame 1: saved RBP
        stack.set(0x1018, 0x5000); //          return address
        stack.set(0x1040, 0); // frame 2: saved RBP 0
        stack.set(0x1048, 0x6000);
        let (pcs, end) = walk(
            Regs::new(0x4000, 0x1000, 0x1010),
            &[FrameRule::FramePointer],
            &stack,
        );
        assert_eq!(pcs, [0x4000, 0x5000, 0x6000][..]);
        assert_eq!(end, Advance::End(StackEnd::Complete));
        // The last step used frame pointers, and said so.
        let mut walker = Walker::new(Regs::new(0x4000, 0x1000, 0x1010));
        walker.advance(FrameRule::FramePointer, |addr| stack.read(addr));
        assert_eq!(walker.last_step, LastStep::FramePointer);
        assert_eq!(walker.exact_pc, 0);
        assert_eq!(walker.lookup_pc(), 0x5000 - 1);
    }

    #[test]
    fn the_walker_reports_read_faults_and_no_progress() {
        use crate::sample::StackEnd;
        let stack = Stack::new(0x1000);
        // The row's return address below the stack: a fault, not a frame
        // pointer's.
        let (_, end) = walk(
            Regs::new(0x4000, 0x1000, 0),
            &[FrameRule::Row(sp_row(-8, 0))],
            &stack,
        );
        assert_eq!(
            end,
            Advance::ReadFault {
                frame_pointer: false
            }
        );
        // A CFA at SP itself (a rule that pops nothing): no progress.
        let mut stack = Stack::new(0xff8);
        stack.set(0xff8, 0x5000);
        let (_, end) = walk(
            Regs::new(0x4000, 0x1000, 0),
            &[FrameRule::Row(sp_row(0, 0))],
            &stack,
        );
        assert_eq!(end, Advance::End(StackEnd::NoProgress));
    }

    #[test]
    fn packed_fields_round_trip() {
        let row = UnwindRow::cfa_deref(RowKind::CfaDeref, 15, -32768, 32767)
            .saving_other_registers()
            .at(0x1234);
        assert_eq!(row.row_kind(), RowKind::CfaDeref);
        assert_eq!(row.cfa_register(), 15);
        assert!(row.saves_other_registers());
        assert_eq!(row.deref_offsets(), (-32768, 32767));
        assert_eq!(row.start, 0x1234);
        let row = UnwindRow::cfa(DWARF_RSP, -5);
        assert_eq!(
            (row.row_kind(), row.cfa_register(), row.cfa_offset),
            (RowKind::Cfa, DWARF_RSP, -5)
        );
        assert!(!row.saves_other_registers());
        // Every byte decodes to some kind.
        for bits in 0..=255u8 {
            let row = UnwindRow {
                kind_bits: bits,
                ..row
            };
            assert_eq!(row.row_kind() as u8, bits & 7);
            assert_eq!(row.cfa_register(), bits >> 4);
        }
    }

    #[test]
    fn sp_based_row_pops_frame_and_restores_rbp() {
        let mut stack = Stack::new(0x1000);
        // Frame of 0x20 bytes below the return address; RBP pushed at CFA-16.
        stack.set(0x1000 + 0x20 - 8, 0xdead_beef);
        stack.set(0x1000 + 0x20 - 16, 0x7777);
        let mut regs = Regs::new(0x400100, 0x1000, 1);
        let r = step(&sp_row(0x20, -16), &mut regs, |a| stack.read(a));
        assert_eq!(r, StepResult::Caller);
        assert_eq!(regs, Regs::new(0xdead_beef, 0x1020, 0x7777));
    }

    #[test]
    fn sp_based_row_without_saved_rbp_keeps_it() {
        let mut stack = Stack::new(0x1000);
        stack.set(0x1000, 0x1234);
        let mut regs = Regs::new(1, 0x1000, 42);
        assert_eq!(
            step(&sp_row(8, 0), &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(regs, Regs::new(0x1234, 0x1008, 42));
    }

    #[test]
    fn rbp_saved_below_sp_was_already_popped() {
        // Epilogue after `pop rbp`: CFA = SP + 24 and the stale rule says RBP
        // is at CFA - 48, below SP; RBP already holds the caller's value.
        let mut stack = Stack::new(0x1000);
        stack.set(0x1010, 0x4444);
        let mut regs = Regs::new(1, 0x1000, 0x5150);
        assert_eq!(
            step(&sp_row(24, -48), &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(regs, Regs::new(0x4444, 0x1018, 0x5150));
    }

    #[test]
    fn fp_based_row_uses_rbp() {
        let mut stack = Stack::new(0x1000);
        // rbp points at the saved rbp; CFA = rbp + 16.
        stack.set(0x1040, 0x5555);
        stack.set(0x1048, 0x4242);
        let mut regs = Regs::new(1, 0x1000, 0x1040);
        assert_eq!(
            step(&fp_row(16, -16), &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(regs, Regs::new(0x4242, 0x1050, 0x5555));
    }

    #[test]
    fn cfa_from_another_register_needs_its_value() {
        // OpenSSL: mov %rsp,%rax; .cfi_def_cfa_register %rax; push %rbx...
        let mut stack = Stack::new(0x1000);
        stack.set(0x1038, 0x4321); // RA at RAX + 8 - 8
        let row = UnwindRow::cfa(RAX, 8);
        let mut regs = all_known(1, 0x1000, 9, &[(RAX, 0x1038), (RBX, 77)]);
        assert_eq!(step(&row, &mut regs, |a| stack.read(a)), StepResult::Caller);
        let expected = all_known(0x4321, 0x1040, 9, &[(RAX, 0x1038), (RBX, 77)]);
        assert_eq!(regs, expected);
        assert_eq!(regs.register(RBX), Some(77));
        // Unknown (only IP, SP and RBP came with the sample): no guess.
        let start = Regs::new(1, 0x1000, 9);
        let mut regs = start;
        assert_eq!(
            step(&row, &mut regs, |a| stack.read(a)),
            StepResult::Unsupported
        );
        assert_eq!(regs, start);
    }

    #[test]
    fn rows_that_save_other_registers_forget_them() {
        let mut stack = Stack::new(0x1000);
        stack.set(0x1008, 0x4321);
        stack.set(0x1018, 0x5678);
        let mut regs = all_known(1, 0x1000, 9, &[(R9, 0x1020)]);
        // A leaf helper that leaves R9 alone: the caller's R9 is the same.
        assert_eq!(
            step(&sp_row(16, 0), &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(regs.register(R9), Some(0x1020));
        // A function that pushed RBX (or anything but RSP/RBP): forgotten.
        assert_eq!(
            step(&sp_row(16, 0).saving_other_registers(), &mut regs, |a| {
                stack.read(a)
            }),
            StepResult::Caller
        );
        assert_eq!((regs.ip, regs.sp), (0x5678, 0x1020));
        assert_eq!(regs.register(R9), None);
        assert_eq!(regs.register(DWARF_RSP), Some(0x1020));
        // Frame pointers say nothing about them either.
        let mut regs = all_known(1, 0x1000, 0x1000, &[(R9, 5)]);
        assert_eq!(
            step_frame_pointer(&mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(regs.register(R9), None);
    }

    #[test]
    fn rows_that_save_rbx_restore_it_for_a_cfa_based_on_rbx() {
        // ld.so's lazy binding: `_dl_runtime_resolve_xsavec` (CFA = RBX +
        // 24) calls `_dl_fixup`, sampled after `push rbx; sub $0x10,%rsp`
        // (CFA = RSP + 32, RBX at CFA - 16) with RBX reused.
        let mut stack = Stack::new(0x1000);
        stack.set(0x1010, 0x1040); // _dl_fixup's save of RBX
        stack.set(0x1018, 0x7777); // return into the trampoline
        stack.set(0x1050, 0x8888); // the trampoline's return address, CFA - 8
        let fixup = sp_row(32, 0).with_saved_rbx_by_8(-2);
        assert_eq!(fixup.saved_rbx(), SavedRbx::AtCfa(-16));
        let trampoline = UnwindRow::cfa(RBX, 24);
        let regs = all_known(0x4000, 0x1000, 5, &[(RBX, 0xdead)]);
        let (pcs, end) = walk(
            regs,
            &[FrameRule::Row(fixup), FrameRule::Row(trampoline)],
            &stack,
        );
        assert_eq!(pcs, [0x4000, 0x7777, 0x8888][..]);
        // (The third frame's rule, the trampoline's again, finds the same
        // CFA.)
        assert_eq!(end, Advance::End(crate::sample::StackEnd::NoProgress));
        // Known through a frame that saves other registers too, and only
        // RBX of them.
        let mut regs = all_known(0x4000, 0x1000, 5, &[(RBX, 0xdead), (R9, 9)]);
        let saves_both = fixup.saving_other_registers();
        assert_eq!(
            step(&saves_both, &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(regs.register(RBX), Some(0x1040));
        assert_eq!(regs.register(R9), None);
        // A saved RBX is known even where the sample's registers were not.
        let mut regs = Regs::new(0x4000, 0x1000, 5);
        assert_eq!(
            step(&fixup, &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(regs.register(RBX), Some(0x1040));
        // A rule the format cannot express: unknown from there on.
        let mut regs = all_known(0x4000, 0x1000, 5, &[(RBX, 0xdead)]);
        let unknown = sp_row(32, 0).with_saved_rbx_by_8(RBX_UNKNOWN);
        assert_eq!(
            step(&unknown, &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(regs.register(RBX), None);
        // Its save slot below SP: popped already, so RBX is as it was.
        let mut regs = all_known(0x4000, 0x1010, 5, &[(RBX, 0xdead)]);
        let popped = sp_row(16, 0).with_saved_rbx_by_8(-4);
        stack.set(0x1018, 0x7777);
        assert_eq!(
            step(&popped, &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!((regs.ip, regs.register(RBX)), (0x7777, Some(0xdead)));
        // Unreadable: unknown, and the step still made.
        let mut regs = all_known(0x4000, 0x1000, 5, &[(RBX, 0xdead)]);
        let far = sp_row(32, 0).with_saved_rbx_by_8(100);
        assert_eq!(step(&far, &mut regs, |a| stack.read(a)), StepResult::Caller);
        assert_eq!((regs.ip, regs.register(RBX)), (0x7777, None));
    }

    #[test]
    fn deref_row_reads_saved_sp_and_adds() {
        // OpenSSL's `.cfi_cfa_expression %rsp+40,deref,+8`: the entry SP was
        // stored at RSP + 40 of a realigned frame.
        let mut stack = Stack::new(0x1000);
        stack.set(0x1028, 0x1100); // *(rsp + 40): the caller's SP - 8
        stack.set(0x1100, 0x9999); // RA at CFA - 8 = 0x1108 - 8
        stack.set(0x10f8, 0x3333); // saved rbp at CFA - 16
        let row = UnwindRow::cfa_deref(RowKind::CfaDeref, DWARF_RSP, 40, 8).with_rbp_offset(-16);
        let mut regs = Regs::new(1, 0x1000, 0x7);
        assert_eq!(step(&row, &mut regs, |a| stack.read(a)), StepResult::Caller);
        assert_eq!(regs, Regs::new(0x9999, 0x1108, 0x3333));
        // From RBP, with a bigger addend and RBP unchanged.
        let row = UnwindRow::cfa_deref(RowKind::CfaDeref, DWARF_RBP, 0x28, 64);
        let mut regs = Regs::new(1, 0x1000, 0x1000);
        stack.set(0x1028, 0x1108 - 64);
        assert_eq!(step(&row, &mut regs, |a| stack.read(a)), StepResult::Caller);
        assert_eq!(regs, Regs::new(0x9999, 0x1108, 0x1000));
        // The saved SP cannot be read: nothing changes.
        let start = Regs::new(1, 0x800, 0x7);
        let mut regs = start;
        let row = UnwindRow::cfa_deref(RowKind::CfaDeref, DWARF_RSP, 40, 8);
        assert_eq!(
            step(&row, &mut regs, |a| stack.read(a)),
            StepResult::ReadFailed
        );
        assert_eq!(regs, start);
    }

    #[test]
    fn drap_row_reads_cfa_from_frame_and_rbp_from_rbp() {
        let mut stack = Stack::new(0x1000);
        stack.set(0x1038, 0x1100); // *(rbp - 8) = CFA
        stack.set(0x10f8, 0x9999); // RA at CFA - 8
        stack.set(0x1040, 0x3333); // saved rbp at RBP + 0
        let row = UnwindRow::cfa_deref(RowKind::CfaDerefDrap, DWARF_RBP, -8, 0);
        let mut regs = Regs::new(1, 0x1000, 0x1040);
        assert_eq!(step(&row, &mut regs, |a| stack.read(a)), StepResult::Caller);
        assert_eq!(regs, Regs::new(0x9999, 0x1100, 0x3333));
    }

    #[test]
    fn plt_row_depends_on_ip_alignment() {
        let mut stack = Stack::new(0x1000);
        stack.set(0x1000, 0xaaaa);
        stack.set(0x1008, 0xbbbb);
        let plt = UnwindRow::plt(8, 11);
        // First half of the entry: RA at SP.
        let mut regs = Regs::new(0x1020, 0x1000, 7);
        assert_eq!(step(&plt, &mut regs, |a| stack.read(a)), StepResult::Caller);
        assert_eq!((regs.ip, regs.sp, regs.bp), (0xaaaa, 0x1008, 7));
        // After `push`: RA at SP + 8.
        let mut regs = Regs::new(0x102b, 0x1000, 7);
        assert_eq!(step(&plt, &mut regs, |a| stack.read(a)), StepResult::Caller);
        assert_eq!((regs.ip, regs.sp, regs.bp), (0xbbbb, 0x1010, 7));
    }

    #[test]
    fn signal_row_reads_ucontext() {
        let mut stack = Stack::new(0x1000);
        stack.set(0x1000 + 160, 0x7000); // rsp
        stack.set(0x1000 + 168, 0x401234); // rip
        stack.set(0x1000 + 120, 0x6000); // rbp
        let signal = UnwindRow::signal(160, 21, 120);
        assert_eq!(signal.ra_offset_by_8(Isa::X86_64), 21);
        let mut regs = all_known(1, 0x1000, 0, &[(RAX, 3), (RBX, 4)]);
        assert_eq!(
            step(&signal, &mut regs, |a| stack.read(a)),
            StepResult::Interrupted
        );
        assert_eq!((regs.ip, regs.sp, regs.bp), (0x401234, 0x7000, 0x6000));
        assert_eq!(regs.register(RAX), None);
        assert_eq!(regs.register(RBX), None);
    }

    #[test]
    fn stop_noinfo_unsupported_and_faults_leave_regs_alone() {
        let stack = Stack::new(0x1000);
        let start = Regs::new(1, 0x1000, 2);
        for (kind, expected) in [
            (RowKind::Stop, StepResult::Outermost),
            (RowKind::NoInfo, StepResult::NoInfo),
            (RowKind::Unsupported, StepResult::Unsupported),
        ] {
            let mut regs = start;
            let row = UnwindRow {
                kind_bits: kind as u8,
                ..sp_row(8, 0)
            };
            assert_eq!(step(&row, &mut regs, |a| stack.read(a)), expected);
            assert_eq!(regs, start);
        }
        // CFA below the stack: the read fails.
        let mut regs = start;
        assert_eq!(
            step(&sp_row(-64, 0), &mut regs, |a| stack.read(a)),
            StepResult::ReadFailed
        );
        assert_eq!(regs, start);
        // Extreme offsets wrap instead of panicking.
        let mut regs = Regs::new(0, u64::MAX, u64::MAX);
        assert_eq!(
            step(&sp_row(i32::MAX, i16::MIN), &mut regs, |a| stack.read(a)),
            StepResult::ReadFailed
        );
        let row = UnwindRow::cfa_deref(RowKind::CfaDerefDrap, DWARF_RSP, i16::MIN, i16::MAX);
        assert_eq!(
            step(&row, &mut regs, |a| stack.read(a)),
            StepResult::ReadFailed
        );
    }

    #[test]
    fn frame_pointer_step_follows_chain_and_stops_at_zero() {
        let mut stack = Stack::new(0x1000);
        stack.set(0x1010, 0x1030); // saved rbp
        stack.set(0x1018, 0x400500); // return address
        let mut regs = Regs::new(1, 0x1000, 0x1010);
        assert_eq!(
            step_frame_pointer(&mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(regs, Regs::new(0x400500, 0x1020, 0x1030));
        regs.bp = 0;
        assert_eq!(
            step_frame_pointer(&mut regs, |a| stack.read(a)),
            StepResult::Outermost
        );
    }

    #[test]
    fn lookup_finds_covering_row() {
        let rows: [UnwindRow; 4] = [
            UnwindRow::with_kind(0x100, RowKind::Cfa),
            UnwindRow::with_kind(0x104, RowKind::CfaDeref),
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

    /// The store and the maps hold rows as their fields' little-endian
    /// bytes in order; a view of bytes as rows takes only whole, aligned
    /// rows.
    #[test]
    fn rows_are_their_fields_little_endian_bytes() {
        let mut row = UnwindRow::with_kind(0x0403_0201, RowKind::Cfa);
        row.cfa_offset = -2;
        row.rbp_offset = 0x0605;
        row.slot_by_8 = -1;
        let rows = [row, UnwindRow::with_kind(0x0a0b_0c0d, RowKind::Stop), row];
        let bytes = rows_as_bytes(&rows);
        assert_eq!(bytes.len(), 3 * ROW_SIZE);
        assert_eq!(
            bytes[..ROW_SIZE],
            [
                1,
                2,
                3,
                4,
                0xfe,
                0xff,
                0xff,
                0xff,
                5,
                6,
                0xff,
                row.kind_bits
            ]
        );
        assert_eq!(rows_from_bytes(bytes), Some(&rows[..]));
        assert_eq!(
            rows_from_bytes(&bytes[ROW_SIZE..2 * ROW_SIZE]),
            Some(&rows[1..2])
        );
        // Part of a row, or a row off its alignment: refused.
        assert_eq!(rows_from_bytes(&bytes[..ROW_SIZE + 1]), None);
        assert_eq!(rows_from_bytes(&bytes[1..1 + ROW_SIZE]), None);
    }

    /// An arm64 frame record: `stp x29, x30, [sp, #-32]!; mov x29, sp`,
    /// CFA = X29 + 32, X29 at CFA - 32, X30 at CFA - 24.
    fn aarch64_frame_row() -> UnwindRow {
        UnwindRow::cfa(DWARF_RBP, 32)
            .with_rbp_offset(-32)
            .with_saved_lr_by_8(-3)
    }

    /// A leaf (or a function before its prologue): CFA = SP, the return
    /// address still in X30.
    fn aarch64_leaf_row() -> UnwindRow {
        UnwindRow::cfa(DWARF_RSP, 0).with_saved_lr_by_8(0)
    }

    fn aarch64_regs(ip: u64, sp: u64, fp: u64, lr: u64) -> Regs {
        Regs {
            lr,
            ..Regs::new(ip, sp, fp)
        }
    }

    #[test]
    fn aarch64_leaf_returns_through_the_link_register_once() {
        let stack = Stack::new(0x1000);
        let mut regs = aarch64_regs(0x400100, 0x1000, 0x1040, 0x400200);
        let leaf = aarch64_leaf_row();
        assert_eq!(
            step_for(Isa::Aarch64, &leaf, &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(
            (regs.ip, regs.sp, regs.bp, regs.lr),
            (0x400200, 0x1000, 0x1040, 0)
        );
        // The caller's X30 is not known: the same rule again cannot step.
        let before = regs;
        assert_eq!(
            step_for(Isa::Aarch64, &leaf, &mut regs, |a| stack.read(a)),
            StepResult::Unsupported
        );
        assert_eq!(regs, before);
    }

    #[test]
    fn aarch64_frame_record_restores_x29_and_strips_the_signed_return_address() {
        let mut stack = Stack::new(0x1000);
        // X29 = SP = 0x1000 points at the record {caller's X29, X30}.
        stack.set(0x1000, 0x1100);
        // A return address signed by pointer authentication (PAC in the
        // bits above 48).
        stack.set(0x1008, 0x002c_0000_0040_1234);
        let mut regs = aarch64_regs(0x400100, 0x1000, 0x1000, 0x400999);
        assert_eq!(
            step_for(Isa::Aarch64, &aarch64_frame_row(), &mut regs, |a| stack
                .read(a)),
            StepResult::Caller
        );
        assert_eq!((regs.ip, regs.sp, regs.bp), (0x40_1234, 0x1020, 0x1100));
        // x86-64 reads the return address at CFA - 8 and keeps every bit.
        let mut regs = Regs::new(0x400100, 0x1000, 0x1000);
        stack.set(0x1018, 0x002c_0000_0040_1234);
        assert_eq!(
            step_for(
                Isa::X86_64,
                &UnwindRow::cfa(DWARF_RBP, 32),
                &mut regs,
                |a| stack.read(a)
            ),
            StepResult::Caller
        );
        assert_eq!(regs.ip, 0x002c_0000_0040_1234);
    }

    #[test]
    fn aarch64_walk_from_a_leaf_to_the_root() {
        let mut stack = Stack::new(0x1000);
        // main's frame record at 0x1000 (X29 = 0 above it: the root).
        stack.set(0x1000, 0);
        stack.set(0x1008, 0x0040_0300);
        let mut walker = Walker::new(aarch64_regs(0x400100, 0x1000, 0x1000, 0x400200));
        // The leaf: the return address in X30, SP unchanged, and still a
        // step forward.
        let advance = walker.advance_for(Isa::Aarch64, FrameRule::Row(aarch64_leaf_row()), |a| {
            stack.read(a)
        });
        assert_eq!(advance, Advance::Next);
        assert_eq!((walker.regs.ip, walker.regs.sp), (0x400200, 0x1000));
        // Its caller, with a frame record; then frame pointers end at 0.
        let advance = walker.advance_for(Isa::Aarch64, FrameRule::Row(aarch64_frame_row()), |a| {
            stack.read(a)
        });
        assert_eq!(advance, Advance::Next);
        assert_eq!(
            (walker.regs.ip, walker.regs.sp, walker.regs.bp),
            (0x400300, 0x1020, 0)
        );
        let advance = walker.advance_for(Isa::Aarch64, FrameRule::FramePointer, |a| stack.read(a));
        assert_eq!(advance, Advance::End(crate::sample::StackEnd::Complete));
    }

    #[test]
    fn aarch64_return_addresses_saved_beyond_a_byte_of_reach() {
        let mut stack = Stack::new(0x1000);
        // A frame record 0x400 bytes below the CFA (a frame over 1 KiB):
        // X29 at CFA - 0x400, X30 beside it.
        stack.set(0x1000 + 0x40, 0x2222);
        stack.set(0x1000 + 0x48, 0x40_4444);
        let record = UnwindRow::cfa(DWARF_RSP, 0x440)
            .with_rbp_offset(-0x400)
            .with_saved_lr_by_8(LR_BESIDE_FP);
        let mut regs = aarch64_regs(1, 0x1000, 7, 0);
        assert_eq!(
            step_for(Isa::Aarch64, &record, &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!((regs.ip, regs.sp, regs.bp), (0x40_4444, 0x1440, 0x2222));
        // No frame record (no frame pointer): X30 alone, at CFA - 0x400 in
        // X29's field, and X29 unchanged.
        let alone = UnwindRow::cfa(DWARF_RSP, 0x440)
            .with_rbp_offset(-0x400)
            .with_saved_lr_by_8(LR_AT_FP_FIELD);
        stack.set(0x1000 + 0x40, 0x40_5555);
        let mut regs = aarch64_regs(1, 0x1000, 7, 0);
        assert_eq!(
            step_for(Isa::Aarch64, &alone, &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!((regs.ip, regs.sp, regs.bp), (0x40_5555, 0x1440, 7));
    }

    #[test]
    fn aarch64_frame_pointer_steps_strip_the_return_address() {
        let mut stack = Stack::new(0x1000);
        stack.set(0x1010, 0x1100);
        stack.set(0x1018, 0x7f00_0000_0040_5678);
        let mut regs = aarch64_regs(1, 0x1000, 0x1010, 2);
        assert_eq!(
            step_frame_pointer_for(Isa::Aarch64, &mut regs, |a| stack.read(a)),
            StepResult::Caller
        );
        assert_eq!(
            (regs.ip, regs.sp, regs.bp, regs.lr),
            (0x40_5678, 0x1020, 0x1100, 0)
        );
    }
}

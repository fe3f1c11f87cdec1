//! Compiler tests on hand-made CFI (written with `gimli::write`) and
//! unwinder tests on synthetic stacks.
use super::compile::{assemble_rows, collect_fdes, CompileStats, LoadSegment};
use super::*;
use crate::files::{ContentKey, Digest};

/// A content key for a table made up in a test.
fn content_key(name: &[u8]) -> ContentKey {
    ContentKey {
        file: Digest::of_bytes(name),
        debug_file: None,
    }
}
use crate::process::MappingRecord;
use ddprof_common::unwind::{Isa, DWARF_RBP, DWARF_RBX, DWARF_RSP, RBX_UNKNOWN};
use gimli::write::{
    Address, CallFrameInstruction as Cfi, CommonInformationEntry, EndianVec, Expression,
    FrameDescriptionEntry, FrameTable,
};
use gimli::{constants, Encoding, Format, LittleEndian, Register, X86_64};

const R10: Register = Register(10);

fn encoding() -> Encoding {
    Encoding {
        format: Format::Dwarf32,
        version: 1,
        address_size: 8,
    }
}

/// The CIE every x86_64 compiler emits: CFA = RSP + 8, RA at CFA - 8.
fn standard_cie(signal: bool) -> CommonInformationEntry {
    let mut cie = CommonInformationEntry::new(encoding(), 1, -8, X86_64::RA);
    cie.add_instruction(Cfi::Cfa(X86_64::RSP, 8));
    cie.add_instruction(Cfi::Offset(X86_64::RA, -8));
    cie.signal_trampoline = signal;
    cie
}

/// An FDE for `[start, start + len)` with `(offset, instruction)` pairs.
struct Fde {
    start: u64,
    len: u32,
    signal: bool,
    instructions: Vec<(u32, Cfi)>,
}

fn fde(start: u64, len: u32, instructions: Vec<(u32, Cfi)>) -> Fde {
    Fde {
        start,
        len,
        signal: false,
        instructions,
    }
}

fn frame_table(fdes: Vec<Fde>) -> FrameTable {
    let mut table = FrameTable::default();
    let normal = table.add_cie(standard_cie(false));
    let signal = table.add_cie(standard_cie(true));
    for f in fdes {
        let mut entry = FrameDescriptionEntry::new(Address::Constant(f.start), f.len);
        for (offset, instruction) in f.instructions {
            entry.add_instruction(offset, instruction);
        }
        table.add_fde(if f.signal { signal } else { normal }, entry);
    }
    table
}

fn compile_eh_frame_bytes(bytes: &[u8]) -> (Vec<UnwindRow>, CompileStats) {
    let section = gimli::EhFrame::new(bytes, LittleEndian);
    let bases = gimli::BaseAddresses::default().set_eh_frame(0);
    let mut fdes = Vec::new();
    let mut stats = CompileStats::default();
    collect_fdes(Isa::X86_64, &section, &bases, &mut fdes, &mut stats);
    (assemble_rows(fdes, &mut stats), stats)
}

fn compile_eh(fdes: Vec<Fde>) -> (Vec<UnwindRow>, CompileStats) {
    let mut eh_frame = gimli::write::EhFrame(EndianVec::new(LittleEndian));
    frame_table(fdes).write_eh_frame(&mut eh_frame).unwrap();
    compile_eh_frame_bytes(eh_frame.0.slice())
}

fn rows_of(fdes: Vec<Fde>) -> Vec<UnwindRow> {
    compile_eh(fdes).0
}

fn sp(start: u32, cfa_offset: i32, rbp_offset: i16) -> UnwindRow {
    UnwindRow::cfa(DWARF_RSP, cfa_offset)
        .with_rbp_offset(rbp_offset)
        .at(start)
}

fn fp(start: u32, cfa_offset: i32, rbp_offset: i16) -> UnwindRow {
    UnwindRow::cfa(DWARF_RBP, cfa_offset)
        .with_rbp_offset(rbp_offset)
        .at(start)
}

fn kind_at(start: u32, kind: RowKind) -> UnwindRow {
    UnwindRow::with_kind(start, kind)
}

#[test]
fn frame_pointer_prologue_and_epilogue() {
    // push rbp; mov rbp, rsp; ...; leave; ret
    let rows = rows_of(vec![fde(
        0x1000,
        0x30,
        vec![
            (1, Cfi::CfaOffset(16)),
            (1, Cfi::Offset(X86_64::RBP, -16)),
            (4, Cfi::CfaRegister(X86_64::RBP)),
            (0x2f, Cfi::Cfa(X86_64::RSP, 8)),
        ],
    )]);
    assert_eq!(
        rows,
        vec![
            sp(0x1000, 8, 0),
            sp(0x1001, 16, -16),
            fp(0x1004, 16, -16),
            sp(0x102f, 8, -16),
            kind_at(0x1030, RowKind::NoInfo),
        ]
    );
}

#[test]
fn remember_restore_state_and_same_value() {
    // sub rsp, 24 / early return path / restore.
    let rows = rows_of(vec![fde(
        0x2000,
        0x40,
        vec![
            (1, Cfi::CfaOffset(16)),
            (1, Cfi::Offset(X86_64::RBP, -16)),
            (5, Cfi::CfaOffset(48)),
            (0x10, Cfi::RememberState),
            (0x10, Cfi::CfaOffset(16)),
            (0x11, Cfi::CfaOffset(8)),
            (0x11, Cfi::SameValue(X86_64::RBP)),
            (0x12, Cfi::RestoreState),
            (0x20, Cfi::Restore(X86_64::RBP)),
        ],
    )]);
    assert_eq!(
        rows,
        vec![
            sp(0x2000, 8, 0),
            sp(0x2001, 16, -16),
            sp(0x2005, 48, -16),
            sp(0x2010, 16, -16),
            sp(0x2011, 8, 0),
            sp(0x2012, 48, -16),
            // DW_CFA_restore: back to the CIE's rule for RBP (unchanged).
            sp(0x2020, 48, 0),
            kind_at(0x2040, RowKind::NoInfo),
        ]
    );
}

#[test]
fn gaps_get_noinfo_rows_and_adjacent_equal_rules_merge() {
    let rows = rows_of(vec![
        fde(0x3000, 0x10, vec![]),
        // Adjacent, same rule as the end of the previous FDE: merged.
        fde(0x3010, 0x10, vec![(2, Cfi::CfaOffset(16))]),
        // After a gap.
        fde(0x3100, 0x10, vec![]),
        // After alignment padding (< 16 bytes): the previous row extends.
        fde(0x311c, 0x10, vec![(1, Cfi::CfaOffset(16))]),
    ]);
    assert_eq!(
        rows,
        vec![
            sp(0x3000, 8, 0),
            sp(0x3012, 16, 0),
            kind_at(0x3020, RowKind::NoInfo),
            sp(0x3100, 8, 0),
            sp(0x311d, 16, 0),
            kind_at(0x312c, RowKind::NoInfo),
        ]
    );
}

#[test]
fn undefined_return_address_is_the_outermost_frame() {
    // _start: xor ebp, ebp; mov r9, rdx; ... (glibc marks RIP undefined).
    let rows = rows_of(vec![fde(
        0x4000,
        0x20,
        vec![(0, Cfi::Undefined(X86_64::RA))],
    )]);
    assert_eq!(
        rows,
        vec![
            kind_at(0x4000, RowKind::Stop),
            kind_at(0x4020, RowKind::NoInfo)
        ]
    );
}

fn plt_expression(threshold: u8) -> Expression {
    let mut e = Expression::new();
    e.op_breg(X86_64::RSP, 8);
    e.op_breg(X86_64::RA, 0);
    e.op(constants::DW_OP_lit15);
    e.op(constants::DW_OP_and);
    e.op(constants::DwOp(constants::DW_OP_lit0.0 + threshold));
    e.op(constants::DW_OP_ge);
    e.op(constants::DW_OP_lit3);
    e.op(constants::DW_OP_shl);
    e.op(constants::DW_OP_plus);
    e
}

#[test]
fn plt_expression_becomes_plt_row() {
    // .plt: the first entry pushes GOT[1] (CFA = RSP + 16), then the
    // entries use the expression.
    let rows = rows_of(vec![fde(
        0x5000,
        0x40,
        vec![
            (0, Cfi::CfaOffset(16)),
            (6, Cfi::CfaOffset(24)),
            (0x10, Cfi::CfaExpression(plt_expression(11))),
        ],
    )]);
    assert_eq!(
        rows,
        vec![
            sp(0x5000, 16, 0),
            sp(0x5006, 24, 0),
            UnwindRow::plt(8, 11).at(0x5010),
            kind_at(0x5040, RowKind::NoInfo),
        ]
    );
    // GNU ld's IBT `.plt` (`endbr64; push $n; jmp`): the push ends at byte 9.
    let rows = rows_of(vec![fde(
        0x5100,
        0x20,
        vec![(0, Cfi::CfaExpression(plt_expression(9)))],
    )]);
    assert_eq!(rows[0], UnwindRow::plt(8, 9).at(0x5100));
}

fn breg(register: Register, offset: i64) -> Expression {
    let mut e = Expression::new();
    e.op_breg(register, offset);
    e
}

fn breg_deref(register: Register, offset: i64) -> Expression {
    let mut e = breg(register, offset);
    e.op_deref();
    e
}

#[test]
fn signal_trampoline_reads_ucontext() {
    // glibc's __restore_rt (sysdeps/unix/sysv/linux/x86_64/libc_sigaction.c).
    let mut trampoline = fde(
        0x6000,
        0x10,
        vec![
            (0, Cfi::CfaExpression(breg_deref(X86_64::RSP, 160))),
            (0, Cfi::Expression(X86_64::RBP, breg(X86_64::RSP, 120))),
            (0, Cfi::Expression(X86_64::RSP, breg(X86_64::RSP, 160))),
            (0, Cfi::Expression(X86_64::RA, breg(X86_64::RSP, 168))),
        ],
    );
    trampoline.signal = true;
    assert_eq!(
        rows_of(vec![trampoline]),
        vec![
            UnwindRow::signal(160, 21, 120).at(0x6000),
            kind_at(0x6010, RowKind::NoInfo),
        ]
    );
}

#[test]
fn drap_realignment_reads_cfa_from_frame() {
    // GCC's dynamic realignment: lea r10,[rsp+8]; and rsp,-32; push [r10-8];
    // push rbp; mov rbp,rsp; push r10 ...
    let rows = rows_of(vec![fde(
        0x7000,
        0x40,
        vec![
            (4, Cfi::Cfa(R10, 0)),
            (0x10, Cfi::CfaExpression(breg_deref(X86_64::RBP, -8))),
            (0x10, Cfi::Expression(X86_64::RBP, breg(X86_64::RBP, 0))),
            (0x30, Cfi::Cfa(X86_64::RSP, 8)),
        ],
    )]);
    assert_eq!(
        rows,
        vec![
            sp(0x7000, 8, 0),
            // CFA in r10: known in the first frame only.
            UnwindRow::cfa(10, 0).at(0x7004),
            UnwindRow::cfa_deref(RowKind::CfaDerefDrap, DWARF_RBP, -8, 0).at(0x7010),
            // RBP's rule is still an expression, relative to RBP: with an
            // RSP-based CFA that cannot be expressed.
            kind_at(0x7030, RowKind::Unsupported),
            kind_at(0x7040, RowKind::NoInfo),
        ]
    );
}

fn breg_deref_plus(register: Register, offset: i64, addend: u64) -> Expression {
    let mut e = breg_deref(register, offset);
    e.op_plus_uconst(addend);
    e
}

const RAX: u8 = 0;
const RSI: u8 = 4;

#[test]
fn rbx_save_rules_compile_to_its_slot_or_unknown() {
    // ld.so's `_dl_fixup`: push rbx (RBX at CFA - 16: the other registers
    // unknown past it, RBX restored) and r12; RBX then kept in a register
    // (not expressible: unknown), then restored.
    let rows = rows_of(vec![fde(
        0xc000,
        0x40,
        vec![
            (1, Cfi::CfaOffset(16)),
            (1, Cfi::Offset(X86_64::RBX, -16)),
            (3, Cfi::CfaOffset(24)),
            (3, Cfi::Offset(Register(12), -24)),
            (0x10, Cfi::Register(X86_64::RBX, R10)),
            (0x20, Cfi::Restore(Register(12))),
            (0x20, Cfi::Restore(X86_64::RBX)),
            (0x20, Cfi::CfaOffset(8)),
        ],
    )]);
    assert_eq!(
        rows,
        vec![
            sp(0xc000, 8, 0),
            sp(0xc001, 16, 0)
                .with_saved_rbx_by_8(-2)
                .saving_other_registers(),
            sp(0xc003, 24, 0)
                .with_saved_rbx_by_8(-2)
                .saving_other_registers(),
            sp(0xc010, 24, 0)
                .with_saved_rbx_by_8(RBX_UNKNOWN)
                .saving_other_registers(),
            sp(0xc020, 8, 0),
            kind_at(0xc040, RowKind::NoInfo),
        ]
    );
    // The trampoline that `_dl_fixup` returns to: CFA in RBX.
    let rows = rows_of(vec![fde(
        0xd000,
        0x40,
        vec![
            (1, Cfi::CfaOffset(24)),
            (1, Cfi::Offset(X86_64::RBX, -24)),
            (4, Cfi::CfaRegister(X86_64::RBX)),
        ],
    )]);
    assert_eq!(
        rows[2],
        UnwindRow::cfa(DWARF_RBX, 24)
            .with_saved_rbx_by_8(-3)
            .saving_other_registers()
            .at(0xd004)
    );
    // A return address anywhere but CFA - 8: not expressible.
    let rows = rows_of(vec![fde(
        0xe000,
        0x10,
        vec![(1, Cfi::Offset(X86_64::RA, -16))],
    )]);
    assert_eq!(rows[1], kind_at(0xe001, RowKind::Unsupported));
}

#[test]
fn openssl_frames_compile_to_register_and_deref_rows() {
    // OpenSSL's perlasm (bn_mul_mont, sha512): `mov %rsp,%rax` and CFA in
    // RAX while pushing; after realigning RSP the entry SP is stored at
    // 40(%rsp) (`.cfi_cfa_expression %rsp+40,deref,+8`), later read
    // through RBP; the epilogue has it in RSI.
    let rows = rows_of(vec![fde(
        0xb000,
        0x60,
        vec![
            (3, Cfi::CfaRegister(X86_64::RAX)),
            (4, Cfi::Offset(X86_64::RBX, -16)),
            (5, Cfi::Offset(X86_64::RBP, -24)),
            (
                0x10,
                Cfi::CfaExpression(breg_deref_plus(X86_64::RSP, 40, 8)),
            ),
            (
                0x40,
                Cfi::CfaExpression(breg_deref_plus(X86_64::RBP, 88, 8)),
            ),
            (0x48, Cfi::Cfa(X86_64::RSI, 8)),
            (0x50, Cfi::Restore(X86_64::RBX)),
            (0x50, Cfi::Restore(X86_64::RBP)),
            (0x50, Cfi::Cfa(X86_64::RSP, 8)),
        ],
    )]);
    let deref = |register, offset, addend| {
        UnwindRow::cfa_deref(RowKind::CfaDeref, register, offset, addend)
            .with_rbp_offset(-24)
            .with_saved_rbx_by_8(-2)
            .saving_other_registers()
    };
    assert_eq!(
        rows,
        vec![
            sp(0xb000, 8, 0),
            UnwindRow::cfa(RAX, 8).at(0xb003),
            // RBX pushed: the caller's RBX is at CFA - 16, and its other
            // registers (RAX and the like) not the current ones any more.
            UnwindRow::cfa(RAX, 8)
                .with_saved_rbx_by_8(-2)
                .saving_other_registers()
                .at(0xb004),
            UnwindRow::cfa(RAX, 8)
                .with_rbp_offset(-24)
                .with_saved_rbx_by_8(-2)
                .saving_other_registers()
                .at(0xb005),
            deref(DWARF_RSP, 40, 8).at(0xb010),
            deref(DWARF_RBP, 88, 8).at(0xb040),
            UnwindRow::cfa(RSI, 8)
                .with_rbp_offset(-24)
                .with_saved_rbx_by_8(-2)
                .saving_other_registers()
                .at(0xb048),
            sp(0xb050, 8, 0),
            kind_at(0xb060, RowKind::NoInfo),
        ]
    );
}

#[test]
fn deref_addends_in_any_form() {
    // `lit8; plus`, `const 56; plus` and `lit8; minus` mean what plus_uconst does.
    let with_tail = |ops: &[(constants::DwOp, Option<i64>)]| {
        let mut e = breg_deref(X86_64::RSP, 16);
        for &(op, value) in ops {
            match value {
                Some(value) => e.op_consts(value),
                None => e.op(op),
            }
        }
        e
    };
    let plus = (constants::DW_OP_plus, None);
    let minus = (constants::DW_OP_minus, None);
    let lit8 = (constants::DW_OP_lit8, None);
    let cases = [
        (with_tail(&[lit8, plus]), 8),
        (with_tail(&[(constants::DW_OP_consts, Some(56)), plus]), 56),
        (with_tail(&[lit8, minus]), -8),
        (with_tail(&[]), 0),
    ];
    for (expression, addend) in cases {
        let rows = rows_of(vec![fde(
            0xd000,
            0x10,
            vec![(0, Cfi::CfaExpression(expression))],
        )]);
        assert_eq!(
            rows[0],
            UnwindRow::cfa_deref(RowKind::CfaDeref, DWARF_RSP, 16, addend).at(0xd000),
            "addend {addend}"
        );
    }
}

#[test]
fn rbp_saved_by_expression_is_placed_relative_to_the_cfa() {
    // The CFA is on the DWARF stack when a register's expression starts.
    let mut cfa_minus_16 = Expression::new();
    cfa_minus_16.op_consts(-16);
    cfa_minus_16.op(constants::DW_OP_plus);
    let rows = rows_of(vec![fde(
        0xc000,
        0x30,
        vec![
            (1, Cfi::CfaOffset(24)),
            // At RSP + 8 = CFA - 16.
            (1, Cfi::Expression(X86_64::RBP, breg(X86_64::RSP, 8))),
            (0x10, Cfi::CfaOffset(32)),
            (0x10, Cfi::Expression(X86_64::RBP, cfa_minus_16)),
            // Under a CFA read from the frame, relative to RBP (as DRAP).
            (
                0x20,
                Cfi::CfaExpression(breg_deref_plus(X86_64::RSP, 16, 8)),
            ),
            (0x20, Cfi::Expression(X86_64::RBP, breg(X86_64::RBP, 0))),
        ],
    )]);
    assert_eq!(
        rows,
        vec![
            sp(0xc000, 8, 0),
            sp(0xc001, 24, -16),
            sp(0xc010, 32, -16),
            UnwindRow::cfa_deref(RowKind::CfaDerefDrap, DWARF_RSP, 16, 8).at(0xc020),
            kind_at(0xc030, RowKind::NoInfo),
        ]
    );
}

#[test]
fn inexpressible_rules_become_unsupported_rows() {
    let mut other_expression = Expression::new();
    other_expression.op_breg(X86_64::RSP, 8);
    other_expression.op_breg(X86_64::RSP, 0);
    other_expression.op(constants::DW_OP_plus);
    let mut double_deref = breg_deref(X86_64::RSP, 8);
    double_deref.op_deref();
    let double_deref_2 = double_deref.clone();
    let mut huge_expression = Expression::new();
    for _ in 0..20 {
        huge_expression.op(constants::DW_OP_nop);
    }
    let cases: Vec<(&str, Vec<(u32, Cfi)>)> = vec![
        (
            "CFA in a vector register",
            vec![(0, Cfi::Cfa(X86_64::XMM0, 8))],
        ),
        (
            "CFA read twice",
            vec![(0, Cfi::CfaExpression(double_deref))],
        ),
        (
            "CFA read from too far",
            vec![(0, Cfi::CfaExpression(breg_deref(X86_64::RSP, 40_000)))],
        ),
        (
            "signal-like CFA with a non-register return address",
            vec![
                (0, Cfi::CfaExpression(breg_deref(X86_64::RSP, 160))),
                (0, Cfi::Expression(X86_64::RA, double_deref_2)),
            ],
        ),
        (
            "unknown CFA expression",
            vec![(0, Cfi::CfaExpression(other_expression))],
        ),
        (
            "overlong CFA expression",
            vec![(0, Cfi::CfaExpression(huge_expression))],
        ),
        (
            "return address in a register",
            vec![(0, Cfi::Register(X86_64::RA, Register(1)))],
        ),
        (
            "return address as a value",
            vec![(0, Cfi::ValOffset(X86_64::RA, -8))],
        ),
        (
            "return address too far",
            vec![(0, Cfi::Offset(X86_64::RA, -8 * 1000))],
        ),
        (
            "RBP as a value",
            vec![(0, Cfi::ValOffset(X86_64::RBP, -16))],
        ),
        (
            "RBP in another register",
            vec![(0, Cfi::Register(X86_64::RBP, Register(9)))],
        ),
        (
            "RBP saved too far",
            vec![(0, Cfi::Offset(X86_64::RBP, -8 * 10_000))],
        ),
        (
            "RBP saved relative to another register",
            vec![(0, Cfi::Expression(X86_64::RBP, breg(X86_64::RBX, 8)))],
        ),
        (
            "RBP as a value expression",
            vec![(0, Cfi::ValExpression(X86_64::RBP, breg(X86_64::RSP, 8)))],
        ),
        (
            "RBP saved at the CFA itself",
            vec![(0, Cfi::Offset(X86_64::RBP, 0))],
        ),
    ];
    for (what, instructions) in cases {
        let rows = rows_of(vec![fde(0x8000, 0x10, instructions)]);
        assert_eq!(
            rows,
            vec![
                kind_at(0x8000, RowKind::Unsupported),
                kind_at(0x8010, RowKind::NoInfo)
            ],
            "{what}"
        );
    }
}

#[test]
fn overlapping_and_out_of_range_fdes_are_dropped() {
    let (rows, stats) = compile_eh(vec![
        fde(0x9000, 0x20, vec![]),
        // Overlaps the first: dropped.
        fde(0x9010, 0x20, vec![(0, Cfi::CfaOffset(64))]),
        // Above 4 GiB: dropped.
        fde(0x1_0000_0000, 0x10, vec![]),
        // Empty: dropped.
        fde(0x9100, 0, vec![]),
    ]);
    assert_eq!(
        rows,
        vec![sp(0x9000, 8, 0), kind_at(0x9020, RowKind::NoInfo)]
    );
    assert_eq!(stats.fdes, 1);
    assert_eq!(stats.skipped_fdes, 3);
}

#[test]
fn debug_frame_sections_compile_too() {
    let table = frame_table(vec![fde(0xa000, 0x10, vec![(1, Cfi::CfaOffset(16))])]);
    let mut debug_frame = gimli::write::DebugFrame(EndianVec::new(LittleEndian));
    table.write_debug_frame(&mut debug_frame).unwrap();
    let mut section = gimli::DebugFrame::new(debug_frame.0.slice(), LittleEndian);
    section.set_address_size(8);
    let mut fdes = Vec::new();
    let mut stats = CompileStats::default();
    collect_fdes(
        Isa::X86_64,
        &section,
        &gimli::BaseAddresses::default(),
        &mut fdes,
        &mut stats,
    );
    assert_eq!(
        assemble_rows(fdes, &mut stats),
        vec![
            sp(0xa000, 8, 0),
            sp(0xa001, 16, 0),
            kind_at(0xa010, RowKind::NoInfo)
        ]
    );
}

#[test]
fn garbage_sections_do_not_panic() {
    // Truncations and corruptions of a valid section, and plain noise.
    let mut eh_frame = gimli::write::EhFrame(EndianVec::new(LittleEndian));
    frame_table(vec![
        fde(0x1000, 0x30, vec![(1, Cfi::CfaOffset(16))]),
        fde(0x2000, 0x30, vec![(1, Cfi::RestoreState)]),
    ])
    .write_eh_frame(&mut eh_frame)
    .unwrap();
    let valid = eh_frame.0.slice().to_vec();
    for cut in 0..valid.len() {
        let _ = compile_eh_frame_bytes(&valid[..cut]);
    }
    let mut state = 0x2545_f491_4f6c_dd1du64;
    for round in 0..200 {
        let mut bytes = valid.clone();
        for _ in 0..1 + round % 4 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let index = (state as usize) % bytes.len();
            bytes[index] = (state >> 32) as u8;
        }
        let (rows, _) = compile_eh_frame_bytes(&bytes);
        assert!(rows.windows(2).all(|w| w[0].start < w[1].start));
    }
    // A restore_state without remember_state fails cleanly: one row.
    let (rows, stats) = compile_eh_frame_bytes(&valid);
    assert_eq!(stats.failed_fdes, 1);
    assert!(rows.contains(&kind_at(0x2000, RowKind::Unsupported)));
}

#[test]
fn compiles_own_executable_and_maps_pcs() {
    let exe = std::fs::read("/proc/self/exe").unwrap();
    let table = compile_elf(exe.as_slice(), None).unwrap();
    assert!(table.stats.fdes > 100, "{:?}", table.stats);
    assert!(table.rows.windows(2).all(|w| w[0].start < w[1].start));
    let mut processes = ProcessTable::new();
    let pid = std::process::id();
    processes.load_from_proc(pid).unwrap();
    let here = compiles_own_executable_and_maps_pcs as *const () as u64;
    let mapping = processes.find_mapping(pid, here).unwrap();
    let bias = table
        .bias_for_mapping(mapping.start, mapping.file_offset)
        .unwrap();
    // A Rust function's entry: CFA = RSP + 8.
    assert_eq!(
        table.row_for(here - bias),
        Some(&sp(table.row_for(here - bias).unwrap().start, 8, 0))
    );
}

// ---------------------------------------------------------------------
// Unwinder on synthetic stacks.

const PID: u32 = 4242;
const MAP_START: u64 = 0x10000;
const STACK: u64 = 0x7ff0_0000;

/// A process with one mapping of a fake file whose table has:
/// f1 [0x1000, 0x1100): CFA = SP + 16, RBP unchanged
/// f2 [0x1100, 0x1200): CFA = SP + 32, RBP at CFA - 16
/// main [0x1200, 0x1300): CFA = RBP + 16, RBP at CFA - 16
/// _start [0x1300, 0x1310): outermost
/// trampoline [0x1400, 0x1410): signal frame
/// no CFI [0x1500, 0x1600)
fn synthetic() -> (ProcessTable, Unwinder) {
    with_rows(vec![
        sp(0x1000, 16, 0),
        sp(0x1100, 32, -16),
        fp(0x1200, 16, -16),
        kind_at(0x1300, RowKind::Stop),
        kind_at(0x1310, RowKind::NoInfo),
        UnwindRow::signal(160, 21, 120).at(0x1400),
        kind_at(0x1410, RowKind::NoInfo),
    ])
}

/// A process with one mapping at `MAP_START` of a fake file with `rows`.
fn with_rows(rows: Vec<UnwindRow>) -> (ProcessTable, Unwinder) {
    let mut processes = ProcessTable::new();
    processes.add_mapping(&MappingRecord {
        pid: PID,
        start: MAP_START,
        len: 0x10000,
        file_offset: 0,
        dev: 1,
        inode: 99,
        prot: (libc::PROT_READ | libc::PROT_EXEC) as u32,
        path: "/synthetic/prog".into(),
    });
    let table = UnwindTable {
        rows: rows.into(),
        segments: vec![LoadSegment {
            file_offset: 0,
            vaddr: 0,
            file_size: 0x10000,
        }],
        stats: CompileStats::default(),
    };
    let mut unwinder = Unwinder::new();
    let file = processes.find_mapping(PID, MAP_START).unwrap().file.clone();
    unwinder
        .tables()
        .preload(file, content_key(b"synthetic"), table);
    (processes, unwinder)
}

/// Stack bytes from `STACK`, with `words` stored at the given addresses.
fn stack_with(len: usize, words: &[(u64, u64)]) -> Vec<u8> {
    let mut stack = vec![0u8; len];
    for &(addr, value) in words {
        let offset = (addr - STACK) as usize;
        stack[offset..offset + 8].copy_from_slice(&value.to_le_bytes());
    }
    stack
}

/// f1 -> f2 -> main -> _start. f1 returns to 0x1200, the first byte after
/// f2: only a `pc - 1` lookup finds f2's rule.
fn four_frame_stack() -> (UserRegs, Vec<u8>) {
    let main_rbp = STACK + 0x80;
    let words = [
        (STACK + 8, MAP_START + 0x1200),       // f1's return address
        (STACK + 16 + 16, main_rbp),           // f2 saved main's RBP
        (STACK + 16 + 24, MAP_START + 0x1250), // f2's return address
        (main_rbp, 0),                         // main saved _start's RBP
        (main_rbp + 8, MAP_START + 0x1305),    // main's return address
    ];
    let regs = UserRegs::new(MAP_START + 0x1050, STACK, 0x1234);
    (regs, stack_with(0x100, &words))
}

#[test]
fn walks_synthetic_stack_to_the_root() {
    let (processes, mut unwinder) = synthetic();
    let (regs, stack) = four_frame_stack();
    let mut frames = Vec::new();
    let end = unwinder.unwind(&processes, PID, &regs, &stack, 64, &mut frames);
    assert_eq!(end, StackEnd::Complete);
    assert_eq!(
        frames,
        vec![
            MAP_START + 0x1050,
            MAP_START + 0x1200,
            MAP_START + 0x1250,
            MAP_START + 0x1305
        ]
    );
    assert_eq!(unwinder.stats().table_steps, 4);
}

#[test]
fn reports_why_a_walk_stopped() {
    let (processes, mut unwinder) = synthetic();
    let (regs, stack) = four_frame_stack();
    let mut frames = Vec::new();
    // Depth limit.
    assert_eq!(
        unwinder.unwind(&processes, PID, &regs, &stack, 2, &mut frames),
        StackEnd::DepthLimit
    );
    assert_eq!(frames.len(), 2);
    // The copy ends before main's frame.
    frames.clear();
    assert_eq!(
        unwinder.unwind(&processes, PID, &regs, &stack[..0x40], 64, &mut frames),
        StackEnd::StackExhausted
    );
    assert_eq!(frames.len(), 3);
    // A return address in no mapping.
    frames.clear();
    let bad = stack_with(0x100, &[(STACK + 8, 0xdead_0000)]);
    assert_eq!(
        unwinder.unwind(&processes, PID, &regs, &bad, 64, &mut frames),
        StackEnd::BadAddress
    );
    assert_eq!(frames, vec![MAP_START + 0x1050, 0xdead_0000]);
    // A zero return address ends the stack (Go's goroutines end so: their
    // `.debug_frame` CFI does not mark `runtime.goexit` as a root).
    frames.clear();
    let zero = stack_with(0x100, &[]);
    assert_eq!(
        unwinder.unwind(&processes, PID, &regs, &zero, 64, &mut frames),
        StackEnd::Complete
    );
    assert_eq!(frames, vec![MAP_START + 0x1050]);
    // Nothing at all to read.
    frames.clear();
    assert_eq!(
        unwinder.unwind(&processes, PID, &regs, &[], 64, &mut frames),
        StackEnd::StackExhausted
    );
    // max_frames 0 pushes nothing.
    frames.clear();
    assert_eq!(
        unwinder.unwind(&processes, PID, &regs, &stack, 0, &mut frames),
        StackEnd::DepthLimit
    );
    assert!(frames.is_empty());
}

#[test]
fn signal_frames_resume_at_the_exact_interrupted_pc() {
    let (processes, mut unwinder) = synthetic();
    // In the trampoline; the ucontext says the signal hit f2 at its very
    // first byte (0x1100): looked up as is, not as 0x10ff (f1).
    let interrupted_sp = STACK + 0x200;
    let stack = stack_with(
        0x300,
        &[
            (STACK + 160, interrupted_sp),
            (STACK + 168, MAP_START + 0x1100),
            (STACK + 120, 0),
            (interrupted_sp + 24, MAP_START + 0x1305), // f2's RA: _start
        ],
    );
    let regs = UserRegs::new(MAP_START + 0x1402, STACK, 7);
    let mut frames = Vec::new();
    let end = unwinder.unwind(&processes, PID, &regs, &stack, 64, &mut frames);
    assert_eq!(end, StackEnd::Complete);
    assert_eq!(
        frames,
        vec![MAP_START + 0x1402, MAP_START + 0x1100, MAP_START + 0x1305]
    );
    // A signal frame that moves SP down makes no progress.
    frames.clear();
    let backwards = stack_with(
        0x300,
        &[
            (STACK + 160, STACK - 0x100),
            (STACK + 168, MAP_START + 0x1100),
        ],
    );
    assert_eq!(
        unwinder.unwind(&processes, PID, &regs, &backwards, 64, &mut frames),
        StackEnd::NoProgress
    );
}

#[test]
fn frame_pointers_where_there_is_no_row() {
    let (processes, mut unwinder) = synthetic();
    // In the CFI-less range; RBP chain: frame at STACK+0x20 returns into
    // main, whose frame at STACK+0x80 returns to _start.
    let stack = stack_with(
        0x100,
        &[
            (STACK + 0x20, STACK + 0x80),
            (STACK + 0x28, MAP_START + 0x1250),
            (STACK + 0x80, 0),
            (STACK + 0x88, MAP_START + 0x1305),
        ],
    );
    let regs = UserRegs::new(MAP_START + 0x1550, STACK, STACK + 0x20);
    let mut frames = Vec::new();
    let end = unwinder.unwind(&processes, PID, &regs, &stack, 64, &mut frames);
    assert_eq!(end, StackEnd::Complete);
    assert_eq!(
        frames,
        vec![MAP_START + 0x1550, MAP_START + 0x1250, MAP_START + 0x1305]
    );
    assert_eq!(unwinder.stats().frame_pointer_steps, 1);
    // A garbage RBP in a CFI-less range: no unwind info.
    frames.clear();
    let garbage = UserRegs { bp: 0x10, ..regs };
    assert_eq!(
        unwinder.unwind(&processes, PID, &garbage, &stack, 64, &mut frames),
        StackEnd::NoUnwindInfo
    );
    // A chain that goes on past the copied bytes: the copy was too short.
    frames.clear();
    assert_eq!(
        unwinder.unwind(&processes, PID, &regs, &stack[..0x24], 64, &mut frames),
        StackEnd::StackExhausted
    );
    assert_eq!(frames, vec![MAP_START + 0x1550]);
}

#[test]
fn cache_shares_tables_and_evicts_within_budget() {
    let exe = std::fs::read("/proc/self/exe").unwrap();
    let table = compile_elf(exe.as_slice(), None).unwrap();
    let size = table.size_bytes();
    // Room for one table only.
    let mut cache = TableCache::with_limit(size + size / 2);
    let mut processes = ProcessTable::new();
    let pid = std::process::id();
    processes.load_from_proc(pid).unwrap();
    let here = cache_shares_tables_and_evicts_within_budget as *const () as u64;
    let mapping = processes.find_mapping(pid, here).unwrap().clone();
    let (first, _) = cache.table_for_mapping(pid, &mapping).unwrap();
    let (again, _) = cache.table_for_mapping(pid, &mapping).unwrap();
    assert!(Arc::ptr_eq(&first, &again));
    // Built here, or taken from another cache of this test process.
    let stats = cache.stats();
    assert_eq!(stats.tables_built + stats.tables_shared, 1);
    let shared_before = stats.tables_shared;
    // A copy of the file (another inode, the same bytes) shares the table
    // through its content's digest.
    let copy = std::env::temp_dir().join(format!("ddprof-cache-twin-{pid}"));
    std::fs::copy("/proc/self/exe", &copy).unwrap();
    let metadata = std::fs::metadata(&copy).unwrap();
    let mut twin = mapping.clone();
    twin.file = Arc::new(crate::files::MappedFile {
        path: copy.to_string_lossy().into_owned(),
        dev: std::os::unix::fs::MetadataExt::dev(&metadata),
        inode: std::os::unix::fs::MetadataExt::ino(&metadata),
    });
    let (shared, _) = cache.table_for_mapping(pid, &twin).unwrap();
    assert!(Arc::ptr_eq(&first, &shared));
    assert_eq!(cache.stats().tables_shared, shared_before + 1);
    // Another file at the mapped path (same inode number, another
    // device: not the mapped file) is not read at all.
    let mut impostor = mapping.clone();
    impostor.file = Arc::new(crate::files::MappedFile {
        dev: twin.file.dev ^ 0xff,
        ..(*twin.file).clone()
    });
    assert!(cache.table_for_mapping(pid, &impostor).is_none());
    std::fs::remove_file(&copy).unwrap();
    // A second, different table does not fit: the first is evicted.
    cache.preload(
        Arc::new(crate::files::MappedFile {
            path: "/other".into(),
            dev: 0,
            inode: 1,
        }),
        content_key(b"other"),
        table,
    );
    assert_eq!(cache.stats().tables_evicted, 1);
    assert!(cache.cached_bytes() <= size + size / 2);
}

#[test]
fn caches_of_one_process_share_the_tables_they_hold() {
    // The BPF engine's and the perf engine's caches: the second to need a
    // file takes the first's table instead of compiling it again.
    let mut processes = ProcessTable::new();
    let pid = std::process::id();
    processes.load_from_proc(pid).unwrap();
    let here = caches_of_one_process_share_the_tables_they_hold as *const () as u64;
    let mapping = processes.find_mapping(pid, here).unwrap().clone();
    let mut bpf = TableCache::default();
    let mut perf = TableCache::default();
    let (compiled, _) = bpf.table_for_mapping(pid, &mapping).unwrap();
    let (taken, _) = perf.table_for_mapping(pid, &mapping).unwrap();
    assert!(Arc::ptr_eq(&compiled, &taken));
    assert_eq!(perf.stats().tables_built, 0);
    assert_eq!(perf.stats().tables_shared, 1);
    assert_eq!(perf.cached_bytes(), compiled.table.size_bytes());
    // Once no cache holds it, it is compiled again.
    drop((bpf, perf, compiled, taken));
    let mut later = TableCache::default();
    let (again, _) = later.table_for_mapping(pid, &mapping).unwrap();
    assert!(again.table.size_bytes() > 0);
}

#[test]
fn caches_that_need_one_table_at_once_make_it_once() {
    // The BPF engine's sync thread and the perf engine's table thread meet
    // a new process's libraries at the same moment: the second waits for
    // the first's table instead of making its own. A copy of this test's
    // executable with bytes of its own: no other test holds its table.
    let pid = std::process::id();
    let copy = std::env::temp_dir().join(format!("ddprof-cache-flight-{pid}"));
    let mut bytes = std::fs::read("/proc/self/exe").unwrap();
    bytes.extend_from_slice(format!("flight {pid} {:?}", std::time::SystemTime::now()).as_bytes());
    std::fs::write(&copy, &bytes).unwrap();
    let metadata = std::fs::metadata(&copy).unwrap();
    let file = crate::files::MappedFile {
        path: copy.to_string_lossy().into_owned(),
        dev: std::os::unix::fs::MetadataExt::dev(&metadata),
        inode: std::os::unix::fs::MetadataExt::ino(&metadata),
    };
    let start = std::sync::Barrier::new(2);
    let (tables, stats): (Vec<_>, Vec<_>) = std::thread::scope(|scope| {
        let threads: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    let mut cache = TableCache::default();
                    start.wait();
                    let table = cache.load(pid, &file, None).unwrap();
                    (table, cache.stats())
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).unzip()
    });
    std::fs::remove_file(&copy).unwrap();
    assert!(Arc::ptr_eq(&tables[0], &tables[1]));
    let built: u64 = stats.iter().map(|s| s.tables_built).sum();
    let shared: u64 = stats.iter().map(|s| s.tables_shared).sum();
    assert_eq!((built, shared), (1, 1), "{stats:?}");
}

#[test]
fn vdso_table_comes_from_our_own_vdso() {
    let mut cache = TableCache::default();
    let vdso = crate::files::MappedFile {
        path: "[vdso]".into(),
        dev: 0,
        inode: 0,
    };
    let table = cache.load(1, &vdso, None).expect("the vDSO has .eh_frame");
    assert!(table.table.stats.fdes > 0, "{:?}", table.table.stats);
    // The vDSO is linked at 0 and mapped from file offset 0.
    assert_eq!(
        table.table.bias_for_mapping(0x7fff_0000_0000, 0),
        Some(0x7fff_0000_0000)
    );
    // A second process's vDSO shares it.
    let again = cache.load(2, &vdso, None).unwrap();
    assert!(Arc::ptr_eq(&table, &again));
    // Special mappings without a file get no table, cleanly.
    let heap = crate::files::MappedFile {
        path: "[heap]".into(),
        dev: 0,
        inode: 0,
    };
    assert!(matches!(
        cache.load(1, &heap, None),
        Err(cache::LoadError::NotAFile(_))
    ));
}

#[test]
fn deleted_files_are_read_through_map_files() {
    // Run a copy of `sleep`, then delete it (as a package upgrade does):
    // only /proc/PID/map_files still reaches the mapped file.
    let copy = std::env::temp_dir().join(format!("ddprof-deleted-sleep-{}", std::process::id()));
    std::fs::copy("/bin/sleep", &copy).unwrap();
    let mut child = std::process::Command::new(&copy).arg("30").spawn().unwrap();
    let pid = child.id();
    // Wait until the copy, not the loader, is mapped (exec is done).
    let mut processes = ProcessTable::new();
    let copy_path = copy.to_str().unwrap().to_string();
    for _ in 0..1000 {
        processes.load_from_proc(pid).unwrap();
        let mapped = processes
            .get(pid)
            .unwrap()
            .mappings
            .iter()
            .any(|m| m.file.path == copy_path);
        if mapped {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::fs::remove_file(&copy).unwrap();
    processes.load_from_proc(pid).unwrap();
    let mapping = processes
        .get(pid)
        .unwrap()
        .mappings
        .iter()
        .find(|m| m.file.path.starts_with(&copy_path))
        .cloned()
        .expect("the deleted copy is still mapped");
    assert!(
        mapping.file.path.ends_with("(deleted)"),
        "{}",
        mapping.file.path
    );
    let mut cache = TableCache::default();
    let found = cache.table_for_mapping(pid, &mapping);
    let _ = child.kill();
    let _ = child.wait();
    let (table, _bias) = found.expect("read through map_files");
    assert!(table.table.stats.fdes > 10, "{:?}", table.table.stats);
}

#[test]
fn bias_uses_the_segment_holding_the_mapping_even_unaligned() {
    // GNU ld: the code segment starts on a page boundary.
    let gnu = [LoadSegment {
        file_offset: 0x1000,
        vaddr: 0x401000,
        file_size: 0x2000,
    }];
    // Mapped at 0x5000 from file offset 0x1000: vaddr = pc - 0x5000 + 0x401000.
    let bias = LoadSegment::bias_for_mapping(&gnu, 0x5000, 0x1000).unwrap();
    assert_eq!(0x5010u64.wrapping_sub(bias), 0x401010);
    assert!(LoadSegment::bias_for_mapping(&gnu, 0x5000, 0x4000).is_none());
    // lld packs segments: `R E` at p_offset 0x810, p_vaddr 0x1810, which the
    // kernel maps from file offset 0 (the page holding 0x810).
    let lld = [LoadSegment {
        file_offset: 0x810,
        vaddr: 0x1810,
        file_size: 0x410,
    }];
    let bias = LoadSegment::bias_for_mapping(&lld, 0x5555_5555_5000, 0).unwrap();
    assert_eq!(0x5555_5555_5820u64.wrapping_sub(bias), 0x1820);
}

/// main [0x1200, 0x1300) with frame pointers, _start, a leaf helper that
/// keeps every register, one that pushes RBX, an OpenSSL-like function
/// (CFA = RAX + 8, then CFA = *(RSP + 40) + 8; RBP at CFA - 24) and a PLT
/// entry — all compiled from hand-made CFI.
fn assembly_process() -> (ProcessTable, Unwinder) {
    let rows = rows_of(vec![
        fde(
            0x1200,
            0x100,
            vec![
                (1, Cfi::CfaOffset(16)),
                (1, Cfi::Offset(X86_64::RBP, -16)),
                (4, Cfi::CfaRegister(X86_64::RBP)),
            ],
        ),
        fde(0x1300, 0x10, vec![(0, Cfi::Undefined(X86_64::RA))]),
        fde(0x2000, 0x10, vec![]),
        fde(
            0x2010,
            0x10,
            vec![(1, Cfi::CfaOffset(16)), (1, Cfi::Offset(X86_64::RBX, -16))],
        ),
        fde(
            0x2100,
            0x100,
            vec![
                (0, Cfi::CfaRegister(X86_64::RAX)),
                (0, Cfi::Offset(X86_64::RBX, -16)),
                (0, Cfi::Offset(X86_64::RBP, -24)),
                (
                    0x40,
                    Cfi::CfaExpression(breg_deref_plus(X86_64::RSP, 40, 8)),
                ),
            ],
        ),
        fde(
            0x3000,
            0x20,
            vec![(0, Cfi::CfaExpression(plt_expression(11)))],
        ),
    ]);
    with_rows(rows)
}

/// main's frame at STACK + 0x80, returning to _start.
const MAIN_RBP: u64 = STACK + 0x80;
const MAIN_FRAME: [(u64, u64); 2] = [(MAIN_RBP, 0), (MAIN_RBP + 8, MAP_START + 0x1305)];

/// The OpenSSL-like function's frame: CFA = STACK + 0x68, returning into
/// main, main's RBP saved at CFA - 24.
const ASSEMBLY_CFA: u64 = STACK + 0x68;

fn assembly_frame() -> Vec<(u64, u64)> {
    let mut words = vec![
        (ASSEMBLY_CFA - 8, MAP_START + 0x1250),
        (ASSEMBLY_CFA - 24, MAIN_RBP),
    ];
    words.extend(MAIN_FRAME);
    words
}

fn walk(
    processes: &ProcessTable,
    unwinder: &mut Unwinder,
    regs: &UserRegs,
    words: &[(u64, u64)],
) -> (StackEnd, Vec<u64>) {
    let stack = stack_with(0x100, words);
    let mut frames = Vec::new();
    let end = unwinder.unwind(processes, PID, regs, &stack, 64, &mut frames);
    let frames = frames.iter().map(|pc| pc - MAP_START).collect();
    (end, frames)
}

/// Registers of a sample: all known, RAX = `rax`.
fn sampled(ip: u64, bp: u64, rax: u64) -> UserRegs {
    let mut regs = UserRegs::new(MAP_START + ip, STACK, bp);
    regs.others[usize::from(RAX)] = rax;
    regs.known = UserRegs::ALL_KNOWN;
    regs
}

#[test]
fn cfa_in_another_register_unwinds_with_the_sampled_value() {
    let (processes, mut unwinder) = assembly_process();
    let words = assembly_frame();
    // In the function itself, RAX = CFA - 8.
    let regs = sampled(0x2110, 7, ASSEMBLY_CFA - 8);
    let (end, frames) = walk(&processes, &mut unwinder, &regs, &words);
    assert_eq!(end, StackEnd::Complete);
    assert_eq!(frames, vec![0x2110, 0x1250, 0x1305]);
    // Without the sample's RAX there is no rule: frame pointers (RBP = 7
    // is none) do not reach the root.
    let (end, frames) = walk(
        &processes,
        &mut unwinder,
        &UserRegs::new(MAP_START + 0x2110, STACK, 7),
        &words,
    );
    assert_ne!(end, StackEnd::Complete);
    assert_eq!(frames, vec![0x2110]);
    assert_eq!(unwinder.stats().unsupported_steps, 1);
}

#[test]
fn registers_keep_their_value_through_helpers_that_leave_them_alone() {
    let (processes, mut unwinder) = assembly_process();
    // A leaf helper (CFA = RSP + 8) called from the function's RAX range
    // (AES-GCM's `_aesni_ctr32_ghash_6x`): RAX is still the caller's.
    let mut words = assembly_frame();
    words.push((STACK, MAP_START + 0x2120));
    let (end, frames) = walk(
        &processes,
        &mut unwinder,
        &sampled(0x2005, 7, ASSEMBLY_CFA - 8),
        &words,
    );
    assert_eq!(end, StackEnd::Complete);
    assert_eq!(frames, vec![0x2005, 0x2120, 0x1250, 0x1305]);
    // A helper that pushed RBX may have changed any of them: the caller's
    // RAX is not trusted.
    let mut words = assembly_frame();
    words.push((STACK + 8, MAP_START + 0x2120));
    let (end, frames) = walk(
        &processes,
        &mut unwinder,
        &sampled(0x2015, 7, ASSEMBLY_CFA - 8),
        &words,
    );
    assert_ne!(end, StackEnd::Complete);
    assert_eq!(frames, vec![0x2015, 0x2120]);
}

#[test]
fn cfa_read_from_the_frame_unwinds() {
    let (processes, mut unwinder) = assembly_process();
    // The entry SP - 8 was stored at RSP + 40; no other register needed.
    let mut words = assembly_frame();
    words.push((STACK + 40, ASSEMBLY_CFA - 8));
    let regs = UserRegs::new(MAP_START + 0x2150, STACK, 7);
    let (end, frames) = walk(&processes, &mut unwinder, &regs, &words);
    assert_eq!(end, StackEnd::Complete);
    assert_eq!(frames, vec![0x2150, 0x1250, 0x1305]);
    // From a helper it called: RSP + 40 as of the caller's frame.
    let mut words = assembly_frame();
    words.push((STACK, MAP_START + 0x2160));
    words.push((STACK + 8 + 40, ASSEMBLY_CFA - 8));
    let regs = UserRegs::new(MAP_START + 0x2008, STACK, 7);
    let (end, frames) = walk(&processes, &mut unwinder, &regs, &words);
    assert_eq!(end, StackEnd::Complete);
    assert_eq!(frames, vec![0x2008, 0x2160, 0x1250, 0x1305]);
    // The saved SP lies outside the copied bytes: the copy was too short.
    let regs = UserRegs::new(MAP_START + 0x2150, STACK, 7);
    let mut frames = Vec::new();
    let stack = stack_with(0x100, &words);
    assert_eq!(
        unwinder.unwind(&processes, PID, &regs, &stack[..0x20], 64, &mut frames),
        StackEnd::StackExhausted
    );
}

#[test]
fn plt_entry_after_its_push() {
    let (processes, mut unwinder) = assembly_process();
    // In a lazy PLT entry after `push $n` (byte 11): the return address is
    // one word up.
    let mut words = MAIN_FRAME.to_vec();
    words.push((STACK + 8, MAP_START + 0x1250));
    let regs = UserRegs::new(MAP_START + 0x301b, STACK, MAIN_RBP);
    let (end, frames) = walk(&processes, &mut unwinder, &regs, &words);
    assert_eq!(end, StackEnd::Complete);
    assert_eq!(frames, vec![0x301b, 0x1250, 0x1305]);
    // Before it, at SP.
    let mut words = MAIN_FRAME.to_vec();
    words.push((STACK, MAP_START + 0x1250));
    let regs = UserRegs::new(MAP_START + 0x3016, STACK, MAIN_RBP);
    let (end, frames) = walk(&processes, &mut unwinder, &regs, &words);
    assert_eq!(end, StackEnd::Complete);
    assert_eq!(frames, vec![0x3016, 0x1250, 0x1305]);
}

/// The row cache gives what a search of the table gives, whatever fills
/// its slots first: every address of two tables whose rows differ at the
/// same addresses, looked up in two interleaved rounds (the second hits the
/// cache, or a slot the other table took since).
#[test]
fn the_row_cache_answers_as_the_table_does() {
    let table_of = |offset: i32| UnwindTable {
        rows: (0..64u32)
            .map(|i| {
                let mut row = UnwindRow::with_kind(0x1000 + i * 16, RowKind::Cfa);
                row.cfa_offset = 8 + offset + i as i32;
                row
            })
            .chain([UnwindRow::with_kind(0x1400, RowKind::NoInfo)])
            .collect::<Vec<_>>()
            .into(),
        segments: vec![LoadSegment {
            file_offset: 0,
            vaddr: 0,
            file_size: 0x2000,
        }],
        stats: CompileStats::default(),
    };
    let mut cache = TableCache::default();
    let mut tables = Vec::new();
    for (n, offset) in [(1u64, 0), (2, 1000)] {
        let file = Arc::new(crate::files::MappedFile {
            path: format!("/row-cache/{n}"),
            dev: 0,
            inode: n,
        });
        cache.preload(
            file.clone(),
            content_key(format!("row-cache-{n}").as_bytes()),
            table_of(offset),
        );
        let mapping = Mapping {
            start: 0x10000,
            end: 0x12000,
            file_offset: 0,
            file,
        };
        tables.push(cache.table_for_mapping(1, &mapping).unwrap().0);
    }
    assert_ne!(tables[0].id, tables[1].id);
    let mut rows = RowCache::default();
    for _round in 0..2 {
        for vaddr in 0xff0..0x1420u64 {
            for table in &tables {
                let expected = table
                    .table
                    .row_for(vaddr)
                    .filter(|row| row.row_kind() != RowKind::NoInfo)
                    .copied();
                assert_eq!(rows.rule(table, vaddr), expected, "{vaddr:#x}");
            }
        }
    }
}

/// Without loading, a walk that reaches a file whose table was never looked
/// for gives up (its caller copies the sample for later); once the table
/// is there, it gives the same frames as the ordinary walk.
#[test]
fn a_walk_that_may_not_load_tables_stops_at_an_unknown_file() {
    use super::TableLoading::KnownOnly;
    let (processes, mut loaded) = synthetic();
    let (regs, stack) = four_frame_stack();
    let mut expected = Vec::new();
    let end = loaded.unwind(&processes, PID, &regs, &stack, 64, &mut expected);
    let mut frames = Vec::new();
    assert_eq!(
        loaded.unwind_with(&processes, PID, &regs, &stack, 64, &mut frames, KnownOnly),
        Some(end)
    );
    assert_eq!(frames, expected);

    // A fresh unwinder has looked for no table: the fake file is unknown.
    let mut fresh = Unwinder::new();
    frames.clear();
    assert_eq!(
        fresh.unwind_with(&processes, PID, &regs, &stack, 64, &mut frames, KnownOnly),
        None
    );
    // An ordinary walk looks for it (the file does not exist: frame
    // pointers), after which the table is known not to be had.
    frames.clear();
    let without_table = fresh.unwind(&processes, PID, &regs, &stack, 64, &mut frames);
    let mut again = Vec::new();
    assert_eq!(
        fresh.unwind_with(&processes, PID, &regs, &stack, 64, &mut again, KnownOnly),
        Some(without_table)
    );
    assert_eq!(again, frames);
}

/// The read ahead at start-up ([`cache::StoredTableRead`]) must stay
/// cheap: its cache reads what another cache stored, from the mapped store
/// file, and neither compiles nor hashes a file it has not seen.
#[test]
fn a_stored_only_cache_reads_what_another_stored_and_never_compiles() {
    use crate::unwind::cache::{LoadError, TableCache};
    use crate::unwind::compile::Rows;
    use std::os::unix::fs::MetadataExt;
    let dir = std::env::temp_dir().join(format!("ddprof-stored-only-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // A fresh copy: no cache of this process knows its digest.
    let program = dir.join("prog");
    std::fs::copy("/usr/bin/true", &program).unwrap();
    let metadata = std::fs::metadata(&program).unwrap();
    let file = crate::files::MappedFile {
        path: program.to_str().unwrap().to_string(),
        dev: metadata.dev(),
        inode: metadata.ino(),
    };
    let store = TableStore::new(dir.join("store"));
    let pid = std::process::id();
    let mut reader = TableCache::default()
        .with_store(Some(store.clone()))
        .stored_only();
    assert!(matches!(
        reader.load(pid, &file, None),
        Err(LoadError::NotStored(_))
    ));
    assert_eq!(reader.stats().tables_built, 0);
    // Not hashed either (a digest taken is remembered).
    let opened = std::fs::File::open(&program).unwrap();
    assert!(crate::files::digest::remembered(&opened).is_none());
    let compiled_rows = {
        let mut compiler = TableCache::default().with_store(Some(store));
        let compiled = compiler.load(pid, &file, None).unwrap();
        assert!(matches!(compiled.table.rows, Rows::Compiled(_)));
        compiled.table.rows.to_vec()
    };
    let stored = reader.load(pid, &file, None).unwrap();
    assert!(matches!(stored.table.rows, Rows::Stored(_)));
    assert_eq!(*stored.table.rows, compiled_rows[..]);
    assert_eq!(
        (
            reader.stats().tables_built,
            reader.stats().tables_from_store
        ),
        (0, 1)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

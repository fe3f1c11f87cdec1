//! arm64's call frame information as rows (see `ddprof_common::unwind`'s
//! "Architectures"): a CFA on SP or X29, the caller's X29 and the return
//! address X30 saved in the frame or (X30) not saved yet, and the PLT
//! stubs, which have no CFI.
use ddprof_common::unwind::{
    RowKind, UnwindRow, DWARF_RBP, DWARF_RSP, LR_AT_FP_FIELD, LR_BESIDE_FP,
};
use gimli::{AArch64, CfaRule, RegisterRule, UnwindTableRow};
use object::{Object, ObjectSection};

use super::compile::{FdeRows, UNSUPPORTED};

/// Translates one gimli row of an arm64 file: a CFA on SP or X29 plus an
/// offset, the caller's X29 and the return address (X30) saved at offsets
/// from the CFA or left in their registers. Rules for other registers only
/// mark the frame as changing them; anything else (expressions: signal
/// trampolines, hand-written code) is left to frame pointers.
pub(super) fn convert_row(row: &UnwindTableRow<usize>) -> UnwindRow {
    let cfa = match row.cfa() {
        CfaRule::RegisterAndOffset { register, offset } => {
            let base = match *register {
                AArch64::SP => DWARF_RSP,
                AArch64::X29 => DWARF_RBP,
                _ => return UNSUPPORTED,
            };
            match i32::try_from(*offset) {
                Ok(offset) => UnwindRow::cfa(base, offset),
                Err(_) => return UNSUPPORTED,
            }
        }
        CfaRule::Expression(_) => return UNSUPPORTED,
    };
    let converted = match row.register(AArch64::X29) {
        None | Some(RegisterRule::SameValue) | Some(RegisterRule::Undefined) => cfa,
        Some(RegisterRule::Offset(offset)) if offset != 0 => match i16::try_from(offset) {
            Ok(offset) => cfa.with_rbp_offset(offset),
            Err(_) => return UNSUPPORTED,
        },
        Some(_) => return UNSUPPORTED,
    };
    // The return address: X30 until saved; undefined in the outermost
    // frame (`_start`, `.cfi_undefined x30`).
    let converted = match row.register(AArch64::X30) {
        Some(RegisterRule::Undefined) => return UnwindRow::with_kind(0, RowKind::Stop),
        None | Some(RegisterRule::SameValue) => converted.with_saved_lr_by_8(0),
        Some(RegisterRule::Offset(offset)) if offset % 8 == 0 && offset != 0 => {
            match i8::try_from(offset / 8) {
                Ok(by_8) if by_8 != LR_BESIDE_FP && by_8 != LR_AT_FP_FIELD => {
                    converted.with_saved_lr_by_8(by_8)
                }
                // Out of the byte's reach (a frame over 1 KiB): beside the
                // saved X29 (a frame record), or in X29's field when X29
                // is not saved.
                _ if converted.rbp_offset != 0 && offset == i64::from(converted.rbp_offset) + 8 => {
                    converted.with_saved_lr_by_8(LR_BESIDE_FP)
                }
                _ if converted.rbp_offset == 0 => match i16::try_from(offset) {
                    Ok(offset) => converted
                        .with_rbp_offset(offset)
                        .with_saved_lr_by_8(LR_AT_FP_FIELD),
                    Err(_) => return UNSUPPORTED,
                },
                _ => return UNSUPPORTED,
            }
        }
        Some(_) => return UNSUPPORTED,
    };
    let saves_others = row
        .registers()
        .any(|(register, rule)| register.0 < 29 && *rule != RegisterRule::SameValue);
    if saves_others {
        converted.saving_other_registers()
    } else {
        converted
    }
}

/// arm64's PLT stubs (`adrp x16; ldr x17; add x16; br x17`, no CFI from
/// the linker) touch neither SP nor X30: the return address is in X30 and
/// the CFA is SP, which only the sampled frame can use.
pub(super) fn plt_rows<'d, O: Object<'d>>(file: &O) -> (Vec<FdeRows>, u64) {
    let mut rows = Vec::new();
    let mut stubs = 0;
    for name in [".plt", ".iplt"] {
        let Some(section) = file.section_by_name(name) else {
            continue;
        };
        let (start, size) = (section.address(), section.size());
        if size == 0 {
            continue;
        }
        // 16-byte entries (after `.plt`'s 32-byte header).
        stubs += size / 16;
        rows.push(FdeRows {
            start,
            end: start.saturating_add(size),
            rows: vec![(start, UnwindRow::cfa(DWARF_RSP, 0).with_saved_lr_by_8(0))],
        });
    }
    (rows, stubs)
}

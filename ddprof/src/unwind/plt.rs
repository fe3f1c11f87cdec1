//! Rows for PLT stubs that have no CFI, derived from their code.
//!
//! GNU ld describes `.plt` with a DWARF expression (and `.plt.sec`,
//! `.plt.got` with plain rows), but lld — the linker of every current Rust
//! binary — emits no `.eh_frame` for its PLT sections at all. A sample in a
//! stub would then fall back to frame pointers, which skips or garbles the
//! caller. The stubs are a handful of fixed instruction sequences in 16-byte
//! slots, so their stack effect is read from the bytes:
//!
//! ```text
//! header (.plt[0]):   push GOT+8(%rip); jmp *GOT+16(%rip); nop     (entered with 2 words pushed)
//! lazy entry:         [endbr64;] jmp *GOT[n](%rip)/(nothing); push $n; jmp header
//! .plt.sec / .plt.got: [endbr64;] [bnd] jmp *GOT[n](%rip); nop
//! ```
//!
//! A slot gets `CFA = SP + 8 * words` where `words` is what was pushed
//! since the caller's `call` (1, or 2 in a slot entered by a `jmp` from a
//! slot that pushed), plus 8 from the end of its one `push` on
//! ([`RowKind::Plt`]). Slots with other instructions, or more than one
//! push, get no row (frame pointers, as before).
//!
//! GNU ld also makes sections of 8-byte stubs, `jmp *GOT[n](%rip); xchg
//! %ax,%ax`, with no CFI: the `.plt` of a statically linked program, whose
//! entries call glibc's IFUNC-selected string functions (`memcpy`,
//! `strlen`: 6 % of a string-heavy static program's samples ended there),
//! and `.plt.got` without IBT. Their one instruction runs with the return
//! address at SP.
use super::compile::FdeRows;
use ddprof_common::unwind::{RowKind, UnwindRow, DWARF_RSP};
use object::{Object, ObjectSection};

/// Sections made of stubs that jump elsewhere (also what
/// `symbolize::plt` names).
pub(crate) const PLT_SECTIONS: [&str; 5] = [".plt", ".plt.sec", ".plt.got", ".plt.bnd", ".iplt"];
const SLOT: u64 = 16;

/// What one instruction does to the stack and the control flow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Effect {
    Nothing,
    /// `push $imm32` (`Some`: the relocation index a lazy entry pushes)
    /// or `push disp32(%rip)` (`None`: GOT[1], in the header).
    Push(Option<u32>),
    /// `jmp` through the GOT slot at this displacement from the end of the
    /// jump.
    IndirectJump(i32),
    /// `jmp rel32`: to the slot at this offset from the end of the jump.
    Jump(i32),
}

/// Decodes the instructions that occur in PLT stubs: `(length, effect)`.
pub(crate) fn decode(code: &[u8]) -> Option<(usize, Effect)> {
    let rel32 = |bytes: &[u8]| Some(i32::from_le_bytes(bytes.get(..4)?.try_into().ok()?));
    Some(match code {
        // endbr64
        [0xf3, 0x0f, 0x1e, 0xfa, ..] => (4, Effect::Nothing),
        // push $imm32 (the relocation index)
        [0x68, rest @ ..] => (5, Effect::Push(Some(rel32(rest)? as u32))),
        // push disp32(%rip) (GOT[1], in the header)
        [0xff, 0x35, _, _, _, _, ..] => (6, Effect::Push(None)),
        // [bnd] jmp *disp32(%rip)
        [0xff, 0x25, rest @ ..] => (6, Effect::IndirectJump(rel32(rest)?)),
        [0xf2, 0xff, 0x25, rest @ ..] => (7, Effect::IndirectJump(rel32(rest)?)),
        // [bnd] jmp rel32
        [0xe9, rest @ ..] => (5, Effect::Jump(rel32(rest)?)),
        [0xf2, 0xe9, rest @ ..] => (6, Effect::Jump(rel32(rest)?)),
        _ => return None,
    })
}

/// A slot's stack effect: where its push ends (if it has one) and the
/// slot it jumps to (as an index relative to its own).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    push_end: Option<u8>,
    jumps_to: Option<i64>,
}

fn decode_slot(code: &[u8]) -> Option<Slot> {
    let mut offset = 0usize;
    let mut push_end = None;
    loop {
        let (length, effect) = decode(code.get(offset..)?)?;
        offset += length;
        match effect {
            Effect::Nothing => {}
            Effect::Push(_) if push_end.is_none() => push_end = Some(u8::try_from(offset).ok()?),
            Effect::Push(_) => return None,
            // Lazy binding: until the GOT entry is resolved, the jump
            // lands on the next instruction (`push $n`). After a final jump
            // comes padding, which is never run.
            Effect::IndirectJump(_) => {
                let runs_on = code.get(offset..).and_then(decode);
                if !matches!(runs_on, Some((_, Effect::Push(_) | Effect::Jump(_)))) {
                    return Some(Slot {
                        push_end,
                        jumps_to: None,
                    });
                }
            }
            Effect::Jump(displacement) => {
                let target = offset as i64 + i64::from(displacement);
                if target.rem_euclid(SLOT as i64) != 0 {
                    return None;
                }
                return Some(Slot {
                    push_end,
                    jumps_to: Some(target.div_euclid(SLOT as i64)),
                });
            }
        }
    }
}

/// The rows of one PLT section's slots, starting at address `address`.
fn section_rows(address: u64, code: &[u8]) -> Vec<(u64, UnwindRow)> {
    let slots: Vec<Option<Slot>> = code.chunks_exact(SLOT as usize).map(decode_slot).collect();
    // Words on the stack when a slot starts: 1 (the return address) when
    // called, more when jumped to from a slot that pushed.
    let mut entry_words = vec![Some(1u8); slots.len()];
    for (index, slot) in slots.iter().enumerate() {
        let Some(Slot {
            push_end,
            jumps_to: Some(relative),
        }) = slot
        else {
            continue;
        };
        let words = 1 + u8::from(push_end.is_some());
        let Some(target) = usize::try_from(index as i64 + relative)
            .ok()
            .filter(|&t| t < slots.len() && t != index)
        else {
            continue;
        };
        entry_words[target] = match entry_words[target] {
            Some(1) => Some(words),
            Some(w) if w == words => Some(w),
            _ => None, // jumped to with different depths: no rule fits
        };
    }
    slots
        .iter()
        .zip(entry_words)
        .enumerate()
        .map(|(index, (slot, words))| {
            let row = match (slot, words) {
                (Some(slot), Some(words)) => {
                    let cfa_offset = 8 * i32::from(words);
                    match slot.push_end {
                        Some(push_end) => UnwindRow::plt(cfa_offset, push_end),
                        None => UnwindRow::cfa(DWARF_RSP, cfa_offset),
                    }
                }
                _ => UnwindRow::with_kind(0, RowKind::NoInfo),
            };
            (address + index as u64 * SLOT, row)
        })
        .collect()
}

/// Bytes of a stub in a section of 8-byte stubs.
const SHORT_SLOT: u64 = 8;

/// Whether `code` is a section of 8-byte `jmp *disp32(%rip)` stubs (the 2
/// bytes after the jump are padding, never run).
pub(crate) fn is_short_stub_section(code: &[u8]) -> bool {
    let all_jumps = code
        .chunks_exact(SHORT_SLOT as usize)
        .all(|slot| matches!(decode(slot), Some((6, Effect::IndirectJump(_)))));
    all_jumps && !code.is_empty() && code.len().is_multiple_of(SHORT_SLOT as usize)
}

/// The rows of a section of 8-byte stubs, or `None` when it is not one.
fn short_stub_rows(address: u64, code: &[u8]) -> Option<Vec<(u64, UnwindRow)>> {
    is_short_stub_section(code).then(|| vec![(address, UnwindRow::cfa(DWARF_RSP, 8))])
}

/// Rows for the PLT sections of `file` that no FDE in `fdes` covers, and
/// how many stubs got a rule.
pub(crate) fn uncovered_plt_rows<'d, O: Object<'d>>(
    file: &O,
    fdes: &[FdeRows],
) -> (Vec<FdeRows>, u64) {
    let mut out = Vec::new();
    let mut stubs = 0;
    for name in PLT_SECTIONS {
        let Some(section) = file.section_by_name(name) else {
            continue;
        };
        let (start, size) = (section.address(), section.size());
        let Some(end) = start.checked_add(size) else {
            continue;
        };
        if size == 0 || start % SHORT_SLOT != 0 || size % SHORT_SLOT != 0 {
            continue;
        }
        if fdes.iter().any(|fde| fde.start < end && fde.end > start) {
            continue;
        }
        let Ok(code) = section.data() else {
            continue;
        };
        if code.len() as u64 != size {
            continue;
        }
        let rows = if let Some(rows) = short_stub_rows(start, code) {
            stubs += size / SHORT_SLOT;
            rows
        } else if start % SLOT == 0 && size % SLOT == 0 {
            // (The `IP & 15` rule needs slots aligned on 16 bytes.)
            let rows = section_rows(start, code);
            stubs += rows
                .iter()
                .filter(|(_, row)| row.row_kind() != RowKind::NoInfo)
                .count() as u64;
            rows
        } else {
            continue;
        };
        out.push(FdeRows { start, end, rows });
    }
    (out, stubs)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// lld's `.plt` (no IBT): header, then `jmp *GOT; push $n; jmp header`.
    fn lld_plt(entries: u8) -> Vec<u8> {
        let mut code = vec![
            0xff, 0x35, 0x4a, 0x22, 0, 0, 0xff, 0x25, 0x4c, 0x22, 0, 0, 0x0f, 0x1f, 0x40, 0,
        ];
        for n in 0..entries {
            // To the header, from the end of this jump (the end of the slot).
            let back = -(16 * (i32::from(n) + 2)) as u32;
            let mut slot = vec![0xff, 0x25, 0x4a, 0x22, 0, 0, 0x68, n, 0, 0, 0, 0xe9];
            slot.extend_from_slice(&back.to_le_bytes());
            code.extend(slot);
        }
        code
    }

    #[test]
    fn lld_lazy_plt() {
        let rows = section_rows(0x1860, &lld_plt(2));
        assert_eq!(
            rows,
            vec![
                // Entered from an entry that pushed its index: CFA = SP + 16,
                // + 8 after `push GOT+8` (6 bytes).
                (0x1860, UnwindRow::plt(16, 6)),
                // `push $n` ends at byte 11.
                (0x1870, UnwindRow::plt(8, 11)),
                (0x1880, UnwindRow::plt(8, 11)),
            ]
        );
    }

    #[test]
    fn ibt_plt_and_plt_sec() {
        // lld -z force-ibt / GNU ld -z ibtplt: endbr64; push $n; jmp header; nop.
        let mut code = lld_plt(0);
        for n in 0..2u8 {
            // To the header, from the end of this jump (byte 14).
            let back = (-(16 * (i32::from(n) + 1)) - 14) as u32;
            let mut slot = vec![0xf3, 0x0f, 0x1e, 0xfa, 0x68, n, 0, 0, 0, 0xe9];
            slot.extend_from_slice(&back.to_le_bytes());
            slot.extend_from_slice(&[0x66, 0x90]);
            code.extend(slot);
        }
        let rows = section_rows(0x18f0, &code);
        assert_eq!(rows[0].1, UnwindRow::plt(16, 6));
        assert_eq!(rows[1].1, UnwindRow::plt(8, 9));
        assert_eq!(rows[2].1, UnwindRow::plt(8, 9));
        // .plt.sec: endbr64; jmp *GOT; nopw — only the return address.
        let sec = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xff, 0x25, 0x46, 0x22, 0, 0, 0x66, 0x0f, 0x1f, 0x44, 0, 0,
        ];
        assert_eq!(
            section_rows(0x1950, &sec),
            vec![(0x1950, UnwindRow::cfa(DWARF_RSP, 8))]
        );
    }

    #[test]
    fn eight_byte_stubs_of_a_static_programs_plt() {
        // GNU ld's `.plt` of a static program (IFUNC relocations), at an
        // 8-byte boundary: `jmp *disp32(%rip); xchg %ax,%ax`.
        let stub = [0xff, 0x25, 0xe2, 0xcf, 0x0a, 0x00, 0x66, 0x90];
        let code = stub.repeat(3);
        assert_eq!(
            short_stub_rows(0x401018, &code),
            Some(vec![(0x401018, UnwindRow::cfa(DWARF_RSP, 8))])
        );
        // Anything else in a slot: not such a section.
        let mut mixed = code.clone();
        mixed[8] = 0x68;
        assert_eq!(short_stub_rows(0x401018, &mixed), None);
        assert_eq!(short_stub_rows(0x401018, &stub[..6]), None);
        // 16-byte stubs whose first 8 bytes are a jump (lazy entries) are
        // not 8-byte stubs: the `push` at byte 6 is no jump.
        assert_eq!(short_stub_rows(0x1860, &lld_plt(2)[16..]), None);
    }

    #[test]
    fn unknown_code_gets_no_rule() {
        // A slot of `int3`s, and one with two pushes (mold's header).
        let mut code = vec![0xcc; 16];
        code.extend([
            0xf3, 0x0f, 0x1e, 0xfa, 0x68, 0, 0, 0, 0, 0xff, 0x35, 0, 0, 0, 0, 0xcc,
        ]);
        let rows = section_rows(0x2000, &code);
        assert!(rows
            .iter()
            .all(|(_, row)| row.row_kind() == RowKind::NoInfo));
        // A jump off the slot grid, or a truncated instruction.
        assert_eq!(decode_slot(&[0xe9, 3, 0, 0, 0]), None);
        assert_eq!(decode_slot(&[0xff, 0x25, 0]), None);
        assert_eq!(decode_slot(&[]), None);
    }
}

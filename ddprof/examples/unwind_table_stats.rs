//! Builds the unwind table of each ELF file given on the command line and
//! prints its size and build time: `cargo run -p ddprof --example
//! unwind_table_stats -- /lib/x86_64-linux-gnu/libc.so.6`.
use ddprof::unwind::{compile_elf, RowKind, UnwindRow};
use ddprof_common::unwind::{SavedRbx, DWARF_RBP as RBP, DWARF_RSP as RSP};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    for path in std::env::args().skip(1) {
        let file = std::fs::File::open(&path)?;
        let size = file.metadata()?.len();
        let cache = object::ReadCache::new(file);
        let started = Instant::now();
        let table = compile_elf(&cache, None)?;
        let elapsed = started.elapsed();
        let count = |matches: &dyn Fn(&UnwindRow) -> bool| {
            table.rows.iter().filter(|row| matches(row)).count()
        };
        let kind = |kind: RowKind| count(&|row| row.row_kind() == kind);
        // Rows that would merge with the previous one but for where they
        // say RBX is (what tracking RBX costs in rows).
        let without_rbx = |row: &UnwindRow| UnwindRow {
            slot_by_8: if row.row_kind() == RowKind::Signal {
                row.slot_by_8
            } else {
                0
            },
            ..*row
        };
        let split_by_rbx = table
            .rows
            .windows(2)
            .filter(|pair| {
                !pair[1].same_rule(&pair[0])
                    && without_rbx(&pair[1]).same_rule(&without_rbx(&pair[0]))
            })
            .count();
        let cfa_from = |register: u8| {
            count(&|row| row.row_kind() == RowKind::Cfa && row.cfa_register() == register)
        };
        println!(
            "{path}: file {size} bytes, {} rows, {} table bytes, {} FDEs ({} skipped, {} failed), \
             {} PLT stubs from code, rows by kind: sp {} fp {} other-register {} deref {} \
             drap {} plt {} signal {} stop {} unsupported {} no-info {} (saving other \
             registers {}, RBX saved {}, unknown {}; {} rows apart only by RBX), built in {:.1} ms",
            table.rows.len(),
            table.size_bytes(),
            table.stats.fdes,
            table.stats.skipped_fdes,
            table.stats.failed_fdes,
            table.stats.plt_stubs,
            cfa_from(RSP),
            cfa_from(RBP),
            kind(RowKind::Cfa) - cfa_from(RSP) - cfa_from(RBP),
            kind(RowKind::CfaDeref),
            kind(RowKind::CfaDerefDrap),
            kind(RowKind::Plt),
            kind(RowKind::Signal),
            kind(RowKind::Stop),
            kind(RowKind::Unsupported),
            kind(RowKind::NoInfo),
            count(&|row| row.saves_other_registers()),
            count(&|row| row.row_kind() != RowKind::Signal
                && matches!(row.saved_rbx(), SavedRbx::AtCfa(_))),
            count(&|row| row.row_kind() != RowKind::Signal && row.saved_rbx() == SavedRbx::Unknown),
            split_by_rbx,
            elapsed.as_secs_f64() * 1e3,
        );
    }
    Ok(())
}

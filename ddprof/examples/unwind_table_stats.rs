//! Builds the unwind table of each ELF file given on the command line and
//! prints its size and build time: `cargo run -p ddprof --example
//! unwind_table_stats -- /lib/x86_64-linux-gnu/libc.so.6`.
use ddprof::unwind::{compile_elf, RowKind};
use std::time::Instant;

fn main() -> anyhow::Result<()> {
    for path in std::env::args().skip(1) {
        let file = std::fs::File::open(&path)?;
        let size = file.metadata()?.len();
        let cache = object::ReadCache::new(file);
        let started = Instant::now();
        let table = compile_elf(&cache, None)?;
        let elapsed = started.elapsed();
        let count = |kind: RowKind| table.rows.iter().filter(|r| r.row_kind() == kind).count();
        println!(
            "{path}: file {size} bytes, {} rows, {} table bytes, {} FDEs ({} skipped, {} failed), \
             rows by kind: sp {} fp {} fp-deref {} plt {} signal {} stop {} unsupported {} no-info {}, built in {:.1} ms",
            table.rows.len(),
            table.size_bytes(),
            table.stats.fdes,
            table.stats.skipped_fdes,
            table.stats.failed_fdes,
            count(RowKind::CfaSp),
            count(RowKind::CfaFp),
            count(RowKind::CfaFpDeref),
            count(RowKind::Plt),
            count(RowKind::Signal),
            count(RowKind::Stop),
            count(RowKind::Unsupported),
            count(RowKind::NoInfo),
            elapsed.as_secs_f64() * 1e3,
        );
    }
    Ok(())
}

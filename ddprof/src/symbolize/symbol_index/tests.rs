use super::*;
use crate::symbolize::{Symbolizer, SymbolizerOptions};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A program whose symbols are what the index must get right: aliases of
/// one function (same address, same size), a weak one, a label inside a
/// function (no size, no type), a function whose symbol is shorter than
/// its code, data, and functions exported to `.dynsym`.
const TRICKY_PROGRAM: &str = r#"
#include <stdio.h>
__attribute__((noinline)) int real_function(int x) { return x * 3 + 1; }
int first_alias(int) __attribute__((alias("real_function")));
int second_alias(int) __attribute__((alias("real_function")));
__attribute__((weak, noinline)) int weak_function(int x) { return x - 7; }
__attribute__((noinline)) int with_label(int x) {
    x += 5;
    __asm__ volatile(".globl label_inside\nlabel_inside:\n\tnop\n\tnop");
    return x * x;
}
/* Its symbol says 4 bytes; its code is longer. */
__asm__(".text\n.globl short_symbol\n.type short_symbol,@function\n"
        "short_symbol:\n\tnop\n\tnop\n\tnop\n\tnop\n\tnop\n\tnop\n\tnop\n\tnop\n\tret\n"
        ".size short_symbol, 4\n");
int table[64] = {1};
int main(int argc, char **argv) {
    (void)argv;
    printf("%d\n", real_function(argc) + weak_function(argc) + with_label(argc) + table[argc]);
    return 0;
}
"#;

fn scratch(test: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ddprof-symidx-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    dir
}

/// [`TRICKY_PROGRAM`] built by `cc` with `flags` into `dir/name`.
fn build(dir: &Path, name: &str, flags: &[&str]) -> PathBuf {
    crate::symbolize::build_c(dir, name, TRICKY_PROGRAM, flags)
}

/// The file offsets of every byte of the file's executable segments.
fn executable_offsets(path: &Path) -> Vec<u64> {
    let file = File::open(path).expect("open the program");
    ElfHeaders::read(&file)
        .expect("an ELF file")
        .segments
        .iter()
        .filter(|segment| segment.executable)
        .flat_map(|segment| segment.file_offset..segment.file_offset + segment.file_size)
        .collect()
}

/// The index's answers and blazesym's for `offsets` of `path`, checked equal
/// in every line and function extent; returns how many were named.
fn assert_same_answers(path: &Path, offsets: &[u64]) -> usize {
    let open_path = path.to_str().expect("a UTF-8 path");
    let mut symbolizer = Symbolizer::new(SymbolizerOptions::default());
    let indexed = symbolizer
        .lines_from_symbol_index(open_path, offsets)
        .unwrap_or_else(|| panic!("{open_path} has no symbol index"));
    let mut named = 0;
    // blazesym in batches, as the symbolizer asks it (with DWARF on: the
    // file has none, so it falls back to the symbol tables).
    for (batch, at) in offsets.chunks(4096).zip((0..).step_by(4096)) {
        let expected = symbolizer
            .lines_from_blazesym_copy(open_path, batch, None, true)
            .expect("blazesym names the file");
        for (i, offset) in batch.iter().enumerate() {
            assert_eq!(
                indexed.lines[at + i],
                expected.lines[i],
                "{open_path}: names of offset {offset:#x}"
            );
            assert_eq!(
                indexed.functions[at + i],
                expected.functions[i],
                "{open_path}: function extent at offset {offset:#x}"
            );
            named += usize::from(expected.lines[i].is_some());
        }
    }
    named
}

#[test]
fn names_every_byte_of_a_program_as_blazesym_does() {
    let dir = scratch("every-byte");
    // No DWARF, symbols exported to `.dynsym` too.
    let program = build(&dir, "tricky", &["-O1", "-g0", "-rdynamic"]);
    let offsets = executable_offsets(&program);
    let named = assert_same_answers(&program, &offsets);
    assert!(
        named > offsets.len() / 2,
        "{named} of {} named",
        offsets.len()
    );
    // The cases the program was written for, as blazesym names them.
    let file = File::open(&program).unwrap();
    let index = SymbolIndex::build(&file).expect("a file without DWARF is indexed");
    let names_at = |symbol: &str| -> Vec<String> {
        let table = &index.tables[0];
        let entry = table
            .entries
            .iter_from(0)
            .find(|entry| table.name(&file, entry.name & !UNDEFINED).as_deref() == Some(symbol))
            .unwrap_or_else(|| panic!("{symbol} in .symtab"));
        (entry.value..entry.value + 16)
            .map(|address| match index.lookup(&file, address) {
                Ok(Some(found)) => found.name,
                _ => String::new(),
            })
            .collect()
    };
    let aliases = names_at("real_function");
    assert!(
        ["real_function", "first_alias", "second_alias"].contains(&aliases[0].as_str()),
        "{aliases:?}"
    );
    assert_eq!(names_at("label_inside")[0], "label_inside");
    let short = names_at("short_symbol");
    assert_eq!(short[..4], ["short_symbol"; 4]);
    assert_ne!(short[4], "short_symbol", "past the symbol's size");

    // Stripped of `.symtab`: `.dynsym` alone, where a symbol without a size
    // names only its own address.
    let stripped = dir.join("tricky-stripped");
    let status = Command::new("strip")
        .arg("--strip-all")
        .arg("-o")
        .arg(&stripped)
        .arg(&program)
        .status()
        .expect("strip runs");
    assert!(status.success());
    let named = assert_same_answers(&stripped, &offsets);
    assert!(named > 0, "the exported functions are named");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn names_librustc_driver_as_blazesym_does() {
    // A library of the Rust toolchain that builds this crate: 150 MB, no
    // DWARF, ~145,000 symbols.
    let output = Command::new("rustc")
        .args(["--print", "sysroot"])
        .output()
        .expect("rustc runs");
    let lib = PathBuf::from(String::from_utf8_lossy(&output.stdout).trim()).join("lib");
    let driver = std::fs::read_dir(&lib)
        .expect("the sysroot's lib directory")
        .flatten()
        .map(|entry| entry.path())
        .find(|path| {
            path.file_name()
                .and_then(|name| name.to_str())
                .is_some_and(|name| name.starts_with("librustc_driver-") && name.ends_with(".so"))
        })
        .unwrap_or_else(|| panic!("no librustc_driver in {}", lib.display()));
    let offsets = executable_offsets(&driver);
    // 20,000 offsets across its code, and the bytes around a few hundred
    // places (symbol starts, ends, aliases fall among them).
    let stride = (offsets.len() / 20_000).max(1);
    let mut chosen: Vec<u64> = offsets.iter().step_by(stride).copied().collect();
    for &start in offsets.iter().step_by(offsets.len() / 300) {
        chosen.extend(start.saturating_sub(8)..start + 8);
    }
    chosen.sort_unstable();
    chosen.dedup();
    let named = assert_same_answers(&driver, &chosen);
    // (About 57 %: the rest is code its symbol table does not cover.)
    assert!(
        named > chosen.len() / 3,
        "{named} of {} named",
        chosen.len()
    );
}

#[test]
fn files_with_dwarf_or_a_debug_link_are_left_to_blazesym() {
    let dir = scratch("left-to-blazesym");
    let with_dwarf = build(&dir, "with-dwarf", &["-O1", "-g"]);
    let file = File::open(&with_dwarf).unwrap();
    assert!(SymbolIndex::build(&file).is_none(), "DWARF");
    let without = build(&dir, "without", &["-O1", "-g0"]);
    assert!(SymbolIndex::build(&File::open(&without).unwrap()).is_some());
    let linked = dir.join("linked");
    let status = Command::new("objcopy")
        .arg(format!("--add-gnu-debuglink={}", with_dwarf.display()))
        .arg(&without)
        .arg(&linked)
        .status()
        .expect("objcopy runs");
    assert!(status.success());
    assert!(
        SymbolIndex::build(&File::open(&linked).unwrap()).is_none(),
        "a debug link"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_kept_index_reads_back_whole_and_a_damaged_one_is_refused() {
    let dir = scratch("store");
    let program = build(&dir, "tricky", &["-O1", "-g0", "-rdynamic"]);
    let index = SymbolIndex::build(&File::open(&program).unwrap()).unwrap();
    let key = Digest::of_bytes(b"the file");
    let bytes = index.encode(&key);
    assert_eq!(SymbolIndex::decode(&bytes, &key), Some(index.clone()));
    assert_eq!(
        SymbolIndex::decode(&bytes, &Digest::of_bytes(b"another")),
        None
    );
    for length in [0, 8, bytes.len() / 2, bytes.len() - 1] {
        assert_eq!(
            SymbolIndex::decode(&bytes[..length], &key),
            None,
            "{length}"
        );
    }
    for at in (0..bytes.len()).step_by(97) {
        let mut flipped = bytes.clone();
        flipped[at] ^= 0x20;
        assert_eq!(SymbolIndex::decode(&flipped, &key), None, "byte {at}");
    }
    // Through the store: what is saved is loaded, under its file's digest.
    let store = IndexStore::new(dir.join("store"));
    let saved = crate::files::digest::of_file(&File::open(&program).unwrap())
        .unwrap()
        .digest;
    store.save(&saved, &index).unwrap();
    let loaded = store.load(&saved).expect("the kept index");
    // Read where it lies, in the mapped file, and the same lookups.
    assert!(matches!(loaded.tables[0].entries, Entries::Stored { .. }));
    let file = File::open(&program).unwrap();
    let mut named = 0;
    for address in index
        .loads
        .iter()
        .flat_map(|&(_, size, start)| start..start + size)
    {
        let found = index.lookup(&file, address).ok().flatten();
        named += usize::from(found.is_some());
        assert_eq!(loaded.lookup(&file, address).ok().flatten(), found);
    }
    assert!(named > 0);
    assert_eq!(loaded, index);
    assert_eq!(store.load(&key), None);
    let _ = std::fs::remove_dir_all(&dir);
}

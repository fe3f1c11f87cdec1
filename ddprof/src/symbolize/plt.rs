//! Names of PLT stubs, as perf gives them: `memcpy@plt`.
//!
//! The stubs have no symbols. The symbol before them is usually `_init`
//! (`.init` comes first, and crti's `_init` has no size), so the symbol
//! tables named every sample in a stub `_init`: 4 % of a program's samples
//! that calls a library through its PLT in a loop, 6 % of a string-heavy
//! static program's (its `.plt` jumps to glibc's IFUNC-selected `strlen`).
//! A stub's name is found from its code and the relocations:
//!
//! - a stub with a `jmp *disp32(%rip)` jumps through a GOT slot, and the
//!   relocation of that slot names the function: `R_X86_64_JUMP_SLOT` or
//!   `GLOB_DAT` by its symbol, `IRELATIVE` (static programs) by the symbol
//!   of its resolver, at its addend (perf says `*ABS*+0x…@plt` there);
//! - a lazy entry of an IBT `.plt` (`endbr64; push $n; jmp header`) has no
//!   GOT jump of its own: its `push` is the index of its `.rela.plt` entry.
//!
//! The file is the target's: every size is checked before anything is read
//! (sections larger than [`MAX_SECTION_BYTES`] are not read), and nothing
//! here can panic on what it reads.
use std::collections::HashMap;
use std::fs::File;
use std::ops::Range;

use object::elf;
use object::read::elf::{FileHeader, Rela, SectionHeader, SectionTable, Sym};
use object::{Endianness, ReadCache, ReadRef};

use crate::unwind::plt::{decode, is_short_stub_section, Effect, PLT_SECTIONS};

/// The relocation sections of GOT slots.
const RELOCATION_SECTIONS: [&[u8]; 3] = [b".rela.plt", b".rela.iplt", b".rela.dyn"];
/// Sections larger than this are not read (a PLT, its relocations, a
/// symbol table and its strings): names are worth less than the memory a
/// hostile file could make the profiler use. Each is read once at most:
/// the first section of each name counts, whatever else the file claims.
const MAX_SECTION_BYTES: u64 = 64 << 20;

type Header = elf::FileHeader64<Endianness>;

/// An ELF file's header and section table: nothing else is read until a
/// stub needs it (not the symbol tables that a full parse reads).
struct Elf<'d, R: ReadRef<'d>> {
    endian: Endianness,
    sections: SectionTable<'d, Header, R>,
    data: R,
}

impl<'d, R: ReadRef<'d>> Elf<'d, R> {
    fn parse(data: R) -> Option<Self> {
        let header = Header::parse(data).ok()?;
        let endian = header.endian().ok()?;
        let sections = header.sections(endian, data).ok()?;
        Some(Self {
            endian,
            sections,
            data,
        })
    }

    /// The first section named `name`, with its index.
    fn section_named(&self, name: &[u8]) -> Option<(usize, &'d elf::SectionHeader64<Endianness>)> {
        self.sections.iter().enumerate().find(|(_, header)| {
            self.sections
                .section_name(self.endian, header)
                .is_ok_and(|found| found == name)
        })
    }
}

/// A PLT section: where its bytes are in the file and in memory.
#[derive(Debug, Clone)]
struct PltSection {
    name: &'static str,
    file_range: Range<u64>,
    address: u64,
    /// Bytes of a stub: 16, or 8 for a section of `jmp; xchg` stubs.
    slot: u64,
    code: Vec<u8>,
}

/// The names of the stubs at some file offsets of one ELF file: the
/// function's symbol and `@plt` (`_Znwm@plt`), or the section's name in
/// brackets (`[.plt]`) for a stub whose function cannot be found (the PLT
/// header, which every lazy entry jumps to). `None` for an offset in no
/// PLT section.
pub(super) fn stub_names(open_path: &str, offsets: &[u64]) -> Vec<Option<String>> {
    let mut names = vec![None; offsets.len()];
    let Ok(file) = File::open(open_path) else {
        return names;
    };
    let cache = ReadCache::new(file);
    let Some(elf) = Elf::parse(&cache) else {
        return names;
    };
    let sections = plt_sections(&elf, offsets);
    if sections.is_empty() {
        return names;
    }
    let relocations = Relocations::read(&elf);
    // One name per stub, however many offsets fall in it.
    let mut by_stub: HashMap<(usize, u64), String> = HashMap::new();
    for (name, &offset) in names.iter_mut().zip(offsets) {
        let Some((index, section)) = sections
            .iter()
            .enumerate()
            .find(|(_, s)| s.file_range.contains(&offset))
        else {
            continue;
        };
        let into_section = offset - section.file_range.start;
        let stub_start = into_section - into_section % section.slot;
        let stub_name = by_stub
            .entry((index, stub_start))
            .or_insert_with(|| stub_name(&elf, section, stub_start, &relocations));
        *name = Some(stub_name.clone());
    }
    names
}

/// The PLT sections of `elf` that hold one of `offsets`, their code read
/// (each name once, of a sane size).
fn plt_sections<'d, R: ReadRef<'d>>(elf: &Elf<'d, R>, offsets: &[u64]) -> Vec<PltSection> {
    let mut out = Vec::new();
    for known in PLT_SECTIONS {
        let Some((_, header)) = elf.section_named(known.as_bytes()) else {
            continue;
        };
        if header.sh_type(elf.endian) != elf::SHT_PROGBITS {
            continue;
        }
        let (offset, size) = (header.sh_offset(elf.endian), header.sh_size(elf.endian));
        let Some(end) = offset.checked_add(size) else {
            continue;
        };
        let file_range = offset..end;
        if size == 0 || size > MAX_SECTION_BYTES || !offsets.iter().any(|o| file_range.contains(o))
        {
            continue;
        }
        let Ok(code) = header.data(elf.endian, elf.data) else {
            continue;
        };
        out.push(PltSection {
            name: known,
            file_range,
            address: header.sh_addr(elf.endian),
            slot: if is_short_stub_section(code) { 8 } else { 16 },
            code: code.to_vec(),
        });
    }
    out
}

/// The name of the stub `stub_start` bytes into `section`.
fn stub_name<'d, R: ReadRef<'d>>(
    elf: &Elf<'d, R>,
    section: &PltSection,
    stub_start: u64,
    relocations: &Relocations,
) -> String {
    let Some(stub) = usize::try_from(stub_start).ok().and_then(|start| {
        section
            .code
            .get(start..start.checked_add(section.slot as usize)?)
    }) else {
        return format!("[{}]", section.name);
    };
    let stub_address = section.address.wrapping_add(stub_start);
    let relocation = match stub_target(stub) {
        Some(StubTarget::GotSlot {
            jump_end,
            displacement,
        }) => {
            let slot = stub_address
                .wrapping_add(jump_end)
                .wrapping_add_signed(i64::from(displacement));
            relocations.by_slot.get(&slot).copied()
        }
        Some(StubTarget::PltIndex(index)) => relocations.plt.get(index as usize).copied(),
        None => None,
    };
    match relocation.and_then(|relocation| name_of(elf, relocation)) {
        Some(name) => format!("{name}@plt"),
        None => format!("[{}]", section.name),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StubTarget {
    /// `jmp *disp32(%rip)` ending `jump_end` bytes into the stub.
    GotSlot { jump_end: u64, displacement: i32 },
    /// `push $n` with no GOT jump before it: entry `n` of `.rela.plt`.
    PltIndex(u32),
}

/// What a stub jumps through: its first GOT jump, or the index it pushes
/// (decoded as `unwind::plt` decodes stubs).
fn stub_target(stub: &[u8]) -> Option<StubTarget> {
    let mut at = 0usize;
    loop {
        let (length, effect) = decode(stub.get(at..)?)?;
        at += length;
        match effect {
            Effect::Nothing => {}
            Effect::IndirectJump(displacement) => {
                return Some(StubTarget::GotSlot {
                    jump_end: at as u64,
                    displacement,
                })
            }
            Effect::Push(Some(index)) => return Some(StubTarget::PltIndex(index)),
            Effect::Push(None) | Effect::Jump(_) => return None,
        }
    }
}

/// One relocation of a GOT slot.
#[derive(Debug, Clone, Copy)]
struct Relocation {
    kind: elf::RelocationType,
    symbol: u32,
    addend: i64,
    /// The section index of the symbol table `symbol` indexes.
    symbols: usize,
}

/// The relocations of the file's GOT slots.
#[derive(Debug, Default)]
struct Relocations {
    by_slot: HashMap<u64, Relocation>,
    /// `.rela.plt` in order (a lazy entry pushes its index).
    plt: Vec<Relocation>,
}

impl Relocations {
    fn read<'d, R: ReadRef<'d>>(elf: &Elf<'d, R>) -> Relocations {
        let endian = elf.endian;
        let mut out = Relocations::default();
        for name in RELOCATION_SECTIONS {
            let Some((_, header)) = elf.section_named(name) else {
                continue;
            };
            if header.sh_type(endian) != elf::SHT_RELA || header.sh_size(endian) > MAX_SECTION_BYTES
            {
                continue;
            }
            let Ok(entries) = header.data_as_array::<elf::Rela64<Endianness>, _>(endian, elf.data)
            else {
                continue;
            };
            let symbols = header.sh_link(endian) as usize;
            for entry in entries {
                let kind = entry.r_type(endian, false);
                if !matches!(
                    kind,
                    elf::R_X86_64_JUMP_SLOT | elf::R_X86_64_GLOB_DAT | elf::R_X86_64_IRELATIVE
                ) {
                    continue;
                }
                let relocation = Relocation {
                    kind,
                    symbol: entry.r_sym(endian, false),
                    addend: entry.r_addend(endian),
                    symbols,
                };
                out.by_slot.insert(entry.r_offset(endian), relocation);
                if name == b".rela.plt" {
                    out.plt.push(relocation);
                }
            }
        }
        out
    }
}

/// The name of the function a relocation binds its slot to.
fn name_of<'d, R: ReadRef<'d>>(elf: &Elf<'d, R>, relocation: Relocation) -> Option<String> {
    if relocation.kind == elf::R_X86_64_IRELATIVE {
        let resolver = u64::try_from(relocation.addend).ok()?;
        return Some(function_at(elf, resolver).unwrap_or_else(|| format!("*ABS*+{resolver:#x}")));
    }
    if !within_bounds(elf, relocation.symbols) {
        return None;
    }
    let symbols = elf
        .sections
        .symbol_table_by_index(
            elf.endian,
            elf.data,
            object::SectionIndex(relocation.symbols),
        )
        .ok()?;
    let symbol = symbols
        .symbol(object::SymbolIndex(relocation.symbol as usize))
        .ok()?;
    let name = symbols.symbol_name(elf.endian, symbol).ok()?;
    let name = std::str::from_utf8(name).ok()?;
    // `memcpy@GLIBC_2.14` in some tables: the version is not the name.
    let name = name.split('@').next().unwrap_or(name);
    (!name.is_empty()).then(|| name.to_string())
}

/// Whether the symbol table at section `index` and its string table are
/// small enough to read.
fn within_bounds<'d, R: ReadRef<'d>>(elf: &Elf<'d, R>, index: usize) -> bool {
    let size = |index: usize| {
        elf.sections
            .section(object::SectionIndex(index))
            .map(|header| header.sh_size(elf.endian))
            .ok()
    };
    let Some(strings) = elf
        .sections
        .section(object::SectionIndex(index))
        .ok()
        .map(|header| header.sh_link(elf.endian) as usize)
    else {
        return false;
    };
    [size(index), size(strings)]
        .iter()
        .all(|size| size.is_some_and(|size| size <= MAX_SECTION_BYTES))
}

/// The name of the function (or IFUNC) symbol at `address`, from the full
/// symbol table, else the dynamic one.
fn function_at<'d, R: ReadRef<'d>>(elf: &Elf<'d, R>, address: u64) -> Option<String> {
    let endian = elf.endian;
    for kind in [elf::SHT_SYMTAB, elf::SHT_DYNSYM] {
        let Some(index) = elf.sections.iter().position(|h| h.sh_type(endian) == kind) else {
            continue;
        };
        if !within_bounds(elf, index) {
            continue;
        }
        let Ok(symbols) = elf.sections.symbols(endian, elf.data, kind) else {
            continue;
        };
        // The IFUNC symbol (`strlen`) rather than its resolver's own
        // (`strlen_ifunc`, a local function at the same address); of
        // aliases, the public name (`memcpy`, not `__new_memcpy`): global
        // first, then the fewest leading underscores, then the shortest.
        let best = |kind: elf::SymbolType| {
            symbols
                .iter()
                .filter(|symbol| symbol.st_value(endian) == address && symbol.st_type() == kind)
                .filter_map(|symbol| {
                    let name = symbols.symbol_name(endian, symbol).ok()?;
                    let name = std::str::from_utf8(name).ok()?;
                    let local = symbol.st_bind() == elf::STB_LOCAL;
                    let underscores = name.len() - name.trim_start_matches('_').len();
                    Some(((local, underscores, name.len()), name))
                })
                .min()
                .map(|(_, name)| name.to_string())
        };
        if let Some(name) = best(elf::STT_GNU_IFUNC).or_else(|| best(elf::STT_FUNC)) {
            return Some(name);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stubs_say_what_they_jump_through() {
        // GNU ld's lazy entry: jmp *GOT(%rip); push $3; jmp header.
        let lazy = [
            0xff, 0x25, 0x10, 0x20, 0, 0, 0x68, 3, 0, 0, 0, 0xe9, 0, 0, 0, 0,
        ];
        assert_eq!(
            stub_target(&lazy),
            Some(StubTarget::GotSlot {
                jump_end: 6,
                displacement: 0x2010
            })
        );
        // IBT `.plt`: endbr64; push $7; bnd jmp header.
        let ibt = [
            0xf3, 0x0f, 0x1e, 0xfa, 0x68, 7, 0, 0, 0, 0xf2, 0xe9, 0, 0, 0, 0, 0x90,
        ];
        assert_eq!(stub_target(&ibt), Some(StubTarget::PltIndex(7)));
        // `.plt.sec`: endbr64; bnd jmp *GOT(%rip).
        let sec = [
            0xf3, 0x0f, 0x1e, 0xfa, 0xf2, 0xff, 0x25, 0xfc, 0xff, 0xff, 0xff, 0x0f, 0x1f, 0x44, 0,
            0,
        ];
        assert_eq!(
            stub_target(&sec),
            Some(StubTarget::GotSlot {
                jump_end: 11,
                displacement: -4
            })
        );
        // The header pushes GOT[1] (`ff 35`), which no rule names; truncated
        // and unknown code neither.
        assert_eq!(stub_target(&[0xff, 0x35, 0, 0, 0, 0]), None);
        assert_eq!(stub_target(&[0xff, 0x25, 0]), None);
        assert_eq!(stub_target(&[0xcc; 16]), None);
        assert_eq!(stub_target(&[]), None);
    }

    /// Builds `source` with `cc -O2` and `flags` into a scratch directory.
    fn build(name: &str, source: &str, flags: &[&str]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("ddprof-plt-{}-{name}", std::process::id()));
        crate::symbolize::build_c(&dir, name, source, &[&["-O2"], flags].concat())
    }

    /// objdump's names of the stubs of `path` (`<memcpy@plt>` labels of
    /// its PLT sections) by file offset.
    fn objdump_stub_labels(path: &std::path::Path) -> Vec<(u64, String)> {
        use object::{Object, ObjectSection};
        let bytes = std::fs::read(path).unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        let output = std::process::Command::new("objdump")
            .arg("-d")
            .arg(path)
            .output()
            .expect("objdump (binutils)");
        let text = String::from_utf8_lossy(&output.stdout);
        let mut labels = Vec::new();
        for line in text.lines() {
            // `0000000000001030 <strlen@plt>:`
            let Some((address, rest)) = line.split_once(" <") else {
                continue;
            };
            let Some(label) = rest.strip_suffix(">:") else {
                continue;
            };
            let Ok(address) = u64::from_str_radix(address.trim(), 16) else {
                continue;
            };
            if !label.ends_with("@plt") {
                continue;
            }
            let section = file
                .sections()
                .find(|s| s.address() <= address && address < s.address() + s.size())
                .unwrap();
            let (offset, _) = section.file_range().unwrap();
            labels.push((address - section.address() + offset, label.to_string()));
        }
        labels
    }

    const CALLS_THROUGH_THE_PLT: &str = r#"
        #include <stdio.h>
        #include <stdlib.h>
        #include <string.h>
        int entry(int argc, char **argv) {
            char buffer[64];
            memcpy(buffer, argv[0], 8);
            buffer[8] = 0;
            puts(buffer);
            return (int)strlen(buffer) + atoi(argv[argc - 1]);
        }
        int main(int argc, char **argv) { return entry(argc, argv); }
    "#;

    #[test]
    fn stubs_are_named_as_objdump_names_them() {
        for (name, flags) in [
            ("lazy", &["-fPIC", "-shared", "-Wl,-z,lazy"][..]),
            ("now", &["-fPIC", "-shared", "-Wl,-z,now"][..]),
            (
                "ibt",
                &["-fPIC", "-shared", "-fcf-protection", "-Wl,-z,ibtplt"][..],
            ),
        ] {
            let path = build(name, CALLS_THROUGH_THE_PLT, flags);
            let labels = objdump_stub_labels(&path);
            assert!(labels.len() >= 4, "{name}: objdump labels {labels:?}");
            // Every byte of a stub is named alike.
            let offsets: Vec<u64> = labels.iter().flat_map(|(o, _)| [*o, o + 5]).collect();
            let names = stub_names(path.to_str().unwrap(), &offsets);
            let expected: Vec<Option<String>> = labels
                .iter()
                .flat_map(|(_, label)| [Some(label.clone()), Some(label.clone())])
                .collect();
            assert_eq!(names, expected, "{name}");
            // Code outside the PLT is not a stub.
            let text = object_section(&path, ".text");
            assert_eq!(stub_names(path.to_str().unwrap(), &[text]), vec![None]);
            let _ = std::fs::remove_dir_all(path.parent().unwrap());
        }
    }

    fn object_section(path: &std::path::Path, name: &str) -> u64 {
        use object::{Object, ObjectSection};
        let bytes = std::fs::read(path).unwrap();
        let file = object::File::parse(&*bytes).unwrap();
        file.section_by_name(name).unwrap().file_range().unwrap().0
    }

    /// The output of `program args`, as text.
    fn output_of(program: &str, args: &[&std::ffi::OsStr]) -> String {
        let output = std::process::Command::new(program)
            .args(args)
            .output()
            .unwrap_or_else(|e| panic!("{program}: {e}"));
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    #[test]
    fn a_static_programs_ifunc_stubs_are_named_after_the_ifunc() {
        // objdump names no stub of a static program's `.plt`; what each is
        // comes from binutils all the same: the GOT slot its jump reads
        // (objdump's `# 4a5000` comment), that slot's IRELATIVE relocation
        // and addend (readelf), the IFUNC symbol there (nm: `i strlen`).
        let path = build("static", CALLS_THROUGH_THE_PLT, &["-static"]);
        let file = path.as_os_str();
        let disassembly = output_of(
            "objdump",
            &["-d".as_ref(), "-j".as_ref(), ".plt".as_ref(), file],
        );
        let relocations = output_of("readelf", &["-rW".as_ref(), file]);
        let symbols = output_of("nm", &[file]);
        let plt = object_section(&path, ".plt");
        let plt_address = {
            use object::{Object, ObjectSection};
            let bytes = std::fs::read(&path).unwrap();
            let elf = object::File::parse(&*bytes).unwrap();
            elf.section_by_name(".plt").unwrap().address()
        };
        let mut stubs = Vec::new(); // (file offset, IFUNC name)
        for line in disassembly.lines() {
            // `  401018:\tff 25 e2 3f 0a 00 \tjmp *0xa3fe2(%rip)  # 4a5000 <…>`
            let Some((address, rest)) = line.trim_start().split_once(':') else {
                continue;
            };
            let Some((_, slot)) = rest.split_once("# ") else {
                continue;
            };
            let (Ok(address), Some(slot)) = (
                u64::from_str_radix(address, 16),
                slot.split_whitespace().next(),
            ) else {
                continue;
            };
            let slot = format!("{:016x}", u64::from_str_radix(slot, 16).unwrap());
            let addend = relocations
                .lines()
                .find(|l| l.starts_with(&slot) && l.contains("R_X86_64_IRELATIVE"))
                .and_then(|l| l.split_whitespace().last())
                .unwrap_or_else(|| panic!("no IRELATIVE relocation of slot {slot}"));
            // Aliases: `memcpy` and `__new_memcpy` are one IFUNC.
            let ifuncs: Vec<String> = symbols
                .lines()
                .filter_map(|l| match l.split_whitespace().collect::<Vec<_>>()[..] {
                    [value, "i", name] if value.trim_start_matches('0') == addend => {
                        Some(format!("{name}@plt"))
                    }
                    _ => None,
                })
                .collect();
            assert!(!ifuncs.is_empty(), "no IFUNC at {addend}");
            stubs.push((address - plt_address + plt, ifuncs));
        }
        assert!(stubs.len() >= 3, "stubs: {stubs:?}");
        let offsets: Vec<u64> = stubs.iter().flat_map(|(o, _)| [*o, o + 5]).collect();
        let names = stub_names(path.to_str().unwrap(), &offsets);
        for (name, (_, ifuncs)) in names.iter().zip(stubs.iter().flat_map(|s| [s, s])) {
            let name = name.as_deref().unwrap_or("(none)");
            assert!(
                ifuncs.iter().any(|i| i == name),
                "{name}, not one of {ifuncs:?}"
            );
        }
        // The public name among the aliases.
        for wanted in ["memcpy@plt", "strlen@plt", "memmove@plt"] {
            assert!(
                names.iter().any(|n| n.as_deref() == Some(wanted)),
                "{wanted} in {names:?}"
            );
        }
        let _ = std::fs::remove_dir_all(path.parent().unwrap());
    }

    #[test]
    fn a_file_that_is_no_elf_names_nothing() {
        let names = stub_names("/proc/self/status", &[0, 16]);
        assert_eq!(names, vec![None, None]);
        assert_eq!(stub_names("/nonexistent", &[0]), vec![None]);
    }
}

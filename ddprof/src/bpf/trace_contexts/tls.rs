//! Where a process's threads keep a publisher's TLS variable.
//!
//! The variable is found by name in the file that defines it (an 8-byte
//! `STT_TLS` symbol: in `.dynsym`, or for a program in `.symtab` too, where
//! a Rust program keeps `libdd-otel-thread-ctx`'s). Each thread then holds
//! it at a fixed place from its thread pointer, which depends on who
//! defines it (x86-64, glibc's TLS layout):
//! - **the program**: its TLS block is the first below the thread pointer,
//!   at `-roundup(p_memsz, p_align)` (glibc's `_dl_determine_tlsoffset`),
//!   so the variable is at a constant offset known from the file alone;
//! - **a library**: the loader decides where its block goes and writes the
//!   answer in the library's GOT entry for the variable: a TLS descriptor
//!   (`R_X86_64_TLSDESC`, two words: resolver, argument), an initial-exec
//!   offset (`R_X86_64_TPOFF64`), or the `tls_index` that
//!   `__tls_get_addr` takes (`R_X86_64_DTPMOD64` then `R_X86_64_DTPOFF64`:
//!   the module's number and the variable's offset in its block; the
//!   general-dynamic model, what `gcc -fPIC` and Rust's `cdylib`s use
//!   unless told `-mtls-dialect=gnu2`). A descriptor's argument is either
//!   the (negative) offset from the thread pointer — a library loaded at
//!   start, in the static TLS block — or a pointer to `{module, offset}` —
//!   a library `dlopen`ed later, whose block each thread allocates and
//!   finds through its DTV; a `tls_index` is always read through the DTV
//!   (whose entry for a library loaded at start points into the static
//!   block). The entry is read from the process's memory once the loader
//!   has filled it.
//!
//! musl places a program's block as glibc does, its GOT entries say the
//! same, and its DTV is at the same place but laid out otherwise (one word
//! an entry, the count first): the registry marks a musl process's DTV
//! slots so (`tls_access::DTV_MUSL`). Other layouts are not read.
use std::fs::File;

use ddprof_common::bpf_maps::{tls_access, TraceContextSlot};

use super::go::{self, GoLabels};
use crate::unwind::LoadSegment;

/// The OTEP 4947 thread context pointer.
pub const OTEL_SYMBOL: &str = "otel_thread_ctx_v1";
/// The `custom-labels` (ABI v1) current label set pointer.
pub const LABELS_SYMBOL: &str = "custom_labels_current_set";
/// `custom-labels`' ABI version, which must be 1.
const LABELS_VERSION_SYMBOL: &str = "custom_labels_abi_version";

/// Symbols looked at per table (a bigger table is searched that far).
const MAX_SYMBOLS: usize = 4_000_000;
/// Dynamic relocations looked at.
const MAX_RELOCATIONS: usize = 4_000_000;
/// A symbol, name or relocation table bigger than this is not read (it is
/// read whole into memory).
const MAX_TABLE_BYTES: u64 = 64 << 20;
/// The largest offset from the thread pointer taken as static TLS (the
/// static TLS block is a few KiB to a few MiB).
const MAX_STATIC_TLS: i64 = 1 << 30;

const R_X86_64_DTPMOD64: u32 = 16;
const R_X86_64_TPOFF64: u32 = 18;
const R_X86_64_TLSDESC: u32 = 36;

/// What a library's GOT entry for its variable holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GotEntry {
    /// An initial-exec offset from the thread pointer (one word).
    Offset,
    /// A TLS descriptor (two words: resolver, argument).
    Descriptor,
    /// `__tls_get_addr`'s `tls_index` (two words: module, offset): the
    /// module's number read from it, the variable's `offset` in the
    /// module's block from the file (its symbol's value, what the loader
    /// writes in the second word: read from the file, it cannot be read
    /// before the loader wrote it).
    ModuleAndOffset { offset: u64 },
}

/// How a file's variable is reached from a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsVariable {
    /// The program's own: at `offset` from the thread pointer.
    Program { offset: i64 },
    /// A library's: its GOT entry at file address `got`.
    Library { got: u64, entry: GotEntry },
}

/// What a file defines of the two ABIs' variables, and its executable
/// segments (to find its load bias in a process); for a Go program, what
/// is made of its pprof labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileTls {
    pub otel: Option<TlsVariable>,
    pub labels: Option<TlsVariable>,
    pub go: Option<GoLabels>,
    pub segments: Vec<LoadSegment>,
}

impl FileTls {
    pub fn defines_any(&self) -> bool {
        self.otel.is_some() || self.labels.is_some() || self.go.is_some()
    }
}

/// The variables `file` defines (none in a library without a `PT_TLS`
/// segment, which is most files: only their program headers are read
/// then).
pub fn find(file: &File) -> FileTls {
    find_in(&object::ReadCache::new(file)).unwrap_or_default()
}

fn find_in<'data, R: object::ReadRef<'data>>(data: R) -> Option<FileTls> {
    use object::elf;
    use object::read::elf::{FileHeader, ProgramHeader, Rela, SectionHeader, Sym};
    let header = elf::FileHeader64::<object::Endianness>::parse(data).ok()?;
    let endian = header.endian().ok()?;
    if header.e_machine(endian) != elf::EM_X86_64 {
        return None;
    }
    let segments = header.program_headers(endian, data).ok()?;
    let tls = segments
        .iter()
        .find(|segment| segment.p_type(endian) == elf::PT_TLS);
    // A program: `ET_EXEC`, or a PIE (an interpreter and no `DT_SONAME`:
    // glibc's libc.so.6 has an interpreter too).
    let program = crate::files::elf_headers::is_program(data);
    let load_segments: Vec<LoadSegment> = segments
        .iter()
        .filter(|segment| {
            segment.p_type(endian) == elf::PT_LOAD && segment.p_flags(endian).0 & elf::PF_X.0 != 0
        })
        .map(|segment| LoadSegment {
            file_offset: segment.p_offset(endian),
            vaddr: segment.p_vaddr(endian),
            file_size: segment.p_filesz(endian),
        })
        .collect();
    if tls.is_none() && !program {
        return None;
    }
    let sections = header.sections(endian, data).ok()?;
    // A Go program: its version (None: before Go 1.18, or unreadable),
    // and its runtime's offsets if its DWARF gives them.
    let go_version = program
        .then(|| sections.section_by_name(endian, go::BUILD_INFO_SECTION))
        .flatten()
        .map(|(_, section)| {
            let size = section.sh_size(endian).min(256);
            data.read_bytes_at(section.sh_offset(endian), size)
                .ok()
                .and_then(go::version)
        });
    let go_dwarf = go_version
        .as_ref()
        .and_then(|version| version.as_deref())
        .is_some_and(go::needs_dwarf)
        .then(|| go::file_dwarf_offsets(&sections, endian, data))
        .flatten();
    let Some(tls) = tls else {
        // A pure Go program: no TLS of its own, the goroutine just below
        // the thread pointer.
        return Some(FileTls {
            go: go_version.map(|version| go::labels(version, go_dwarf, Some(go::PURE_GO_G_OFFSET))),
            segments: load_segments,
            ..FileTls::default()
        });
    };

    // (index in .dynsym, if there; st_value) of each wanted symbol: the
    // two ABIs' variables, then Go's goroutine pointer.
    let mut found: [Option<(Option<usize>, u64)>; 3] = [None, None, None];
    let mut labels_version_ok = false;
    for kind in [elf::SHT_DYNSYM, elf::SHT_SYMTAB] {
        if kind == elf::SHT_SYMTAB && !program {
            break;
        }
        // The table and its names, each read once (a name at a time would
        // be a read each, and a cache that keeps them all).
        let Some((_, table)) = sections
            .iter()
            .enumerate()
            .find(|(_, section)| section.sh_type(endian) == kind)
        else {
            continue;
        };
        let Ok(strings) = sections.section(object::SectionIndex(table.sh_link(endian) as usize))
        else {
            continue;
        };
        if table.sh_size(endian) > MAX_TABLE_BYTES || strings.sh_size(endian) > MAX_TABLE_BYTES {
            continue;
        }
        let Ok(names) = data.read_bytes_at(strings.sh_offset(endian), strings.sh_size(endian))
        else {
            continue;
        };
        let Ok(symbols) = sections.symbols(endian, data, kind) else {
            continue;
        };
        for (index, symbol) in symbols.iter().enumerate().take(MAX_SYMBOLS) {
            let name = names
                .get(symbol.st_name(endian) as usize..)
                .map(|rest| {
                    &rest[..rest
                        .iter()
                        .position(|&byte| byte == 0)
                        .unwrap_or(rest.len())]
                })
                .unwrap_or_default();
            if name == LABELS_VERSION_SYMBOL.as_bytes() && symbol.st_size(endian) == 4 {
                labels_version_ok |= symbol_u32(&sections, endian, data, symbol) == Some(1);
                continue;
            }
            let slot = match name {
                n if n == OTEL_SYMBOL.as_bytes() => 0,
                n if n == LABELS_SYMBOL.as_bytes() => 1,
                n if go_version.is_some() && n == go::TLSG_SYMBOL.as_bytes() => 2,
                _ => continue,
            };
            let defined = symbol.st_type() == elf::STT_TLS
                && symbol.st_shndx(endian) != elf::SHN_UNDEF
                && symbol.st_size(endian) == 8;
            if defined && found[slot].is_none() {
                let dynamic = (kind == elf::SHT_DYNSYM).then_some(index);
                found[slot] = Some((dynamic, symbol.st_value(endian)));
            }
        }
    }
    if !labels_version_ok {
        found[1] = None;
    }
    let tls_offset = program_tls_offset(
        tls.p_memsz(endian),
        tls.p_align(endian),
        tls.p_vaddr(endian),
    );
    // The program's own block, relaxed to fixed offsets by the linker.
    let program_offset = |value: u64| -> Option<i64> {
        let offset = i64::try_from(value).ok()?.checked_sub(tls_offset?)?;
        (program && (-MAX_STATIC_TLS..0).contains(&offset)).then_some(offset)
    };
    // A Go program linked with the C library: the goroutine pointer is
    // `runtime.tlsg` (without symbols, the block's only 8 bytes if that is
    // all it holds).
    let go = go_version.map(|version| {
        let g_offset = match found[2] {
            Some((_, value)) => program_offset(value),
            None if tls.p_memsz(endian) == 8 => program_offset(0),
            None => None,
        };
        go::labels(version, go_dwarf, g_offset)
    });
    if found[..2].iter().all(Option::is_none) {
        return Some(FileTls {
            go,
            segments: load_segments,
            ..FileTls::default()
        });
    }

    // A library reaches its variable through a GOT entry the loader fills.
    let mut got: [Option<(u64, GotEntry)>; 2] = [None, None];
    let mut seen = 0usize;
    for section in sections.iter() {
        if section.sh_type(endian) != elf::SHT_RELA
            || section.sh_size(endian) > MAX_TABLE_BYTES
            || seen >= MAX_RELOCATIONS
        {
            continue;
        }
        let Ok(Some((relocations, _))) = section.rela(endian, data) else {
            continue;
        };
        for relocation in relocations {
            seen += 1;
            if seen >= MAX_RELOCATIONS {
                break;
            }
            let entry = match relocation.r_type(endian, false).0 {
                R_X86_64_TPOFF64 => GotEntry::Offset,
                R_X86_64_TLSDESC => GotEntry::Descriptor,
                // (Its R_X86_64_DTPOFF64 names the next word.)
                R_X86_64_DTPMOD64 => GotEntry::ModuleAndOffset { offset: 0 },
                _ => continue,
            };
            let symbol = relocation.r_sym(endian, false) as usize;
            for (slot, wanted) in found[..2].iter().enumerate() {
                if let Some((Some(index), _)) = wanted {
                    if *index == symbol && got[slot].is_none() {
                        got[slot] = Some((relocation.r_offset(endian), entry));
                    }
                }
            }
        }
    }

    let variable = |slot: usize| -> Option<TlsVariable> {
        let (_, value) = found[slot]?;
        if let Some((got, entry)) = got[slot] {
            let entry = match entry {
                GotEntry::ModuleAndOffset { .. } => GotEntry::ModuleAndOffset { offset: value },
                other => other,
            };
            return Some(TlsVariable::Library { got, entry });
        }
        program_offset(value).map(|offset| TlsVariable::Program { offset })
    };
    Some(FileTls {
        otel: variable(0),
        labels: variable(1),
        go,
        segments: load_segments,
    })
}

/// How far below the thread pointer the program's TLS block starts
/// (glibc's x86-64 `l_tls_offset` of the first module).
fn program_tls_offset(memsz: u64, align: u64, vaddr: u64) -> Option<i64> {
    let align = align.max(1);
    if !align.is_power_of_two() {
        return None;
    }
    let first_byte = vaddr.wrapping_neg() & (align - 1);
    // As glibc computes it, in wrapping arithmetic: a block smaller than
    // its first byte's misalignment rounds up to that misalignment.
    let offset = memsz.wrapping_sub(first_byte).wrapping_add(align - 1) & !(align - 1);
    let offset = offset.wrapping_add(first_byte);
    i64::try_from(offset).ok()
}

/// A 4-byte defined data symbol's value in the file (its section's bytes).
fn symbol_u32<'data, R: object::ReadRef<'data>>(
    sections: &object::read::elf::SectionTable<
        'data,
        object::elf::FileHeader64<object::Endianness>,
        R,
    >,
    endian: object::Endianness,
    data: R,
    symbol: &object::elf::Sym64<object::Endianness>,
) -> Option<u32> {
    use object::read::elf::{SectionHeader, Sym};
    let index = symbol.st_shndx(endian).index()?;
    let section = sections
        .section(object::SectionIndex(usize::from(index)))
        .ok()?;
    if section.sh_type(endian) == object::elf::SHT_NOBITS {
        return Some(0);
    }
    let at = symbol
        .st_value(endian)
        .checked_sub(section.sh_addr(endian))?;
    let offset = section.sh_offset(endian).checked_add(at)?;
    let bytes = data.read_bytes_at(offset, 4).ok()?;
    Some(u32::from_le_bytes(bytes.try_into().ok()?))
}

/// Why a library's variable is not located yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NotYet {
    /// The loader has not filled the GOT entry (the library is mapped but
    /// not relocated yet): try again shortly.
    Unrelocated,
    /// The entry says something this reader does not take.
    Unreadable,
}

/// Where `pid`'s threads hold `variable` of a file mapped with load bias
/// `bias`. `read` reads the process's memory (bounded by the caller).
pub fn locate(
    variable: TlsVariable,
    bias: u64,
    mut read: impl FnMut(u64, &mut [u8]) -> bool,
) -> Result<TraceContextSlot, NotYet> {
    let mut word = |address: u64| -> Option<u64> {
        let mut bytes = [0u8; 8];
        read(address, &mut bytes).then(|| u64::from_le_bytes(bytes))
    };
    let static_slot = |offset: i64| TraceContextSlot {
        access: tls_access::STATIC,
        offset,
        ..TraceContextSlot::default()
    };
    match variable {
        TlsVariable::Program { offset } => Ok(static_slot(offset)),
        TlsVariable::Library {
            got,
            entry: GotEntry::Offset,
        } => {
            let offset = word(bias.wrapping_add(got)).ok_or(NotYet::Unrelocated)? as i64;
            if (-MAX_STATIC_TLS..0).contains(&offset) {
                Ok(static_slot(offset))
            } else if offset == 0 {
                // Not filled yet (the link-time value).
                Err(NotYet::Unrelocated)
            } else {
                Err(NotYet::Unreadable)
            }
        }
        TlsVariable::Library {
            got,
            entry: GotEntry::ModuleAndOffset { offset },
        } => {
            let module = word(bias.wrapping_add(got)).ok_or(NotYet::Unrelocated)?;
            if module == 0 {
                // Not filled yet (the link-time value).
                return Err(NotYet::Unrelocated);
            }
            dtv_slot(module, offset)
        }
        TlsVariable::Library {
            got,
            entry: GotEntry::Descriptor,
        } => {
            let entry = bias.wrapping_add(got);
            // Unreadable memory: the process may be mid-exec, or the
            // library just mapped; looked at again.
            let resolver = word(entry).ok_or(NotYet::Unrelocated)?;
            let argument = word(entry.wrapping_add(8)).ok_or(NotYet::Unrelocated)?;
            if resolver == 0 {
                // Not filled yet (lazy TLS descriptors are not in glibc
                // since 2.35; before, the resolver is set at once).
                return Err(NotYet::Unrelocated);
            }
            let signed = argument as i64;
            if (-MAX_STATIC_TLS..0).contains(&signed) {
                return Ok(static_slot(signed));
            }
            // A `tlsdesc_dynamic_arg`: the `tls_index` {module, offset} first.
            if !(4096..(1 << 47)).contains(&argument) {
                return Err(NotYet::Unreadable);
            }
            let module = word(argument).ok_or(NotYet::Unreadable)?;
            let offset = word(argument.wrapping_add(8)).ok_or(NotYet::Unreadable)?;
            dtv_slot(module, offset)
        }
    }
}

/// The variable at `offset` in the TLS block of module `module`, found
/// through each thread's DTV.
fn dtv_slot(module: u64, offset: u64) -> Result<TraceContextSlot, NotYet> {
    if !(1..=65_535).contains(&module) || offset >= MAX_STATIC_TLS as u64 {
        return Err(NotYet::Unreadable);
    }
    Ok(TraceContextSlot {
        access: tls_access::DTV,
        module,
        offset: offset as i64,
        ..TraceContextSlot::default()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_programs_block_sits_below_the_thread_pointer_as_glibc_puts_it() {
        // A Rust program's: 0x60 bytes, 8-aligned.
        assert_eq!(program_tls_offset(0x60, 8, 0x53870), Some(0x60));
        assert_eq!(program_tls_offset(0x61, 16, 0x1000), Some(0x70));
        // A template not aligned in the file keeps its misalignment.
        assert_eq!(program_tls_offset(0x20, 64, 0x1008), Some(0x38));
        assert_eq!(program_tls_offset(0x50, 64, 0x1008), Some(0x78));
        assert_eq!(program_tls_offset(0x20, 3, 0), None);
    }

    #[test]
    fn a_libraries_got_entry_says_static_dynamic_or_not_yet() {
        let memory = |words: Vec<(u64, u64)>| {
            move |address: u64, out: &mut [u8]| match words.iter().find(|(at, _)| *at == address) {
                Some((_, value)) => {
                    out.copy_from_slice(&value.to_le_bytes());
                    true
                }
                None => false,
            }
        };
        let descriptor = TlsVariable::Library {
            got: 0x100,
            entry: GotEntry::Descriptor,
        };
        // Static TLS: the argument is the offset from the thread pointer.
        let slot = locate(
            descriptor,
            0x7f00_0000_0000,
            memory(vec![
                (0x7f00_0000_0100, 0x7f55),
                (0x7f00_0000_0108, (-0x90i64) as u64),
            ]),
        );
        assert_eq!(
            slot.map(|s| (s.access, s.offset)),
            Ok((tls_access::STATIC, -0x90))
        );
        // Dynamic TLS: a pointer to {module, offset}.
        let slot = locate(
            descriptor,
            0,
            memory(vec![
                (0x100, 0x7f55),
                (0x108, 0x5000),
                (0x5000, 3),
                (0x5008, 0x18),
            ]),
        );
        assert_eq!(
            slot.map(|s| (s.access, s.module, s.offset)),
            Ok((tls_access::DTV, 3, 0x18))
        );
        // Not relocated yet (no resolver), or not readable yet: again later.
        assert_eq!(
            locate(descriptor, 0, memory(vec![(0x100, 0), (0x108, 0)])),
            Err(NotYet::Unrelocated)
        );
        assert_eq!(
            locate(descriptor, 0, memory(vec![])),
            Err(NotYet::Unrelocated)
        );
        // Filled, with an argument no layout read here gives: not again.
        assert_eq!(
            locate(descriptor, 0, memory(vec![(0x100, 0x7f55), (0x108, 8)])),
            Err(NotYet::Unreadable)
        );
        // Initial-exec: the entry is the offset.
        let initial_exec = TlsVariable::Library {
            got: 0x100,
            entry: GotEntry::Offset,
        };
        assert_eq!(
            locate(initial_exec, 0, memory(vec![(0x100, (-0x40i64) as u64)])).map(|s| s.offset),
            Ok(-0x40)
        );
        // `__tls_get_addr`'s {module, offset}: through the DTV, the offset
        // the file's (the second word not written yet is not read); a
        // module of 0 is not relocated yet.
        let general_dynamic = TlsVariable::Library {
            got: 0x100,
            entry: GotEntry::ModuleAndOffset { offset: 0x10 },
        };
        assert_eq!(
            locate(general_dynamic, 0, memory(vec![(0x100, 2), (0x108, 0)]))
                .map(|s| (s.access, s.module, s.offset)),
            Ok((tls_access::DTV, 2, 0x10))
        );
        assert_eq!(
            locate(general_dynamic, 0, memory(vec![(0x100, 0), (0x108, 0)])),
            Err(NotYet::Unrelocated)
        );
        assert_eq!(
            locate(
                general_dynamic,
                0,
                memory(vec![(0x100, 1 << 20), (0x108, 0)])
            ),
            Err(NotYet::Unreadable)
        );
    }

    #[test]
    fn files_without_the_variables_have_none() {
        let own = File::open("/proc/self/exe").unwrap();
        assert!(!find(&own).defines_any());
        let libc = File::open("/lib/x86_64-linux-gnu/libc.so.6").unwrap();
        let found = find(&libc);
        assert!(!found.defines_any());
        assert!(!found.segments.is_empty(), "libc has TLS and code");
    }
}

//! What ddprof needs of an ELF file before anything else: its GNU build
//! id, its `.gnu_debuglink` name and its executable segments, read from the
//! headers and the few small sections that hold them.
//!
//! `object`'s full parse also reads the symbol table: libLLVM's is 6 MB,
//! read (and allocated) again by each of the three places that wanted
//! these (the unwind tables' cache, the symbolizer's file identity, its
//! store key): ~10 ms of a warm `rustc -O` run's profiler CPU for nothing.
use std::fs::File;

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader, SectionHeader};
use object::{Endianness, ReadCache, ReadRef};

/// A loadable segment: where it is in the file and where it is mapped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub file_offset: u64,
    pub vaddr: u64,
    pub file_size: u64,
    pub executable: bool,
}

/// The headers of a 64-bit ELF file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ElfHeaders {
    pub build_id: Option<Vec<u8>>,
    /// The file name in `.gnu_debuglink`.
    pub debuglink: Option<Vec<u8>>,
    /// `PT_LOAD` segments, in program-header order.
    pub segments: Vec<Segment>,
}

impl ElfHeaders {
    /// The headers of `file`; `None` if it is not a 64-bit ELF file whose
    /// headers can be read.
    pub fn read(file: &File) -> Option<Self> {
        let data = ReadCache::new(file);
        Self::parse(&data)
    }

    /// The headers of the ELF file in `data`.
    pub fn parse<'d, R: ReadRef<'d>>(data: R) -> Option<Self> {
        let header = elf::FileHeader64::<Endianness>::parse(data).ok()?;
        let endian = header.endian().ok()?;
        let segments = header
            .program_headers(endian, data)
            .ok()?
            .iter()
            .filter(|segment| segment.p_type(endian) == elf::PT_LOAD)
            .map(|segment| Segment {
                file_offset: segment.p_offset(endian),
                vaddr: segment.p_vaddr(endian),
                file_size: segment.p_filesz(endian),
                executable: segment.p_flags(endian).contains(elf::PF_X),
            })
            .collect();
        let sections = header.sections(endian, data).ok()?;
        // As `object` finds them: the first GNU build-id note of a note
        // section, the first `.gnu_debuglink` section's name.
        let build_id = sections.iter().find_map(|section| {
            let mut notes = section.notes(endian, data).ok()??;
            while let Ok(Some(note)) = notes.next() {
                if note.name() == elf::ELF_NOTE_GNU && note.n_type(endian) == elf::NT_GNU_BUILD_ID {
                    return Some(note.desc().to_vec());
                }
            }
            None
        });
        let debuglink = sections
            .section_by_name(endian, b".gnu_debuglink")
            .and_then(|(_, section)| section.data(endian, data).ok())
            .and_then(|bytes| {
                let end = bytes.iter().position(|&byte| byte == 0)?;
                Some(bytes[..end].to_vec())
            });
        Some(Self {
            build_id,
            debuglink,
            segments,
        })
    }
}

/// `DT_FLAGS_1`'s flag of a position-independent executable.
const DF_1_PIE: u64 = 0x0800_0000;

/// A dynamic segment is read up to this size (a longer one counts as a
/// library's).
const MAX_DYNAMIC_BYTES: u64 = 64 << 10;

/// Whether an ELF file (32- or 64-bit) is a program rather than a shared
/// library: of type `ET_EXEC`, or `ET_DYN` with a program interpreter (a
/// PIE) or the `DF_1_PIE` flag (a static PIE), and no `DT_SONAME` (glibc's
/// `libc.so.6` has an interpreter too, to print its version when run, and
/// is a library). `false` for what is not
/// ELF or cannot be read.
pub fn is_program<'d, R: ReadRef<'d>>(data: R) -> bool {
    // `e_ident[EI_CLASS]`: 1 for 32-bit files, 2 for 64-bit ones.
    match data.read_bytes_at(4, 1) {
        Ok([2]) => is_program_of::<elf::FileHeader64<Endianness>, R>(data),
        Ok([1]) => is_program_of::<elf::FileHeader32<Endianness>, R>(data),
        _ => None,
    }
    .unwrap_or(false)
}

fn is_program_of<'d, Elf: FileHeader<Endian = Endianness>, R: ReadRef<'d>>(
    data: R,
) -> Option<bool> {
    use object::read::elf::Dyn;
    let header = Elf::parse(data).ok()?;
    let endian = header.endian().ok()?;
    match header.e_type(endian) {
        elf::ET_EXEC => Some(true),
        elf::ET_DYN => {
            let segments = header.program_headers(endian, data).ok()?;
            let interpreter = segments
                .iter()
                .any(|segment| segment.p_type(endian) == elf::PT_INTERP);
            // A dynamic section is a few hundred bytes; the file says how
            // long it is, and a longer one is not read (a library's).
            let (mut soname, mut pie) = (false, false);
            for segment in segments {
                if segment.p_type(endian) != elf::PT_DYNAMIC {
                    continue;
                }
                if Into::<u64>::into(segment.p_filesz(endian)) > MAX_DYNAMIC_BYTES {
                    soname = true;
                    continue;
                }
                let Ok(Some(entries)) = segment.dynamic(endian, data) else {
                    continue;
                };
                for entry in entries {
                    match entry.d_tag(endian) {
                        elf::DT_SONAME => soname = true,
                        elf::DT_FLAGS_1 => {
                            pie |= Into::<u64>::into(entry.d_val(endian)) & DF_1_PIE != 0
                        }
                        _ => {}
                    }
                }
            }
            // A static PIE (Rust's musl programs, `gcc -static-pie`) has
            // no interpreter, but its linker marks it `DF_1_PIE`.
            Some((interpreter || pie) && !soname)
        }
        _ => Some(false),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use object::Object;

    /// The same answers as `object`'s full parse, on the files of this
    /// machine that have each (a build id, a debug link, neither).
    #[test]
    fn reads_what_a_full_parse_reads() {
        let mut with_link = 0;
        let mut with_id = 0;
        let paths = ["/proc/self/exe", "/usr/bin/ls", "/bin/sh"]
            .into_iter()
            .map(String::from)
            .chain(
                std::fs::read_dir("/usr/lib/x86_64-linux-gnu")
                    .into_iter()
                    .flatten()
                    .flatten()
                    .map(|entry| entry.path().display().to_string())
                    .filter(|path| path.contains(".so")),
            )
            .take(200);
        for path in paths {
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            let Ok(full) = object::read::elf::ElfFile64::<Endianness>::parse(&*bytes) else {
                continue;
            };
            let headers = ElfHeaders::read(&File::open(&path).unwrap()).expect(&path);
            let build_id = full.build_id().unwrap().map(<[u8]>::to_vec);
            let debuglink = full.gnu_debuglink().unwrap().map(|(name, _)| name.to_vec());
            assert_eq!(headers.build_id, build_id, "{path}");
            assert_eq!(headers.debuglink, debuglink, "{path}");
            let loads = full
                .elf_program_headers()
                .iter()
                .filter(|segment| segment.p_type(full.endian()) == elf::PT_LOAD)
                .count();
            assert_eq!(headers.segments.len(), loads, "{path}");
            with_id += usize::from(build_id.is_some());
            with_link += usize::from(debuglink.is_some());
        }
        assert!(
            with_id > 10 && with_link > 5,
            "{with_id} ids, {with_link} links"
        );
    }

    /// An ELF header of `class` (1: 32-bit, 2: 64-bit) and type `e_type`,
    /// no segments.
    fn bare_header(class: u8, e_type: u16) -> Vec<u8> {
        let mut bytes = vec![0u8; if class == 1 { 52 } else { 64 }];
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[4] = class;
        bytes[5] = 1; // little-endian
        bytes[6] = 1; // EV_CURRENT
        bytes[16..18].copy_from_slice(&e_type.to_le_bytes());
        bytes[20..24].copy_from_slice(&1u32.to_le_bytes());
        bytes
    }

    #[test]
    fn a_program_is_told_from_a_library_in_32_and_64_bits() {
        let program = std::fs::File::open(std::env::current_exe().unwrap()).unwrap();
        assert!(is_program(&ReadCache::new(&program)));
        // glibc's libc.so.6 has a program interpreter (it runs, to print
        // its version), and a soname.
        let library = [
            "/lib/x86_64-linux-gnu/libc.so.6",
            "/usr/lib/x86_64-linux-gnu/libc.so.6",
        ]
        .iter()
        .find_map(|path| File::open(path).ok())
        .expect("glibc's libc.so.6");
        assert!(!is_program(&ReadCache::new(&library)));
        for class in [1, 2] {
            assert!(
                is_program(bare_header(class, 2).as_slice()),
                "ET_EXEC, class {class}"
            );
            // A shared object without an interpreter: a library.
            assert!(
                !is_program(bare_header(class, 3).as_slice()),
                "ET_DYN, class {class}"
            );
        }
        assert!(!is_program(bare_header(3, 2).as_slice()));
        assert!(!is_program(&b"#!/bin/sh\n"[..]));
    }
}

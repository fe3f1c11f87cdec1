//! Decompressed copies of split debug files, kept on disk by build id.
//!
//! Distributions ship split debug information with compressed sections
//! (Debian's `libc6-dbg`: 4 MiB on disk, 10 MiB of DWARF once inflated).
//! blazesym inflates every section of a compressed file onto the heap each
//! time a profiler starts: for libc that is ~25 ms of CPU and 10 MiB of
//! resident memory per run, most of a short run's cost (and a zstd file,
//! which blazesym is not built to read, is not read at all). The first run
//! that needs such a file writes it once, inflated section by section
//! straight into `DIR/.build-id/xx/rest.debug` (about what blazesym's own
//! inflating costs, without the memory, and less: the location lists,
//! which a symbolizer never reads, are left out); later runs map the copy
//! and read only the pages they look up. The originals are found by build
//! id in the debug directories (root's, like `/usr/lib/debug`: see
//! [`DebugCache::copy_for`] for why a build id is a safe name here), opened
//! without blocking, and a copy is kept only if its original did not
//! change while it was written. The directory is
//! ddprof's own ([`PrivateDir`]): the copy is written under a fresh name
//! and renamed into place, so a reader sees a whole file or none. The
//! oldest copies are removed once the directory holds more than
//! [`CACHE_MAX_BYTES`].
use std::fs;
use std::io::{BufReader, BufWriter, Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

use object::elf::{FileHeader64, SectionHeader64};
use object::read::elf::{ElfFile64, FileHeader, ProgramHeader, SectionHeader};
use object::{Endianness, ReadRef};

use crate::files::cache_dir::CacheDir;
use crate::files::disk::PrivateDir;
use crate::files::{build_id_debug_path, TargetRoot};
use std::os::fd::AsRawFd;

/// Total size of the copies kept; the least recently used go first.
pub const CACHE_MAX_BYTES: u64 = 1 << 30;
/// Debug files that inflate to more than this are left to blazesym: one copy
/// must not take more than a quarter of the cache.
const MAX_INFLATED_BYTES: u64 = CACHE_MAX_BYTES / 4;
/// Sections the copy keeps empty (header and name, no bytes): location
/// lists say where a function's variables live, which no symbolizer reads
/// (blazesym reads units, functions, inlined calls, lines and ranges).
/// They are the largest part of a debug file that a copy would otherwise
/// inflate for nothing: libc's `.debug_loclists`, 1.4 of its 10 MiB.
const SECTIONS_LEFT_EMPTY: [&[u8]; 2] = [b".debug_loc", b".debug_loclists"];
/// Alignments above this are not what a linker writes for a section with
/// bytes in a debug file; a copy padded to them would be mostly zeros.
const MAX_SECTION_ALIGNMENT: u64 = 64 << 10;

#[derive(Debug, thiserror::Error)]
pub enum DebugCacheError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not an ELF file ddprof can rewrite: {source}")]
    Elf {
        path: PathBuf,
        source: object::Error,
    },
    #[error("{path}: cannot write it back decompressed: {what}")]
    Layout { path: PathBuf, what: String },
}

/// One `PT_LOAD` segment of a mapped file: where its file offsets land in
/// the ELF's address space (which its split debug file shares).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    file_offset: u64,
    file_size: u64,
    address: u64,
}

/// A split debug file to read instead of the mapped file (a decompressed
/// copy, or the original), and how to turn the mapped file's offsets into
/// the addresses its DWARF and symbols use.
#[derive(Debug, Clone)]
pub struct DebugCopy {
    /// Where this process reads it (for a copy, through the directory held
    /// open: `/proc/self/fd/N/name`).
    pub path: PathBuf,
    /// Where it is on disk, for messages and other processes.
    pub location: PathBuf,
    segments: Vec<Segment>,
    /// What `path` reaches the copy through: the directory it is in
    /// (`/proc/self/fd/N/name`), or the copy itself (`/proc/self/fd/N`)
    /// while it is on its way to its directory.
    _held: Held,
}

#[derive(Debug, Clone)]
enum Held {
    Nothing,
    Dir { _dir: PrivateDir },
    File { _file: std::sync::Arc<fs::File> },
}

impl PartialEq for DebugCopy {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path && self.segments == other.segments
    }
}

impl Eq for DebugCopy {}

impl DebugCopy {
    /// The split debug file at `path` as it is, for the ELF file mapped
    /// from `mapped_path`.
    pub fn of_original(path: &Path, mapped_path: &str) -> Result<Self, DebugCacheError> {
        Ok(Self {
            path: path.to_path_buf(),
            location: path.to_path_buf(),
            segments: load_segments(Path::new(mapped_path))?,
            _held: Held::Nothing,
        })
    }

    /// The ELF address of `offset` in the mapped file, if a segment holds it.
    pub fn address_of(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| offset >= s.file_offset && offset - s.file_offset < s.file_size)
            .map(|s| offset - s.file_offset + s.address)
    }
}

/// The directory of decompressed copies.
#[derive(Debug, Clone)]
pub struct DebugCache {
    dir: CacheDir,
}

impl DebugCache {
    /// The copies in `dir` (made, `0700`, at the first write).
    pub fn new(dir: PathBuf) -> Self {
        Self {
            dir: CacheDir::new(dir),
        }
    }

    /// The decompressed copy of the split debug file of the ELF file at
    /// `mapped_path` (build id `build_id`), written now if this is the first
    /// run that needs it. `None` when no directory of `debug_dirs` holds a
    /// debug file for that build id, or when it has nothing compressed
    /// (blazesym maps it as it is).
    ///
    /// The copy is named by the build id, which whoever built the mapped
    /// file chose, and that is safe here: the id only picks which file of
    /// the debug directories (root's, `/usr/lib/debug`) is copied, and the
    /// copy holds that file's bytes, so a forged id can make a file be named
    /// from another build's debug file (its own frames, wrong), never put
    /// bytes of its choosing under another file's name.
    pub fn copy_for(
        &self,
        mapped_path: &str,
        build_id: &[u8],
        debug_dirs: &[PathBuf],
    ) -> Result<Option<DebugCopy>, DebugCacheError> {
        // Shorter ids are not real build ids (blazesym skips them too).
        if build_id.len() < 8 {
            return Ok(None);
        }
        let Some(relative) = build_id_debug_path(build_id) else {
            return Ok(None);
        };
        // `.build-id/xx/rest.debug`: the prefix and the name, under this
        // cache's own `.build-id`.
        let (Some(prefix), Some(name)) = (
            relative
                .parent()
                .and_then(Path::file_name)
                .and_then(|p| p.to_str()),
            relative.file_name().and_then(|n| n.to_str()),
        ) else {
            return Ok(None);
        };
        let kept = self
            .dir
            .prefix_dir(prefix)
            .filter(|dir| dir.has_file(name))
            .filter(|dir| {
                // A copy that is not a whole ELF file (seen once in root's
                // default cache: 13.2 MB of which the first 4.2 MB were the
                // 8.9 MB copy's, every later run failing to read libc's
                // lines from it) is written again rather than kept forever.
                let whole = is_whole_elf(&dir.fd_path(name));
                if !whole {
                    log::info!(
                        "debug cache: {} is damaged; writing it again",
                        dir.path().join(name).display()
                    );
                }
                whole
            });
        if let Some(dir) = kept {
            // Marks it recently used for the eviction order.
            self.dir.touch(prefix, name);
            return Ok(Some(DebugCopy {
                path: dir.fd_path(name),
                location: dir.path().join(name),
                segments: load_segments(Path::new(mapped_path))?,
                _held: Held::Dir { _dir: dir },
            }));
        }
        let Some((original_path, original)) = self.original(&relative, debug_dirs) else {
            return Ok(None);
        };
        // Nothing compressed (or too much): blazesym maps the original as
        // it is, and the cache directory is not even made.
        if !worth_a_copy(&original_path, &original)? {
            return Ok(None);
        }
        // Layout errors (the original's) travel through the writer's
        // `io::Error` and come back as they were; any other error is the
        // cache's.
        let written = self.dir.write_keeping(prefix, name, |out| {
            write_decompressed(&original_path, original, out).map_err(std::io::Error::other)
        });
        let copy = match written {
            Ok(copy) => copy,
            Err(error) => {
                return Err(match error.downcast::<DebugCacheError>() {
                    Ok(error) => error,
                    Err(error) => DebugCacheError::Io {
                        path: self.dir.path().join(prefix).join(name),
                        source: error,
                    },
                })
            }
        };
        let location = self.dir.path().join(prefix).join(name);
        log::info!(
            "debug cache: wrote {} (the decompressed {})",
            location.display(),
            original_path.display()
        );
        self.dir
            .trim("debug cache", CACHE_MAX_BYTES, Some((prefix, name)), None);
        Ok(Some(DebugCopy {
            path: PathBuf::from(format!("/proc/self/fd/{}", copy.as_raw_fd())),
            location,
            segments: load_segments(Path::new(mapped_path))?,
            _held: Held::File {
                _file: std::sync::Arc::new(copy),
            },
        }))
    }

    /// The debug file at `relative` in the first of `debug_dirs` that has
    /// one, opened without blocking (a regular file only).
    fn original(&self, relative: &Path, debug_dirs: &[PathBuf]) -> Option<(PathBuf, fs::File)> {
        let own_root = TargetRoot::own().ok()?;
        debug_dirs.iter().find_map(|dir| {
            let path = dir.join(relative);
            let opened = own_root.open(&path).ok()?;
            Some((path, opened.file))
        })
    }
}

/// Whether the ELF file `original` (opened as `file`) is worth a copy: it
/// has a compressed section (other than those a copy leaves empty), and
/// inflated they fit in what one copy may take.
fn worth_a_copy(original: &Path, file: &fs::File) -> Result<bool, DebugCacheError> {
    let elf = |source| DebugCacheError::Elf {
        path: original.to_path_buf(),
        source,
    };
    let handle = file.try_clone().map_err(|error| DebugCacheError::Layout {
        path: original.to_path_buf(),
        what: format!("cannot open it: {error}"),
    })?;
    let headers = object::ReadCache::new(handle);
    let parsed = ElfFile64::<Endianness, _>::parse(&headers).map_err(elf)?;
    let endian = parsed.endian();
    let table = parsed.elf_section_table();
    for header in table.iter() {
        let name = table.section_name(endian, header).map_err(elf)?;
        if SECTIONS_LEFT_EMPTY.contains(&name) {
            continue;
        }
        if header
            .sh_flags(endian)
            .contains(object::elf::SHF_COMPRESSED)
        {
            return Ok(true);
        }
    }
    Ok(false)
}

/// Where one section's bytes go in the copy, and where they come from.
struct PlacedSection {
    index: usize,
    /// The section's bytes in the original: `(offset, size)`.
    from: (u64, u64),
    /// Set for a compressed section: its format, and the alignment its
    /// compression header gives the inflated bytes.
    inflate: Option<(CompressionFormat, u64)>,
    /// Offset and size in the copy.
    offset: u64,
    size: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CompressionFormat {
    Zlib,
    Zstd,
}

/// Writes `original` (opened as `handle`) to `out` with every compressed
/// section inflated and [`SECTIONS_LEFT_EMPTY`] emptied; an error (and the
/// copy not kept) when the original changed while it was copied.
///
/// The copy is streamed: each section is inflated (or copied) straight into
/// the file through small buffers, so writing a copy of any size costs the
/// worker a few hundred KiB of memory, not the whole inflated file (libc's
/// debug file: 10 MiB inflated, once held three times over).
fn write_decompressed(
    original: &Path,
    handle: fs::File,
    out: &mut dyn Write,
) -> Result<(), DebugCacheError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DebugCacheError::Io { path, source }
    };
    let elf = |source| DebugCacheError::Elf {
        path: original.to_path_buf(),
        source,
    };
    // `Io` says the cache cannot be written (the cache is off for the run
    // then): an original that cannot be opened is the original's problem.
    let unreadable = |error: std::io::Error| DebugCacheError::Layout {
        path: original.to_path_buf(),
        what: format!("cannot open it: {error}"),
    };
    // Only the headers are read through the read cache (it keeps what it
    // reads); section bytes are streamed from a second handle.
    let second = handle.try_clone().map_err(unreadable)?;
    let checked = handle.try_clone().map_err(unreadable)?;
    let before = checked.metadata().map_err(unreadable)?;
    let headers = object::ReadCache::new(handle);
    let file = ElfFile64::<Endianness, _>::parse(&headers).map_err(elf)?;
    let endian = file.endian();
    let table = file.elf_section_table();

    let mut placed = Vec::new();
    let mut inflated_total: u64 = 0;
    for (index, header) in table.enumerate() {
        if header.sh_type(endian) == object::elf::SHT_NULL {
            continue;
        }
        let Some(from) = header.file_range(endian) else {
            continue; // SHT_NOBITS: no bytes in the file.
        };
        let name = table.section_name(endian, header).map_err(elf)?;
        if SECTIONS_LEFT_EMPTY.contains(&name) {
            placed.push(PlacedSection {
                index: index.0,
                from: (from.0, 0),
                inflate: None,
                offset: 0,
                size: 0,
            });
            continue;
        }
        let Some((chdr, offset, compressed_size)) =
            header.compression(endian, &headers).map_err(elf)?
        else {
            placed.push(PlacedSection {
                index: index.0,
                from,
                inflate: None,
                offset: 0,
                size: from.1,
            });
            continue;
        };
        let format = match chdr.ch_type.get(endian) {
            object::elf::ELFCOMPRESS_ZLIB => CompressionFormat::Zlib,
            object::elf::ELFCOMPRESS_ZSTD => CompressionFormat::Zstd,
            other => {
                return Err(DebugCacheError::Layout {
                    path: original.to_path_buf(),
                    what: format!("section {} is compressed in format {other}", index.0),
                });
            }
        };
        let size = chdr.ch_size.get(endian);
        inflated_total = inflated_total.saturating_add(size);
        placed.push(PlacedSection {
            index: index.0,
            from: (offset, compressed_size),
            inflate: Some((format, chdr.ch_addralign.get(endian))),
            offset: 0,
            size,
        });
    }
    if !placed.iter().any(|p| p.inflate.is_some()) || inflated_total > MAX_INFLATED_BYTES {
        return Err(DebugCacheError::Layout {
            path: original.to_path_buf(),
            what: "nothing to inflate, or more than a copy may hold".to_string(),
        });
    }

    // The copy keeps the original's order: the ELF and program headers
    // first (copied as they are), then the sections, each at its alignment,
    // then the section headers. The headers' sizes and offsets are checked,
    // not trusted: a hostile file gets an error, not an overflow.
    let layout = |what: &str| DebugCacheError::Layout {
        path: original.to_path_buf(),
        what: what.to_string(),
    };
    let file_len = headers
        .len()
        .map_err(|()| layout("cannot read its length"))?;
    if placed.iter().any(|p| {
        p.from
            .0
            .checked_add(p.from.1)
            .is_none_or(|end| end > file_len)
    }) {
        return Err(layout("a section runs past the end of the file"));
    }
    let header = file.elf_header();
    let headers_end = u64::from(header.e_phnum.get(endian))
        .checked_mul(u64::from(header.e_phentsize.get(endian)))
        .and_then(|size| size.checked_add(header.e_phoff.get(endian)))
        .ok_or_else(|| layout("program headers beyond any file"))?;
    let prefix_len = headers_end.max(std::mem::size_of::<FileHeader64<Endianness>>() as u64);
    let mut prefix = headers
        .read_bytes_at(0, prefix_len)
        .map_err(|()| layout("shorter than its program headers"))?
        .to_vec();
    placed.sort_by_key(|p| p.from.0);
    if placed
        .first()
        .is_some_and(|first| first.from.0 < prefix_len)
    {
        return Err(layout("a section overlaps the ELF or program headers"));
    }
    let mut section_headers: Vec<SectionHeader64<Endianness>> = table.iter().copied().collect();
    let mut position = prefix_len;
    for section in &mut placed {
        let shdr = &mut section_headers[section.index];
        if let Some((_, alignment)) = section.inflate {
            shdr.sh_addralign.set(endian, alignment);
        }
        // What the copy holds: the same for a section copied as it is, the
        // inflated size for a compressed one, nothing for one left empty.
        shdr.sh_size.set(endian, section.size);
        let mut flags = shdr.sh_flags.get(endian);
        flags.remove(object::elf::SHF_COMPRESSED);
        shdr.sh_flags.set(endian, flags);
        let alignment = shdr.sh_addralign.get(endian).max(1);
        if alignment > MAX_SECTION_ALIGNMENT {
            return Err(layout("a section is aligned beyond 64 KiB"));
        }
        section.offset = position
            .checked_next_multiple_of(alignment)
            .ok_or_else(|| layout("a section's alignment is beyond any file"))?;
        shdr.sh_offset.set(endian, section.offset);
        position = section
            .offset
            .checked_add(section.size)
            .ok_or_else(|| layout("a section's size is beyond any file"))?;
    }
    let section_headers_offset = position
        .checked_next_multiple_of(8)
        .ok_or_else(|| layout("sections beyond any file"))?;
    // Sections that share their bytes (or a hostile table) could make the
    // copy far larger than the original and its inflated data.
    if section_headers_offset > file_len.saturating_add(MAX_INFLATED_BYTES) {
        return Err(layout(
            "the copy would be larger than the file and its inflated data",
        ));
    }
    let mut new_header = *header;
    new_header.e_shoff.set(endian, section_headers_offset);
    prefix[..std::mem::size_of::<FileHeader64<Endianness>>()]
        .copy_from_slice(object::bytes_of(&new_header));

    let mut out = BufWriter::with_capacity(STREAM_BUFFER_BYTES, out);
    let mut input = BufReader::with_capacity(STREAM_BUFFER_BYTES, second);
    stream_copy(
        &mut input,
        &mut out,
        &prefix,
        &placed,
        &section_headers,
        section_headers_offset,
    )
    .map_err(|source| match source.kind() {
        std::io::ErrorKind::InvalidData => DebugCacheError::Layout {
            path: original.to_path_buf(),
            what: source.to_string(),
        },
        _ => DebugCacheError::Io {
            path: PathBuf::from("the copy"),
            source,
        },
    })?;
    out.flush().map_err(io(Path::new("the copy")))?;
    // Written while it was copied: the copy is not of any one state of it.
    if !same_file_state(&before, &checked) {
        return Err(DebugCacheError::Layout {
            path: original.to_path_buf(),
            what: "it changed while it was copied".to_string(),
        });
    }
    Ok(())
}

/// Whether `file` is as `before` said: same size, modification and change
/// times (the change time moves at any write).
fn same_file_state(before: &fs::Metadata, file: &fs::File) -> bool {
    use std::os::unix::fs::MetadataExt;
    file.metadata().is_ok_and(|now| {
        (
            now.len(),
            now.mtime(),
            now.mtime_nsec(),
            now.ctime(),
            now.ctime_nsec(),
        ) == (
            before.len(),
            before.mtime(),
            before.mtime_nsec(),
            before.ctime(),
            before.ctime_nsec(),
        )
    })
}

/// Buffer size of each stream (read and written) while a copy is made.
const STREAM_BUFFER_BYTES: usize = 128 << 10;

/// Writes the copy: `prefix` (the ELF and program headers), each placed
/// section (inflated or copied from `input`), then `section_headers`.
fn stream_copy(
    input: &mut BufReader<fs::File>,
    out: &mut impl Write,
    prefix: &[u8],
    placed: &[PlacedSection],
    section_headers: &[SectionHeader64<Endianness>],
    section_headers_offset: u64,
) -> std::io::Result<()> {
    out.write_all(prefix)?;
    let mut position = prefix.len() as u64;
    for section in placed {
        pad_to(out, &mut position, section.offset)?;
        let original = |error| original_error(section.index, error);
        input
            .seek(SeekFrom::Start(section.from.0))
            .map_err(original)?;
        let source = Read::take(&mut *input, section.from.1);
        // At most one byte more than the header says is inflated: a stream
        // that inflates to far more (a bomb) stops there and is an error.
        let limit = section.size.saturating_add(1);
        let copied = match section.inflate {
            None => std::io::copy(&mut OriginalBytes(source, section.index), out)?,
            Some((CompressionFormat::Zlib, _)) => {
                // ELFCOMPRESS_ZLIB: a zlib stream, header included.
                let inflated = flate2::bufread::ZlibDecoder::new(source);
                std::io::copy(&mut OriginalBytes(inflated.take(limit), section.index), out)?
            }
            Some((CompressionFormat::Zstd, _)) => {
                let inflated =
                    zstd::stream::read::Decoder::with_buffer(source).map_err(original)?;
                std::io::copy(&mut OriginalBytes(inflated.take(limit), section.index), out)?
            }
        };
        if copied != section.size {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!(
                    "section {} holds {copied} bytes where its header says {}",
                    section.index, section.size
                ),
            ));
        }
        position += copied;
    }
    pad_to(out, &mut position, section_headers_offset)?;
    out.write_all(object::bytes_of_slice(section_headers))?;
    out.flush()
}

/// The bytes of section `.1` of the original, inflated or not. A read or
/// decoder error is the original's (a damaged stream, a disk error), told
/// apart from the copy's write errors as `InvalidData`: it must not be
/// taken for a cache directory that cannot be written.
struct OriginalBytes<R>(R, usize);

impl<R: Read> Read for OriginalBytes<R> {
    fn read(&mut self, buffer: &mut [u8]) -> std::io::Result<usize> {
        self.0
            .read(buffer)
            .map_err(|error| original_error(self.1, error))
    }
}

fn original_error(section: usize, error: std::io::Error) -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        format!("section {section}: {error}"),
    )
}

/// Writes zeros from `position` up to `offset`.
fn pad_to(out: &mut impl Write, position: &mut u64, offset: u64) -> std::io::Result<()> {
    const ZEROS: [u8; 64] = [0; 64];
    while *position < offset {
        let n = (offset - *position).min(ZEROS.len() as u64);
        out.write_all(&ZEROS[..n as usize])?;
        *position += n;
    }
    Ok(())
}

/// Whether the file at `path` is an ELF file whose sections' data all lie
/// within it and whose section links name sections it has (only the
/// headers are read).
fn is_whole_elf(path: &Path) -> bool {
    let Ok(file) = fs::File::open(path) else {
        return false;
    };
    let Ok(length) = file.metadata().map(|metadata| metadata.len()) else {
        return false;
    };
    let data = object::ReadCache::new(file);
    let Ok(header) = FileHeader64::<Endianness>::parse(&data) else {
        return false;
    };
    let Ok(endian) = header.endian() else {
        return false;
    };
    let Ok(sections) = header.section_headers(endian, &data) else {
        return false;
    };
    let count = sections.len() as u64;
    sections.iter().all(|section| {
        let within = section
            .file_range(endian)
            .is_none_or(|(offset, size)| offset.checked_add(size).is_some_and(|end| end <= length));
        within && u64::from(section.sh_link(endian)) < count.max(1)
    })
}

/// The `PT_LOAD` segments of the ELF file at `path`.
fn load_segments(path: &Path) -> Result<Vec<Segment>, DebugCacheError> {
    // Only the headers are read, not the whole (maybe large) file.
    let file = fs::File::open(path).map_err(|source| DebugCacheError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let data = object::ReadCache::new(file);
    let elf = |source| DebugCacheError::Elf {
        path: path.to_path_buf(),
        source,
    };
    let header = object::elf::FileHeader64::<object::Endianness>::parse(&data).map_err(elf)?;
    let endian = header.endian().map_err(elf)?;
    let headers = header.program_headers(endian, &data).map_err(elf)?;
    Ok(headers
        .iter()
        .filter(|h| h.p_type(endian) == object::elf::PT_LOAD)
        .map(|h| Segment {
            file_offset: h.p_offset(endian),
            file_size: h.p_filesz(endian),
            address: h.p_vaddr(endian),
        })
        .collect())
}

//! Decompressed copies of split debug files, kept on disk by build id.
//!
//! Distributions ship split debug information with compressed sections
//! (Debian's `libc6-dbg`: 4 MiB on disk, 10 MiB of DWARF once inflated).
//! blazesym inflates every section of a compressed file onto the heap each
//! time a profiler starts: for libc that is ~25 ms of CPU and 10 MiB of
//! resident memory per run, most of a short run's cost. The first run that
//! needs such a file writes it once, inflated, under
//! `DIR/.build-id/xx/rest.debug`; later runs map the copy and read only the
//! pages they look up. The copy is written next to its final name and
//! renamed into place, so a reader sees a whole file or none; a build id
//! names one build, so a copy never goes stale. The oldest copies are
//! removed once the directory holds more than [`CACHE_MAX_BYTES`].
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use object::read::elf::{ElfFile64, FileHeader, ProgramHeader, SectionHeader};
use object::{Object, ObjectSection};

use crate::files::{build_id_debug_path, remove_least_recently_used};

/// Total size of the copies kept; the least recently used go first.
pub const CACHE_MAX_BYTES: u64 = 1 << 30;
/// Debug files that inflate to more than this are left to blazesym: the
/// copy is built in memory, and must not grow the worker past its bound.
const MAX_INFLATED_BYTES: u64 = 256 << 20;

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
    #[error("{path}: cannot write it back decompressed: {source}")]
    Build {
        path: PathBuf,
        source: object::build::Error,
    },
}

/// One `PT_LOAD` segment of a mapped file: where its file offsets land in
/// the ELF's address space (which its split debug file shares).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Segment {
    file_offset: u64,
    file_size: u64,
    address: u64,
}

/// A decompressed split debug file, and how to turn the mapped file's
/// offsets into the addresses its DWARF uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugCopy {
    pub path: PathBuf,
    segments: Vec<Segment>,
}

impl DebugCopy {
    /// The ELF address of `offset` in the mapped file, if a segment holds it.
    pub fn address_of(&self, offset: u64) -> Option<u64> {
        self.segments
            .iter()
            .find(|s| offset >= s.file_offset && offset - s.file_offset < s.file_size)
            .map(|s| offset - s.file_offset + s.address)
    }
}

/// The directory of decompressed copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DebugCache {
    dir: PathBuf,
}

impl DebugCache {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    /// The decompressed copy of the split debug file of the ELF file at
    /// `mapped_path` (build id `build_id`), written now if this is the first
    /// run that needs it. `None` when no directory of `debug_dirs` holds a
    /// debug file for that build id, or when it has nothing compressed
    /// (blazesym maps it as it is).
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
        let cached = self.dir.join(&relative);
        if !cached.exists() {
            let Some(original) = debug_dirs
                .iter()
                .map(|dir| dir.join(&relative))
                .find(|path| path.is_file())
            else {
                return Ok(None);
            };
            if !write_decompressed(&original, &cached)? {
                return Ok(None);
            }
            log::info!(
                "debug cache: wrote {} (the decompressed {})",
                cached.display(),
                original.display()
            );
            self.evict_beyond(CACHE_MAX_BYTES, &cached);
        } else {
            // Marks it recently used for the eviction order.
            let _ = fs::File::options()
                .append(true)
                .open(&cached)
                .and_then(|file| file.set_modified(std::time::SystemTime::now()));
        }
        let segments = load_segments(Path::new(mapped_path))?;
        Ok(Some(DebugCopy {
            path: cached,
            segments,
        }))
    }

    /// Removes the least recently used copies until the cache holds at most
    /// `max_bytes` (never `keep`, the copy just written).
    fn evict_beyond(&self, max_bytes: u64, keep: &Path) {
        for path in remove_least_recently_used(&self.dir.join(".build-id"), max_bytes, keep) {
            log::info!("debug cache: removed {} (over 1 GiB)", path.display());
        }
    }
}

/// Writes `original` to `destination` with every compressed section
/// inflated; `false` (and nothing written) when no section is compressed.
fn write_decompressed(original: &Path, destination: &Path) -> Result<bool, DebugCacheError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DebugCacheError::Io { path, source }
    };
    let elf = |source| DebugCacheError::Elf {
        path: original.to_path_buf(),
        source,
    };
    // The section headers first, through a read cache: most debug files
    // have nothing compressed, and are not read further.
    let handle = fs::File::open(original).map_err(io(original))?;
    let headers = object::ReadCache::new(handle);
    let mut total: u64 = 0;
    let mut any = false;
    {
        let file = ElfFile64::<object::Endianness, _>::parse(&headers).map_err(elf)?;
        for section in file.sections() {
            let flags = section.elf_section_header().sh_flags(file.endian());
            if flags.contains(object::elf::SHF_COMPRESSED) {
                any = true;
                total += section.compressed_data().map_err(elf)?.uncompressed_size;
            }
        }
    }
    if !any || total > MAX_INFLATED_BYTES {
        return Ok(false);
    }
    let data = fs::read(original).map_err(io(original))?;
    let file = ElfFile64::<object::Endianness>::parse(&*data).map_err(elf)?;
    let mut inflated: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
    for section in file.sections() {
        let flags = section.elf_section_header().sh_flags(file.endian());
        if flags.contains(object::elf::SHF_COMPRESSED) {
            let name = section.name_bytes().map_err(elf)?.to_vec();
            let bytes = section.uncompressed_data().map_err(elf)?.into_owned();
            inflated.push((name, bytes));
        }
    }
    let mut builder =
        object::build::elf::Builder::read(&*data).map_err(|source| DebugCacheError::Build {
            path: original.to_path_buf(),
            source,
        })?;
    for section in builder.sections.iter_mut() {
        let Some(index) = inflated
            .iter()
            .position(|(name, _)| name.as_slice() == section.name.as_slice())
        else {
            continue;
        };
        let (_, bytes) = inflated.swap_remove(index);
        section.sh_flags.remove(object::elf::SHF_COMPRESSED);
        // The alignment of the data the compression header described.
        section.sh_addralign = 1;
        section.data = object::build::elf::SectionData::Data(bytes.into());
    }
    let mut written = Vec::new();
    builder
        .write(&mut written)
        .map_err(|source| DebugCacheError::Build {
            path: original.to_path_buf(),
            source,
        })?;

    let parent = destination.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(parent).map_err(io(parent))?;
    let partial = destination.with_extension(format!("debug.{}.partial", std::process::id()));
    let result = fs::File::create(&partial)
        .and_then(|mut out| out.write_all(&written).and_then(|()| out.sync_data()))
        .and_then(|()| fs::rename(&partial, destination));
    if let Err(source) = result {
        let _ = fs::remove_file(&partial);
        return Err(DebugCacheError::Io {
            path: destination.to_path_buf(),
            source,
        });
    }
    Ok(true)
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

//! Files, in one place: which file a mapping maps ([`MappedFile`], the key
//! of every per-file cache), what its content is ([`ContentKey`]: digests,
//! see [`digest`]), its build id, the one way to open what a profiled
//! process names ([`target`]: mapped files, debug files, perf maps — never
//! blocking, never out of the process's root, the mapped inode or nothing,
//! under a time bound) and the one way to keep files on disk ([`disk`]:
//! outputs and caches, in directories no other user can write, never
//! through a link). Used by unwinding, aggregation, symbolization and the
//! outputs.
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

pub mod bounded;
pub mod cache_dir;
pub mod digest;
pub mod disk;
pub mod elf_headers;
pub mod target;

pub use digest::Digest;
pub use target::{open_mapped, FileIdentity, OpenedMapped, TargetFileError, TargetRoot};

/// The file the command `command` runs: the path as given, or a name
/// looked up in `PATH` as the exec (`execvp`) will, the first regular file
/// of that name. `None` when there is none.
pub fn command_path(command: &str) -> Option<std::path::PathBuf> {
    if command.contains('/') {
        return Some(std::path::PathBuf::from(command));
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| std::path::Path::new(dir).join(command))
        .find(|candidate| candidate.is_file())
}

/// Which file a mapping maps: its path as the kernel named it at mmap time,
/// its device and inode (0 when unknown). The process table shares one per
/// file among every process that maps it; the stages key their caches by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MappedFile {
    pub path: String,
    pub dev: u64,
    pub inode: u64,
}

impl MappedFile {
    pub fn identity(&self) -> FileIdentity {
        FileIdentity {
            dev: self.dev,
            inode: self.inode,
        }
    }
}

/// What something derived from a file (an unwind table, names) was derived
/// from: the file's bytes, and those of the split debug file used with it.
/// Tables and names are shared between paths, processes and runs by it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ContentKey {
    pub file: Digest,
    pub debug_file: Option<Digest>,
}

impl ContentKey {
    /// One digest for the pair (what the stores on disk name files by).
    pub fn digest(&self) -> Digest {
        match &self.debug_file {
            Some(debug) => Digest::of_parts(&[&self.file.0, &debug.0]),
            None => Digest::of_parts(&[&self.file.0]),
        }
    }
}

pub mod debug_file;

/// A file as its metadata tells it, to notice that it changed since it was
/// last read (a perf map written to, replaced or rewritten).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FileStamp {
    pub device: u64,
    pub inode: u64,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: i64,
}

impl FileStamp {
    pub fn of(metadata: &std::fs::Metadata) -> Self {
        Self {
            device: metadata.dev(),
            inode: metadata.ino(),
            size: metadata.len(),
            mtime: metadata.mtime(),
            mtime_nsec: metadata.mtime_nsec(),
        }
    }

    /// Whether `other` is a stamp of the same file (whatever its contents).
    pub fn same_file(&self, other: &Self) -> bool {
        (self.device, self.inode) == (other.device, other.inode)
    }
}

/// The build id of the running ddprof (`None` if it cannot be read): what
/// it computed and kept on disk is keyed by it too, so that another build's
/// results (its compiler or symbolizer may have changed) are computed again
/// with no version to bump by hand.
pub fn own_build_id() -> Option<&'static [u8]> {
    static ID: std::sync::OnceLock<Option<Vec<u8>>> = std::sync::OnceLock::new();
    ID.get_or_init(|| read_build_id("/proc/self/exe"))
        .as_deref()
}

/// A little-endian reader over a byte slice that fails past its end: how
/// the stores on disk decode their files.
pub struct Fields<'a> {
    pub rest: &'a [u8],
}

impl<'a> Fields<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self { rest: bytes }
    }

    /// The fields of a store file after its `magic` and `version`, if the
    /// file ends with the CRC-32 of everything before it and starts with
    /// them (the CRC is not among the fields).
    pub fn checked(bytes: &'a [u8], magic: &[u8], version: u32) -> Option<Self> {
        let (body, crc) = bytes.split_at_checked(bytes.len().checked_sub(4)?)?;
        if crc32fast::hash(body).to_le_bytes() != crc {
            return None;
        }
        let mut fields = Self::new(body);
        (fields.take(magic.len())? == magic && fields.u32()? == version).then_some(fields)
    }

    pub fn take(&mut self, count: usize) -> Option<&'a [u8]> {
        let (taken, rest) = self.rest.split_at_checked(count)?;
        self.rest = rest;
        Some(taken)
    }

    pub fn array<const N: usize>(&mut self) -> Option<[u8; N]> {
        self.take(N)?.try_into().ok()
    }

    pub fn u8(&mut self) -> Option<u8> {
        Some(self.array::<1>()?[0])
    }

    pub fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.array()?))
    }

    pub fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.array()?))
    }

    pub fn i64(&mut self) -> Option<i64> {
        Some(i64::from_le_bytes(self.array()?))
    }
}

/// Shorter ids are not real build ids (blazesym skips them too): the
/// stores on disk key nothing by them.
pub const MIN_BUILD_ID_LEN: usize = 8;
/// A build id longer than this is not one (GNU's are 20 bytes).
pub const MAX_BUILD_ID_LEN: usize = 64;

/// A build id in lowercase hex.
pub fn build_id_hex(build_id: &[u8]) -> String {
    build_id.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Reads the GNU build id of an ELF file without reading the whole file.
pub fn read_build_id(path: &str) -> Option<Vec<u8>> {
    use object::Object;
    let file = std::fs::File::open(path).ok()?;
    if let Some(headers) = elf_headers::ElfHeaders::read(&file) {
        return headers.build_id;
    }
    // Not a 64-bit ELF file: whatever `object` reads.
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).ok()?;
    elf.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// The `.gnu_debuglink` name of an ELF file: the file name of its split
/// debug file, when it names one.
pub fn read_debuglink(path: &str) -> Option<Vec<u8>> {
    use object::Object;
    let file = std::fs::File::open(path).ok()?;
    if let Some(headers) = elf_headers::ElfHeaders::read(&file) {
        return headers.debuglink;
    }
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).ok()?;
    let link = elf.gnu_debuglink().ok().flatten()?;
    Some(link.0.to_vec())
}

/// Where a debug directory keeps the split debug file of `build_id`:
/// `.build-id/xx/rest.debug`, relative to the directory (`None` for an id
/// under 2 bytes).
pub fn build_id_debug_path(build_id: &[u8]) -> Option<PathBuf> {
    if build_id.len() < 2 {
        return None;
    }
    let hex = build_id_hex(build_id);
    Some(
        PathBuf::from(".build-id")
            .join(&hex[..2])
            .join(format!("{}.debug", &hex[2..])),
    )
}

/// A mapped file as profiles report it, with its GNU build id (read once).
#[derive(Debug)]
pub struct ObjectFile {
    /// The path the file was mapped from (without the kernel's
    /// ` (deleted)` mark).
    pub path: String,
    pub dev: u64,
    pub inode: u64,
    pub build_id: Option<Vec<u8>>,
    /// Where the symbolizer reads the file: `/proc/self/fd/N` of the file
    /// held open; empty when it is not held (then it is not read at all:
    /// its path may name another file by now, or one of ddprof's own
    /// namespace rather than the process's).
    pub open_path: String,
    /// The file, opened while a process mapped it (the mapped inode, see
    /// [`target::open_mapped`]), so that it can be read after the process
    /// exited even if it was deleted or replaced on disk or lives in
    /// another mount namespace.
    held: Option<std::fs::File>,
    /// The root of the process it was opened for while held: where the
    /// package database that may name it is (a container's own).
    root: Option<TargetRoot>,
}

impl ObjectFile {
    /// A file of ddprof's own namespace, read by its path (tools and tests
    /// that symbolize files they chose themselves).
    pub fn by_path(path: &str, dev: u64, inode: u64) -> Self {
        Self {
            path: path.to_string(),
            dev,
            inode,
            build_id: read_build_id(path),
            open_path: path.to_string(),
            held: None,
            root: None,
        }
    }

    /// The file mapped from `path`, read through `opened` (the mapped file
    /// itself), or not at all.
    pub(crate) fn new(path: &str, dev: u64, inode: u64, opened: Option<OpenedMapped>) -> Self {
        let (held, root) = opened.map_or((None, None), |opened| (Some(opened.file), opened.root));
        let open_path = open_path(held.as_ref());
        Self {
            path: path.to_string(),
            dev,
            inode,
            build_id: (!open_path.is_empty())
                .then(|| read_build_id(&open_path))
                .flatten(),
            open_path,
            held,
            root,
        }
    }

    /// The same file, held through `opened` (or no longer held, nor its
    /// process's root).
    pub(crate) fn with_handle(&self, opened: Option<OpenedMapped>) -> Self {
        let (held, root) = opened.map_or((None, None), |opened| (Some(opened.file), opened.root));
        Self {
            path: self.path.clone(),
            dev: self.dev,
            inode: self.inode,
            build_id: self.build_id.clone(),
            open_path: open_path(held.as_ref()),
            held,
            root,
        }
    }

    /// Whether the file is held open (read through `open_path` whatever
    /// happens to its path).
    pub fn is_held(&self) -> bool {
        self.held.is_some()
    }

    /// The file held open, if it is.
    pub fn held(&self) -> Option<&File> {
        self.held.as_ref()
    }

    /// The root of the process the file is held for, when it is held and
    /// that root could be opened.
    pub fn root(&self) -> Option<&TargetRoot> {
        self.root.as_ref()
    }

    /// The build id as lowercase hex ("" when the file has none).
    pub fn build_id_hex(&self) -> String {
        self.build_id
            .as_deref()
            .map(build_id_hex)
            .unwrap_or_default()
    }

    /// Which file this is (the symbolizer's cache key).
    pub fn identity(&self) -> MappedFile {
        MappedFile {
            path: self.path.clone(),
            dev: self.dev,
            inode: self.inode,
        }
    }

    /// The file name without its directory, for frames that cannot be symbolized.
    pub fn file_name(&self) -> &str {
        self.path.rsplit('/').next().unwrap_or(&self.path)
    }
}

/// `/proc/self/fd/N` for a held file, else nothing.
fn open_path(held: Option<&File>) -> String {
    use std::os::fd::AsRawFd;
    held.map(|file| format!("/proc/self/fd/{}", file.as_raw_fd()))
        .unwrap_or_default()
}

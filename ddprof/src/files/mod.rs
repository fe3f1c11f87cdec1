//! File identity, in one place: which file a mapping maps ([`MappedFile`]),
//! what its content is ([`ContentKey`], for sharing unwind tables between
//! copies), its build id, and how to open it while a process maps it: by our
//! path when that is the mapped inode, else through `/proc/PID/root` (a file
//! of another mount namespace, a container's `/usr/lib/libc.so.6`), else
//! through `/proc/PID/map_files` (a file deleted or replaced since it was
//! mapped, as by a package upgrade). The path of a mapping record does not
//! say which: perf names the file as it was at mmap time, `/proc/PID/maps`
//! marks deleted ones. Used by unwinding, aggregation and symbolization.
use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Which file a mapping maps: its path as the kernel named it at mmap time,
/// its device and inode (0 when unknown). The process table shares one per
/// file among every process that maps it; the stages key their caches by it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct MappedFile {
    pub path: String,
    pub dev: u64,
    pub inode: u64,
}

/// Identifies a file's content: tables are shared between paths and
/// processes with the same content.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ContentKey {
    BuildId(Vec<u8>),
    /// Files without a build id.
    File {
        path: PathBuf,
        size: u64,
        mtime: i64,
        mtime_nsec: i64,
    },
}

/// A mapped file opened for reading.
#[derive(Debug)]
pub struct OpenedFile {
    pub file: File,
    /// The prefix the path resolved under: empty for our own namespace,
    /// `/proc/PID/root` otherwise (where the file's debug file is looked for).
    pub root: PathBuf,
    /// Whether it is the mapped inode (always true when that is unknown);
    /// when no candidate is, the first one that opened.
    pub same_inode: bool,
}

/// Opens `mapped` while process `pid` maps it: our path, then
/// `/proc/PID/root` + path, then the mapping `range` (start, end) in
/// `/proc/PID/map_files`; the first that is the mapped inode, else the
/// first that opened, else the last error.
pub fn open_mapped(
    pid: u32,
    mapped: &MappedFile,
    range: Option<(u64, u64)>,
) -> std::io::Result<OpenedFile> {
    let through_root = PathBuf::from(format!("/proc/{pid}/root"));
    let mut candidates = vec![
        (PathBuf::from(&mapped.path), PathBuf::new()),
        (
            through_root.join(mapped.path.trim_start_matches('/')),
            through_root.clone(),
        ),
    ];
    if let Some((start, end)) = range {
        candidates.push((
            PathBuf::from(format!("/proc/{pid}/map_files/{start:x}-{end:x}")),
            through_root,
        ));
    }
    let mut first_opened = None;
    let mut last_error = None;
    for (path, root) in candidates {
        match File::open(&path) {
            Ok(file) => {
                let same_inode = file
                    .metadata()
                    .is_ok_and(|m| mapped.inode == 0 || m.ino() == mapped.inode);
                if same_inode {
                    return Ok(OpenedFile {
                        file,
                        root,
                        same_inode,
                    });
                }
                first_opened.get_or_insert(OpenedFile {
                    file,
                    root,
                    same_inode,
                });
            }
            Err(error) => last_error = Some(error),
        }
    }
    first_opened.ok_or_else(|| {
        last_error.unwrap_or_else(|| std::io::Error::from(std::io::ErrorKind::NotFound))
    })
}

pub mod debug_file;

/// A file's identity as its metadata tells it: enough to notice that a
/// debug file was replaced (a package upgrade) or appeared.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct FileStamp {
    pub inode: u64,
    pub size: u64,
    pub mtime: i64,
    pub mtime_nsec: i64,
}

impl FileStamp {
    pub fn of(metadata: &std::fs::Metadata) -> Self {
        Self {
            inode: metadata.ino(),
            size: metadata.len(),
            mtime: metadata.mtime(),
            mtime_nsec: metadata.mtime_nsec(),
        }
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
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).ok()?;
    elf.build_id().ok().flatten().map(<[u8]>::to_vec)
}

/// The bytes of the regular file at `path` if it holds at most `max_bytes`:
/// `None` for anything else (a FIFO, which would block the open; a device or
/// a symbolic link, which could be endless), so that a file planted in a
/// cache directory costs a miss, not a hung or exhausted profiler.
pub fn read_regular_file(path: &Path, max_bytes: u64) -> Option<Vec<u8>> {
    use std::io::Read;
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK)
        .open(path)
        .ok()?;
    let metadata = file.metadata().ok()?;
    if !metadata.is_file() || metadata.len() > max_bytes {
        return None;
    }
    let mut bytes = Vec::with_capacity(metadata.len() as usize);
    file.take(max_bytes + 1).read_to_end(&mut bytes).ok()?;
    (bytes.len() as u64 <= max_bytes).then_some(bytes)
}

/// The `.gnu_debuglink` name of an ELF file: the file name of its split
/// debug file, when it names one.
pub fn read_debuglink(path: &str) -> Option<Vec<u8>> {
    use object::Object;
    let file = std::fs::File::open(path).ok()?;
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
    /// Where the symbolizer reads the file: `/proc/self/fd/N` for a file
    /// held open, else `path`.
    pub open_path: String,
    /// The file, opened while a process mapped it, so that it can be read
    /// after the process exited even if it was deleted or replaced on disk
    /// or lives in another mount namespace.
    held: Option<std::fs::File>,
}

impl ObjectFile {
    /// A file read by its path, without holding it open.
    pub fn by_path(path: &str, dev: u64, inode: u64) -> Self {
        Self::new(path, dev, inode, None)
    }

    pub(crate) fn new(path: &str, dev: u64, inode: u64, held: Option<std::fs::File>) -> Self {
        let open_path = open_path(path, held.as_ref());
        Self {
            path: path.to_string(),
            dev,
            inode,
            build_id: read_build_id(&open_path),
            open_path,
            held,
        }
    }

    /// The same file, held through `held` (or no longer held).
    pub(crate) fn with_handle(&self, held: Option<std::fs::File>) -> Self {
        Self {
            path: self.path.clone(),
            dev: self.dev,
            inode: self.inode,
            build_id: self.build_id.clone(),
            open_path: open_path(&self.path, held.as_ref()),
            held,
        }
    }

    /// Whether the file is held open (read through `open_path` whatever
    /// happens to its path).
    pub fn is_held(&self) -> bool {
        self.held.is_some()
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

/// `/proc/self/fd/N` for a held file, else its path.
fn open_path(path: &str, held: Option<&std::fs::File>) -> String {
    use std::os::fd::AsRawFd;
    match held {
        Some(file) => format!("/proc/self/fd/{}", file.as_raw_fd()),
        None => path.to_string(),
    }
}

/// Removes the least recently modified files of `root/*/` (a directory of
/// prefix directories, as `.build-id/xx/` lays them out) until they take at
/// most `max_bytes`, never `keep`; returns the files removed. The caches
/// kept on disk (decompressed debug files, compiled unwind tables) bound
/// themselves with it, each marking the files it uses as modified.
pub fn remove_least_recently_used(root: &Path, max_bytes: u64, keep: &Path) -> Vec<PathBuf> {
    let mut files: Vec<(SystemTime, u64, PathBuf)> = Vec::new();
    let Ok(prefixes) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    for prefix in prefixes.flatten() {
        let Ok(entries) = std::fs::read_dir(prefix.path()) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(metadata) = entry.metadata() else {
                continue;
            };
            let modified = metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH);
            // Another writer's file, about to be renamed into place (one
            // left behind by a crash goes once it is a minute old).
            let partial = entry.file_name().to_string_lossy().ends_with(".partial");
            if partial && modified.elapsed().is_ok_and(|age| age.as_secs() < 60) {
                continue;
            }
            files.push((modified, metadata.len(), entry.path()));
        }
    }
    let mut total: u64 = files.iter().map(|(_, size, _)| size).sum();
    files.sort();
    let mut removed = Vec::new();
    for (_, size, path) in files {
        if total <= max_bytes {
            break;
        }
        if path != keep && std::fs::remove_file(&path).is_ok() {
            total -= size;
            removed.push(path);
        }
    }
    removed
}

//! The one way ddprof opens a file that a profiled process names: the
//! files it maps, their split debug files, its JIT's perf map. ddprof runs
//! as root beside processes of other users and containers, and every such
//! path is chosen by someone else, so every open here:
//! - never blocks: the path is first opened `O_PATH` (no open of a device,
//!   no wait on a FIFO), checked to be a regular file, then reopened for
//!   reading `O_NONBLOCK` through `/proc/self/fd`; and the whole call runs
//!   under a time bound ([`super::bounded`]): a hung FUSE or NFS mount costs
//!   [`OPEN_TIMEOUT`] once, and the device is not tried again;
//! - never follows a link out of the process's root: paths resolve under
//!   its `/proc/PID/root` as if that were `/` (`openat2` with
//!   `RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS` since Linux 5.6; before it, a
//!   walk component by component that reads each link and resolves it
//!   itself under the same root);
//! - for a mapped file, is the mapped file or nothing: its device and inode
//!   must be the mapping's, tried first through `/proc/PID/map_files` (the
//!   very file mapped, even when deleted or replaced since), then through
//!   the process's root; a path of ddprof's own namespace is opened only
//!   when it leads to that same device and inode (a process that has
//!   exited, in the same namespace), never instead of it.
//!
//! Sizes are the caller's to bound (the readers check the size of the file
//! opened before reading it).
use std::collections::{HashSet, VecDeque};
use std::ffi::OsString;
use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{OFlag, ResolveFlag, AT_FDCWD};
use nix::sys::stat::{FileStat, Mode, SFlag};

use super::bounded::{self, Unanswered};
use super::MappedFile;

/// The longest one open of a file a process names may take.
pub const OPEN_TIMEOUT: Duration = Duration::from_secs(2);
/// Symbolic links one resolution follows at most (as the kernel's
/// `MAXSYMLINKS`).
const MAX_LINKS: usize = 40;

/// Which file a mapping maps, as the kernel identifies it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    pub dev: u64,
    pub inode: u64,
}

impl FileIdentity {
    fn of(stat: &FileStat) -> Self {
        Self {
            dev: stat.st_dev,
            inode: stat.st_ino,
        }
    }
}

/// Why a file a process names was not opened.
#[derive(Debug, thiserror::Error)]
pub enum TargetFileError {
    #[error("no such file")]
    NotFound,
    #[error(
        "not a regular file (ddprof opens no FIFO, device, socket or directory a process names)"
    )]
    NotRegular,
    #[error("the path leads to another file than the one mapped")]
    OtherFile,
    #[error(
        "the filesystem did not answer: {0} (ddprof does not open files on that device again)"
    )]
    Unanswered(Unanswered),
    #[error("owned by user {owner}, who is neither root nor the process's user")]
    ForeignOwner { owner: u32 },
    #[error("{0}")]
    Io(std::io::Error),
}

impl From<Errno> for TargetFileError {
    fn from(errno: Errno) -> Self {
        match errno {
            Errno::ENOENT | Errno::ENOTDIR => TargetFileError::NotFound,
            other => TargetFileError::Io(other.into()),
        }
    }
}

/// A regular file opened for reading, and what `fstat` said of it.
#[derive(Debug)]
pub struct OpenedRegular {
    pub file: File,
    pub identity: FileIdentity,
    pub size: u64,
    pub owner: u32,
}

/// A mapped file opened for reading.
#[derive(Debug)]
pub struct OpenedMapped {
    pub file: File,
    /// The root of the process that maps it, where its split debug file is
    /// looked for (`None` when the process's root could not be opened: no
    /// debug file is looked for then).
    pub root: Option<TargetRoot>,
}

/// A process's root directory (`/proc/PID/root`), held open: what the
/// process names resolves under it, never above it, also after the
/// process has exited.
#[derive(Debug, Clone)]
pub struct TargetRoot {
    fd: Arc<OwnedFd>,
    /// Its identity, to tell it from ddprof's own root.
    identity: FileIdentity,
}

impl TargetRoot {
    /// The root of process `pid` (which is ddprof's own when it shares its
    /// mount namespace and is not chrooted).
    pub fn of_process(pid: u32) -> Result<Self, TargetFileError> {
        Self::open_dir(PathBuf::from(format!("/proc/{pid}/root")))
    }

    /// ddprof's own root, `/`.
    pub fn own() -> Result<Self, TargetFileError> {
        Self::open_dir(PathBuf::from("/"))
    }

    /// A directory taken as a root (a test's scratch root).
    pub fn of_directory(path: &Path) -> Result<Self, TargetFileError> {
        Self::open_dir(path.to_path_buf())
    }

    fn open_dir(path: PathBuf) -> Result<Self, TargetFileError> {
        // `/proc/PID/root` and `/` are resolved by procfs and ddprof's own
        // root: nothing of another filesystem is read, nothing to bound.
        let fd = nix::fcntl::open(
            &path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let identity = FileIdentity::of(&nix::sys::stat::fstat(&fd)?);
        Ok(Self {
            fd: Arc::new(fd),
            identity,
        })
    }

    /// Whether this is the same directory as `other` (a process in ddprof's
    /// own mount namespace has ddprof's root).
    pub fn same_as(&self, other: &TargetRoot) -> bool {
        self.identity == other.identity
    }

    /// Opens the regular file at `path` as the process would resolve it.
    pub fn open(&self, path: &Path) -> Result<OpenedRegular, TargetFileError> {
        let root = self.fd.clone();
        let path = path.to_path_buf();
        let root_identity = self.identity;
        bounded_call(None, move || {
            if HUNG_ROOTS
                .lock()
                .is_ok_and(|hung| hung.contains(&root_identity))
            {
                return Err(TargetFileError::Unanswered(Unanswered::TooManyStuck));
            }
            let handle = resolve_in_root(&root, &path)?;
            reopen_regular(handle, None)
        })
        .inspect_err(|error| {
            if matches!(error, TargetFileError::Unanswered(_)) {
                if let Ok(mut hung) = HUNG_ROOTS.lock() {
                    if !hung.contains(&root_identity) {
                        hung.push(root_identity);
                    }
                }
            }
        })
    }

    /// Which file `path` is as the process would resolve it, without
    /// opening it. Not bounded here: for callers that bound a whole walk
    /// of a root's files (`provenance::dpkg`).
    pub fn identity_of(&self, path: &Path) -> Result<FileIdentity, TargetFileError> {
        let handle = resolve_in_root(&self.fd, path)?;
        Ok(FileIdentity::of(&nix::sys::stat::fstat(&handle)?))
    }

    /// The names in the directory `path` as the process would resolve it,
    /// at most `max` of them. Not bounded here, as [`TargetRoot::identity_of`].
    pub fn entry_names(&self, path: &Path, max: usize) -> Result<Vec<OsString>, TargetFileError> {
        let handle = resolve_in_root(&self.fd, path)?;
        // The directory already resolved, opened through this process's
        // own descriptor of it: nothing of the path is looked up again.
        let entries = std::fs::read_dir(format!("/proc/self/fd/{}", handle.as_raw_fd()))
            .map_err(TargetFileError::Io)?;
        Ok(entries
            .take(max)
            .filter_map(|entry| Some(entry.ok()?.file_name()))
            .collect())
    }

    /// [`TargetRoot::open`], accepted only when the file belongs to root or
    /// to one of `owners` (a JIT's perf map: a file anyone could have
    /// written in a shared `/tmp` names nothing).
    pub fn open_owned_by(
        &self,
        path: &Path,
        owners: &[u32],
    ) -> Result<OpenedRegular, TargetFileError> {
        let opened = self.open(path)?;
        if opened.owner != 0 && !owners.contains(&opened.owner) {
            return Err(TargetFileError::ForeignOwner {
                owner: opened.owner,
            });
        }
        Ok(opened)
    }
}

/// Devices on which an open timed out: not tried again by this process.
static HUNG_DEVICES: Mutex<Option<(u32, HashSet<u64>)>> = Mutex::new(None);
/// Roots under which an open timed out.
static HUNG_ROOTS: Mutex<Vec<FileIdentity>> = Mutex::new(Vec::new());

fn device_hung(dev: u64) -> bool {
    let pid = std::process::id();
    HUNG_DEVICES
        .lock()
        .ok()
        .and_then(|hung| {
            hung.as_ref()
                .filter(|(owner, _)| *owner == pid)
                .map(|(_, devices)| devices.contains(&dev))
        })
        .unwrap_or(false)
}

fn mark_device_hung(dev: u64) {
    let pid = std::process::id();
    if let Ok(mut hung) = HUNG_DEVICES.lock() {
        let (owner, devices) = hung.get_or_insert_with(|| (pid, HashSet::new()));
        if *owner != pid {
            *owner = pid;
            devices.clear();
        }
        devices.insert(dev);
        log::warn!(
            "an open on device {}:{} did not return within {} s: ddprof opens no more files \
             there (a hung network or FUSE filesystem?); their frames keep the file's name",
            libc::major(dev),
            libc::minor(dev),
            OPEN_TIMEOUT.as_secs()
        );
    }
}

/// Runs `open` under [`OPEN_TIMEOUT`]; a call that does not return marks
/// `device` (when known) as hung.
fn bounded_call<T: Send + 'static>(
    device: Option<u64>,
    open: impl FnOnce() -> Result<T, TargetFileError> + Send + 'static,
) -> Result<T, TargetFileError> {
    match bounded::run(OPEN_TIMEOUT, open) {
        Ok(result) => result,
        Err(unanswered) => {
            if let (Some(dev), Unanswered::TimedOut(_)) = (device, unanswered) {
                mark_device_hung(dev);
            }
            Err(TargetFileError::Unanswered(unanswered))
        }
    }
}

/// The descriptor of the library ddprof preloads into the command
/// (`sALLOC`), which this process holds: mapped files of that inode are
/// opened through it once the command is gone.
static PRELOADED_LIBRARY: std::sync::OnceLock<std::os::fd::RawFd> = std::sync::OnceLock::new();

/// Says which descriptor of this process holds the preloaded library.
pub fn preloaded_library_is(fd: std::os::fd::RawFd) {
    let _ = PRELOADED_LIBRARY.set(fd);
}

/// Opens the file that process `pid` maps as `mapped` (its path as the
/// kernel named it, its device and inode), at `range` (start, end) when
/// known: by its path in the process's root (gone: the roots met lately)
/// and in ddprof's own, then — a file deleted or replaced since it was
/// mapped — through `/proc/PID/map_files`; whichever way, only the mapped
/// device and inode is taken. One time bound covers them all.
pub fn open_mapped(
    pid: u32,
    mapped: &MappedFile,
    range: Option<(u64, u64)>,
) -> Result<OpenedMapped, TargetFileError> {
    let expected = FileIdentity {
        dev: mapped.dev,
        inode: mapped.inode,
    };
    if device_hung(expected.dev) {
        return Err(TargetFileError::Unanswered(Unanswered::TooManyStuck));
    }
    let path = PathBuf::from(
        mapped
            .path
            .strip_suffix(" (deleted)")
            .unwrap_or(&mapped.path),
    );
    // Where the path may resolve: the process's own root; when the process
    // is gone (a 30 ms job of a build in a container), the roots of the
    // processes met lately (its parent's, most likely: the same
    // container); last, ddprof's own. Whatever root a path resolves under,
    // only the mapped device and inode is taken. (Opening a root reads
    // nothing of the process's filesystems.)
    let own_root = TargetRoot::own().ok();
    let mut roots: Vec<TargetRoot> = Vec::new();
    match TargetRoot::of_process(pid) {
        Ok(root) => {
            remember_root(&root);
            roots.push(root);
        }
        Err(_) => roots.extend(recent_roots()),
    }
    if let Some(own) = &own_root {
        if !roots.iter().any(|root| root.same_as(own)) {
            roots.push(own.clone());
        }
    }
    let fds: Vec<Arc<OwnedFd>> = roots.iter().map(|root| root.fd.clone()).collect();
    let (file, root_index) = bounded_call(Some(expected.dev), move || {
        let mut first_error = None;
        // By path first: `/proc/PID/map_files` takes the process's memory
        // map lock, which a process that maps and unmaps all the time
        // (threads starting and ending) holds for writing, with the holder
        // often preempted on a busy machine: 1,000 threads of 5 ms on 2
        // busy CPUs kept it 87-314 ms in 3 of 6 runs (the path: < 0.1 ms),
        // and the table of such a program waited up to 0.86 s while its
        // samples took the perf engine's path (stack copies of 32 KB
        // filling the per-CPU buffers). `map_files` stays for what no path
        // reaches: a file deleted or replaced since it was mapped.
        for (index, root_fd) in fds.iter().enumerate() {
            match resolve_in_root(root_fd, &path).and_then(|h| reopen_regular(h, Some(expected))) {
                Ok(opened) => return Ok((opened.file, index)),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        if let Some((start, end)) = range {
            let map_file = format!("/proc/{pid}/map_files/{start:x}-{end:x}");
            let opened = nix::fcntl::open(
                map_file.as_str(),
                OFlag::O_PATH | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(TargetFileError::from)
            .and_then(|handle| reopen_regular(handle, Some(expected)));
            match opened {
                Ok(opened) => return Ok((opened.file, 0)),
                Err(error) => {
                    first_error.get_or_insert(error);
                }
            }
        }
        // The allocation sampler ddprof preloaded (an anonymous file, gone
        // with the process): the profiler inherited its descriptor; the
        // very inode, or nothing.
        if let Some(&fd) = PRELOADED_LIBRARY.get() {
            let own = nix::fcntl::open(
                format!("/proc/self/fd/{fd}").as_str(),
                OFlag::O_PATH | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(TargetFileError::from)
            .and_then(|handle| reopen_regular(handle, Some(expected)));
            if let Ok(opened) = own {
                return Ok((opened.file, 0));
            }
        }
        Err(first_error.unwrap_or(TargetFileError::NotFound))
    })?;
    Ok(OpenedMapped {
        file,
        root: roots.into_iter().nth(root_index),
    })
}

/// Roots of processes met lately, distinct (see [`open_mapped`]).
static RECENT_ROOTS: Mutex<Vec<TargetRoot>> = Mutex::new(Vec::new());
/// How many [`RECENT_ROOTS`] are kept (and tried) at most.
const RECENT_ROOTS_KEPT: usize = 8;

/// Remembers the root of process `pid` (which has just exec'd), while it
/// runs, for the files of processes that have exited by the time they are
/// opened.
pub fn note_process_root(pid: u32) {
    if let Ok(root) = TargetRoot::of_process(pid) {
        remember_root(&root);
    }
}

fn remember_root(root: &TargetRoot) {
    if let Ok(mut recent) = RECENT_ROOTS.lock() {
        recent.retain(|known| !known.same_as(root));
        recent.insert(0, root.clone());
        recent.truncate(RECENT_ROOTS_KEPT);
    }
}

fn recent_roots() -> Vec<TargetRoot> {
    RECENT_ROOTS
        .lock()
        .map(|recent| recent.clone())
        .unwrap_or_default()
}

/// Perf maps longer than this are not read: a file of any size can sit at
/// that name, and the map is held in memory (a map this long names about a
/// million functions).
pub const MAX_PERF_MAP_BYTES: u64 = 64 << 20;

/// Why a perf map found for a process names none of its code.
#[derive(Debug, Clone, thiserror::Error)]
#[error("perf map {path} not read: {why}")]
pub struct PerfMapRefused {
    pub path: String,
    pub why: String,
}

/// What names a JIT's code: the file, and how to read it.
#[derive(Debug)]
pub struct JitSymbols {
    pub file: File,
    pub format: JitFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JitFormat {
    /// `/tmp/perf-PID.map`: `START SIZE NAME` lines.
    PerfMap,
    /// `jit-PID.dump` (perf's jitdump, as `perf inject --jit` reads it),
    /// which the runtime maps executable so that its path is in the
    /// process's mappings (Node's `--perf-prof`).
    JitDump,
}

/// Whether `path` names a jitdump file (`…/jit-PID.dump`).
pub fn is_jitdump_path(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    name.strip_prefix("jit-")
        .and_then(|rest| rest.strip_suffix(".dump"))
        .is_some_and(|pid| !pid.is_empty() && pid.bytes().all(|b| b.is_ascii_digit()))
}

/// The perf map of process `pid` (`/tmp/perf-PID.map`, which JIT runtimes
/// write for code no ELF file describes), opened while the process runs:
/// the map in the process's own `/tmp` (its root's: a JIT in a container
/// writes its map there, named by its PID in its own PID namespace) first,
/// then the one in ddprof's `/tmp` by the PID ddprof sees. `/tmp` is
/// everyone's, so a map is taken only if it is a regular file that belongs
/// to root or to one of the process's users, and at most
/// [`MAX_PERF_MAP_BYTES`] long. Without a map, the jitdump the process
/// mapped (`jitdump`: its path in the process's mappings, so under the
/// process's root), on the same terms. `Ok(None)`: no map, or the process
/// is gone.
pub fn open_perf_map(
    pid: u32,
    jitdump: Option<&str>,
) -> Result<Option<JitSymbols>, PerfMapRefused> {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return Ok(None);
    };
    let field = |name: &str| -> Option<Vec<u32>> {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .map(|rest| {
                rest.split_whitespace()
                    .filter_map(|v| v.parse().ok())
                    .collect()
            })
    };
    // Real, effective, saved and filesystem user ids.
    let Some(owners) = field("Uid:") else {
        return Ok(None);
    };
    // The PID in the process's own namespace: the last of `NSpid`.
    let own_pid = field("NSpid:")
        .and_then(|pids| pids.last().copied())
        .unwrap_or(pid);
    let process_root = TargetRoot::of_process(pid).ok();
    let own_root = TargetRoot::own().ok();
    let mut candidates = Vec::new();
    if let Some(root) = &process_root {
        candidates.push((root, format!("/tmp/perf-{own_pid}.map"), JitFormat::PerfMap));
    }
    if let Some(own) = &own_root {
        let same_file =
            own_pid == pid && process_root.as_ref().is_some_and(|root| root.same_as(own));
        if !same_file {
            candidates.push((own, format!("/tmp/perf-{pid}.map"), JitFormat::PerfMap));
        }
    }
    if let (Some(root), Some(path)) = (&process_root, jitdump.filter(|p| is_jitdump_path(p))) {
        candidates.push((root, path.to_string(), JitFormat::JitDump));
    }
    let mut refused = None;
    for (root, path, format) in candidates {
        let why = match root.open_owned_by(Path::new(&path), &owners) {
            Ok(opened) if opened.size <= MAX_PERF_MAP_BYTES => {
                return Ok(Some(JitSymbols {
                    file: opened.file,
                    format,
                }))
            }
            Ok(opened) => format!(
                "{} bytes, more than the {} MiB ddprof reads",
                opened.size,
                MAX_PERF_MAP_BYTES >> 20
            ),
            Err(TargetFileError::NotFound) => continue,
            Err(error) => error.to_string(),
        };
        refused.get_or_insert(PerfMapRefused { path, why });
    }
    refused.map_or(Ok(None), Err)
}

/// `O_PATH` handle of `path` resolved under `root` as if it were `/`.
fn resolve_in_root(root: &OwnedFd, path: &Path) -> Result<OwnedFd, TargetFileError> {
    resolve(
        root,
        path,
        ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    )
}

/// Whether `openat2` works here: unknown, yes, no (Linux before 5.6, or a
/// seccomp filter that refuses it).
static OPENAT2: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const AVAILABLE: u8 = 1;
const MISSING: u8 = 2;

fn resolve(root: &OwnedFd, path: &Path, flags: ResolveFlag) -> Result<OwnedFd, TargetFileError> {
    if OPENAT2.load(Ordering::Relaxed) != MISSING {
        let how = nix::fcntl::OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(flags);
        // Relative to the root, whatever the path says.
        let relative = relative_path(path);
        match nix::fcntl::openat2(root, relative.as_path(), how) {
            Ok(fd) => {
                OPENAT2.store(AVAILABLE, Ordering::Relaxed);
                return Ok(fd);
            }
            // Whenever it comes: a worker inherits the parent's "available"
            // and its seccomp filter answers ENOSYS (a filter cannot read
            // `openat2`'s flags, behind a pointer).
            Err(Errno::ENOSYS | Errno::EPERM) => {
                OPENAT2.store(MISSING, Ordering::Relaxed);
            }
            // The kernel refuses a magic link, or a link (in-root
            // resolution does not allow `..` races either): no file.
            Err(Errno::ELOOP | Errno::EXDEV | Errno::EAGAIN) => {
                return Err(TargetFileError::NotFound)
            }
            Err(errno) => return Err(errno.into()),
        }
    }
    walk(root, path)
}

/// `path` without its leading `/` (an empty path stays `.`).
fn relative_path(path: &Path) -> PathBuf {
    let relative = path.strip_prefix("/").unwrap_or(path);
    if relative.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        relative.to_path_buf()
    }
}

/// Resolves `path` under `root` one component at a time, never letting
/// the kernel follow a link: each link is read and its target resolved
/// here, absolute ones from `root` again, and `..` never climbs above
/// `root`. What `openat2` with `RESOLVE_IN_ROOT` does in the kernel, for
/// kernels before 5.6. A magic link (`/proc/PID/fd/N`) reads as a path
/// string and is resolved as one: it cannot jump anywhere.
fn walk(root: &OwnedFd, path: &Path) -> Result<OwnedFd, TargetFileError> {
    let dup = |fd: &OwnedFd| fd.try_clone().map_err(TargetFileError::Io);
    // The directories from the root down to where the walk is.
    let mut dirs: Vec<OwnedFd> = vec![dup(root)?];
    let mut pending: VecDeque<OsString> = components(path.as_os_str().as_bytes());
    let mut links = 0;
    let mut last: Option<OwnedFd> = None;
    while let Some(component) = pending.pop_front() {
        if let Some(done) = last.take() {
            // A non-directory in the middle of the path.
            drop(done);
            return Err(TargetFileError::NotFound);
        }
        if component == ".." {
            if dirs.len() > 1 {
                dirs.pop();
            }
            continue;
        }
        let here = dirs.last().expect("the root is never popped");
        let fd = nix::fcntl::openat(
            here,
            component.as_os_str(),
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        )?;
        let stat = nix::sys::stat::fstat(&fd)?;
        match SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT {
            SFlag::S_IFLNK => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(TargetFileError::NotFound);
                }
                let target = nix::fcntl::readlinkat(&fd, "")?;
                let target = target.as_bytes();
                if target.first() == Some(&b'/') {
                    dirs.truncate(1);
                }
                for component in components(target).into_iter().rev() {
                    pending.push_front(component);
                }
            }
            SFlag::S_IFDIR => dirs.push(fd),
            _ => last = Some(fd),
        }
    }
    match last {
        Some(fd) => Ok(fd),
        None => dup(dirs.last().expect("the root is never popped")),
    }
}

/// The components of a path, without empty ones and `.`.
fn components(path: &[u8]) -> VecDeque<OsString> {
    path.split(|&byte| byte == b'/')
        .filter(|part| !part.is_empty() && *part != b".")
        .map(|part| OsString::from(std::ffi::OsStr::from_bytes(part)))
        .collect()
}

/// Checks that `handle` (`O_PATH`) is a regular file — and `expected`,
/// when given — and opens it for reading. The reopen goes through
/// `/proc/self/fd`, so it is the very inode checked.
fn reopen_regular(
    handle: OwnedFd,
    expected: Option<FileIdentity>,
) -> Result<OpenedRegular, TargetFileError> {
    let stat = nix::sys::stat::fstat(&handle)?;
    if SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(TargetFileError::NotRegular);
    }
    let identity = FileIdentity::of(&stat);
    if expected.is_some_and(|expected| expected != identity) {
        return Err(TargetFileError::OtherFile);
    }
    let fd = nix::fcntl::openat(
        AT_FDCWD,
        format!("/proc/self/fd/{}", handle.as_fd().as_raw_fd()).as_str(),
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    Ok(OpenedRegular {
        file: File::from(fd),
        identity,
        size: stat.st_size as u64,
        owner: stat.st_uid,
    })
}

/// Field `number` of a `/proc/…/stat` line, as proc(5) numbers them (3 is
/// the state). The command name (field 2), which the process chooses, may
/// hold spaces and parentheses: the fields are counted after its last ')'.
pub fn stat_field(stat: &str, number: usize) -> Option<&str> {
    let (_, fields) = stat.rsplit_once(')')?;
    fields.split_whitespace().nth(number.checked_sub(3)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A scratch directory that stands for a process's root.
    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ddprof-target-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(dir.join("usr/lib")).unwrap();
        dir
    }

    fn root_at(dir: &Path) -> TargetRoot {
        TargetRoot::open_dir(dir.to_path_buf()).unwrap()
    }

    fn resolves_under_the_root_whatever_the_links_say(walk_only: bool) {
        let dir = scratch(if walk_only { "walk" } else { "openat2" });
        std::fs::write(dir.join("usr/lib/libx.so"), b"inside").unwrap();
        // Links that would leave the root if the kernel followed them from
        // ddprof's own `/`.
        std::os::unix::fs::symlink("/usr/lib/libx.so", dir.join("absolute")).unwrap();
        std::os::unix::fs::symlink("../../../../../../etc/hostname", dir.join("climbs")).unwrap();
        std::os::unix::fs::symlink("/proc/self/root/etc/hostname", dir.join("magic")).unwrap();
        std::os::unix::fs::symlink("loop", dir.join("loop")).unwrap();
        std::os::unix::fs::symlink("usr/lib", dir.join("lib")).unwrap();
        let root = root_at(&dir);
        let read = |path: &str| {
            let handle = if walk_only {
                walk(&root.fd, Path::new(path))
            } else {
                resolve(
                    &root.fd,
                    Path::new(path),
                    ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS,
                )
            };
            handle
                .and_then(|h| reopen_regular(h, None))
                .map(|mut opened| {
                    let mut text = String::new();
                    std::io::Read::read_to_string(&mut opened.file, &mut text).unwrap();
                    text
                })
        };
        assert_eq!(read("/usr/lib/libx.so").unwrap(), "inside");
        assert_eq!(read("usr/lib/libx.so").unwrap(), "inside");
        assert_eq!(read("/absolute").unwrap(), "inside");
        assert_eq!(read("/lib/libx.so").unwrap(), "inside");
        assert_eq!(read("/lib/../lib/libx.so").unwrap(), "inside");
        assert_eq!(read("/usr/../usr/lib/../../absolute").unwrap(), "inside");
        assert_eq!(read("/../../../usr/lib/libx.so").unwrap(), "inside");
        // `..` stops at the root, so this is the root's own /etc/hostname:
        // there is none.
        assert!(matches!(read("/climbs"), Err(TargetFileError::NotFound)));
        assert!(read("/magic").is_err());
        assert!(read("/loop").is_err());
        assert!(matches!(
            read("/usr/lib/libx.so/more"),
            Err(TargetFileError::NotFound)
        ));
        if !walk_only && OPENAT2.load(Ordering::Relaxed) == MISSING {
            eprintln!("no openat2 on this kernel: resolve() used the walk");
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn links_resolve_under_the_root_with_openat2() {
        resolves_under_the_root_whatever_the_links_say(false);
    }

    #[test]
    fn links_resolve_under_the_root_with_the_walk() {
        resolves_under_the_root_whatever_the_links_say(true);
    }

    /// A FIFO is never opened (an open would block until a writer comes),
    /// nor a device, nor a directory.
    #[test]
    fn opens_only_regular_files_and_does_not_block() {
        let dir = scratch("fifo");
        let fifo = dir.join("usr/lib/fifo.so");
        nix::unistd::mkfifo(&fifo, Mode::S_IRWXU).unwrap();
        let root = root_at(&dir);
        let started = std::time::Instant::now();
        assert!(matches!(
            root.open(Path::new("/usr/lib/fifo.so")),
            Err(TargetFileError::NotRegular)
        ));
        assert!(matches!(
            root.open(Path::new("/usr/lib")),
            Err(TargetFileError::NotRegular)
        ));
        let own = TargetRoot::own().unwrap();
        assert!(matches!(
            own.open(Path::new("/dev/zero")),
            Err(TargetFileError::NotRegular)
        ));
        assert!(started.elapsed() < Duration::from_secs(1));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A mapped file is the mapped device and inode, or nothing: a file of
    /// ddprof's own namespace at the same path is not taken for it.
    #[test]
    fn a_mapped_file_is_the_mapped_inode_or_nothing() {
        let dir = scratch("mapped");
        let path = dir.join("usr/lib/liby.so");
        std::fs::write(&path, b"one").unwrap();
        let metadata = std::fs::metadata(&path).unwrap();
        let pid = std::process::id();
        let mapped = MappedFile {
            path: path.to_string_lossy().into_owned(),
            dev: metadata.dev(),
            inode: metadata.ino(),
        };
        assert!(open_mapped(pid, &mapped, None).is_ok());
        // Same inode number, another device: another file.
        let other_device = MappedFile {
            dev: metadata.dev() ^ 1,
            ..mapped.clone()
        };
        assert!(matches!(
            open_mapped(pid, &other_device, None),
            Err(TargetFileError::OtherFile)
        ));
        // The path now names another file.
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"two").unwrap();
        if std::fs::metadata(&path).unwrap().ino() != metadata.ino() {
            assert!(matches!(
                open_mapped(pid, &mapped, None),
                Err(TargetFileError::OtherFile)
            ));
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn perf_maps_of_other_users_are_refused() {
        let dir = scratch("owner");
        let map = dir.join("perf-1.map");
        std::fs::write(&map, b"1000 10 jitted\n").unwrap();
        let root = root_at(&dir);
        let me = nix::unistd::geteuid().as_raw();
        assert!(root.open_owned_by(Path::new("/perf-1.map"), &[me]).is_ok());
        if me == 0 {
            std::os::unix::fs::chown(&map, Some(65534), None).unwrap();
            assert!(matches!(
                root.open_owned_by(Path::new("/perf-1.map"), &[1000]),
                Err(TargetFileError::ForeignOwner { owner: 65534 })
            ));
            assert!(root
                .open_owned_by(Path::new("/perf-1.map"), &[65534])
                .is_ok());
        }
        std::fs::remove_dir_all(dir).unwrap();
    }
}

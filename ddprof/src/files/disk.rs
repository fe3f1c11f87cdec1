//! The one way ddprof keeps files on disk: its outputs (pprof files,
//! `stacks.folded`, `flamegraph.svg`) and its caches (unwind tables, names,
//! decompressed debug files). ddprof often runs as root, in directories
//! other users can reach (`/tmp`, a shared cache, the caller's working
//! directory), so nothing here lets another user choose what is written or
//! removed:
//! - a directory is used only if it is a real directory (never a link, at
//!   its last component) that belongs to ddprof's user and that no other
//!   user can write (group and others without write permission); one that
//!   does not exist is created `0700`. Anything else is refused with one
//!   line that says what to do ([`DiskError`]);
//! - the directory is held open and every file operation is relative to it
//!   (`openat`, `renameat`, `unlinkat`, `utimensat`), so renaming or
//!   replacing the path afterwards changes nothing;
//! - a file is written under a fresh name (`O_CREAT | O_EXCL | O_NOFOLLOW`,
//!   mode `0600`, a random part) and renamed into place: a reader sees a
//!   whole file or none, and no link can be written through;
//! - files are read only if regular (`O_NOFOLLOW | O_NONBLOCK`, then the
//!   type and the size are checked), and removals (the caches' size bounds)
//!   never follow a link: subdirectories are opened like the directory
//!   itself, and only regular files are removed.
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{BufWriter, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::UnlinkatFlags;

/// Why a directory is not used.
#[derive(Debug, thiserror::Error)]
pub enum DiskError {
    #[error(
        "{}: a symbolic link; ddprof writes only into a directory named by its own path \
         (give the real directory)",
        .0.display()
    )]
    Link(PathBuf),
    #[error("{}: not a directory", .0.display())]
    NotADirectory(PathBuf),
    #[error(
        "{}: belongs to user {owner}, not to ddprof's user {user}, who would write there what \
         that user chooses (choose a directory of ddprof's user)",
        path.display()
    )]
    OtherOwner {
        path: PathBuf,
        owner: u32,
        user: u32,
    },
    #[error(
        "{}: other users can write in it (mode {mode:04o}) and so choose what ddprof writes \
         there (choose a directory only ddprof's user can write, or `chmod go-w` it)",
        path.display()
    )]
    WritableByOthers { path: PathBuf, mode: u32 },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

impl DiskError {
    fn io(path: &Path, errno: Errno) -> Self {
        DiskError::Io {
            path: path.to_path_buf(),
            source: errno.into(),
        }
    }

    /// Whether the directory could not be made or reached (as opposed to
    /// refused for its owner, mode or kind).
    pub fn is_io(&self) -> bool {
        matches!(self, DiskError::Io { .. })
    }
}

/// What a directory entry is, without following a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    File,
    Directory,
    /// A link, FIFO, socket or device.
    Other,
}

/// One entry of a [`PrivateDir`].
#[derive(Debug, Clone)]
pub struct Entry {
    pub name: OsString,
    pub kind: EntryKind,
    pub size: u64,
    pub modified: SystemTime,
}

/// A directory that belongs to ddprof's user and that no other user can
/// write, held open (see the module documentation).
#[derive(Debug, Clone)]
pub struct PrivateDir {
    fd: Arc<OwnedFd>,
    path: PathBuf,
}

impl PrivateDir {
    /// Opens the directory at `path` (its last component must not be a
    /// link), creating it `0700` — and its missing parents — when `create`.
    pub fn open(path: &Path, create: bool) -> Result<Self, DiskError> {
        let Some(name) = path.file_name() else {
            // `/`, `.` or `..`: no last component to create or to check for
            // a link.
            let fd = nix::fcntl::open(
                path,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|errno| DiskError::io(path, errno))?;
            return Self::checked(fd, path.to_path_buf());
        };
        let parent = match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        if create {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode_0700()
                .create(parent)
                .map_err(|source| match source.kind() {
                    // A file where a directory of the path should be.
                    std::io::ErrorKind::AlreadyExists => {
                        DiskError::NotADirectory(parent.to_path_buf())
                    }
                    _ => DiskError::Io {
                        path: parent.to_path_buf(),
                        source,
                    },
                })?;
        }
        let parent_fd = nix::fcntl::open(
            parent,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| DiskError::io(parent, errno))?;
        Self::open_in(&parent_fd, name, path.to_path_buf(), create)
    }

    /// The subdirectory `name` (one component), created `0700` when `create`.
    pub fn child(&self, name: &str, create: bool) -> Result<PrivateDir, DiskError> {
        check_name(OsStr::new(name)).map_err(|source| DiskError::Io {
            path: self.path.join(name),
            source,
        })?;
        Self::open_in(
            self.fd.as_ref(),
            OsStr::new(name),
            self.path.join(name),
            create,
        )
    }

    fn open_in(
        parent: &impl AsFd,
        name: &OsStr,
        path: PathBuf,
        create: bool,
    ) -> Result<Self, DiskError> {
        if create {
            match nix::sys::stat::mkdirat(parent, name, Mode::S_IRWXU) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(errno) => return Err(DiskError::io(&path, errno)),
            }
        }
        let opened = nix::fcntl::openat(
            parent,
            name,
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        );
        match opened {
            Ok(fd) => Self::checked(fd, path),
            Err(errno @ (Errno::ELOOP | Errno::ENOTDIR)) => {
                // Tell a link from another kind of file.
                match nix::sys::stat::fstatat(parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
                    Ok(stat) if kind_of(&stat) == SFlag::S_IFLNK => Err(DiskError::Link(path)),
                    Ok(_) => Err(DiskError::NotADirectory(path)),
                    Err(_) => Err(DiskError::io(&path, errno)),
                }
            }
            Err(errno) => Err(DiskError::io(&path, errno)),
        }
    }

    fn checked(fd: OwnedFd, path: PathBuf) -> Result<Self, DiskError> {
        let stat = nix::sys::stat::fstat(&fd).map_err(|errno| DiskError::io(&path, errno))?;
        let user = nix::unistd::geteuid().as_raw();
        if stat.st_uid != user {
            return Err(DiskError::OtherOwner {
                path,
                owner: stat.st_uid,
                user,
            });
        }
        let mode = stat.st_mode & 0o7777;
        if mode & 0o022 != 0 {
            return Err(DiskError::WritableByOthers { path, mode });
        }
        Ok(Self {
            fd: Arc::new(fd),
            path,
        })
    }

    /// The path it was opened by (for messages; operations go through the
    /// descriptor).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// A path that reaches `name` in this very directory whatever happens
    /// to [`PrivateDir::path`], for readers that take a path
    /// (`/proc/self/fd/N/name`).
    pub fn fd_path(&self, name: &str) -> PathBuf {
        PathBuf::from(format!("/proc/self/fd/{}", self.fd.as_raw_fd())).join(name)
    }

    /// Creates `name`, which must not exist, for writing (mode `0600`).
    pub fn create_new(&self, name: &str) -> std::io::Result<File> {
        check_name(OsStr::new(name))?;
        let fd = nix::fcntl::openat(
            self.fd.as_ref(),
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::S_IRUSR | Mode::S_IWUSR,
        )?;
        Ok(File::from(fd))
    }

    /// Writes `name` whole: `write` fills a fresh file (see
    /// [`PrivateDir::create_temporary`]), which is then renamed to `name`
    /// (replacing it).
    pub fn write_atomically(
        &self,
        name: &str,
        write: impl FnOnce(&mut BufWriter<File>) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let (temporary, file) = self.create_temporary(name)?;
        let mut writer = BufWriter::new(file);
        let written = write(&mut writer)
            .and_then(|()| writer.flush())
            .and_then(|()| self.rename(&temporary, name));
        if written.is_err() {
            let _ = self.remove(&temporary);
        }
        written
    }

    /// A new file for what will become `name`: `.NAME.RANDOM.partial`,
    /// created exclusively, and its name.
    pub fn create_temporary(&self, name: &str) -> std::io::Result<(String, File)> {
        check_name(OsStr::new(name))?;
        self.create_new_randomly(|random| format!(".{name}.{random}{PARTIAL_SUFFIX}"))
    }

    /// Creates a new file named by `name_with` from a random part (16 hex
    /// digits), drawing again while the name exists; the name and the file.
    fn create_new_randomly(
        &self,
        name_with: impl Fn(&str) -> String,
    ) -> std::io::Result<(String, File)> {
        for _ in 0..16 {
            let name = name_with(&format!("{:016x}", random()));
            match self.create_new(&name) {
                Ok(file) => return Ok((name, file)),
                Err(error) if error.raw_os_error() == Some(libc::EEXIST) => {}
                Err(error) => return Err(error),
            }
        }
        Err(Errno::EEXIST.into())
    }

    /// Lets other users read and traverse this directory (`0755`), never
    /// write to it: for files that processes of other users must open by
    /// path (the allocation sampler a command of `--switch-user` preloads).
    pub fn let_others_read(&self) -> std::io::Result<()> {
        nix::sys::stat::fchmod(self.fd.as_ref(), Mode::from_bits_truncate(0o755))?;
        Ok(())
    }

    /// Creates `name`, which must not exist, with `bytes` in it, readable
    /// by every user and writable by none (`0444`); a random part replaces
    /// `RANDOM` in `name`. The name made.
    pub fn create_readable_by_all(&self, name: &str, bytes: &[u8]) -> std::io::Result<String> {
        let (made, mut file) = self.create_new_randomly(|random| name.replace("RANDOM", random))?;
        let written = file.write_all(bytes).and_then(|()| {
            nix::sys::stat::fchmod(&file, Mode::from_bits_truncate(0o444))
                .map_err(std::io::Error::from)
        });
        if let Err(error) = written {
            let _ = self.remove(&made);
            return Err(error);
        }
        Ok(made)
    }

    /// Renames `from` to `to` in this directory.
    pub fn rename(&self, from: &str, to: &str) -> std::io::Result<()> {
        check_name(OsStr::new(from))?;
        check_name(OsStr::new(to))?;
        nix::fcntl::renameat(self.fd.as_ref(), from, self.fd.as_ref(), to)?;
        Ok(())
    }

    /// Removes the file (or link) `name`; a link is removed, never followed.
    pub fn remove(&self, name: &str) -> std::io::Result<()> {
        check_name(OsStr::new(name))?;
        nix::unistd::unlinkat(self.fd.as_ref(), name, UnlinkatFlags::NoRemoveDir)?;
        Ok(())
    }

    /// Removes the empty subdirectory `name` (never through a link).
    pub fn remove_dir(&self, name: &str) -> std::io::Result<()> {
        check_name(OsStr::new(name))?;
        nix::unistd::unlinkat(self.fd.as_ref(), name, UnlinkatFlags::RemoveDir)?;
        Ok(())
    }

    /// Whether a bounded store in this directory is due for its trimming:
    /// not when `mark` (a file here) was touched less than `interval` ago.
    /// Marks the time now when it is. Listing a store costs a `stat` per
    /// file, so the stores that share a directory trim it at most this
    /// often.
    pub fn due(&self, mark: &str, interval: Duration) -> bool {
        let recent = self
            .modified(mark)
            .and_then(|modified| modified.elapsed().ok())
            .is_some_and(|age| age < interval);
        if recent {
            return false;
        }
        // The mark: created if missing (never through a link), else touched.
        if self.has_file(mark) {
            self.touch(mark);
        } else if let Err(error) = self.write_atomically(mark, |_| Ok(())) {
            log::debug!("{}: cannot mark the trimming: {error}", self.path.display());
        }
        true
    }

    /// The regular file `name`, opened for reading, if it is at most
    /// `max_bytes`.
    pub fn open_regular(&self, name: &str, max_bytes: u64) -> Option<File> {
        check_name(OsStr::new(name)).ok()?;
        let fd = nix::fcntl::openat(
            self.fd.as_ref(),
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .ok()?;
        let stat = nix::sys::stat::fstat(&fd).ok()?;
        (kind_of(&stat) == SFlag::S_IFREG && (stat.st_size as u64) <= max_bytes)
            .then(|| File::from(fd))
    }

    /// The bytes of the regular file `name`, if it is at most `max_bytes`.
    pub fn read_regular(&self, name: &str, max_bytes: u64) -> Option<Vec<u8>> {
        let file = self.open_regular(name, max_bytes)?;
        // Sized as `fstat` says (one more byte shows a file that grew):
        // grown by doubling, a 15 MB unwind table was copied twice more and
        // faulted in twice its size.
        let size = file.metadata().ok()?.len().min(max_bytes);
        let mut bytes = Vec::with_capacity(size as usize + 1);
        file.take(max_bytes + 1).read_to_end(&mut bytes).ok()?;
        (bytes.len() as u64 <= max_bytes).then_some(bytes)
    }

    /// Whether `name` is a regular file here.
    pub fn has_file(&self, name: &str) -> bool {
        self.stat(name)
            .is_some_and(|stat| kind_of(&stat) == SFlag::S_IFREG)
    }

    /// When the regular file `name` was last modified.
    pub fn modified(&self, name: &str) -> Option<SystemTime> {
        let stat = self.stat(name)?;
        (kind_of(&stat) == SFlag::S_IFREG).then(|| modified_of(&stat))
    }

    /// Marks `name` as modified now (without following a link): the caches
    /// evict the least recently used first.
    pub fn touch(&self, name: &str) {
        if check_name(OsStr::new(name)).is_ok() {
            let _ = nix::sys::stat::utimensat(
                self.fd.as_ref(),
                name,
                &TimeSpec::UTIME_NOW,
                &TimeSpec::UTIME_NOW,
                UtimensatFlags::NoFollowSymlink,
            );
        }
    }

    fn stat(&self, name: &str) -> Option<FileStat> {
        check_name(OsStr::new(name)).ok()?;
        nix::sys::stat::fstatat(self.fd.as_ref(), name, AtFlags::AT_SYMLINK_NOFOLLOW).ok()
    }

    /// The entries of the directory (without `.` and `..`), none followed.
    pub fn entries(&self) -> Vec<Entry> {
        let Ok(fd) = nix::fcntl::openat(
            self.fd.as_ref(),
            ".",
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) else {
            return Vec::new();
        };
        let Ok(mut dir) = nix::dir::Dir::from_fd(fd) else {
            return Vec::new();
        };
        let mut entries = Vec::new();
        for entry in dir.iter().flatten() {
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            let Ok(stat) =
                nix::sys::stat::fstatat(self.fd.as_ref(), name, AtFlags::AT_SYMLINK_NOFOLLOW)
            else {
                continue;
            };
            let kind = match kind_of(&stat) {
                SFlag::S_IFREG => EntryKind::File,
                SFlag::S_IFDIR => EntryKind::Directory,
                _ => EntryKind::Other,
            };
            entries.push(Entry {
                name: name.to_os_string(),
                kind,
                size: stat.st_size as u64,
                modified: modified_of(&stat),
            });
        }
        entries
    }
}

/// A [`PrivateDir`] opened (and created) at first use, by whichever
/// process uses it first: the configuration names the caches' directories
/// long before the profiler (and its workers) use them.
#[derive(Debug, Clone)]
pub struct LazyDir {
    path: PathBuf,
    dir: Arc<std::sync::OnceLock<Option<PrivateDir>>>,
}

impl LazyDir {
    pub fn new(path: PathBuf) -> Self {
        Self {
            path,
            dir: Arc::new(std::sync::OnceLock::new()),
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory, or `None` when it cannot be made or is refused (said
    /// once, at debug level: the profiler checks the caches' root at start
    /// and says it there).
    pub fn get(&self) -> Option<&PrivateDir> {
        self.dir
            .get_or_init(|| match PrivateDir::open(&self.path, true) {
                Ok(dir) => Some(dir),
                Err(error) => {
                    log::debug!("cache directory not used: {error}");
                    None
                }
            })
            .as_ref()
    }
}

impl LazyDir {
    /// The directory if it exists already (and may be used); nothing is
    /// made.
    pub fn existing(&self) -> Option<&PrivateDir> {
        if let Some(opened) = self.dir.get() {
            return opened.as_ref();
        }
        let dir = PrivateDir::open(&self.path, false).ok()?;
        self.dir.get_or_init(|| Some(dir)).as_ref()
    }
}

impl PartialEq for LazyDir {
    fn eq(&self, other: &Self) -> bool {
        self.path == other.path
    }
}

impl Eq for LazyDir {}

/// How the temporary names of [`PrivateDir::create_temporary`] end.
pub const PARTIAL_SUFFIX: &str = ".partial";

/// A temporary file younger than this may be another writer's, about to be
/// renamed into place; an older one was left behind by a crash.
const PARTIAL_GRACE: Duration = Duration::from_secs(60);

/// Removes the least recently modified regular files of `root`'s
/// subdirectories (a directory of prefix directories, as `.build-id/xx/`
/// lays them out) until they take at most `max_bytes`, never `keep` (a
/// subdirectory and a name); returns the paths removed. A subdirectory that
/// is a link, or that another user could write, is left alone, and so is
/// anything in it that is not a regular file.
pub fn remove_least_recently_used(
    root: &PrivateDir,
    max_bytes: u64,
    keep: Option<(&str, &str)>,
) -> Vec<PathBuf> {
    // (modified, size, subdirectory, name, kept)
    let mut files: Vec<(SystemTime, u64, usize, OsString, bool)> = Vec::new();
    let mut dirs: Vec<PrivateDir> = Vec::new();
    for entry in root.entries() {
        if entry.kind != EntryKind::Directory {
            continue;
        }
        let Some(name) = entry.name.to_str() else {
            continue;
        };
        let Ok(dir) = root.child(name, false) else {
            continue;
        };
        for file in dir.entries() {
            if file.kind != EntryKind::File {
                continue;
            }
            let partial = file.name.as_bytes().ends_with(PARTIAL_SUFFIX.as_bytes());
            if partial && file.modified.elapsed().is_ok_and(|age| age < PARTIAL_GRACE) {
                continue;
            }
            let kept = keep
                .is_some_and(|(keep_dir, keep_name)| keep_dir == name && file.name == keep_name);
            files.push((file.modified, file.size, dirs.len(), file.name, kept));
        }
        dirs.push(dir);
    }
    let mut total: u64 = files.iter().map(|(_, size, _, _, _)| size).sum();
    files.sort();
    let mut removed = Vec::new();
    for (_, size, dir, name, kept) in files {
        if total <= max_bytes {
            break;
        }
        let Some(name) = name.to_str().filter(|_| !kept) else {
            continue;
        };
        if dirs[dir].remove(name).is_ok() {
            total -= size;
            removed.push(dirs[dir].path().join(name));
        }
    }
    removed
}

/// A name of one component (no `/`, not `.` or `..`, not empty).
fn check_name(name: &OsStr) -> std::io::Result<()> {
    let bytes = name.as_bytes();
    if bytes.is_empty() || bytes == b"." || bytes == b".." || bytes.contains(&b'/') {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("not a file name: {name:?}"),
        ));
    }
    Ok(())
}

fn kind_of(stat: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(stat.st_mode) & SFlag::S_IFMT
}

fn modified_of(stat: &FileStat) -> SystemTime {
    let since_epoch = Duration::new(
        stat.st_mtime.max(0) as u64,
        stat.st_mtime_nsec.clamp(0, 999_999_999) as u32,
    );
    SystemTime::UNIX_EPOCH + since_epoch
}

/// A random number for temporary names (std's hasher keys are random per
/// process; the time and a counter make each call differ).
fn random() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    hasher.write_u128(
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |elapsed| elapsed.as_nanos()),
    );
    hasher.write_u32(std::process::id());
    hasher.finish()
}

/// `DirBuilder::mode(0o700)` (a trait method, imported here only).
trait Mode0700 {
    fn mode_0700(&mut self) -> &mut Self;
}

impl Mode0700 for std::fs::DirBuilder {
    fn mode_0700(&mut self) -> &mut Self {
        use std::os::unix::fs::DirBuilderExt;
        self.mode(0o700)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn scratch(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("ddprof-disk-{test}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        dir
    }

    #[test]
    fn creates_private_directories_and_refuses_others() {
        let dir = scratch("refuse");
        let made = PrivateDir::open(&dir.join("a/b/out"), true).unwrap();
        let mode = std::fs::metadata(made.path()).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        // A link at the last component.
        std::os::unix::fs::symlink(dir.join("a"), dir.join("link")).unwrap();
        assert!(matches!(
            PrivateDir::open(&dir.join("link"), true),
            Err(DiskError::Link(_))
        ));
        // A directory others can write.
        std::fs::create_dir(dir.join("shared")).unwrap();
        std::fs::set_permissions(dir.join("shared"), std::fs::Permissions::from_mode(0o1777))
            .unwrap();
        assert!(matches!(
            PrivateDir::open(&dir.join("shared"), true),
            Err(DiskError::WritableByOthers { mode: 0o1777, .. })
        ));
        // A file.
        std::fs::write(dir.join("file"), b"x").unwrap();
        assert!(matches!(
            PrivateDir::open(&dir.join("file"), true),
            Err(DiskError::NotADirectory(_))
        ));
        // Another user's directory (as root, one can make one).
        if nix::unistd::geteuid().is_root() {
            std::fs::create_dir(dir.join("nobody")).unwrap();
            std::os::unix::fs::chown(dir.join("nobody"), Some(65534), Some(65534)).unwrap();
            assert!(matches!(
                PrivateDir::open(&dir.join("nobody"), true),
                Err(DiskError::OtherOwner { owner: 65534, .. })
            ));
        }
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Every write goes through a fresh file in the directory held open:
    /// a link planted at any name is replaced, never written through, and
    /// renaming the directory away changes nothing.
    #[test]
    fn writes_never_follow_links() {
        let dir = scratch("links");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"precious").unwrap();
        let out = PrivateDir::open(&dir.join("out"), true).unwrap();
        std::os::unix::fs::symlink(&victim, dir.join("out/stacks.folded")).unwrap();
        out.write_atomically("stacks.folded", |w| w.write_all(b"a;b 1\n"))
            .unwrap();
        assert_eq!(std::fs::read(&victim).unwrap(), b"precious");
        assert_eq!(
            std::fs::read(dir.join("out/stacks.folded")).unwrap(),
            b"a;b 1\n"
        );
        assert!(out.create_new("stacks.folded").is_err());
        // Reads refuse a link too.
        std::os::unix::fs::symlink(&victim, dir.join("out/linked")).unwrap();
        assert!(out.read_regular("linked", 100).is_none());
        out.touch("linked");
        assert!(out.modified("linked").is_none());
        // The directory moved: writes still land in it.
        std::fs::rename(dir.join("out"), dir.join("moved")).unwrap();
        std::os::unix::fs::symlink(&dir, dir.join("out")).unwrap();
        out.write_atomically("later", |w| w.write_all(b"x"))
            .unwrap();
        assert!(dir.join("moved/later").exists());
        assert!(!dir.join("later").exists());
        assert!(matches!(out.child("../x", true), Err(DiskError::Io { .. })));
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// Eviction removes the oldest regular files, and nothing through a
    /// link (a linked "prefix directory" is not entered).
    #[test]
    fn eviction_never_follows_links() {
        let dir = scratch("evict");
        let outside = dir.join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("a.conf"), vec![0u8; 4096]).unwrap();
        let store = PrivateDir::open(&dir.join("store"), true).unwrap();
        let prefix = store.child("ab", true).unwrap();
        for (i, name) in ["old", "mid", "new"].iter().enumerate() {
            prefix
                .write_atomically(name, |w| w.write_all(&[0u8; 1000]))
                .unwrap();
            let when = SystemTime::now() - Duration::from_secs(100 - i as u64 * 10);
            File::options()
                .write(true)
                .open(prefix.fd_path(name))
                .unwrap()
                .set_modified(when)
                .unwrap();
        }
        std::os::unix::fs::symlink(&outside, dir.join("store/zz")).unwrap();
        std::os::unix::fs::symlink(outside.join("a.conf"), dir.join("store/ab/link")).unwrap();
        // 3000 bytes, "old" kept: "mid" goes, then "new" (the next oldest
        // that may go) is not needed.
        let removed = remove_least_recently_used(&store, 2500, Some(("ab", "old")));
        let names: Vec<_> = removed
            .iter()
            .map(|p| p.file_name().unwrap().to_owned())
            .collect();
        assert_eq!(names, ["mid"]);
        assert!(outside.join("a.conf").exists());
        assert!(prefix.has_file("old") && prefix.has_file("new"));
        std::fs::remove_dir_all(dir).unwrap();
    }
}

//! The directories ddprof's caches keep their files in (`DIR/xx/name`:
//! unwind tables, names, decompressed debug files, digests), and who writes
//! them.
//!
//! Reads are made by whoever needs the file. Writes are made by one process
//! only: the profiler's parent. A worker parses whatever the profiled
//! processes map, and a bug a hostile file triggers must not give it the
//! means to write anywhere: its sandbox (`confine::worker_sandbox`) refuses it every
//! open for writing, every rename, every `mkdir`. So in a worker
//! ([`route_writes_to`]), a write fills an anonymous file (`memfd_create`)
//! that goes to the parent over a socket with the directory and the name,
//! and the parent ([`serve_writes`]) writes it in place itself, the same way
//! it would have (a fresh name renamed into place, in a directory of its
//! own user that no other user can write), after checking that the
//! directory is one of the caches'. Touching a file for the eviction order
//! and trimming a store to its size go the same way. Writes are not
//! waited for: a later read may not find a file written a moment ago, and
//! is a cache miss.
use std::fs::File;
use std::io::{BufWriter, Seek, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags, UnixAddr};

use super::disk::{remove_least_recently_used, LazyDir, PrivateDir};

/// A cache's directory of prefix subdirectories.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheDir {
    dir: LazyDir,
}

/// Where this process's cache writes go, when not done here.
static REMOTE: OnceLock<OwnedFd> = OnceLock::new();

/// Sends every cache write of this process to the process at the other end
/// of `socket` (a `SOCK_SEQPACKET` socket; see [`serve_writes`]). Called
/// once, by a worker, before it reads or writes any cache.
pub fn route_writes_to(socket: OwnedFd) {
    let _ = REMOTE.set(socket);
}

fn remote() -> Option<&'static OwnedFd> {
    REMOTE.get()
}

impl CacheDir {
    /// The cache in `path` (made `0700` at its first write).
    pub fn new(path: PathBuf) -> Self {
        Self {
            dir: LazyDir::new(path),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The directory, to read from, as it is (a read makes nothing).
    fn readable(&self) -> Option<&PrivateDir> {
        self.dir.existing()
    }

    /// The subdirectory `prefix`, if it exists.
    pub fn prefix_dir(&self, prefix: &str) -> Option<PrivateDir> {
        self.readable()?.child(prefix, false).ok()
    }

    /// The bytes of `prefix/name` if it is a regular file of at most
    /// `max_bytes`.
    pub fn read(&self, prefix: &str, name: &str, max_bytes: u64) -> Option<Vec<u8>> {
        self.prefix_dir(prefix)?.read_regular(name, max_bytes)
    }

    /// `prefix/name` opened for reading, if it is a regular file of at
    /// most `max_bytes`.
    pub fn open(&self, prefix: &str, name: &str, max_bytes: u64) -> Option<File> {
        self.prefix_dir(prefix)?.open_regular(name, max_bytes)
    }

    /// `prefix/name` mapped read-only, if it is a non-empty regular file of
    /// at most `max_bytes`: its pages are the page cache's, neither copied
    /// nor zeroed first (reading a stored table into fresh memory cost more
    /// than the rest of its load here, a page fault per 4 KiB).
    pub fn map(&self, prefix: &str, name: &str, max_bytes: u64) -> Option<FileView> {
        FileView::of(&self.open(prefix, name, max_bytes)?)
    }

    /// Whether `prefix/name` is a regular file.
    pub fn has(&self, prefix: &str, name: &str) -> bool {
        self.prefix_dir(prefix)
            .is_some_and(|dir| dir.has_file(name))
    }

    /// Writes `prefix/name` whole with what `write` produces (in a worker,
    /// by the parent, see the module documentation). `write` returning an
    /// error writes nothing.
    pub fn write(
        &self,
        prefix: &str,
        name: &str,
        write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        match remote() {
            Some(socket) => {
                let mut content = BufWriter::new(anonymous_file()?);
                write(&mut content)?;
                let content = content.into_inner().map_err(|e| e.into_error())?;
                send(
                    socket,
                    &Operation::Write {
                        dir: self.path().to_path_buf(),
                        prefix: prefix.to_string(),
                        name: name.to_string(),
                    },
                    Some(&content),
                )
            }
            None => {
                let root = self.dir.get().ok_or_else(|| {
                    std::io::Error::other(format!("{} cannot be used", self.path().display()))
                })?;
                let dir = root.child(prefix, true).map_err(std::io::Error::other)?;
                dir.write_atomically(name, |out| write(out))
            }
        }
    }

    /// [`CacheDir::write`], and the file written, for reading now (in a
    /// worker, the content on its way to the parent: the file itself may
    /// not be there yet).
    pub fn write_keeping(
        &self,
        prefix: &str,
        name: &str,
        write: impl FnOnce(&mut dyn Write) -> std::io::Result<()>,
    ) -> std::io::Result<File> {
        match remote() {
            Some(socket) => {
                let mut content = BufWriter::new(anonymous_file()?);
                write(&mut content)?;
                let mut content = content.into_inner().map_err(|e| e.into_error())?;
                send(
                    socket,
                    &Operation::Write {
                        dir: self.path().to_path_buf(),
                        prefix: prefix.to_string(),
                        name: name.to_string(),
                    },
                    Some(&content),
                )?;
                content.rewind()?;
                Ok(content)
            }
            None => {
                self.write(prefix, name, write)?;
                self.prefix_dir(prefix)
                    .and_then(|dir| dir.open_regular(name, u64::MAX))
                    .ok_or_else(|| std::io::Error::other("the file written is gone"))
            }
        }
    }

    /// Marks `prefix/name` as used now (the eviction order).
    pub fn touch(&self, prefix: &str, name: &str) {
        match remote() {
            Some(socket) => {
                let _ = send(
                    socket,
                    &Operation::Touch {
                        dir: self.path().to_path_buf(),
                        prefix: prefix.to_string(),
                        name: name.to_string(),
                    },
                    None,
                );
            }
            None => {
                if let Some(dir) = self.prefix_dir(prefix) {
                    dir.touch(name);
                }
            }
        }
    }

    /// Removes the least recently used files until the cache holds at most
    /// `max_bytes`, never `keep` (prefix, name); with `every` (a mark file
    /// and an interval), at most once per interval for all the runs that
    /// share the cache. Each file removed is logged, at info level, with
    /// `what` (the cache's name).
    pub fn trim(
        &self,
        what: &str,
        max_bytes: u64,
        keep: Option<(&str, &str)>,
        every: Option<(&str, Duration)>,
    ) {
        match remote() {
            Some(socket) => {
                let _ = send(
                    socket,
                    &Operation::Trim {
                        dir: self.path().to_path_buf(),
                        what: what.to_string(),
                        max_bytes,
                        keep: keep.map(|(p, n)| (p.to_string(), n.to_string())),
                        every: every.map(|(mark, interval)| (mark.to_string(), interval)),
                    },
                    None,
                );
            }
            None => {
                let Some(root) = self.dir.get() else {
                    return;
                };
                if let Some((mark, interval)) = every {
                    if !root.due(mark, interval) {
                        return;
                    }
                }
                for path in remove_least_recently_used(root, max_bytes, keep) {
                    log::info!(
                        "{what}: removed {} (over {} MiB)",
                        path.display(),
                        max_bytes >> 20
                    );
                }
            }
        }
    }
}

/// A cache operation a worker asks of the parent.
#[derive(Debug, Clone, PartialEq)]
enum Operation {
    /// Write `dir/prefix/name` with the file sent along.
    Write {
        dir: PathBuf,
        prefix: String,
        name: String,
    },
    Touch {
        dir: PathBuf,
        prefix: String,
        name: String,
    },
    Trim {
        dir: PathBuf,
        what: String,
        max_bytes: u64,
        keep: Option<(String, String)>,
        every: Option<(String, Duration)>,
    },
}

const WRITE: u8 = 1;
const TOUCH: u8 = 2;
const TRIM: u8 = 3;
/// The largest message (paths and names only: content goes as a file).
const MAX_MESSAGE: usize = 16 << 10;

impl Operation {
    fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        let text = |out: &mut Vec<u8>, text: &[u8]| {
            out.extend_from_slice(&(text.len() as u32).to_le_bytes());
            out.extend_from_slice(text);
        };
        use std::os::unix::ffi::OsStrExt;
        match self {
            Operation::Write { dir, prefix, name } | Operation::Touch { dir, prefix, name } => {
                out.push(if matches!(self, Operation::Write { .. }) {
                    WRITE
                } else {
                    TOUCH
                });
                text(&mut out, dir.as_os_str().as_bytes());
                text(&mut out, prefix.as_bytes());
                text(&mut out, name.as_bytes());
            }
            Operation::Trim {
                dir,
                what,
                max_bytes,
                keep,
                every,
            } => {
                out.push(TRIM);
                text(&mut out, dir.as_os_str().as_bytes());
                text(&mut out, what.as_bytes());
                out.extend_from_slice(&max_bytes.to_le_bytes());
                let (keep_prefix, keep_name) = keep.clone().unwrap_or_default();
                out.push(u8::from(keep.is_some()));
                text(&mut out, keep_prefix.as_bytes());
                text(&mut out, keep_name.as_bytes());
                let (mark, interval) = every.clone().unwrap_or_default();
                out.push(u8::from(every.is_some()));
                text(&mut out, mark.as_bytes());
                out.extend_from_slice(&(interval.as_millis() as u64).to_le_bytes());
            }
        }
        out
    }

    fn decode(bytes: &[u8]) -> Option<Operation> {
        let mut fields = super::Fields::new(bytes);
        let kind = fields.u8()?;
        let text = |fields: &mut super::Fields<'_>| -> Option<String> {
            let length = fields.u32()? as usize;
            String::from_utf8(fields.take(length)?.to_vec()).ok()
        };
        let dir = {
            use std::os::unix::ffi::OsStrExt;
            let length = fields.u32()? as usize;
            PathBuf::from(std::ffi::OsStr::from_bytes(fields.take(length)?))
        };
        let operation = match kind {
            WRITE | TOUCH => {
                let prefix = text(&mut fields)?;
                let name = text(&mut fields)?;
                if kind == WRITE {
                    Operation::Write { dir, prefix, name }
                } else {
                    Operation::Touch { dir, prefix, name }
                }
            }
            TRIM => {
                let what = text(&mut fields)?;
                let max_bytes = fields.u64()?;
                let has_keep = fields.u8()? != 0;
                let keep = (text(&mut fields)?, text(&mut fields)?);
                let has_every = fields.u8()? != 0;
                let mark = text(&mut fields)?;
                let interval = Duration::from_millis(fields.u64()?);
                Operation::Trim {
                    dir,
                    what,
                    max_bytes,
                    keep: has_keep.then_some(keep),
                    every: has_every.then_some((mark, interval)),
                }
            }
            _ => return None,
        };
        fields.rest.is_empty().then_some(operation)
    }
}

/// A cache file mapped read-only ([`CacheDir::map`]). A cache's files are
/// never written in place: written under a fresh name and renamed, touched
/// (times only), removed by unlink. So the bytes a view shows stay what
/// they were when mapped, whatever happens to the name meanwhile.
pub struct FileView {
    address: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: a read-only mapping, never written through, that only `Drop`
// unmaps: shared references to it may go to any thread.
unsafe impl Send for FileView {}
// SAFETY: as above: nothing writes through the view.
unsafe impl Sync for FileView {}

impl FileView {
    fn of(file: &File) -> Option<Self> {
        let len = usize::try_from(file.metadata().ok()?.len()).ok()?;
        if len == 0 {
            return None;
        }
        // SAFETY: a private read-only mapping of a regular file that this
        // process opened, of its length as `fstat` said it; the kernel
        // picks the address. `MAP_POPULATE` maps the pages that the page
        // cache holds now, at once rather than a fault each.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_PRIVATE | libc::MAP_POPULATE,
                file.as_raw_fd(),
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return None;
        }
        Some(Self {
            address: std::ptr::NonNull::new(address.cast::<u8>())?,
            len,
        })
    }

    /// The file's bytes (page-aligned).
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `len` bytes mapped readable at `address` until `drop`; the
        // file is never written in place (see the type), so they do not
        // change while borrowed. (A file truncated under the view by
        // another process of ddprof's user would fault the reader with
        // SIGBUS: in a worker, which its parent replaces; the store never
        // truncates.)
        unsafe { std::slice::from_raw_parts(self.address.as_ptr(), self.len) }
    }
}

impl Drop for FileView {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping `of` made, which no borrow
        // outlives (they borrow `self`).
        unsafe { libc::munmap(self.address.as_ptr().cast(), self.len) };
    }
}

impl std::fmt::Debug for FileView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "FileView({} bytes)", self.len)
    }
}

/// An anonymous file (`memfd_create`): content on its way to the parent.
fn anonymous_file() -> std::io::Result<File> {
    // SAFETY: memfd_create takes a NUL-terminated name and flags, and
    // returns a new descriptor (or -1) that nothing else owns.
    let fd = unsafe { libc::memfd_create(c"ddprof-cache".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor memfd_create just returned, owned from here.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

fn send(socket: &OwnedFd, operation: &Operation, content: Option<&File>) -> std::io::Result<()> {
    let bytes = operation.encode();
    if bytes.len() > MAX_MESSAGE {
        return Err(std::io::Error::other("cache path too long"));
    }
    let fds: Vec<i32> = content.iter().map(|file| file.as_raw_fd()).collect();
    let control = [ControlMessage::ScmRights(&fds)];
    sendmsg::<UnixAddr>(
        socket.as_raw_fd(),
        &[std::io::IoSlice::new(&bytes)],
        if fds.is_empty() { &[] } else { &control },
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
        None,
    )?;
    Ok(())
}

/// Carries out the cache writes a worker sent on `socket` (see
/// [`route_writes_to`]), without waiting for more; only in directories
/// under `root` (the caches' root). Returns how many were carried out.
pub fn serve_writes(socket: &OwnedFd, root: Option<&Path>) -> usize {
    let mut done = 0;
    loop {
        let mut buffer = vec![0u8; MAX_MESSAGE];
        let mut control = nix::cmsg_space!([std::os::fd::RawFd; 1]);
        let mut iov = [std::io::IoSliceMut::new(&mut buffer)];
        let received = recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut control),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
        );
        let Ok(message) = received else {
            return done;
        };
        if message.bytes == 0 {
            return done;
        }
        let mut content: Option<File> = None;
        if let Ok(cmsgs) = message.cmsgs() {
            for cmsg in cmsgs {
                if let ControlMessageOwned::ScmRights(fds) = cmsg {
                    for fd in fds {
                        // SAFETY: SCM_RIGHTS installed these descriptors in
                        // this process for us; nothing else owns them.
                        let file = File::from(unsafe { OwnedFd::from_raw_fd(fd) });
                        content.get_or_insert(file);
                    }
                }
            }
        }
        let length = message.bytes;
        let Some(operation) = Operation::decode(&buffer[..length]) else {
            log::warn!("a profiler worker sent a cache operation that does not parse; ignored");
            continue;
        };
        match apply(&operation, content, root) {
            Ok(()) => done += 1,
            Err(error) => log::debug!("cache operation {operation:?} not carried out: {error}"),
        }
    }
}

/// One operation, in this process.
fn apply(operation: &Operation, content: Option<File>, root: Option<&Path>) -> std::io::Result<()> {
    let dir = match operation {
        Operation::Write { dir, .. }
        | Operation::Touch { dir, .. }
        | Operation::Trim { dir, .. } => dir,
    };
    // A worker names a directory of the caches: under their root, by a
    // plain path (no `..`), nothing else.
    let allowed = root.is_some_and(|root| {
        dir.starts_with(root)
            && dir
                .components()
                .all(|component| matches!(component, Component::RootDir | Component::Normal(_)))
    });
    if !allowed {
        return Err(std::io::Error::other(format!(
            "{} is not a cache directory",
            dir.display()
        )));
    }
    let cache = CacheDir::new(dir.clone());
    match operation {
        Operation::Write { prefix, name, .. } => {
            let mut content =
                content.ok_or_else(|| std::io::Error::other("a write without its content"))?;
            content.rewind()?;
            cache.write(prefix, name, |out| {
                std::io::copy(&mut content, out).map(|_| ())
            })
        }
        Operation::Touch { prefix, name, .. } => {
            cache.touch(prefix, name);
            Ok(())
        }
        Operation::Trim {
            what,
            max_bytes,
            keep,
            every,
            ..
        } => {
            cache.trim(
                what,
                *max_bytes,
                keep.as_ref().map(|(p, n)| (p.as_str(), n.as_str())),
                every
                    .as_ref()
                    .map(|(mark, interval)| (mark.as_str(), *interval)),
            );
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_survive_the_round_trip() {
        let operations = [
            Operation::Write {
                dir: "/root/.cache/ddprof/unwind".into(),
                prefix: "ab".into(),
                name: "cdef.rows".into(),
            },
            Operation::Touch {
                dir: "/c/symbols".into(),
                prefix: "01".into(),
                name: "x.syms".into(),
            },
            Operation::Trim {
                dir: "/c/symbols".into(),
                what: "symbol store".into(),
                max_bytes: 64 << 20,
                keep: Some(("ab".into(), "y".into())),
                every: Some((".evicted".into(), Duration::from_secs(600))),
            },
            Operation::Trim {
                dir: "/c/digests".into(),
                what: "digests".into(),
                max_bytes: 1,
                keep: None,
                every: None,
            },
        ];
        for operation in operations {
            let bytes = operation.encode();
            assert_eq!(Operation::decode(&bytes), Some(operation.clone()));
            for length in 0..bytes.len() {
                assert_eq!(Operation::decode(&bytes[..length]), None, "{length}");
            }
        }
    }

    /// What a worker writes reaches the disk through the parent, only in
    /// the caches' directories.
    #[test]
    fn the_parent_writes_what_the_worker_sends_and_only_under_the_root() {
        let scratch = std::env::temp_dir().join(format!("ddprof-cache-dir-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        let root = scratch.join("cache");
        let (worker, parent) = nix::sys::socket::socketpair(
            nix::sys::socket::AddressFamily::Unix,
            nix::sys::socket::SockType::SeqPacket,
            None,
            nix::sys::socket::SockFlag::SOCK_CLOEXEC,
        )
        .unwrap();
        let mut content = anonymous_file().unwrap();
        content.write_all(b"table bytes").unwrap();
        let write = |dir: PathBuf| Operation::Write {
            dir,
            prefix: "ab".into(),
            name: "cd.rows".into(),
        };
        send(&worker, &write(root.join("unwind")), Some(&content)).unwrap();
        // Outside the root, or climbing out of it: refused.
        send(&worker, &write(scratch.join("elsewhere")), Some(&content)).unwrap();
        send(&worker, &write(root.join("../elsewhere")), Some(&content)).unwrap();
        assert_eq!(serve_writes(&parent, Some(&root)), 1);
        assert_eq!(
            std::fs::read(root.join("unwind/ab/cd.rows")).unwrap(),
            b"table bytes"
        );
        assert!(!scratch.join("elsewhere").exists());
        let _ = std::fs::remove_dir_all(&scratch);
    }
}

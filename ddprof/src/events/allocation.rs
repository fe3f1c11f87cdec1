//! `sALLOC`: the allocation sampler preloaded into the wrapped command, and
//! the uprobe perf event that samples at its marker.
//!
//! The library (`ddprof/alloc/ddprof_alloc.c`, built by `build.rs` and
//! embedded in the binary) forwards every allocation to the program's own
//! allocator, draws which ones are sampled (by bytes, a Poisson process of
//! mean `p=`), and calls `ddprof_sampled_allocation(size, address)` for
//! those. The event is a uprobe on that function: the kernel takes the
//! sample there, with the registers (`rdi` is the size) and a copy of the
//! user stack, and the engines unwind it as they unwind a CPU sample. The
//! target copies no stack and writes no buffer.
//!
//! For the live heap (`mode=l`), the library also remembers the addresses
//! it sampled and calls `ddprof_sampled_free(address, held, renamed)` when
//! one is freed (or a sampled mapping loses a part, or moves): a second
//! uprobe, whose samples carry only its registers (no stack).
//!
//! The uprobe is defined in tracefs (`uprobe_events`) and opened as a
//! tracepoint, not through the `uprobe` PMU: an event of that PMU inherited
//! at a fork is set up again in the forking process, which reads the
//! probe's path from the address ddprof gave in *its* memory and must be
//! privileged (`perf_uprobe_event_init`), so the command's first fork
//! failed ("Cannot fork"). An inherited tracepoint is allowed as its parent
//! was. Each run names its probe after the command's PID and the file's
//! inode (`ddprof_alloc/sampled_PID_INODE`); a run removes the probes of
//! runs whose command has ended (the kernel refuses to remove one open).
//!
//! The library is a file of this run, `/run/ddprof/alloc-PID-RANDOM.so`
//! (`PID` the command's; `/var/lib/ddprof` where `/run` is `noexec`): the
//! directory belongs to root, others may read it and never write it
//! (`files::disk::PrivateDir`, `0755`), the file is created exclusively
//! and left `0444`, and the uprobe is on that very inode. `LD_PRELOAD`
//! names that path, which every descendant can open, including those
//! started with their descriptors closed (Python's `subprocess` closes
//! them by default). The run's profiler holds a shared lock on it; a later
//! run removes the files no profiler holds. A descendant that outlives its
//! run and execs after that loses the library (the loader says so on its
//! stderr). Where no directory can be used (ddprof not root, a directory
//! someone else's), the library is an anonymous file (`memfd_create`,
//! sealed against writes) named `/proc/self/fd/N`, kept open through the
//! exec, and one line says what that costs: children started with their
//! descriptors closed print a loader error and are not sampled.
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;

/// The sampler library, when this ddprof was built with a C compiler.
#[cfg(ddprof_alloc)]
pub const LIBRARY: Option<&[u8]> = Some(include_bytes!(env!("DDPROF_ALLOC_LIBRARY_PATH")));
#[cfg(not(ddprof_alloc))]
pub const LIBRARY: Option<&[u8]> = None;

/// The function of the library the allocation uprobe is placed on.
const MARKER: &str = "ddprof_sampled_allocation";
/// The function the library calls when a sampled address is freed.
const FREE_MARKER: &str = "ddprof_sampled_free";

/// The environment variable that gives the library its mean.
pub const MEAN_VARIABLE: &str = "DDPROF_ALLOC_MEAN";
/// The environment variable that turns on the library's following of the
/// sampled addresses (`1`): the live heap.
pub const LIVE_VARIABLE: &str = "DDPROF_ALLOC_LIVE";

/// Frames of an allocation sample that are the library's own (the marker
/// and the hook that called it), dropped from its stack.
pub const LIBRARY_FRAMES: u8 = 2;

/// The marker's third argument (`rdx`) for memory the program mapped itself
/// (`mmap`, `mmap64`): the hook's frame is then kept as the leaf.
pub const MAPPED: u64 = 1;

/// C++ ddprof's default mean: 512 KiB between samples.
pub const DEFAULT_MEAN_BYTES: u64 = 524_288;

#[derive(Debug, thiserror::Error)]
pub enum AllocationError {
    #[error("this ddprof was built without a C compiler, so without its allocation sampler")]
    NotBuilt,
    #[error(
        "cannot define the allocation probe in tracefs ({0}): allocation profiling needs root \
         (or CAP_SYS_ADMIN) and a kernel with CONFIG_UPROBE_EVENTS"
    )]
    Probe(String),
    #[error("cannot prepare the allocation sampler: {0}")]
    Prepare(String),
}

/// The library, ready to be preloaded and probed.
#[derive(Debug)]
pub struct Sampler {
    /// The file holding it (read-only, or the anonymous file, open
    /// without close-on-exec).
    file: OwnedFd,
    /// What `LD_PRELOAD` names, and what the uprobe's path is resolved
    /// from: the file in one of [`LIBRARY_DIRS`], or `/proc/self/fd/N`.
    path: CString,
    /// Why the library is in none of [`LIBRARY_DIRS`], when it is not.
    pub not_on_disk: Option<String>,
    /// The tracepoint id of the probe on the allocation marker.
    pub probe_id: u64,
    /// The tracepoint id of the probe on the free marker.
    pub free_probe_id: u64,
}

impl Sampler {
    /// The anonymous file, which the profiler inherits too: it unwinds and
    /// symbolizes the library's frames from it once the command is gone.
    pub fn file(&self) -> std::os::fd::BorrowedFd<'_> {
        use std::os::fd::AsFd;
        self.file.as_fd()
    }

    /// `LD_PRELOAD` for the command: the library first, then what the
    /// caller preloads already (its entries keep their order).
    pub fn ld_preload(&self, existing: Option<&str>) -> String {
        let own = self.path.to_string_lossy().into_owned();
        match existing.map(str::trim).filter(|value| !value.is_empty()) {
            Some(existing) => format!("{own}:{existing}"),
            None => own,
        }
    }
}

static SAMPLER: OnceLock<Sampler> = OnceLock::new();
/// Why [`prepare`] failed, for the event's open error.
static NOT_PREPARED: OnceLock<String> = OnceLock::new();

/// The sampler of this process, prepared once.
pub fn prepare() -> Result<&'static Sampler, AllocationError> {
    if let Some(sampler) = SAMPLER.get() {
        return Ok(sampler);
    }
    try_prepare().inspect_err(|error| {
        let _ = NOT_PREPARED.set(error.to_string());
    })
}

/// Why the sampler is not prepared in this process.
pub fn not_prepared_reason() -> String {
    NOT_PREPARED
        .get()
        .cloned()
        .unwrap_or_else(|| "the allocation sampler is not prepared".into())
}

/// Leaves the sampler out for the command, for `reason`: what the event's
/// open error says.
pub fn decline(reason: String) {
    let _ = NOT_PREPARED.set(reason);
}

/// Where each run writes its library, the first that works: a directory
/// of root's in a filesystem of memory (`/run`), then one on the root
/// filesystem for hosts whose `/run` is mounted `noexec` (Debian's and
/// Ubuntu's initramfs mount it so). Readable by the command's user whoever
/// it is.
pub const LIBRARY_DIRS: [&str; 2] = ["/run/ddprof", "/var/lib/ddprof"];

/// A library file is removed by a later run only this long after it was
/// made (and only if no profiler holds it): the run that made it takes its
/// lock a moment after making it.
const LIBRARY_FILE_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

/// The library written to the first of [`LIBRARY_DIRS`] where it can be
/// mapped executable, after removing the files of ended runs there: its
/// file (open read-only, holding a shared lock for the run: see
/// [`remove_ended_libraries`]) and its path; else why not, for each.
fn library_on_disk(library: &[u8]) -> Result<(OwnedFd, String), String> {
    let mut refused = Vec::new();
    for dir in LIBRARY_DIRS {
        match library_in(dir, library) {
            Ok(placed) => return Ok(placed),
            Err(why) => refused.push(why),
        }
    }
    Err(refused.join("; "))
}

fn library_in(dir_path: &str, library: &[u8]) -> Result<(OwnedFd, String), String> {
    use crate::files::disk::PrivateDir;
    let dir = PrivateDir::open(std::path::Path::new(dir_path), true)
        .map_err(|error| error.to_string())?;
    dir.let_others_read()
        .map_err(|error| format!("{dir_path}: {error}"))?;
    remove_ended_libraries(&dir);
    let name = dir
        .create_readable_by_all(&format!("alloc-{}-RANDOM.so", std::process::id()), library)
        .map_err(|error| format!("{dir_path}: {error}"))?;
    let Some(file) = dir.open_regular(&name, library.len() as u64) else {
        let _ = dir.remove(&name);
        return Err(format!("{dir_path}/{name}: cannot open it again"));
    };
    let file = OwnedFd::from(file);
    if let Err(why) = lock_and_map_executable(&file, library.len()) {
        let _ = dir.remove(&name);
        return Err(format!("{dir_path}: {why}"));
    }
    Ok((file, format!("{dir_path}/{name}")))
}

/// Takes the run's shared lock on the library's file (held as long as a
/// descriptor of this open file is: the profiler keeps one for the whole
/// run), and checks that the loader will be able to map it executable (a
/// `noexec` mount, or a security module, refuses).
fn lock_and_map_executable(file: &OwnedFd, length: usize) -> Result<(), String> {
    // SAFETY: flock on a descriptor this function borrows; no memory is
    // touched.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_SH | libc::LOCK_NB) } != 0 {
        return Err(format!("lock: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: a new private read-only mapping of a file this function
    // borrows, at an address the kernel picks; nothing reads it, and it
    // is unmapped at once.
    let mapped = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            length,
            libc::PROT_READ | libc::PROT_EXEC,
            libc::MAP_PRIVATE,
            file.as_raw_fd(),
            0,
        )
    };
    if mapped == libc::MAP_FAILED {
        return Err(format!(
            "cannot map a file there executable ({}): mounted noexec?",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the mapping made above, of `length` bytes, used by nothing.
    unsafe { libc::munmap(mapped, length) };
    Ok(())
}

/// Removes the libraries of ended runs: `alloc-*.so` files made more than
/// [`LIBRARY_FILE_GRACE`] ago that no profiler holds (an exclusive lock is
/// granted: whatever the PID namespace a run is in, its profiler's shared
/// lock stands until it exits).
fn remove_ended_libraries(dir: &crate::files::disk::PrivateDir) {
    for entry in dir.entries() {
        let Some(name) = entry.name.to_str() else {
            continue;
        };
        if !name.starts_with("alloc-") || !name.ends_with(".so") {
            continue;
        }
        let young = entry
            .modified
            .elapsed()
            .map_or(true, |age| age < LIBRARY_FILE_GRACE);
        let Some(file) = (!young).then(|| dir.open_regular(name, 64 << 20)).flatten() else {
            continue;
        };
        // SAFETY: flock on a descriptor owned by `file`, closed (and the
        // lock with it) at the end of this iteration.
        let unheld = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0;
        if unheld {
            let _ = dir.remove(name);
        }
    }
}

fn try_prepare() -> Result<&'static Sampler, AllocationError> {
    let library = LIBRARY.ok_or(AllocationError::NotBuilt)?;
    let marker_offset = symbol_offset(library, MARKER).map_err(AllocationError::Prepare)?;
    let free_marker_offset =
        symbol_offset(library, FREE_MARKER).map_err(AllocationError::Prepare)?;
    let (file, path, not_on_disk) = match library_on_disk(library) {
        Ok((file, path)) => (file, path, None),
        Err(why) => {
            let file = sealed_file(library)
                .map_err(|error| AllocationError::Prepare(format!("anonymous file: {error}")))?;
            let path = format!("/proc/self/fd/{}", file.as_raw_fd());
            (file, path, Some(why))
        }
    };
    let path = CString::new(path).map_err(|error| AllocationError::Prepare(error.to_string()))?;
    let library_path = path.to_string_lossy();
    let inode = inode_of(&file);
    let probe_id = define_probe(&library_path, Probe::Sampled, marker_offset, inode)
        .map_err(AllocationError::Probe)?;
    let free_probe_id = define_probe(&library_path, Probe::Freed, free_marker_offset, inode)
        .map_err(AllocationError::Probe)?;
    crate::files::target::preloaded_library_is(file.as_raw_fd());
    Ok(SAMPLER.get_or_init(|| Sampler {
        file,
        path,
        not_on_disk,
        probe_id,
        free_probe_id,
    }))
}

/// The group of ddprof's probes in tracefs.
const PROBE_GROUP: &str = "ddprof_alloc";

/// The inode number of the library's file: with the PID, a name no other
/// run has, in whatever PID namespace it runs.
fn inode_of(file: &OwnedFd) -> u64 {
    nix::sys::stat::fstat(file).map_or(0, |stat| stat.st_ino)
}

/// The two probes of a run, by the prefix of their names.
#[derive(Debug, Clone, Copy)]
enum Probe {
    /// On the allocation marker: `sampled_PID_INODE`.
    Sampled,
    /// On the free marker: `freed_PID_INODE`.
    Freed,
}

impl Probe {
    const ALL: [Probe; 2] = [Probe::Sampled, Probe::Freed];

    fn prefix(self) -> &'static str {
        match self {
            Probe::Sampled => "sampled_",
            Probe::Freed => "freed_",
        }
    }
}

/// Defines `ddprof_alloc/sampled_PID_INODE` (or `freed_…`) at `offset` in
/// the library at `path` (resolved by the kernel now, in this process: the
/// anonymous file `inode`), after removing the probes of ended runs; its id.
fn define_probe(path: &str, probe: Probe, offset: u64, inode: u64) -> Result<u64, String> {
    let tracefs = super::tracepoint::tracefs().map_err(|error| error.to_string())?;
    let events = tracefs.join("uprobe_events");
    remove_ended_probes(&events);
    let name = format!("{}{}_{inode}", probe.prefix(), std::process::id());
    // Appending: opening it truncated would remove every uprobe of the
    // machine.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&events)
        .map_err(|error| format!("{}: {error}", events.display()))?;
    file.write_all(format!("p:{PROBE_GROUP}/{name} {path}:{offset:#x}\n").as_bytes())
        .map_err(|error| format!("{}: {error}", events.display()))?;
    let id_path = tracefs
        .join("events")
        .join(PROBE_GROUP)
        .join(&name)
        .join("id");
    let text = super::tracepoint::read_small(&id_path)
        .map_err(|error| format!("{}: {error}", id_path.display()))?;
    text.trim()
        .parse()
        .map_err(|_| format!("{}: not a number", id_path.display()))
}

/// Removes the probes of ddprof runs whose command has ended (named after
/// its PID, which no process has now); the kernel refuses those still open.
/// A run in another PID namespace may see a live run's PID as free: if
/// its probe is open, the kernel refuses; if not yet (between its
/// definition and its events' opening, milliseconds), that run leaves
/// `sALLOC` out with one line.
fn remove_ended_probes(events: &std::path::Path) {
    let Ok(listing) = super::tracepoint::read_small(events) else {
        return;
    };
    let Ok(mut file) = std::fs::OpenOptions::new().append(true).open(events) else {
        return;
    };
    for line in listing.lines() {
        // `p:ddprof_alloc/sampled_PID_INODE PATH:OFFSET`
        let Some((probe, suffix)) = Probe::ALL.iter().find_map(|probe| {
            let prefix = format!("p:{PROBE_GROUP}/{}", probe.prefix());
            let suffix = line.strip_prefix(&prefix)?.split_whitespace().next()?;
            Some((probe, suffix))
        }) else {
            continue;
        };
        let Some(pid) = suffix
            .split('_')
            .next()
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        // The name is digits and `_` only: nothing else goes into the write.
        if !suffix.bytes().all(|b| b.is_ascii_digit() || b == b'_')
            || std::path::Path::new(&format!("/proc/{pid}")).exists()
        {
            continue;
        }
        let _ = file.write_all(format!("-:{PROBE_GROUP}/{}{suffix}\n", probe.prefix()).as_bytes());
    }
}

/// The sampler, if [`prepare`] succeeded in this process.
pub fn prepared() -> Option<&'static Sampler> {
    SAMPLER.get()
}

/// The file offset of the function `name` in `library` (a uprobe is placed
/// by file offset): its address, mapped through the loadable segment
/// holding it.
fn symbol_offset(library: &[u8], name: &str) -> Result<u64, String> {
    use object::{Object, ObjectSegment, ObjectSymbol};
    let file = object::File::parse(library).map_err(|error| error.to_string())?;
    let address = file
        .dynamic_symbols()
        .chain(file.symbols())
        .find(|symbol| symbol.name() == Ok(name))
        .map(|symbol| symbol.address())
        .ok_or_else(|| format!("the library has no {name}"))?;
    file.segments()
        .find(|segment| {
            let start = segment.address();
            (start..start + segment.size()).contains(&address)
        })
        .map(|segment| address - segment.address() + segment.file_range().0)
        .ok_or_else(|| format!("{name} is in no segment"))
}

/// An anonymous file holding `bytes`, sealed against any change (the
/// command could otherwise write to the library it runs through its
/// descriptor), open without close-on-exec.
fn sealed_file(bytes: &[u8]) -> nix::Result<OwnedFd> {
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    use nix::sys::memfd::{memfd_create, MFdFlags};
    let fd = memfd_create("ddprof-alloc", MFdFlags::MFD_ALLOW_SEALING)?;
    let mut file = std::fs::File::from(fd);
    file.write_all(bytes)
        .map_err(|error| nix::errno::Errno::from_raw(error.raw_os_error().unwrap_or(libc::EIO)))?;
    let fd = OwnedFd::from(file);
    fcntl(
        &fd,
        FcntlArg::F_ADD_SEALS(
            SealFlag::F_SEAL_SEAL
                | SealFlag::F_SEAL_SHRINK
                | SealFlag::F_SEAL_GROW
                | SealFlag::F_SEAL_WRITE,
        ),
    )?;
    Ok(fd)
}

/// Whether the program `command` names (a path, or a name looked up in
/// `PATH` as the exec will) is an ELF executable without a dynamic loader:
/// `LD_PRELOAD` means nothing to it. `None` when it cannot tell (not
/// found, not ELF: a script's interpreter is looked at by nobody here).
pub fn statically_linked(command: &str) -> Option<bool> {
    use std::io::Read;
    let path = crate::files::command_path(command)?;
    let mut header = Vec::with_capacity(64 * 1024);
    std::fs::File::open(path)
        .ok()?
        .take(64 * 1024)
        .read_to_end(&mut header)
        .ok()?;
    has_no_interpreter(&header)
}

/// Whether a 64-bit little-endian ELF file whose first bytes are `header`
/// has no `PT_INTERP` program header (`None`: not such a file, or its
/// program headers are beyond `header`).
fn has_no_interpreter(header: &[u8]) -> Option<bool> {
    const PT_INTERP: u32 = 3;
    if header.len() < 64 || &header[..4] != b"\x7fELF" || header[4] != 2 || header[5] != 1 {
        return None;
    }
    let u16_at = |offset: usize| {
        Some(u16::from_le_bytes(
            header.get(offset..offset + 2)?.try_into().ok()?,
        ))
    };
    let phoff =
        usize::try_from(u64::from_le_bytes(header.get(0x20..0x28)?.try_into().ok()?)).ok()?;
    let entry_size = usize::from(u16_at(0x36)?);
    let count = usize::from(u16_at(0x38)?);
    if entry_size < 4 {
        return None;
    }
    for index in 0..count {
        let start = phoff.checked_add(index.checked_mul(entry_size)?)?;
        let kind = u32::from_le_bytes(header.get(start..start + 4)?.try_into().ok()?);
        if kind == PT_INTERP {
            return Some(false);
        }
    }
    Some(true)
}

/// The weights of an allocation of `size` bytes sampled by a Poisson
/// process of mean `mean` bytes, which samples it with probability
/// p = 1 - e^(-size/mean): (allocations, bytes) it stands for, 1/p and
/// size/p, so that sums over the samples estimate the real totals.
pub fn unbiased(size: u64, mean: u64) -> (f64, f64) {
    if size == 0 || mean == 0 {
        return (0.0, 0.0);
    }
    let probability = -(-(size as f64) / mean as f64).exp_m1();
    let allocations = 1.0 / probability;
    (allocations, size as f64 * allocations)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weights_undo_the_sampling_probability() {
        // Far above the mean: sampled every time, counted once.
        let (count, bytes) = unbiased(100 << 20, 512 << 10);
        assert!((count - 1.0).abs() < 1e-9, "{count}");
        assert!((bytes - (100 << 20) as f64).abs() < 1.0, "{bytes}");
        // At the mean: p = 1 - 1/e.
        let (count, _) = unbiased(512 << 10, 512 << 10);
        assert!(
            (count - 1.0 / (1.0 - (-1.0f64).exp())).abs() < 1e-9,
            "{count}"
        );
        // Far below: about mean/size allocations of size bytes, the mean's
        // worth of bytes.
        let (count, bytes) = unbiased(16, 512 << 10);
        assert!((count - 32768.5).abs() < 1.0, "{count}");
        assert!((bytes - 524_296.0).abs() < 16.0, "{bytes}");
        assert_eq!(unbiased(0, 512), (0.0, 0.0));
    }

    #[test]
    #[cfg(ddprof_alloc)]
    fn the_markers_are_found_at_their_nops() {
        let library = LIBRARY.unwrap();
        let offset = symbol_offset(library, MARKER).unwrap() as usize;
        assert_eq!(
            &library[offset..offset + 6],
            &[0x66, 0x90, 0x66, 0x90, 0x90, 0xc3]
        );
        let offset = symbol_offset(library, FREE_MARKER).unwrap() as usize;
        assert_eq!(
            &library[offset..offset + 6],
            &[0x90, 0x66, 0x90, 0x66, 0x90, 0xc3]
        );
    }

    #[test]
    fn a_program_without_a_dynamic_loader_is_told_apart() {
        assert_eq!(statically_linked("sh"), Some(false));
        assert_eq!(statically_linked("/nonexistent/program"), None);
        // A script: not ELF.
        assert_eq!(has_no_interpreter(b"#!/bin/sh\necho hello\n"), None);
        // An ELF header whose program headers (none) have no PT_INTERP.
        let mut elf = vec![0u8; 64];
        elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
        elf[0x20] = 64;
        elf[0x36] = 56;
        assert_eq!(has_no_interpreter(&elf), Some(true));
        // Program headers past the bytes read: cannot tell.
        elf[0x38] = 1;
        assert_eq!(has_no_interpreter(&elf), None);
    }

    #[test]
    fn the_library_goes_first_in_ld_preload() {
        let sampler = Sampler {
            file: std::fs::File::open("/dev/null").unwrap().into(),
            path: CString::new("/proc/self/fd/7").unwrap(),
            not_on_disk: None,
            probe_id: 0,
            free_probe_id: 0,
        };
        assert_eq!(sampler.ld_preload(None), "/proc/self/fd/7");
        assert_eq!(sampler.ld_preload(Some(" ")), "/proc/self/fd/7");
        assert_eq!(
            sampler.ld_preload(Some("/usr/lib/libjemalloc.so.2")),
            "/proc/self/fd/7:/usr/lib/libjemalloc.so.2"
        );
    }
}

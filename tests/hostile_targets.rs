//! Hostile neighbours (issue 31): another user, the profiled programs and
//! containers trying to make the root profiler write or delete files they
//! choose, hang, name frames from files they forged, or lose samples
//! without saying so. Each test ports one of the attacks that worked against
//! the profiler before, and first shows the attack's primitive working
//! against plain `std` on the very same set-up (a `File::create` that
//! follows the planted link and overwrites a root file, a `File::open` of
//! the FIFO that blocks, a path that opens another file than the one
//! mapped...), so that a fixture that stopped being hostile fails the test
//! instead of letting it pass. Then it runs the real ddprof on that set-up
//! and asserts the defence, and positive evidence that the run profiled: the
//! workload's functions named, with enough samples.
//!
//! The other user is the real `nobody` (uid 65534, through `setpriv`), the
//! namespaces and mounts are real (`unshare`, `chroot`, tmpfs), every ddprof
//! run is bounded (killed after [`RUN_TIMEOUT`]; the profiler, which shares
//! the command's stderr, must be gone [`PROFILER_EXIT_BOUND`] after the
//! command), and every process a test started is killed at its end, passed
//! or failed. Runs as root, as CI does.
use std::collections::{BTreeMap, HashMap};
use std::ffi::{CString, OsStr};
use std::fs::{self, File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use ddprof_tests::guards::{cpus_alone, cpus_shared, Scratch};
use ddprof_tests::outputs::{accounting_lines, pprof_files, summary_fields};
use ddprof_tests::processes::wait_with_cpu_time;
use ddprof_tests::workload_build::compile_command;
use ddprof_tests::workloads::{build_workload, workloads_source_dir};
use ddprof_tests::{as_nobody, ddprof_bin, ddprof_command};
use object::{Object, ObjectSegment};

/// `nobody`: the other user of every test.
const NOBODY: u32 = 65534;
/// How long a ddprof run (its command) may take before it is killed.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);
/// How long the profiler may outlive its command: its stderr (shared with
/// the command) must reach its end by then.
const PROFILER_EXIT_BOUND: Duration = Duration::from_secs(15);
/// The most a profiler may outlive its command in the hang cases (before:
/// 57 s, 119 s).
const NO_HANG: Duration = Duration::from_secs(10);
/// The event of the tests that look at names: enough samples in a second.
const EVENT: &str = "sCPU freq=499";
/// [`EVENT`]'s frequency.
const EVENT_HZ: u32 = 499;
/// `STORE_MAX_BYTES` of the symbol store: past it, it evicts.
const SYMBOL_STORE_MAX: u64 = 64 << 20;
/// 2020-01-01T00:00:00Z: the mtime of the victims (older than anything
/// a run writes, so that a size eviction would take them first).
const OLD: u64 = 1_577_836_800;

// ---------------------------------------------------------------------
// Scratch directories, processes, runs
// ---------------------------------------------------------------------

/// A scratch directory `ddprof-hostile-NAME-PID` that `nobody` can
/// traverse, removed at the end of the test.
fn scratch(name: &str) -> Scratch {
    let scratch = Scratch::new(&format!("hostile-{name}"));
    set_mode(&scratch.0, 0o755);
    scratch
}

fn set_mode(path: &Path, mode: u32) {
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .unwrap_or_else(|e| panic!("chmod {mode:o} {}: {e}", path.display()));
}

/// A new directory (as root) with exactly `mode`.
fn dir_with_mode(path: &Path, mode: u32) -> PathBuf {
    fs::create_dir_all(path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
    set_mode(path, mode);
    path.to_path_buf()
}

/// A root file `0600` holding `content`.
fn root_file(path: &Path, content: &str) {
    fs::write(path, content).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
    set_mode(path, 0o600);
}

fn set_mtime(path: &Path, seconds_since_epoch: u64) {
    File::options()
        .write(true)
        .open(path)
        .and_then(|file| {
            file.set_modified(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds_since_epoch))
        })
        .unwrap_or_else(|e| panic!("set the mtime of {}: {e}", path.display()));
}

/// A root-only directory (`0700`) of root files (`0600`), the victims.
fn victim_dir(path: &Path, files: &[(&str, &str)]) -> PathBuf {
    dir_with_mode(path, 0o700);
    for (name, content) in files {
        root_file(&path.join(name), content);
        set_mtime(&path.join(name), OLD);
    }
    path.to_path_buf()
}

/// Every entry of `dir`, not following links: name → (kind, content of a
/// regular file, mtime). Equal before and after a run: nothing was written,
/// created, removed or touched there.
fn snapshot(dir: &Path) -> BTreeMap<String, (String, Vec<u8>, i64)> {
    let mut entries = BTreeMap::new();
    for entry in fs::read_dir(dir).unwrap_or_else(|e| panic!("list {}: {e}", dir.display())) {
        let entry = entry.unwrap();
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).unwrap();
        let (kind, content) = if meta.file_type().is_symlink() {
            (
                format!("link -> {}", fs::read_link(&path).unwrap().display()),
                Vec::new(),
            )
        } else if meta.is_file() {
            ("file".to_string(), fs::read(&path).unwrap())
        } else {
            (format!("{:?}", meta.file_type()), Vec::new())
        };
        entries.insert(
            entry.file_name().to_string_lossy().into_owned(),
            (kind, content, meta.mtime()),
        );
    }
    entries
}

/// `count` random bytes as hexadecimal (a build id no store has seen).
fn random_hex(count: usize) -> String {
    let mut hex = String::new();
    while hex.len() < count * 2 {
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        hasher.write_u128(
            SystemTime::now()
                .duration_since(SystemTime::UNIX_EPOCH)
                .unwrap()
                .as_nanos(),
        );
        hex.push_str(&format!("{:016x}", hasher.finish()));
    }
    hex.truncate(count * 2);
    hex
}

/// Compiles `tests/workloads/<source>` with `flags` into `output` (the
/// workloads that need flags `build_workload` does not give: a chosen
/// build id, `-D`).
fn compile(source: &str, output: &Path, flags: &[&str]) -> PathBuf {
    let result = compile_command(&workloads_source_dir().join(source), output)
        .unwrap_or_else(|e| panic!("{e}"))
        .args(flags)
        .output()
        .expect("run cc");
    assert!(
        result.status.success(),
        "cc {source} {flags:?}: {}",
        String::from_utf8_lossy(&result.stderr)
    );
    output.to_path_buf()
}

/// `hostile_burn` built with a fresh random build id: names and unwind
/// tables no cache holds.
fn burn_with_fresh_build_id(dir: &Path) -> (PathBuf, String) {
    let id = random_hex(20);
    let binary = compile(
        "hostile_burn.c",
        &dir.join("burn-fresh"),
        &[&format!("-Wl,--build-id=0x{id}")],
    );
    (binary, id)
}

/// Runs `sh -c SCRIPT nobody-sh ARGS...` as `nobody` and checks it worked.
fn nobody_sh<I, S>(script: &str, args: I)
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let output = as_nobody("sh")
        .arg("-c")
        .arg(script)
        .arg("nobody-sh")
        .args(args)
        .output()
        .expect("run setpriv");
    assert!(
        output.status.success(),
        "as nobody: {script}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Runs a Perl script (one process, however many files it makes), as
/// `nobody` or as root.
fn perl(as_other_user: bool, script: &str, args: &[&OsStr]) {
    let mut command = if as_other_user {
        as_nobody("perl")
    } else {
        Command::new("perl")
    };
    let output = command
        .arg("-e")
        .arg(script)
        .args(args)
        .output()
        .expect("run perl");
    assert!(
        output.status.success(),
        "perl {script}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The PIDs a process started from now on may get, written one a line to
/// `file` (readable by nobody): every PID when the kernel's range is small
/// (`pid_max` is 32,768 here, so the planted names cover whatever PID the
/// profiler gets), else the 40,000 after the last one handed out.
fn likely_pids(file: &Path) -> Vec<u32> {
    let read = |path: &str| -> u32 {
        fs::read_to_string(path)
            .unwrap()
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{path}: {e}"))
    };
    let max = read("/proc/sys/kernel/pid_max");
    let pids: Vec<u32> = if max <= 40_000 {
        (1..max).collect()
    } else {
        let last = read("/proc/sys/kernel/ns_last_pid");
        (1..=40_000)
            .map(|i| {
                let pid = last + i;
                if pid >= max {
                    pid - max + 300
                } else {
                    pid
                }
            })
            .collect()
    };
    let text: String = pids.iter().map(|pid| format!("{pid}\n")).collect();
    fs::write(file, text).unwrap();
    set_mode(file, 0o644);
    pids
}

/// The processes (PID, comm) whose command line contains `marker` (a
/// test's scratch path, in every command it starts), this one excepted.
fn marked_processes(marker: &str) -> Vec<(u32, String)> {
    let me = std::process::id();
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| pid != me)
        .filter_map(|pid| {
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            if !String::from_utf8_lossy(&cmdline).contains(marker) {
                return None;
            }
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            Some((pid, comm.trim().to_string()))
        })
        .collect()
}

fn kill_marked(marker: &str) {
    for (pid, _) in marked_processes(marker) {
        // SAFETY: kill(2) takes integers.
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
}

fn signal(pid: u32, signal: libc::c_int) {
    // SAFETY: kill(2) takes integers.
    let result = unsafe { libc::kill(pid as libc::pid_t, signal) };
    assert_eq!(
        result,
        0,
        "kill({pid}, {signal}): {}",
        std::io::Error::last_os_error()
    );
}

fn alive(pid: u32) -> bool {
    // SAFETY: kill(2) with signal 0 only checks the process exists.
    let exists = unsafe { libc::kill(pid as libc::pid_t, 0) } == 0;
    exists
        && fs::read_to_string(format!("/proc/{pid}/stat"))
            .map(|stat| !stat.contains(") Z "))
            .unwrap_or(false)
}

/// What every command line of a test's processes holds: its scratch
/// directory, as the start of a path (a directory of another test process
/// cannot be a prefix of it).
fn marker(scratch: &Scratch) -> String {
    format!("{}/", scratch.0.display())
}

/// Kills every process of a test (found by its scratch path) when dropped:
/// nothing a test started outlives it, passed or failed.
struct Leftovers(String);

impl Leftovers {
    fn new(scratch: &Scratch) -> Leftovers {
        Leftovers(marker(scratch))
    }
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        kill_marked(&self.0);
    }
}

/// Removes a path outside the scratch directory when dropped (a planted
/// `/tmp/perf-PID.map`).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// Polls `ready` every 10 ms until it is true, at most `within`.
fn wait_until(what: &str, within: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ready() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A command running (stdin and stdout null, stderr read to its end on a
/// thread), reaped with `wait4` for its CPU time by [`Running::finish`],
/// killed if dropped before.
struct Running {
    what: String,
    marker: String,
    pid: u32,
    reaped: bool,
    started: Instant,
    stderr: mpsc::Receiver<String>,
}

/// How a run ended.
struct Finished {
    what: String,
    status: ExitStatus,
    /// The command's CPU time and that of the children it waited for
    /// (`wait4`): measured by the kernel, independently of ddprof.
    cpu: Duration,
    stderr: String,
    /// When the command was reaped.
    ended: Instant,
    /// From the command's exit to the end of its stderr: how long the
    /// profiler (which shares it) outlived the command.
    profiler_tail: Duration,
    wall: Duration,
}

impl Running {
    fn spawn(what: &str, scratch: &Scratch, command: &mut Command) -> Running {
        command
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = command
            .spawn()
            .unwrap_or_else(|e| panic!("{what}: cannot start {command:?}: {e}"));
        let mut pipe = child.stderr.take().expect("stderr is piped");
        let (sender, receiver) = mpsc::channel();
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            let _ = pipe.read_to_end(&mut bytes);
            let _ = sender.send(String::from_utf8_lossy(&bytes).into_owned());
        });
        // Reaped below with wait4 (dropping a Child neither kills nor waits).
        let pid = child.id();
        drop(child);
        Running {
            what: what.to_string(),
            marker: marker(scratch),
            pid,
            reaped: false,
            started: Instant::now(),
            stderr: receiver,
        }
    }

    fn finish(mut self) -> Finished {
        let reaped = wait_with_cpu_time(self.pid, RUN_TIMEOUT);
        self.reaped = true;
        let ended = Instant::now();
        let reaped = match reaped {
            Ok(reaped) => reaped,
            Err(error) => {
                kill_marked(&self.marker);
                let stderr = self
                    .stderr
                    .recv_timeout(Duration::from_secs(5))
                    .unwrap_or_default();
                panic!("{}: {error}\n{stderr}", self.what);
            }
        };
        let Ok(stderr) = self.stderr.recv_timeout(PROFILER_EXIT_BOUND) else {
            let left = marked_processes(&self.marker);
            kill_marked(&self.marker);
            let stderr = self
                .stderr
                .recv_timeout(Duration::from_secs(5))
                .unwrap_or_default();
            panic!(
                "{}: the profiler was still running {PROFILER_EXIT_BOUND:?} after the command \
                 exited ({left:?}):\n{stderr}",
                self.what
            );
        };
        let finished = Finished {
            what: self.what.clone(),
            status: reaped.status,
            cpu: reaped.cpu,
            stderr,
            ended,
            profiler_tail: ended.elapsed(),
            wall: ended.duration_since(self.started),
        };
        eprintln!(
            "{}: {:?} in {:.1} s (+{:.1} s profiler), cpu {:.2} s; {}",
            finished.what,
            finished.status,
            finished.wall.as_secs_f64(),
            finished.profiler_tail.as_secs_f64(),
            finished.cpu.as_secs_f64(),
            finished
                .stderr
                .lines()
                .find(|line| line.contains("summary:"))
                .unwrap_or("no summary")
        );
        finished
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.reaped {
            kill_marked(&self.marker);
            // SAFETY: kill and waitpid take integers and a null status.
            unsafe {
                libc::kill(self.pid as libc::pid_t, libc::SIGKILL);
                libc::waitpid(self.pid as libc::pid_t, std::ptr::null_mut(), 0);
            }
        }
    }
}

impl Finished {
    fn summary(&self) -> HashMap<String, u64> {
        assert!(
            self.stderr.contains("summary:"),
            "{}: no summary line:\n{}",
            self.what,
            self.stderr
        );
        summary_fields(&self.stderr)
    }

    fn assert_success(&self) {
        assert!(
            self.status.success(),
            "{}: {:?} (signal {:?}):\n{}",
            self.what,
            self.status,
            self.status.signal(),
            self.stderr
        );
    }

    fn assert_no_panic(&self) {
        assert!(
            !self.stderr.contains("panicked"),
            "{}:\n{}",
            self.what,
            self.stderr
        );
    }

    /// The PID of the profiler's parent (`ddprof-profiler`), which prints
    /// the summary (`ddprof[PID]: notice: summary: ...`).
    fn daemon_pid(&self) -> u32 {
        let line = self
            .stderr
            .lines()
            .find(|line| line.contains("summary:"))
            .unwrap_or_else(|| panic!("{}: no summary:\n{}", self.what, self.stderr));
        line.split_once("ddprof[")
            .and_then(|(_, rest)| rest.split_once(']'))
            .and_then(|(pid, _)| pid.parse().ok())
            .unwrap_or_else(|| panic!("{}: no ddprof[PID] in {line}", self.what))
    }

    /// The directory of "the outputs go to DIR instead".
    fn fallback_dir(&self) -> PathBuf {
        const SAYS: &str = "the outputs go to ";
        let line = self
            .stderr
            .lines()
            .find(|line| line.contains(SAYS))
            .unwrap_or_else(|| {
                panic!(
                    "{}: no warning naming the fallback directory:\n{}",
                    self.what, self.stderr
                )
            });
        let rest = &line[line.find(SAYS).unwrap() + SAYS.len()..];
        PathBuf::from(rest.trim_end().trim_end_matches(" instead"))
    }
}

/// `stacks.folded`: (frames, process name first, leaf last; count).
struct Folded {
    stacks: Vec<(Vec<String>, u64)>,
}

fn folded(dir: &Path) -> Folded {
    let path = dir.join("stacks.folded");
    let text = fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}; the directory holds {:?}",
            path.display(),
            fs::read_dir(dir).map(|entries| entries
                .flatten()
                .map(|entry| entry.file_name())
                .collect::<Vec<_>>())
        )
    });
    let stacks = text
        .lines()
        .map(|line| {
            let (stack, count) = line.rsplit_once(' ').expect("`stack count` lines");
            (
                stack.split(';').map(str::to_string).collect(),
                count.parse().expect("a count"),
            )
        })
        .collect();
    Folded { stacks }
}

impl Folded {
    fn total(&self) -> u64 {
        self.stacks.iter().map(|(_, count)| count).sum()
    }

    fn count(&self, keep: impl Fn(&[String]) -> bool) -> u64 {
        self.stacks
            .iter()
            .filter(|(frames, _)| keep(frames))
            .map(|(_, count)| count)
            .sum()
    }

    /// Samples with a frame named `name`.
    fn with_frame(&self, name: &str) -> u64 {
        self.count(|frames| frames.iter().any(|frame| frame == name))
    }

    /// Samples with a frame whose name contains `part`.
    fn with_frame_containing(&self, part: &str) -> u64 {
        self.count(|frames| frames.iter().any(|frame| frame.contains(part)))
    }

    /// Samples of the processes named `comm`.
    fn of_process(&self, comm: &str) -> u64 {
        self.count(|frames| frames.first().is_some_and(|first| first == comm))
    }

    /// Samples of `comm` whose stack holds `chain` (frames joined by `;`).
    fn of_process_with_chain(&self, comm: &str, chain: &str) -> u64 {
        self.count(|frames| {
            frames.first().is_some_and(|first| first == comm)
                && format!(";{};", frames.join(";")).contains(&format!(";{chain};"))
        })
    }
}

impl std::fmt::Debug for Folded {
    /// The heaviest stacks, for assertion messages.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut stacks: Vec<&(Vec<String>, u64)> = self.stacks.iter().collect();
        stacks.sort_by_key(|(_, count)| std::cmp::Reverse(*count));
        writeln!(f, "{} samples in {} stacks:", self.total(), stacks.len())?;
        for (frames, count) in stacks.into_iter().take(12) {
            writeln!(f, "  {} {count}", frames.join(";"))?;
        }
        Ok(())
    }
}

/// The ddprof under test, logging at `info`, without a cache, sampling at
/// [`EVENT`], its outputs in `out`.
fn ddprof(out: &Path) -> Command {
    let mut command = ddprof_command();
    command
        .env_remove("TMPDIR")
        .env_remove("XDG_CACHE_HOME")
        .args([
            "-l",
            "info",
            "--debug-cache",
            "none",
            "-e",
            EVENT,
            "--output",
        ])
        .arg(out);
    command
}

/// [`ddprof`] with its caches in `cache`, logging at `level`.
fn ddprof_with_cache(out: &Path, cache: &Path, level: &str) -> Command {
    let mut command = ddprof_command();
    command
        .env_remove("TMPDIR")
        .env_remove("XDG_CACHE_HOME")
        .args(["-l", level, "-e", EVENT, "--debug-cache"])
        .arg(cache)
        .arg("--output")
        .arg(out);
    command
}

/// The directory is ddprof's own: a real directory (not a link), root's,
/// that no other user can enter or write.
fn assert_private_dir(dir: &Path) {
    let meta = fs::symlink_metadata(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    assert!(meta.is_dir(), "{}: {:?}", dir.display(), meta.file_type());
    assert_eq!(meta.uid(), 0, "{} is not root's", dir.display());
    assert_eq!(
        meta.mode() & 0o777,
        0o700,
        "{}: mode {:o}",
        dir.display(),
        meta.mode()
    );
}

/// Whether a plain `File::open` of the FIFO `path` was still blocked after
/// `wait`. It runs on a thread; a writer then opens the FIFO (without
/// blocking), which releases it, so the test itself never hangs.
fn plain_open_blocks(path: &Path, wait: Duration) -> bool {
    let target = path.to_path_buf();
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let opened = File::open(&target).is_ok();
        let _ = sender.send(opened);
    });
    let blocked = receiver.recv_timeout(wait).is_err();
    if blocked {
        let _writer = OpenOptions::new()
            .write(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path);
        let _ = receiver.recv_timeout(Duration::from_secs(5));
    }
    blocked
}

fn mkfifo(path: &Path) {
    let c_path = CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path that lives across the call.
    let result = unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) };
    assert_eq!(result, 0, "mkfifo {}", path.display());
}

// ---------------------------------------------------------------------
// 1, 2: the output directories
// ---------------------------------------------------------------------

/// The root files nobody's links point at.
const SECRETS: [(&str, &str); 3] = [
    ("file-probe", "ROOT-SECRET-probe\n"),
    ("file-folded", "ROOT-SECRET-folded\n"),
    ("file-svg", "ROOT-SECRET-svg\n"),
];

/// Before: `--output` unusable, the outputs went to the predictable
/// `$TMPDIR/ddprof-out-<daemon pid>`. `nobody` plants that name for every
/// PID the profiler can get: (a) a link to a root-only directory, (b) its
/// own directory holding `*.tmp` links to root files. Control: a
/// `File::create` there writes into the root-only directory, resp.
/// overwrites the root file. ddprof: the root-only directory and files are
/// untouched, the planted name of the very PID the profiler got is still
/// nobody's, and the outputs are in a fresh `0700` directory of root's,
/// with the workload's leaf named.
#[test]
fn out_fallback_symlink_the_fallback_directory_is_not_a_name_another_user_can_plant() {
    let _cpus = cpus_shared();
    let scratch = scratch("out-fallback");
    let _leftovers = Leftovers::new(&scratch);
    let burn = build_workload("hostile_burn.c");
    let secret = victim_dir(&scratch.0.join("rootonly"), &SECRETS);
    let blocker = scratch.0.join("blocker");
    fs::write(&blocker, "a regular file where --output wants a directory").unwrap();
    let pid_file = scratch.0.join("pids");
    let pids = likely_pids(&pid_file);

    for variant in ["link", "dir"] {
        let tmp = dir_with_mode(&scratch.0.join(format!("tmp-{variant}")), 0o1777);
        perl(
            true,
            r#"my ($variant, $dir, $secret, $pids) = @ARGV;
               open my $fh, "<", $pids or die; chomp(my @pids = <$fh>);
               for my $p (@pids) {
                 my $d = "$dir/ddprof-out-$p";
                 if ($variant eq "link") { symlink $secret, $d or die "$d: $!"; next }
                 mkdir $d or die "$d: $!";
                 symlink "$secret/file-probe", "$d/.ddprof-write-probe.tmp" or die;
                 symlink "$secret/file-folded", "$d/stacks.folded.tmp" or die;
                 symlink "$secret/file-svg", "$d/flamegraph.svg.tmp" or die;
               }"#,
            &[
                OsStr::new(variant),
                tmp.as_os_str(),
                secret.as_os_str(),
                pid_file.as_os_str(),
            ],
        );

        // Control: plain std, as root, follows nobody's planted name.
        let planted = tmp.join(format!("ddprof-out-{}", pids[pids.len() / 2]));
        if variant == "link" {
            File::create(planted.join("stacks.folded"))
                .and_then(|mut file| file.write_all(b"control"))
                .unwrap();
            assert!(
                secret.join("stacks.folded").is_file(),
                "control: File::create through nobody's link writes into the root-only directory"
            );
            fs::remove_file(secret.join("stacks.folded")).unwrap();
        } else {
            File::create(planted.join("stacks.folded.tmp"))
                .and_then(|mut file| file.write_all(b"control"))
                .unwrap();
            assert_eq!(
                fs::read(secret.join("file-folded")).unwrap(),
                b"control",
                "control: File::create of nobody's *.tmp link overwrites the root file"
            );
            root_file(&secret.join("file-folded"), SECRETS[1].1);
            set_mtime(&secret.join("file-folded"), OLD);
        }
        let before = snapshot(&secret);

        let run = Running::spawn(
            &format!("fallback-{variant}"),
            &scratch,
            ddprof(&blocker.join("out"))
                .env("TMPDIR", &tmp)
                .arg("--")
                .arg(&burn)
                .arg("1"),
        )
        .finish();
        run.assert_success();
        run.assert_no_panic();
        assert_eq!(
            snapshot(&secret),
            before,
            "{variant}: root wrote in the root-only directory through nobody's names:\n{}",
            run.stderr
        );
        // The fixture covered the very PID the profiler got: before, it
        // would have used this name.
        let daemon = run.daemon_pid();
        let predictable = tmp.join(format!("ddprof-out-{daemon}"));
        let planted_meta = fs::symlink_metadata(&predictable)
            .unwrap_or_else(|e| panic!("no planted {}: {e}", predictable.display()));
        assert_eq!(planted_meta.uid(), NOBODY, "{}", predictable.display());
        // Where the outputs went: a fresh directory of root's.
        let used = run.fallback_dir();
        assert_eq!(used.parent(), Some(tmp.as_path()), "{}", run.stderr);
        assert_ne!(used, predictable);
        assert_private_dir(&used);
        let stacks = folded(&used);
        assert!(
            stacks.with_frame("hostile_burn_leaf") >= 100,
            "{variant}: {stacks:?}"
        );
        assert!(!pprof_files(&used).is_empty());
        assert!(used.join("flamegraph.svg").is_file());
    }
}

/// Before: run from a world-writable directory with no `--output`, root
/// wrote into `./ddprof-out` as nobody had prepared it: (a) a link to a
/// root-only directory, (b) nobody's directory of `*.tmp` links to root
/// files. Control: `File::create` there lands in the root-only directory,
/// resp. overwrites the root file. ddprof: refuses `ddprof-out` (one line
/// saying so), nothing of root's changes, nobody's directory gets nothing,
/// and the outputs are in a fresh private fallback, the workload named.
#[test]
fn out_default_cwd_a_planted_ddprof_out_is_refused() {
    let _cpus = cpus_shared();
    let scratch = scratch("out-default");
    let _leftovers = Leftovers::new(&scratch);
    // A copy in the scratch directory: its path marks the run's processes.
    let burn = scratch.0.join("burn");
    fs::copy(build_workload("hostile_burn.c"), &burn).unwrap();
    let secret = victim_dir(&scratch.0.join("rootonly"), &SECRETS);

    for variant in ["link", "dir"] {
        let cwd = dir_with_mode(&scratch.0.join(format!("shared-{variant}")), 0o1777);
        let tmp = dir_with_mode(&scratch.0.join(format!("tmp-{variant}")), 0o1777);
        let planted = cwd.join("ddprof-out");
        if variant == "link" {
            nobody_sh("ln -s \"$1\" \"$2\"", [&secret, &planted]);
            File::create(planted.join("stacks.folded"))
                .and_then(|mut file| file.write_all(b"control"))
                .unwrap();
            assert!(
                secret.join("stacks.folded").is_file(),
                "control: File::create through nobody's ddprof-out link writes in the root-only directory"
            );
            fs::remove_file(secret.join("stacks.folded")).unwrap();
        } else {
            nobody_sh(
                "mkdir \"$2\" && cd \"$2\" && ln -s \"$1/file-probe\" .ddprof-write-probe.tmp \
                 && ln -s \"$1/file-folded\" stacks.folded.tmp \
                 && ln -s \"$1/file-svg\" flamegraph.svg.tmp",
                [&secret, &planted],
            );
            File::create(planted.join("stacks.folded.tmp"))
                .and_then(|mut file| file.write_all(b"control"))
                .unwrap();
            assert_eq!(
                fs::read(secret.join("file-folded")).unwrap(),
                b"control",
                "control: File::create of nobody's stacks.folded.tmp overwrites the root file"
            );
            root_file(&secret.join("file-folded"), SECRETS[1].1);
            set_mtime(&secret.join("file-folded"), OLD);
        }
        let before = snapshot(&secret);
        let planted_before = fs::read_dir(&planted).map(|entries| entries.count());

        let mut command = ddprof_command();
        command
            .env_remove("XDG_CACHE_HOME")
            .env("TMPDIR", &tmp)
            .current_dir(&cwd)
            .args(["-l", "info", "--debug-cache", "none", "-e", EVENT, "--"])
            .arg(&burn)
            .arg("1");
        let run =
            Running::spawn(&format!("default-cwd-{variant}"), &scratch, &mut command).finish();
        run.assert_success();
        run.assert_no_panic();
        assert_eq!(
            snapshot(&secret),
            before,
            "{variant}: root wrote in the root-only directory:\n{}",
            run.stderr
        );
        assert!(
            run.stderr.contains("cannot write in ddprof-out"),
            "{variant}: no line refusing ./ddprof-out:\n{}",
            run.stderr
        );
        let planted_meta = fs::symlink_metadata(&planted).unwrap();
        assert_eq!(planted_meta.uid(), NOBODY);
        assert_eq!(
            planted_meta.file_type().is_symlink(),
            variant == "link",
            "nobody's ddprof-out was replaced"
        );
        if variant == "dir" {
            assert_eq!(
                fs::read_dir(&planted).map(|entries| entries.count()).ok(),
                planted_before.ok(),
                "root wrote into nobody's ddprof-out"
            );
        }
        let used = run.fallback_dir();
        assert_eq!(used.parent(), Some(tmp.as_path()), "{}", run.stderr);
        assert_private_dir(&used);
        let stacks = folded(&used);
        assert!(
            stacks.with_frame("hostile_burn_leaf") >= 100,
            "{variant}: {stacks:?}"
        );
        assert!(!pprof_files(&used).is_empty());
    }
}

// ---------------------------------------------------------------------
// 3, 4, 5: the caches
// ---------------------------------------------------------------------

/// A cache directory shared with other users (`1777`, as `/tmp`).
fn shared_cache(path: &Path) -> PathBuf {
    dir_with_mode(path, 0o1777)
}

/// The refusal of a cache other users can write, and a run that still
/// profiled: `hostile_burn_leaf` named.
fn assert_shared_cache_refused(run: &Finished, cache: &Path, out: &Path) {
    run.assert_success();
    run.assert_no_panic();
    assert!(
        run.stderr
            .contains(&format!("not keeping caches: {}", cache.display())),
        "{}: the shared cache must be refused:\n{}",
        run.what,
        run.stderr
    );
    let stacks = folded(out);
    assert!(
        stacks.with_frame("hostile_burn_leaf") >= 100,
        "{}: {stacks:?}",
        run.what
    );
}

/// Sets up case 3 in `root`: a shared cache where nobody made `symbols/`
/// (`0777`), a 100 MiB (sparse) filler in `symbols/aa/` dated tomorrow, and
/// `symbols/zz`, a link to a root-only directory of three old root files.
fn evict_fixture(root: &Path) -> (PathBuf, PathBuf) {
    dir_with_mode(root, 0o755);
    let cache = shared_cache(&root.join("shared-cache"));
    let victim = victim_dir(
        &root.join("root-data"),
        &[
            ("important-1", "root file 1\n"),
            ("important-2", "root file 2\n"),
            ("important-3", "root file 3\n"),
        ],
    );
    nobody_sh(
        "mkdir -m 777 \"$1/symbols\" && mkdir \"$1/symbols/aa\" && ln -s \"$2\" \"$1/symbols/zz\" \
         && truncate -s 100M \"$1/symbols/aa/filler.syms\" \
         && touch -d '+1 day' \"$1/symbols/aa/filler.syms\"",
        [&cache, &victim],
    );
    (cache, victim)
}

/// The size eviction of the old symbol store, in plain std: the least
/// recently modified files of `symbols/*/` (listed through `read_dir`,
/// which follows a link) go until the store is under its size.
fn plain_evict(symbols: &Path, max_bytes: u64) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for sub in fs::read_dir(symbols).unwrap().flatten() {
        if !sub.path().is_dir() {
            continue;
        }
        for file in fs::read_dir(sub.path()).unwrap().flatten() {
            let meta = fs::metadata(file.path()).unwrap();
            if meta.is_file() {
                files.push((meta.modified().unwrap(), meta.len(), file.path()));
            }
        }
    }
    files.sort();
    let mut total: u64 = files.iter().map(|(_, len, _)| len).sum();
    let mut removed = Vec::new();
    for (_, len, path) in files {
        if total <= max_bytes {
            break;
        }
        if fs::remove_file(&path).is_ok() {
            total -= len;
            removed.push(path);
        }
    }
    removed
}

/// Before: in a shared `--debug-cache`, nobody's `symbols/zz` link to a
/// root-only directory made the symbol store's size eviction delete root's
/// files. Control: the same eviction in plain std deletes them. ddprof:
/// (shared cache) refused with one line, the root files intact, the run
/// profiled; (root's own `0700` cache holding the same link and filler)
/// the eviction runs — the filler is removed, which proves it — and never
/// goes through the link.
#[test]
fn cache_evict_symlink_eviction_never_deletes_through_a_link() {
    let _cpus = cpus_shared();
    let scratch = scratch("cache-evict");
    let _leftovers = Leftovers::new(&scratch);

    let (control_cache, control_victim) = evict_fixture(&scratch.0.join("control"));
    let removed = plain_evict(&control_cache.join("symbols"), SYMBOL_STORE_MAX);
    assert!(
        removed
            .iter()
            .filter(|path| path.starts_with(control_cache.join("symbols/zz")))
            .count()
            == 3
            && fs::read_dir(&control_victim).unwrap().count() == 0,
        "control: the plain eviction deletes the root files through the link: {removed:?}"
    );

    let (cache, victim) = evict_fixture(&scratch.0.join("attack"));
    let before = snapshot(&victim);
    let (burn, _) = burn_with_fresh_build_id(&scratch.0);
    let out = scratch.0.join("out-shared");
    let run = Running::spawn(
        "evict-shared",
        &scratch,
        ddprof_with_cache(&out, &cache, "info")
            .arg("--")
            .arg(&burn)
            .arg("1"),
    )
    .finish();
    assert_shared_cache_refused(&run, &cache, &out);
    assert_eq!(snapshot(&victim), before, "{}", run.stderr);
    assert!(cache.join("symbols/aa/filler.syms").is_file());

    // Root's own cache with the same link and an older filler: the
    // eviction runs (the filler goes) and leaves the link's target alone.
    let private = dir_with_mode(&scratch.0.join("private-cache"), 0o700);
    let aa = dir_with_mode(&private.join("symbols/aa"), 0o700);
    set_mode(&private.join("symbols"), 0o700);
    let filler = aa.join("filler.syms");
    File::create(&filler)
        .and_then(|file| file.set_len(100 << 20))
        .unwrap();
    set_mtime(&filler, OLD + 366 * 86_400);
    let private_victim = victim_dir(
        &scratch.0.join("private-victim"),
        &[("important-1", "1\n"), ("important-2", "2\n")],
    );
    symlink(&private_victim, private.join("symbols/zz")).unwrap();
    let private_before = snapshot(&private_victim);
    let (burn, _) = burn_with_fresh_build_id(&scratch.0);
    let out = scratch.0.join("out-private");
    let run = Running::spawn(
        "evict-private",
        &scratch,
        ddprof_with_cache(&out, &private, "info")
            .arg("--")
            .arg(&burn)
            .arg("1"),
    )
    .finish();
    run.assert_success();
    run.assert_no_panic();
    assert!(
        run.stderr
            .contains(&format!("symbol store: removed {}", filler.display())),
        "the eviction must have run (the old filler removed):\n{}",
        run.stderr
    );
    assert!(!filler.exists());
    assert!(
        !run.stderr.contains("/symbols/zz/"),
        "eviction through the link:\n{}",
        run.stderr
    );
    assert_eq!(snapshot(&private_victim), private_before);
    assert!(fs::symlink_metadata(private.join("symbols/zz"))
        .unwrap()
        .file_type()
        .is_symlink());
    let stacks = folded(&out);
    assert!(stacks.with_frame("hostile_burn_leaf") >= 100, "{stacks:?}");
}

/// Plants `unwind/ID[0:2]/ID[2:].rows.PID.partial -> target` for every PID
/// of `pid_file` (as nobody in a shared cache, as root in root's own).
fn plant_partial_links(
    as_other_user: bool,
    cache: &Path,
    id: &str,
    target: &Path,
    pid_file: &Path,
) {
    perl(
        as_other_user,
        r#"my ($cache, $id, $target, $pids) = @ARGV;
           my $d = "$cache/unwind"; mkdir $d; $d .= "/" . substr($id, 0, 2); mkdir $d;
           -d $d or die "$d: $!";
           open my $fh, "<", $pids or die; chomp(my @pids = <$fh>);
           for my $p (@pids) {
             symlink $target, "$d/" . substr($id, 2) . ".rows.$p.partial" or die "$!";
           }"#,
        &[
            cache.as_os_str(),
            OsStr::new(id),
            target.as_os_str(),
            pid_file.as_os_str(),
        ],
    );
}

/// Before: the unwind table store wrote `unwind/xx/<build id>.rows.PID.partial`
/// with `File::create`: nobody's link there, for the writer's PID, made
/// root overwrite a root file with an unwind table. Control: a
/// `File::create` of one planted name overwrites it. ddprof (BPF engine,
/// where the worker compiles and the parent writes): (shared cache)
/// refused, the root file intact; (root's own cache with the same links
/// for every PID) tables stored as regular files, the root file intact.
#[test]
fn cache_partial_symlink_the_unwind_store_never_writes_through_a_link() {
    let _cpus = cpus_shared();
    let scratch = scratch("cache-partial");
    let _leftovers = Leftovers::new(&scratch);
    let (burn, id) = burn_with_fresh_build_id(&scratch.0);
    let victim = victim_dir(
        &scratch.0.join("root-data"),
        &[("config", "ROOT-SECRET-CONFIG\n")],
    );
    let pid_file = scratch.0.join("pids");
    let pids = likely_pids(&pid_file);

    let cache = shared_cache(&scratch.0.join("shared-cache"));
    plant_partial_links(true, &cache, &id, &victim.join("config"), &pid_file);
    let planted = cache.join(format!(
        "unwind/{}/{}.rows.{}.partial",
        &id[..2],
        &id[2..],
        pids[0]
    ));
    File::create(&planted)
        .and_then(|mut file| file.write_all(b"DDPRUNW\0control"))
        .unwrap();
    assert_eq!(
        fs::read(victim.join("config")).unwrap(),
        b"DDPRUNW\0control",
        "control: File::create of nobody's .partial link overwrites the root file"
    );
    root_file(&victim.join("config"), "ROOT-SECRET-CONFIG\n");
    set_mtime(&victim.join("config"), OLD);
    let before = snapshot(&victim);

    let out = scratch.0.join("out-shared");
    let run = Running::spawn(
        "partial-shared",
        &scratch,
        ddprof_with_cache(&out, &cache, "info")
            .args(["--engine", "bpf", "--"])
            .arg(&burn)
            .arg("1"),
    )
    .finish();
    assert_shared_cache_refused(&run, &cache, &out);
    assert_eq!(snapshot(&victim), before, "{}", run.stderr);

    let private = dir_with_mode(&scratch.0.join("private-cache"), 0o700);
    plant_partial_links(false, &private, &id, &victim.join("config"), &pid_file);
    let out = scratch.0.join("out-private");
    let run = Running::spawn(
        "partial-private",
        &scratch,
        ddprof_with_cache(&out, &private, "info")
            .args(["--engine", "bpf", "--"])
            .arg(&burn)
            .arg("1"),
    )
    .finish();
    run.assert_success();
    run.assert_no_panic();
    assert_eq!(snapshot(&victim), before, "{}", run.stderr);
    let stored: Vec<PathBuf> = fs::read_dir(private.join("unwind"))
        .unwrap()
        .flatten()
        .flat_map(|prefix| fs::read_dir(prefix.path()).into_iter().flatten().flatten())
        .map(|entry| entry.path())
        .filter(|path| {
            fs::symlink_metadata(path).is_ok_and(|meta| meta.is_file())
                && path.extension().is_some_and(|ext| ext == "rows")
        })
        .collect();
    assert!(
        !stored.is_empty(),
        "the run must have stored its unwind tables:\n{}",
        run.stderr
    );
    let stacks = folded(&out);
    assert!(stacks.with_frame("hostile_burn_leaf") >= 100, "{stacks:?}");
}

/// Before: the symbol store marked its evictions by opening
/// `symbols/.evicted` with `O_CREAT` (following a link): nobody's link made
/// root create a file where nobody chose, or touch a root file's mtime.
/// Control: the plain open creates the file, resp. `set_modified` through
/// the link changes the root file's mtime. ddprof: (shared cache) refused,
/// nothing created; (root's own cache, `.evicted` a link to an old root
/// file) names stored, the mark replaced by a regular file, the root file
/// untouched.
#[test]
fn cache_evicted_mark_the_eviction_mark_is_never_followed() {
    let _cpus = cpus_shared();
    let scratch = scratch("cache-evicted");
    let _leftovers = Leftovers::new(&scratch);
    let victim = victim_dir(&scratch.0.join("root-only"), &[("existing", "existing\n")]);
    let chosen = victim.join("created-by-root");

    let cache = shared_cache(&scratch.0.join("shared-cache"));
    nobody_sh(
        "mkdir -m 777 \"$1/symbols\" && ln -s \"$2\" \"$1/symbols/.evicted\"",
        [&cache, &chosen],
    );
    OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(cache.join("symbols/.evicted"))
        .unwrap();
    assert!(
        chosen.is_file(),
        "control: the plain open creates the file nobody chose"
    );
    fs::remove_file(&chosen).unwrap();
    let before = snapshot(&victim);
    let (burn, _) = burn_with_fresh_build_id(&scratch.0);
    let out = scratch.0.join("out-shared");
    let run = Running::spawn(
        "evicted-shared",
        &scratch,
        ddprof_with_cache(&out, &cache, "info")
            .arg("--")
            .arg(&burn)
            .arg("1"),
    )
    .finish();
    assert_shared_cache_refused(&run, &cache, &out);
    assert!(!chosen.exists(), "{}", run.stderr);
    assert_eq!(snapshot(&victim), before);

    let private = dir_with_mode(&scratch.0.join("private-cache"), 0o700);
    let symbols = dir_with_mode(&private.join("symbols"), 0o700);
    symlink(victim.join("existing"), symbols.join(".evicted")).unwrap();
    File::options()
        .write(true)
        .open(symbols.join(".evicted"))
        .and_then(|file| file.set_modified(SystemTime::now()))
        .unwrap();
    assert!(
        fs::metadata(victim.join("existing")).unwrap().mtime() > OLD as i64,
        "control: touching the mark through the link changes the root file's mtime"
    );
    set_mtime(&victim.join("existing"), OLD);
    let before = snapshot(&victim);
    let (burn, _) = burn_with_fresh_build_id(&scratch.0);
    let out = scratch.0.join("out-private");
    let run = Running::spawn(
        "evicted-private",
        &scratch,
        ddprof_with_cache(&out, &private, "info")
            .arg("--")
            .arg(&burn)
            .arg("1"),
    )
    .finish();
    run.assert_success();
    run.assert_no_panic();
    assert_eq!(snapshot(&victim), before, "{}", run.stderr);
    let stored = fs::read_dir(&symbols)
        .unwrap()
        .flatten()
        .filter(|entry| entry.path().is_dir())
        .flat_map(|prefix| fs::read_dir(prefix.path()).into_iter().flatten().flatten())
        .filter(|entry| entry.path().extension().is_some_and(|ext| ext == "syms"))
        .count();
    assert!(
        stored > 0,
        "the run must have stored names:\n{}",
        run.stderr
    );
    let mark = fs::symlink_metadata(symbols.join(".evicted")).unwrap();
    assert!(
        mark.is_file() && mark.uid() == 0,
        "the eviction mark must have been written as a file of its own (not through the link): \
         {:?}",
        mark.file_type()
    );
    let stacks = folded(&out);
    assert!(stacks.with_frame("hostile_burn_leaf") >= 100, "{stacks:?}");
}

// ---------------------------------------------------------------------
// 6: a FIFO at a mapped file's path
// ---------------------------------------------------------------------

/// `libhostile_fifo_plugin.so` copied to `dir/libfifo.so` (the workload
/// replaces it with a FIFO), and the control: a plain `File::open` of a
/// FIFO blocks.
fn fifo_fixture(dir: &Path) -> PathBuf {
    let lib_dir = dir_with_mode(dir, 0o755);
    let fifo = lib_dir.join("control.fifo");
    mkfifo(&fifo);
    assert!(
        plain_open_blocks(&fifo, Duration::from_secs(1)),
        "control: File::open of a FIFO blocks"
    );
    let library = lib_dir.join("libfifo.so");
    fs::copy(build_workload("hostile_fifo_plugin.c"), &library).unwrap();
    library
}

fn assert_fifo_profiled(run: &Finished, library: &Path, out: &Path) {
    run.assert_no_panic();
    assert!(
        fs::symlink_metadata(library).unwrap().file_type().is_fifo(),
        "the workload put a FIFO at the library's path"
    );
    let summary = run.summary();
    let stacks = folded(out);
    let named = stacks.with_frame("hostile_fifo_fn");
    assert!(
        summary["samples"] >= 200 && named * 100 >= summary["samples"] * 80,
        "{}: the library behind the FIFO must be named: {summary:?}\n{stacks:?}",
        run.what
    );
    assert_summary_accounts(run, EVENT_HZ);
}

/// Before: a target that put a FIFO at its mapped library's path hung the
/// worker in `open` until its watchdog (57 s past the command), its samples
/// lost and uncounted. Control: a plain `File::open` of a FIFO blocks.
/// ddprof: gone within [`NO_HANG`] of the command, and the library's
/// function named in ≥ 80 % of the samples.
#[test]
fn fifo_mapped_command_does_not_hang_the_profiler() {
    let _cpus = cpus_shared();
    let scratch = scratch("fifo-command");
    let _leftovers = Leftovers::new(&scratch);
    let library = fifo_fixture(&scratch.0.join("lib"));
    let out = scratch.0.join("out");
    let run = Running::spawn(
        "fifo-command",
        &scratch,
        ddprof(&out)
            .args(["-u", "1", "--"])
            .arg(build_workload("hostile_fifo.c"))
            .arg(&library)
            .arg("2"),
    )
    .finish();
    run.assert_success();
    assert!(
        run.profiler_tail < NO_HANG,
        "the profiler outlived the command by {:?}:\n{}",
        run.profiler_tail,
        run.stderr
    );
    assert_fifo_profiled(&run, &library, &out);
}

/// The same FIFO with `ddprof -p` attached to the running target (before:
/// the set-up or the worker hung). ddprof exits within [`NO_HANG`] of the
/// target, the library named.
#[test]
fn fifo_mapped_attach_does_not_hang_the_profiler() {
    let _cpus = cpus_shared();
    let scratch = scratch("fifo-attach");
    let _leftovers = Leftovers::new(&scratch);
    let library = fifo_fixture(&scratch.0.join("lib"));
    let target = Command::new(build_workload("hostile_fifo.c"))
        .arg(&library)
        .arg("3")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut target = ddprof_tests::guards::KillOnDrop(target);
    wait_until("the FIFO in place", Duration::from_secs(10), || {
        fs::symlink_metadata(&library).is_ok_and(|meta| meta.file_type().is_fifo())
    });
    let out = scratch.0.join("out");
    let run = Running::spawn(
        "fifo-attach",
        &scratch,
        ddprof(&out)
            .args(["-u", "1", "-p"])
            .arg(target.id().to_string()),
    );
    let status = target.wait().unwrap();
    let target_ended = Instant::now();
    assert!(status.success(), "{status:?}");
    let run = run.finish();
    run.assert_success();
    let outlived = run.ended.saturating_duration_since(target_ended);
    assert!(
        outlived < NO_HANG,
        "ddprof -p outlived its target by {outlived:?}:\n{}",
        run.stderr
    );
    assert_fifo_profiled(&run, &library, &out);
}

// ---------------------------------------------------------------------
// 7: perf maps
// ---------------------------------------------------------------------

/// A run of `hostile_jit` for `seconds` under ddprof (`-u 1`; as nobody
/// with `as_nobody`); `plant(pid, address, map)` runs as soon as the JIT
/// wrote where its code is. Returns the run, its output directory, the
/// JIT's PID.
fn run_jit(
    scratch: &Scratch,
    name: &str,
    as_nobody_user: bool,
    plant: impl FnOnce(u32, u64, &Path),
) -> (Finished, PathBuf, u32) {
    let out = scratch.0.join(format!("out-{name}"));
    let mut command = ddprof(&out);
    command.args(["-u", "1"]);
    if as_nobody_user {
        command.args(["--switch-user", "65534"]);
    }
    run_jit_under(scratch, name, command, 2, plant)
}

/// [`run_jit`] under `command` (ddprof and its options, up to `--`), the
/// JIT running `seconds`; its outputs are where `command` says.
fn run_jit_under(
    scratch: &Scratch,
    name: &str,
    mut command: Command,
    seconds: u32,
    plant: impl FnOnce(u32, u64, &Path),
) -> (Finished, PathBuf, u32) {
    let jit_dir = dir_with_mode(&scratch.0.join(format!("jit-{name}")), 0o777);
    let address_file = jit_dir.join("address");
    let out = scratch.0.join(format!("out-{name}"));
    command
        .arg("--")
        .arg(build_workload("hostile_jit.c"))
        .arg(seconds.to_string())
        .arg(&address_file);
    let running = Running::spawn(&format!("jit-{name}"), scratch, &mut command);
    wait_until("the JIT's address", Duration::from_secs(10), || {
        address_file.exists()
    });
    let text = fs::read_to_string(&address_file).unwrap();
    let (pid, address) = text.trim().split_once(' ').expect("PID ADDRESS");
    let pid: u32 = pid.parse().unwrap();
    let address = u64::from_str_radix(address, 16).unwrap();
    let map = PathBuf::from(format!("/tmp/perf-{pid}.map"));
    let _remove = RemoveOnDrop(map.clone());
    plant(pid, address, &map);
    (running.finish(), out, pid)
}

/// Before: `/tmp/perf-PID.map` was read whoever made it: nobody's map named
/// 349 of 446 samples of a root JIT. Control run: a map written by root
/// (the JIT's user) does name the JIT's code — maps are read. Attack:
/// nobody's map; plain std reads its forged name. ddprof: not one frame
/// named from it, one line saying why, the JIT's samples there.
#[test]
fn perfmap_forged_by_another_user_names_nothing() {
    let _cpus = cpus_shared();
    let scratch = scratch("perfmap-forged");
    let _leftovers = Leftovers::new(&scratch);

    let (run, out, _) = run_jit(&scratch, "legit", false, |_, address, map| {
        fs::write(map, format!("{address:x} 100 HOSTILE_LEGIT_jit_fn\n")).unwrap();
    });
    run.assert_success();
    let stacks = folded(&out);
    let jit = stacks.of_process("hostile_jit");
    let legit = stacks.with_frame("HOSTILE_LEGIT_jit_fn");
    assert!(
        jit >= 200 && legit * 100 >= jit * 50,
        "control: root's own perf map names the JIT's code: {stacks:?}"
    );

    let (run, out, pid) = run_jit(&scratch, "forged", false, |_, address, map| {
        nobody_sh(
            "printf '%s 100 NOBODY_FORGED_jit_fn\\n' \"$2\" > \"$1\"",
            [map.as_os_str(), OsStr::new(&format!("{address:x}"))],
        );
        let meta = fs::metadata(map).unwrap();
        assert_eq!(meta.uid(), NOBODY);
        assert!(
            fs::read_to_string(map)
                .unwrap()
                .contains("NOBODY_FORGED_jit_fn"),
            "control: plain std reads nobody's names"
        );
    });
    run.assert_success();
    run.assert_no_panic();
    let stacks = folded(&out);
    assert_eq!(
        stacks.with_frame_containing("NOBODY_FORGED"),
        0,
        "names from nobody's perf map: {stacks:?}"
    );
    assert!(stacks.of_process("hostile_jit") >= 200, "{stacks:?}");
    assert!(
        run.stderr
            .contains(&format!("perf map /tmp/perf-{pid}.map not read")),
        "{}",
        run.stderr
    );
}

/// Before: a FIFO at `/tmp/perf-PID.map` (nobody's) hung the worker, then
/// its replacement: the profiler outlived the JIT by 119 s with 0 samples.
/// Control: a plain `File::open` of the planted FIFO blocks. ddprof: gone
/// within [`NO_HANG`], the JIT's samples there, one line saying why the map
/// was not read.
#[test]
fn perfmap_fifo_does_not_hang_the_profiler() {
    let _cpus = cpus_shared();
    let scratch = scratch("perfmap-fifo");
    let _leftovers = Leftovers::new(&scratch);
    let control = dir_with_mode(&scratch.0.join("nobody"), 0o1777).join("control.fifo");
    nobody_sh("mkfifo \"$1\"", [&control]);
    assert!(
        plain_open_blocks(&control, Duration::from_secs(1)),
        "control: File::open of nobody's FIFO blocks"
    );
    let (run, out, pid) = run_jit(&scratch, "fifo", false, |_, _, map| {
        nobody_sh("mkfifo \"$1\"", [map]);
    });
    run.assert_success();
    run.assert_no_panic();
    assert!(
        run.profiler_tail < NO_HANG,
        "the profiler outlived the JIT by {:?}:\n{}",
        run.profiler_tail,
        run.stderr
    );
    let stacks = folded(&out);
    assert!(stacks.of_process("hostile_jit") >= 200, "{stacks:?}");
    assert!(
        run.stderr
            .contains(&format!("perf map /tmp/perf-{pid}.map not read")),
        "{}",
        run.stderr
    );
    assert_summary_accounts(&run, EVENT_HZ);
}

/// Before: a 3 GiB sparse perf map was read whole: the worker reached
/// 3 GiB RSS. Here the JIT runs as nobody, who plants the map itself (so
/// that the owner check passes and the size bound is what is tested).
/// Control: a plain open of it succeeds and it is 3 GiB long. ddprof: not
/// read ("N bytes, more than..."), the worker's peak RSS far below it, no
/// hang, the JIT profiled.
#[test]
fn perfmap_3gib_sparse_is_not_read() {
    let _cpus = cpus_shared();
    let scratch = scratch("perfmap-sparse");
    let _leftovers = Leftovers::new(&scratch);
    const SIZE: u64 = 3 << 30;
    let (run, out, pid) = run_jit(&scratch, "sparse", true, |_, _, map| {
        nobody_sh("truncate -s 3G \"$1\"", [map]);
        let file = File::open(map).expect("control: a plain open of the map succeeds");
        assert_eq!(
            file.metadata().unwrap().len(),
            SIZE,
            "control: 3 GiB to read"
        );
    });
    run.assert_success();
    run.assert_no_panic();
    assert!(
        run.stderr.contains(&format!(
            "perf map /tmp/perf-{pid}.map not read: {SIZE} bytes"
        )),
        "{}",
        run.stderr
    );
    let summary = run.summary();
    assert!(
        summary["worker_peak_rss_kib"] < 200 * 1024,
        "the worker read the map: {summary:?}"
    );
    assert!(run.profiler_tail < NO_HANG, "{:?}", run.profiler_tail);
    let stacks = folded(&out);
    assert!(stacks.of_process("hostile_jit") >= 200, "{stacks:?}");
    assert_summary_accounts(&run, EVENT_HZ);
}

/// A runtime writes its perf map after its first JIT code runs (or the
/// period's first anonymous sample comes before the runtime made its map).
/// Before: the map was looked for once a period, at the period's first
/// anonymous sample of the process; not there then, the whole period's
/// JIT samples stayed `[anon]`. Here the map is written 600 ms after the
/// JIT's code starts, in a 4 s run of 3 s periods (so that a slow machine
/// still writes it within the first period). ddprof: the map is looked
/// for again at the period's end, and at least 90 % of the JIT's samples
/// are named (before: 505 of 1,997).
#[test]
fn perfmap_written_after_the_code_runs_names_that_period() {
    let _cpus = cpus_shared();
    let scratch = scratch("perfmap-late");
    let _leftovers = Leftovers::new(&scratch);
    let out = scratch.0.join("out-late");
    let mut command = ddprof(&out);
    command.args(["-u", "3"]);
    let started = Instant::now();
    let mut written_after = Duration::ZERO;
    let (run, out, _) = run_jit_under(&scratch, "late", command, 4, |_, address, map| {
        std::thread::sleep(Duration::from_millis(600));
        fs::write(map, format!("{address:x} 100 HOSTILE_LATE_jit_fn\n")).unwrap();
        written_after = started.elapsed();
    });
    run.assert_success();
    run.assert_no_panic();
    assert!(
        written_after < Duration::from_millis(2500),
        "control: the map written within the first 3 s period ({written_after:?} after ddprof \
         started)"
    );
    let stacks = folded(&out);
    let jit = stacks.of_process("hostile_jit");
    let named = stacks.with_frame("HOSTILE_LATE_jit_fn");
    assert!(
        jit >= 100 && named * 100 >= jit * 90,
        "{named} of the JIT's {jit} samples named from a map written late: {stacks:?}"
    );
}

/// A JIT agent that writes its whole perf map again as it goes (as
/// perf-map-agent does each time it is asked to dump) makes the map be
/// read whole every period: with 16 MiB, ~50 ms, and the period's
/// symbolization is that long. Before, the loop symbolized in line and the
/// buffers (here 512 KiB a CPU: ~16 stack copies, 16 ms at 999 Hz)
/// overflowed at every period's end: 125 of 4,858 samples lost in full
/// buffers. Control: a period's symbolization outlasts twice what the
/// buffers hold. ddprof: the loop goes on while the publisher thread
/// symbolizes, no more than 1 % of the samples lost in full buffers in
/// the periods after the first, the ones sampled while a period is
/// symbolized (room for a busy machine's scheduling; the loop symbolizing
/// in line lost 2.4–3.4 %). The first period's samples are counted apart:
/// none is symbolized meanwhile, and the start of a run on a loaded
/// machine is another matter (run alone: beside another test's ddprof and
/// workload on two CPUs, the loop waited 0.1 s for one in the first period
/// and lost 1.1–1.4 %; CI at 04e6850 lost 246 of its first period's 998
/// and none after),
/// every sample due accounted for, the JIT's code named in 95 % of the
/// samples (every period, the ones whose read caught the map truncated
/// too), the worker's peak RSS at most 72 MiB.
#[test]
fn perfmap_growing_does_not_stop_the_sampling() {
    let _cpus = cpus_alone();
    const HZ: u32 = 999;
    const RING_KIB: u32 = 512;
    const MAP_MIB: usize = 16;
    let scratch = scratch("perfmap-growing");
    let _leftovers = Leftovers::new(&scratch);
    let out = scratch.0.join("out-growing");
    let mut command = ddprof_command();
    command
        .env_remove("TMPDIR")
        .env_remove("XDG_CACHE_HOME")
        .args(["-l", "info", "--debug-cache", "none", "-u", "1"])
        .args([
            "--engine",
            "perf",
            "--ring-buffer-kib",
            &RING_KIB.to_string(),
        ])
        .args(["-e", &format!("sCPU freq={HZ}"), "--output"])
        .arg(&out);
    let (run, out, _) = run_jit_under(&scratch, "growing", command, 5, |_, address, map| {
        let filler = 0x7f00_0000_0000u64;
        let mut text = format!("{address:x} 100 HOSTILE_GROWING_jit_fn\n");
        let mut index = 0u64;
        while text.len() < MAP_MIB << 20 {
            text.push_str(&format!(
                "{:x} 40 LazyCompile:~filler_function_{index:08} /srv/app/module{}.js:1\n",
                filler + index * 64,
                index % 977
            ));
            index += 1;
        }
        fs::write(map, &text).unwrap();
        // The whole map written again every 250 ms, in address order, one
        // function more each time (below the others: not an append), for
        // the JIT's run.
        let started = Instant::now();
        while started.elapsed() < Duration::from_millis(4500) {
            std::thread::sleep(Duration::from_millis(250));
            index += 1;
            let dumped = format!("{:x} 40 LazyCompile:~dumped_{index}\n", filler - index * 64);
            text.insert_str(0, &dumped);
            fs::write(map, &text).unwrap();
        }
    });
    run.assert_success();
    run.assert_no_panic();
    let symbolized_ms: Vec<f64> = run
        .stderr
        .split("symbolized in ")
        .skip(1)
        .filter_map(|rest| rest.split(' ').next()?.parse().ok())
        .collect();
    let longest = symbolized_ms.iter().copied().fold(0.0, f64::max);
    let ring_ms = f64::from(RING_KIB) * 1024.0 / (32768.0 + 256.0) * 1000.0 / f64::from(HZ);
    eprintln!("growing perf map: periods symbolized in {symbolized_ms:?} ms; the buffers hold {ring_ms:.0} ms");
    assert!(
        longest >= 2.0 * ring_ms,
        "control: a period's symbolization ({longest} ms) outlasts what the buffers hold \
         ({ring_ms:.0} ms):\n{}",
        run.stderr
    );
    let summary = run.summary();
    // (samples, lost in full buffers) of each period, in order.
    let periods: Vec<(u64, u64)> = run
        .stderr
        .split("notice: period: ")
        .skip(1)
        .filter_map(|rest| {
            let line = rest.lines().next()?;
            let samples = line.split(" samples").next()?.parse().ok()?;
            let ring_full = line
                .split(" ring buffer full")
                .next()
                .filter(|before| before.len() < line.len())
                .and_then(|before| before.rsplit('(').next()?.parse().ok())
                .unwrap_or(0);
            Some((samples, ring_full))
        })
        .collect();
    let (samples, ring_full) = periods
        .iter()
        .skip(1)
        .fold((0, 0), |(samples, lost), period| {
            (samples + period.0, lost + period.1)
        });
    assert!(
        periods.len() >= 4 && samples >= 2000 && ring_full * 100 <= samples,
        "{ring_full} samples lost in full buffers of {samples} after the first period \
         ({periods:?}):\n{}",
        run.stderr
    );
    // Its names in one string, not one allocation each: before, 78–108 MiB.
    assert!(
        summary["worker_peak_rss_kib"] <= 72 << 10,
        "a {MAP_MIB} MiB map must not cost the worker more than 72 MiB: {summary:?}"
    );
    let stacks = folded(&out);
    eprintln!("growing perf map: {stacks:?}");
    // Before the map was looked for again at a period's end and a map
    // read while it was written again kept the longer one's names, one or
    // two periods' JIT frames were `[anon]` (979 and 1,840 of ~4,900).
    let named = stacks.with_frame("HOSTILE_GROWING_jit_fn");
    assert!(
        named * 100 >= summary["samples"] * 95,
        "the JIT's code named from its map in {named} of {} samples: {stacks:?}",
        summary["samples"]
    );
    assert_summary_accounts(&run, HZ);
}

// ---------------------------------------------------------------------
// 8: a container's file and the host's at the same path
// ---------------------------------------------------------------------

/// A tmpfs mounted at a directory (in this mount namespace), unmounted
/// when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(path: &Path) -> Tmpfs {
        fs::create_dir_all(path).unwrap();
        let target = CString::new(path.as_os_str().as_bytes()).unwrap();
        let source = CString::new("tmpfs").unwrap();
        let options = CString::new("size=16m,mode=0755").unwrap();
        // SAFETY: mount(2) reads NUL-terminated strings that live across
        // the call.
        let result = unsafe {
            libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                source.as_ptr(),
                0,
                options.as_ptr().cast(),
            )
        };
        assert_eq!(
            result,
            0,
            "mount tmpfs on {}: {}",
            path.display(),
            std::io::Error::last_os_error()
        );
        Tmpfs(path.to_path_buf())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let target = CString::new(self.0.as_os_str().as_bytes()).unwrap();
        // SAFETY: umount2 reads a NUL-terminated path.
        unsafe { libc::umount2(target.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Copies `binary` and the libraries `ldd` lists for it into `root`, at
/// their paths (a minimal root to chroot into), as `root/name`.
fn minimal_root(root: &Path, binary: &Path, name: &str) {
    fs::create_dir_all(root).unwrap();
    fs::copy(binary, root.join(name)).unwrap();
    let ldd = Command::new("ldd").arg(binary).output().expect("run ldd");
    for path in String::from_utf8_lossy(&ldd.stdout)
        .split_whitespace()
        .filter(|word| word.starts_with('/'))
    {
        let inside = root.join(path.trim_start_matches('/'));
        fs::create_dir_all(inside.parent().unwrap()).unwrap();
        fs::copy(path, &inside).unwrap_or_else(|e| panic!("copy {path}: {e}"));
    }
}

/// Before: the frames of a container's process were named from the host's
/// file at the same path: every frame of short-lived processes, and those
/// of a long-lived one when the two files had the same inode number on
/// different devices. Here both at once: the host's `P` and the
/// container's `P` are the first file of two fresh tmpfs mounts (same path,
/// same inode, different devices, different code). Control: a plain
/// `File::open(P)` from the host opens the host's file, and its inode is
/// the container's. ddprof, on 30 short-lived processes and on one
/// long-lived one: the container's function named, never the host's.
#[test]
fn host_file_never_names_a_containers_frames() {
    let _cpus = cpus_shared();
    let scratch = scratch("container");
    let _leftovers = Leftovers::new(&scratch);
    let build = dir_with_mode(&scratch.0.join("build"), 0o755);
    let host_lib = compile(
        "hostile_named_lib.c",
        &build.join("host.so"),
        &["-shared", "-fPIC", "-DFN=HOSTSECRET_fn"],
    );
    let container_lib = compile(
        "hostile_named_lib.c",
        &build.join("container.so"),
        &["-shared", "-fPIC", "-DFN=CONTAINER_fn0"],
    );
    let root = scratch.0.join("rootfs");
    minimal_root(&root, &build_workload("hostile_dlrun.c"), "dlrun");
    let lib_dir = scratch.0.join("lib");
    let path = lib_dir.join("libc8.so");
    let inside = root.join(lib_dir.strip_prefix("/").unwrap());
    // Unmounted before the scratch directory is removed (dropped first).
    let _host_mount = Tmpfs::mount(&lib_dir);
    let _container_mount = Tmpfs::mount(&inside);
    fs::copy(&host_lib, &path).unwrap();
    fs::copy(&container_lib, inside.join("libc8.so")).unwrap();

    let host = fs::metadata(&path).unwrap();
    let container = fs::metadata(inside.join("libc8.so")).unwrap();
    let mut host_bytes = Vec::new();
    File::open(&path)
        .unwrap()
        .read_to_end(&mut host_bytes)
        .unwrap();
    let has = |bytes: &[u8], name: &[u8]| bytes.windows(name.len()).any(|w| w == name);
    assert!(
        has(&host_bytes, b"HOSTSECRET_fn") && !has(&host_bytes, b"CONTAINER_fn0"),
        "control: File::open(P) from the host opens the host's file"
    );
    assert_eq!(
        (host.ino(), host.dev() != container.dev()),
        (container.ino(), true),
        "control: the same inode number on another device"
    );

    for (name, args) in [
        ("short-lived", &["0.05", "30"][..]),
        ("long-lived", &["1.5"][..]),
    ] {
        let out = scratch.0.join(format!("out-{name}"));
        let run = Running::spawn(
            &format!("container-{name}"),
            &scratch,
            ddprof(&out)
                .args(["--", "unshare", "--mount", "chroot"])
                .arg(&root)
                .arg("/dlrun")
                .arg(&path)
                .args(args),
        )
        .finish();
        run.assert_success();
        run.assert_no_panic();
        let stacks = folded(&out);
        let dlrun = stacks.of_process("dlrun");
        let named = stacks.with_frame("CONTAINER_fn0");
        assert_eq!(
            stacks.with_frame("HOSTSECRET_fn"),
            0,
            "{name}: the host's file named the container's frames: {stacks:?}"
        );
        assert!(
            dlrun >= 200 && named * 100 >= dlrun * 80,
            "{name}: the container's function must be named: {stacks:?}"
        );
        assert_summary_accounts(&run, EVENT_HZ);
    }
}

// ---------------------------------------------------------------------
// 9: two libraries with one build id
// ---------------------------------------------------------------------

/// What a cache keyed by build id compared: (build id, size, executable
/// segments as (address, size, file range)).
type Identity = (Vec<u8>, u64, Vec<(u64, u64, (u64, u64))>);

fn identity(path: &Path) -> Identity {
    let bytes = fs::read(path).unwrap();
    let file = object::File::parse(&*bytes).unwrap();
    let executable = file
        .segments()
        .filter(|segment| {
            matches!(segment.flags(), object::SegmentFlags::Elf { p_flags, .. } if p_flags.0 & 1 != 0)
        })
        .map(|segment| (segment.address(), segment.size(), segment.file_range()))
        .collect();
    (
        file.build_id().unwrap().unwrap_or_default().to_vec(),
        bytes.len() as u64,
        executable,
    )
}

/// Before: two libraries with the same build id (which whoever builds a
/// file chooses): the second's stacks were unwound with the first's table
/// and named from its names (`BETA_mid;ALPHA_leaf`), within one run and
/// across runs through the on-disk cache. Control: the two files have the
/// same build id, size and executable segments (all a build-id-keyed cache
/// compared) and different code. ddprof: each library's own chain, in one
/// run and in a second run that does read the first's cache.
#[test]
fn buildid_poison_a_shared_build_id_neither_poisons_nor_is_poisoned() {
    let _cpus = cpus_shared();
    let scratch = scratch("buildid");
    let _leftovers = Leftovers::new(&scratch);
    let id = random_hex(20);
    let build_id = format!("-Wl,--build-id=0x{id}");
    let library = |variant: &str| {
        let dir = dir_with_mode(&scratch.0.join(variant.to_lowercase()), 0o755);
        compile(
            "hostile_poison_lib.c",
            &dir.join("libpoison.so"),
            &[
                "-shared",
                "-fPIC",
                &format!("-DVARIANT_{variant}"),
                &build_id,
            ],
        )
    };
    let (a, b) = (library("A"), library("B"));
    let size = fs::metadata(&a)
        .unwrap()
        .len()
        .max(fs::metadata(&b).unwrap().len());
    for path in [&a, &b] {
        OpenOptions::new()
            .write(true)
            .open(path)
            .and_then(|file| file.set_len(size))
            .unwrap();
    }
    assert_eq!(
        identity(&a),
        identity(&b),
        "control: the same build id, size and executable segments"
    );
    assert_ne!(fs::read(&a).unwrap(), fs::read(&b).unwrap());
    let dlrun = build_workload("hostile_dlrun.c");
    let (use_a, use_b) = (scratch.0.join("useA"), scratch.0.join("useB"));
    fs::copy(&dlrun, &use_a).unwrap();
    fs::copy(&dlrun, &use_b).unwrap();

    let check = |run: &Finished, out: &Path, comm: &str, chain: &str, foreign: &str| {
        run.assert_success();
        run.assert_no_panic();
        let stacks = folded(out);
        let total = stacks.of_process(comm);
        let whole = stacks.of_process_with_chain(comm, chain);
        let wrong = stacks.count(|frames| {
            frames.first().is_some_and(|first| first == comm)
                && frames.iter().any(|frame| frame.starts_with(foreign))
        });
        assert!(
            total >= 150 && whole * 100 >= total * 90 && wrong == 0,
            "{}: {comm}'s stacks must be {chain}, none naming {foreign}*: {stacks:?}",
            run.what
        );
        assert_summary_accounts(run, EVENT_HZ);
    };

    // One run, A then B.
    let cache = dir_with_mode(&scratch.0.join("cache-one"), 0o700);
    let out = scratch.0.join("out-one");
    let run = Running::spawn(
        "buildid-one-run",
        &scratch,
        ddprof_with_cache(&out, &cache, "info")
            .args([
                "-u",
                "1",
                "--",
                "sh",
                "-c",
                "\"$0\" \"$1\" 1 && \"$2\" \"$3\" 1",
            ])
            .arg(&use_a)
            .arg(&a)
            .arg(&use_b)
            .arg(&b),
    )
    .finish();
    check(
        &run,
        &out,
        "useA",
        "main;entry;ALPHA_mid;ALPHA_leaf",
        "BETA_",
    );
    check(
        &run,
        &out,
        "useB",
        "main;entry;BETA_mid;BETA_leaf",
        "ALPHA_",
    );

    // Two runs, one cache: A's, then B's.
    let cache = dir_with_mode(&scratch.0.join("cache-two"), 0o700);
    let out = scratch.0.join("out-first");
    let run = Running::spawn(
        "buildid-first-run",
        &scratch,
        ddprof_with_cache(&out, &cache, "info")
            .args(["-u", "1", "--"])
            .arg(&use_a)
            .arg(&a)
            .arg("1"),
    )
    .finish();
    check(
        &run,
        &out,
        "useA",
        "main;entry;ALPHA_mid;ALPHA_leaf",
        "BETA_",
    );
    let out = scratch.0.join("out-second");
    let run = Running::spawn(
        "buildid-second-run",
        &scratch,
        ddprof_with_cache(&out, &cache, "debug")
            .args(["-u", "1", "--"])
            .arg(&use_b)
            .arg(&b)
            .arg("1"),
    )
    .finish();
    check(
        &run,
        &out,
        "useB",
        "main;entry;BETA_mid;BETA_leaf",
        "ALPHA_",
    );
    // The second run did use the first one's cache (useB is a copy of
    // useA: the same bytes, the same table)...
    assert!(
        run.stderr.contains(&format!(
            "unwind table of {} read from the store",
            use_b.display()
        )),
        "the second run must read the first one's cache:\n{}",
        run.stderr
    );
    // ...but not for B's library.
    assert!(
        !run.stderr.contains(&format!(
            "unwind table of {} read from the store",
            b.display()
        )) && !run
            .stderr
            .lines()
            .any(|line| line.contains("read from the symbol store")
                && line.contains(&*b.to_string_lossy())),
        "B's library read from A's cache entries:\n{}",
        run.stderr
    );
}

// ---------------------------------------------------------------------
// 10: a container's PID 1
// ---------------------------------------------------------------------

/// `unshare --pid --fork --mount-proc PROGRAM`, without ddprof's `DD_*`
/// environment.
fn unshare_pid(program: &Path) -> Command {
    let mut command = Command::new("unshare");
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("DD_") {
            command.env_remove(key);
        }
    }
    command
        .env_remove("TMPDIR")
        .env_remove("XDG_CACHE_HOME")
        .args(["--pid", "--fork", "--mount-proc"])
        .arg(program);
    command
}

/// The control of case 10: when PID 1 of a PID namespace exits, the
/// kernel kills every other process of it (a 30 s `hostile_burn` started
/// in the background is gone at once).
fn assert_pid1_exit_kills_its_namespace(scratch: &Scratch, burn: &Path) {
    let word = format!("{}/pid1-control", scratch.0.display());
    // PID 1 exits once the test has seen its background process (a file
    // says so; at most 10 s), not after a fixed time a slow machine may
    // not have started the process in.
    let seen = scratch.0.join("pid1-control-seen");
    let _ = fs::remove_file(&seen);
    let mut command = unshare_pid(Path::new("sh"));
    command
        .args([
            "-c",
            "\"$0\" 30 0 -1 \"$1\" & i=0; \
             while [ ! -e \"$2\" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done; exit 0",
        ])
        .arg(burn)
        .arg(&word)
        .arg(&seen);
    let running = Running::spawn("pid1-control", scratch, &mut command);
    let in_namespace = || {
        marked_processes(&word)
            .into_iter()
            .any(|(_, comm)| comm == "hostile_burn")
    };
    wait_until(
        "the namespace's background process",
        Duration::from_secs(5),
        in_namespace,
    );
    fs::write(&seen, "").unwrap();
    let run = running.finish();
    run.assert_success();
    wait_until(
        "control: the kernel ends the namespace with its PID 1",
        Duration::from_secs(2),
        || !in_namespace(),
    );
}

/// The outputs of a whole run are there: a pprof, `stacks.folded` naming
/// the workload, `flamegraph.svg`, and the summary, which accounts for
/// every sample due.
fn assert_last_period_kept(run: &Finished, out: &Path, engine: &str) {
    run.assert_no_panic();
    assert!(
        run.stderr.contains(&format!(
            "engine: {}",
            if engine == "bpf" { "BPF" } else { "perf" }
        )),
        "{}: the {engine} engine must be the one used:\n{}",
        run.what,
        run.stderr
    );
    let summary = run.summary();
    assert!(summary["samples"] >= 150, "{}: {summary:?}", run.what);
    assert!(!pprof_files(out).is_empty(), "{}: no pprof", run.what);
    assert!(out.join("flamegraph.svg").is_file());
    let stacks = folded(out);
    assert!(
        stacks.with_frame("hostile_burn_leaf") >= 150,
        "{}: {stacks:?}",
        run.what
    );
    assert_summary_accounts(run, EVENT_HZ);
}

/// Before: `unshare --pid --fork --mount-proc ddprof -- svc`: when the
/// command (PID 1) exits, the kernel kills the profiler with it: no last
/// period, no `stacks.folded`, no summary. Control: the kernel does end the
/// namespace with its PID 1. ddprof `--init` (PID 1 itself): the command
/// exits by itself with code 7; ddprof exits 7 and every output is there.
fn pid1_command_exits(engine: &str) {
    let scratch = scratch(&format!("pid1-exit-{engine}"));
    let _leftovers = Leftovers::new(&scratch);
    let burn = build_workload("hostile_burn.c");
    assert_pid1_exit_kills_its_namespace(&scratch, &burn);
    let out = scratch.0.join("out");
    let run = Running::spawn(
        &format!("pid1-exit-{engine}"),
        &scratch,
        unshare_pid(ddprof_bin())
            .args([
                "--init",
                "--engine",
                engine,
                "-l",
                "info",
                "--debug-cache",
                "none",
            ])
            .args(["-e", EVENT, "--output"])
            .arg(&out)
            .arg("--")
            .arg(&burn)
            .args(["1.5", "7", "-1"])
            .arg(scratch.0.join("marker")),
    )
    .finish();
    assert_eq!(
        run.status.code(),
        Some(7),
        "the command's exit status:\n{}",
        run.stderr
    );
    assert_last_period_kept(&run, &out, engine);
}

#[test]
fn pid1_last_period_command_exits_bpf() {
    let _cpus = cpus_shared();
    pid1_command_exits("bpf");
}

#[test]
fn pid1_last_period_command_exits_perf() {
    let _cpus = cpus_shared();
    pid1_command_exits("perf");
}

/// As [`pid1_command_exits`], stopped the way a container is (`docker
/// stop`): SIGTERM to PID 1, which is ddprof `--init`. With `term_code`, the
/// command's handler exits with it; without, SIGTERM kills the command
/// (128 + 15). ddprof exits with that status within [`NO_HANG`], every
/// output there.
fn pid1_sigterm(engine: &str, term_code: Option<i32>) {
    let scratch = scratch(&format!("pid1-term-{engine}"));
    let _leftovers = Leftovers::new(&scratch);
    let burn = build_workload("hostile_burn.c");
    assert_pid1_exit_kills_its_namespace(&scratch, &burn);
    let out = scratch.0.join("out");
    let handler = term_code.unwrap_or(-1).to_string();
    let running = Running::spawn(
        &format!("pid1-sigterm-{engine}"),
        &scratch,
        unshare_pid(ddprof_bin())
            .args([
                "--init",
                "--engine",
                engine,
                "-l",
                "info",
                "--debug-cache",
                "none",
            ])
            .args(["-e", EVENT, "--output"])
            .arg(&out)
            .arg("--")
            .arg(&burn)
            .args(["30", "0", &handler])
            .arg(scratch.0.join("marker")),
    );
    // ddprof, PID 1 of the namespace: the unshare process's child.
    let children = format!("/proc/{0}/task/{0}/children", running.pid);
    let mut init = 0;
    wait_until("ddprof as PID 1", Duration::from_secs(10), || {
        init = fs::read_to_string(&children)
            .ok()
            .and_then(|text| text.split_whitespace().next()?.parse().ok())
            .unwrap_or(0);
        init != 0
            && fs::read_to_string(format!("/proc/{init}/comm"))
                .is_ok_and(|comm| comm.trim() == "ddprof")
    });
    let marker = marker(&scratch);
    wait_until("the command running", Duration::from_secs(10), || {
        marked_processes(&marker)
            .iter()
            .any(|(_, comm)| comm == "hostile_burn")
    });
    let status = fs::read_to_string(format!("/proc/{init}/status")).unwrap();
    assert!(
        status
            .lines()
            .any(|line| line.starts_with("NSpid:") && line.ends_with("\t1")),
        "ddprof must be PID 1 of its namespace:\n{status}"
    );
    std::thread::sleep(Duration::from_millis(1500));
    signal(init, libc::SIGTERM);
    let signalled = Instant::now();
    let run = running.finish();
    let took = run.ended.saturating_duration_since(signalled);
    assert!(
        took < NO_HANG,
        "ddprof took {took:?} to end after SIGTERM:\n{}",
        run.stderr
    );
    assert_eq!(
        run.status.code(),
        Some(term_code.unwrap_or(128 + libc::SIGTERM)),
        "the command's status:\n{}",
        run.stderr
    );
    assert_last_period_kept(&run, &out, engine);
}

#[test]
fn pid1_last_period_sigterm_bpf() {
    let _cpus = cpus_shared();
    pid1_sigterm("bpf", Some(42));
}

#[test]
fn pid1_last_period_sigterm_perf() {
    let _cpus = cpus_shared();
    pid1_sigterm("perf", None);
}

/// Without `--init`, a command that is PID 1 takes the profiler with it:
/// ddprof says so, with what to do, and the command's exit status is kept.
#[test]
fn pid1_without_init_is_warned_about() {
    let _cpus = cpus_shared();
    let scratch = scratch("pid1-warn");
    let _leftovers = Leftovers::new(&scratch);
    let burn = build_workload("hostile_burn.c");
    assert_pid1_exit_kills_its_namespace(&scratch, &burn);
    let out = scratch.0.join("out");
    let run = Running::spawn(
        "pid1-no-init",
        &scratch,
        unshare_pid(ddprof_bin())
            .args(["-l", "warn", "--debug-cache", "none", "--output"])
            .arg(&out)
            .arg("--")
            .arg(&burn)
            .args(["1", "3", "-1"])
            .arg(scratch.0.join("marker")),
    )
    .finish();
    assert_eq!(run.status.code(), Some(3), "{}", run.stderr);
    assert!(
        run.stderr
            .contains("the command is PID 1 of its PID namespace")
            && run.stderr.contains("ddprof --init"),
        "the PID 1 warning:\n{}",
        run.stderr
    );
    eprintln!(
        "without --init: outputs {:?}, summary {}",
        fs::read_dir(&out).map(|entries| entries
            .flatten()
            .map(|entry| entry.file_name())
            .collect::<Vec<_>>()),
        run.stderr.contains("summary:")
    );
}

// ---------------------------------------------------------------------
// 11: every sample accounted for
// ---------------------------------------------------------------------

/// The frequency of the short-task cases (the default, as in the attack:
/// a 5 ms thread or a 1 ms process is shorter than one period).
const DEFAULT_HZ: u32 = 99;
/// The frequency of the stopped and killed worker case: ten times the
/// default, so that a 4 s stop fills the buffers (at 99 Hz the BPF ring
/// holds ~27 s of samples) without a test of a minute.
const WORKER_FAULT_HZ: u32 = 999;

/// ddprof with `engine` at `hz`, `-u 1`, wrapping `workload args`.
fn accounting_run(
    scratch: &Scratch,
    name: &str,
    engine: &str,
    hz: u32,
    workload: &Path,
    args: &[&str],
) -> Running {
    let out = scratch.0.join(format!("out-{name}"));
    let mut command = ddprof_command();
    command
        .env_remove("TMPDIR")
        .args([
            "--engine",
            engine,
            "-l",
            "info",
            "--debug-cache",
            "none",
            "-u",
            "1",
        ])
        .args(["-e", &format!("sCPU freq={hz}"), "--output"])
        .arg(&out)
        .arg("--")
        .arg(workload)
        .args(args);
    Running::spawn(name, scratch, &mut command)
}

/// Samples delivered and samples counted lost, against the workload's CPU
/// time (`wait4`, the kernel's count) × the frequency `hz`, within
/// `tolerance` (a fraction); returns (samples, lost, expected).
fn accounting(run: &Finished, hz: u32, tolerance: f64) -> (f64, f64, f64) {
    run.assert_no_panic();
    let summary = run.summary();
    let samples = summary["samples"] as f64;
    let lost = summary["lost"] as f64;
    let expected = run.cpu.as_secs_f64() * f64::from(hz);
    eprintln!(
        "{}: samples {samples} + lost {lost} = {:.1} % of {expected:.0} (CPU {:.3} s × {hz} Hz)",
        run.what,
        (samples + lost) * 100.0 / expected,
        run.cpu.as_secs_f64()
    );
    assert!(
        ((samples + lost) - expected).abs() <= expected * tolerance,
        "{}: samples {samples} + lost {lost} must be within {:.0} % of {expected:.0} ({:?}):\n{}\n\
         the whole log:\n{}",
        run.what,
        tolerance * 100.0,
        summary,
        accounting_lines(&run.stderr),
        run.stderr
    );
    (samples, lost, expected)
}

/// Every sample due accounted for, by the summary alone (it also serves
/// `-p`, whose target is no child of the test): samples + counted losses
/// within 5 % of the kernel's count of the profiled tasks' CPU time
/// (`target_cpu_ms`) × `hz`.
fn assert_summary_accounts(run: &Finished, hz: u32) {
    let summary = run.summary();
    let field = |name: &str| summary.get(name).copied().unwrap_or(0) as f64;
    let due = field("target_cpu_ms") * f64::from(hz) / 1000.0;
    let accounted = field("samples") + field("lost");
    eprintln!(
        "{}: samples + lost = {accounted} = {:.1} % of {due:.0} due",
        run.what,
        accounted * 100.0 / due
    );
    assert!(
        due >= 100.0 && (accounted - due).abs() <= due * 0.05,
        "{}: samples + lost = {accounted} must be within 5 % of the {due:.0} due: {summary:?}",
        run.what
    );
}

/// Before: a worker stopped past its watchdog lost half the samples with
/// `lost=0` (what the buffers could not hold was dropped, uncounted). Here,
/// at [`WORKER_FAULT_HZ`], the worker is stopped for 4 s (shorter than its
/// watchdog, longer than the buffers hold), then killed (SIGKILL, as a
/// crash). Control: the kill is real (the worker's PID is gone, another
/// worker takes over). ddprof: the samples and the counted losses within
/// 5 % of the workload's CPU × frequency, the workload named.
fn killed_worker(engine: &str) {
    let scratch = scratch(&format!("lost-worker-{engine}"));
    let _leftovers = Leftovers::new(&scratch);
    let marker = marker(&scratch);
    let name = format!("killed-worker-{engine}");
    let running = accounting_run(
        &scratch,
        &name,
        engine,
        WORKER_FAULT_HZ,
        &build_workload("hostile_burn.c"),
        &["8"],
    );
    let worker = || {
        marked_processes(&marker)
            .into_iter()
            .find(|(_, comm)| comm == "ddprof-worker")
            .map(|(pid, _)| pid)
    };
    let mut first = 0;
    wait_until("the worker", Duration::from_secs(10), || {
        first = worker().unwrap_or(0);
        first != 0
    });
    std::thread::sleep(Duration::from_secs(1));
    signal(first, libc::SIGSTOP);
    std::thread::sleep(Duration::from_secs(4));
    signal(first, libc::SIGCONT);
    std::thread::sleep(Duration::from_millis(500));
    signal(first, libc::SIGKILL);
    wait_until(
        "control: the killed worker gone",
        Duration::from_secs(5),
        || !alive(first),
    );
    wait_until("control: another worker", Duration::from_secs(10), || {
        worker().is_some_and(|pid| pid != first)
    });
    let run = running.finish();
    run.assert_success();
    let summary = run.summary();
    assert!(summary["worker_restarts"] >= 1, "{summary:?}");
    let (samples, _, expected) = accounting(&run, WORKER_FAULT_HZ, 0.05);
    assert!(expected >= 1500.0, "{expected}");
    let stacks = folded(&scratch.0.join(format!("out-{name}")));
    assert!(
        stacks.with_frame("hostile_burn_leaf") as f64 >= samples * 0.9,
        "{stacks:?}"
    );
}

#[test]
fn lost_uncounted_killed_worker_bpf() {
    let _cpus = cpus_shared();
    killed_worker("bpf");
}

#[test]
fn lost_uncounted_killed_worker_perf() {
    let _cpus = cpus_shared();
    killed_worker("perf");
}

/// Before: 2,000 threads of 5 ms gave 58 % (BPF) / 68 % (perf) of CPU ×
/// frequency, `lost=0`; 5,000 forks of 1 ms gave 0 samples. Control: each
/// task's CPU time (from `wait4`) is below one 99 Hz period, so per-task
/// counters alone cannot sample them. ddprof: samples + counted losses
/// within `tolerance` of CPU × frequency; with the BPF engine (per-CPU
/// sampling of the process tree) the samples taken (delivered, or lost in
/// a full buffer: at most 10 %) ≥ 95 % of the kernel's count of the tasks'
/// CPU time, and with the samples of processes on their way out
/// (`lost_exiting`) ≥ 95 % of `wait4`'s; the workload's function named.
///
/// A process's CPU time after its events detach in the kernel's exit path
/// (tens of µs: ~6 % of a 1 ms child here) is in `wait4`'s figure and in
/// no per-task count: the BPF engine samples it (no stack is left: counted
/// as `lost_exiting`), the perf engine cannot see it, hence its wider
/// tolerance on forks.
fn short_tasks(engine: &str, workload: &str, tasks: u32, each: &str, leaf: &str, tolerance: f64) {
    let scratch = scratch(&format!("lost-{workload}-{engine}"));
    let _leftovers = Leftovers::new(&scratch);
    let name = format!("{workload}-{engine}");
    let binary = build_workload(&format!("{workload}.c"));
    let run = accounting_run(
        &scratch,
        &name,
        engine,
        DEFAULT_HZ,
        &binary,
        &[&tasks.to_string(), each],
    )
    .finish();
    run.assert_success();
    let per_task = run.cpu.as_secs_f64() / f64::from(tasks);
    assert!(
        per_task < 1.0 / f64::from(DEFAULT_HZ),
        "control: {per_task:.4} s of CPU per task must be below one period"
    );
    let (samples, _, expected) = accounting(&run, DEFAULT_HZ, tolerance);
    assert!(expected >= 150.0, "{expected}");
    if engine == "bpf" {
        let summary = run.summary();
        let counted = summary["target_cpu_ms"] as f64 * f64::from(DEFAULT_HZ) / 1000.0;
        // What the per-CPU events sampled: delivered, or lost in a full
        // buffer (taken by the kernel, and counted). CI lost 28 (89a493f)
        // and 100 (12a2a7f) of 499 so. Found since: the program's table
        // waited up to 0.86 s for `/proc/PID/map_files` (the memory map
        // lock of a process starting threads, on a busy machine), and its
        // samples went to the perf buffers with 32 KB stack copies
        // meanwhile (174-261 of ~500 in 4 of 80 runs beside two busy
        // loops; here the loop kept up, buffers at most 33 % full). Files
        // are opened by path first since (at most 33 handed over in 60
        // such runs). Each period's line says how full the buffers were
        // and whether the loop was busy or kept off a CPU: a failure
        // prints them first. CI then lost 84 of 499 (5b72cc6) with the
        // loop 4 ms on a CPU and 2,042 ms waiting for one: 1,000 threads
        // runnable at once on 2 CPUs leave a nice-0 loop about a
        // 500th of one, before it had loaded the program's table. Those
        // losses are the machine's, not the engine's: the bound holds
        // where the loop had its CPU, and where it did not, the run must
        // say so (the summary's wait and the warning naming it). Per-task
        // events alone sample ~58 % of these tasks.
        let ring_full = summary.get("lost_ring_full").copied().unwrap_or(0) as f64;
        let loop_wait_ms = summary.get("ring_full_loop_wait_ms").copied().unwrap_or(0);
        let kept_off_a_cpu = loop_wait_ms >= 500
            && run.stderr.lines().any(|line| {
                line.contains("lost with the ring buffers full while the profiler waited")
            });
        assert!(
            samples + ring_full >= counted * 0.95,
            "{name}: the BPF engine sampled {samples} + {ring_full} lost in full buffers of \
             the {counted:.0} the kernel's count makes due:\n{}\nthe whole log:\n{}",
            accounting_lines(&run.stderr),
            run.stderr
        );
        assert!(
            ring_full <= counted * 0.1 || kept_off_a_cpu,
            "{name}: {ring_full} samples of {counted:.0} lost in full buffers (the loop waited \
             {loop_wait_ms} ms for a CPU then):\n{}\nthe whole log:\n{}",
            accounting_lines(&run.stderr),
            run.stderr
        );
        let exiting = summary.get("lost_exiting").copied().unwrap_or(0) as f64;
        assert!(
            samples + ring_full + exiting >= expected * 0.95,
            "{name}: the BPF engine sampled {samples} + {ring_full} lost in full buffers + \
             {exiting} exiting of {expected:.0} due:\n{}\nthe whole log:\n{}",
            accounting_lines(&run.stderr),
            run.stderr
        );
    }
    if samples >= expected * 0.2 {
        let stacks = folded(&scratch.0.join(format!("out-{name}")));
        assert!(
            stacks.with_frame(leaf) as f64 >= samples * 0.5,
            "{name}: {stacks:?}"
        );
    } else {
        // Per-task counters that never reached a period (the perf engine
        // with 1 ms forks): nothing to name, and the losses must say why.
        let summary = run.summary();
        assert!(
            summary["lost_unsampled"] as f64 >= (expected - samples) * 0.9,
            "{name}: the missing samples must be counted as unsampled: {summary:?}"
        );
    }
}

#[test]
fn lost_uncounted_short_threads_bpf() {
    let _cpus = cpus_shared();
    short_tasks(
        "bpf",
        "hostile_threads",
        1000,
        "5",
        "hostile_thread_burn",
        0.05,
    );
}

#[test]
fn lost_uncounted_short_threads_perf() {
    let _cpus = cpus_shared();
    short_tasks(
        "perf",
        "hostile_threads",
        1000,
        "5",
        "hostile_thread_burn",
        0.05,
    );
}

#[test]
fn lost_uncounted_short_forks_bpf() {
    let _cpus = cpus_shared();
    short_tasks(
        "bpf",
        "hostile_forks",
        2000,
        "1000",
        "hostile_fork_burn",
        0.05,
    );
}

#[test]
fn lost_uncounted_short_forks_perf() {
    let _cpus = cpus_shared();
    short_tasks(
        "perf",
        "hostile_forks",
        2000,
        "1000",
        "hostile_fork_burn",
        0.08,
    );
}

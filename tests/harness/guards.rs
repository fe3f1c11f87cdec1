//! What the tests share around the processes and clocks they use.
use std::path::PathBuf;
use std::process::Child;

/// A child process killed and reaped when dropped, whether the test passed
/// or panicked: no workload outlives its test.
#[derive(Debug)]
pub struct KillOnDrop(pub Child);

impl KillOnDrop {
    /// Kills and reaps the child now (dropping it later does nothing more).
    pub fn stop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl std::ops::Deref for KillOnDrop {
    type Target = Child;

    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for KillOnDrop {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        self.stop();
    }
}

/// The machine's CPUs as a test binary's tests (run two at a time) share
/// them: every test of a file that uses it takes [`cpus_shared`], and the
/// few that measure whether the profiler keeps up with a workload (or that
/// profile every process) take [`cpus_alone`], so that no second ddprof and
/// workload run beside them. One lock per test binary.
static CPUS: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// Runs beside this binary's other `cpus_shared` tests.
pub fn cpus_shared() -> std::sync::RwLockReadGuard<'static, ()> {
    CPUS.read().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs while none of this binary's other `cpus_shared` tests does.
pub fn cpus_alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    CPUS.write()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// CLOCK_MONOTONIC in nanoseconds: the clock of `Sample::time` and of the
/// perf records.
pub fn monotonic_nanos() -> u64 {
    let now = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always there");
    now.tv_sec() as u64 * 1_000_000_000 + now.tv_nsec() as u64
}

/// A scratch directory, `ddprof-NAME-PID` in the temporary directory,
/// empty at start and removed when the test ends (passed or panicked).
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(name: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("ddprof-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create a scratch directory");
        Scratch(
            dir.canonicalize()
                .expect("canonicalize the scratch directory"),
        )
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A cgroup of the cgroup v2 hierarchy (`cpu.stat` is in every v2 cgroup,
/// whatever controllers are enabled): the CPU time the kernel charged to
/// the processes that ran in it, however short-lived, measured from
/// outside. Removed when dropped (once its processes are gone).
pub struct CpuCgroup(pub PathBuf);

impl CpuCgroup {
    /// A new cgroup `ddprof-NAME-PID` under the v2 hierarchy's root.
    pub fn new(name: &str) -> CpuCgroup {
        let root = cgroup2_root().expect(
            "a cgroup v2 hierarchy (mounted as cgroup2, e.g. /sys/fs/cgroup or \
             /sys/fs/cgroup/unified): the test measures the profiler's CPU time there",
        );
        let dir = root.join(format!("ddprof-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot create the cgroup {}: {e}", dir.display()));
        CpuCgroup(dir)
    }

    /// The `cgroup.procs` file: writing a PID moves that process here.
    pub fn procs(&self) -> PathBuf {
        self.0.join("cgroup.procs")
    }

    /// The CPU time charged to the cgroup so far.
    pub fn usage(&self) -> std::time::Duration {
        let stat = std::fs::read_to_string(self.0.join("cpu.stat")).expect("cpu.stat");
        let micros = stat
            .lines()
            .find_map(|line| line.strip_prefix("usage_usec "))
            .and_then(|value| value.trim().parse().ok())
            .expect("usage_usec in cpu.stat");
        std::time::Duration::from_micros(micros)
    }
}

impl Drop for CpuCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Where the cgroup v2 hierarchy is mounted (from /proc/self/mountinfo).
fn cgroup2_root() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|line| {
        let (mount, filesystem) = line.split_once(" - ")?;
        filesystem
            .starts_with("cgroup2 ")
            .then(|| mount.split_whitespace().nth(4).map(PathBuf::from))?
    })
}

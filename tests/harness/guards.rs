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

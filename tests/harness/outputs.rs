//! Reading what ddprof leaves behind: its log's summary line, pprof files
//! (through `go tool pprof`, the reference reader).
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The `key=value` fields of the `summary:` log line.
pub fn summary_fields(stderr: &str) -> HashMap<String, u64> {
    let line = stderr
        .lines()
        .find(|l| l.contains("summary:"))
        .unwrap_or_else(|| panic!("no summary line in:\n{stderr}"));
    line.split_whitespace()
        .filter_map(|word| {
            let (key, value) = word.split_once('=')?;
            Some((key.to_string(), value.parse().ok()?))
        })
        .collect()
}

/// The lines of a ddprof log that say where samples went (each period's
/// counts, how full the buffers were and how the loop kept up; the
/// engines' hand-off and loss lines; the summary), for the first lines of
/// a failed accounting assertion: the suite's digest keeps only a
/// message's first lines, and a whole log at `-l info` starts with set-up.
pub fn accounting_lines(stderr: &str) -> String {
    const ABOUT_SAMPLES: [&str; 5] = [" period: ", "BPF engine: ", " lost", "summary:", "warn"];
    stderr
        .lines()
        .filter(|line| ABOUT_SAMPLES.iter().any(|mark| line.contains(mark)))
        .filter(|line| !line.contains(" verified ("))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The `.pprof` files of a directory, sorted by name (start time).
pub fn pprof_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot list {}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "pprof"))
        .collect();
    files.sort();
    files
}

/// The one pprof file ddprof wrote in `dir` (a run of one period),
/// decoded; fails the test, with ddprof's log `stderr`, when there is not
/// exactly one.
pub fn only_pprof(dir: &Path, stderr: &str) -> crate::pprof::Profile {
    let files = pprof_files(dir);
    assert_eq!(files.len(), 1, "{stderr}");
    crate::pprof::Profile::read_gzipped(&files[0]).unwrap()
}

/// `go tool pprof ARGS FILE`'s output; fails the test when Go cannot read it.
pub fn go_pprof(args: &[&str], file: &Path) -> String {
    let output = Command::new("go")
        .args(["tool", "pprof"])
        .args(args)
        .arg(file)
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `go tool pprof` ({e}): install Go with `apt-get install -y golang-go`"
            )
        });
    assert!(
        output.status.success(),
        "go tool pprof {args:?} {} failed: {}",
        file.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

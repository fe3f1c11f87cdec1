//! A real JIT, Node, named as the C++ ddprof names it: from the perf map
//! it writes in its own `/tmp` (a container's: a mount namespace with a
//! `/tmp` of its own), and from the jitdump it writes with `--perf-prof`.
use std::path::Path;

use ddprof_tests::guards::Scratch;
use ddprof_tests::outputs::pprof_files;
use ddprof_tests::pprof::Profile;
use ddprof_tests::workloads::workloads_source_dir;
use ddprof_tests::{run_without_input as run, text};

fn hot_js() -> String {
    workloads_source_dir()
        .join("jit_hot.js")
        .to_string_lossy()
        .into_owned()
}

/// The script's text, for `node -e`: a checkout under `/tmp` is hidden by
/// the private `/tmp` the namespace test mounts.
fn hot_js_text() -> String {
    std::fs::read_to_string(hot_js()).expect("tests/workloads/jit_hot.js")
}

/// The profile of `out`: the share of its CPU samples with a frame named
/// after the script's functions (V8's `JS:*ddprofHotLoop /path:1:23`,
/// `JS:*ddprofOuter …`), and the pids of its samples.
fn hot_share(out: &Path, stderr: &str) -> (f64, Vec<u32>) {
    let files = pprof_files(out);
    assert_eq!(files.len(), 1, "{stderr}");
    let pprof = Profile::read_gzipped(&files[0]).unwrap();
    let (mut hot, mut all) = (0i64, 0i64);
    for (names, values) in pprof.stacks() {
        all += values[0];
        if names
            .iter()
            .any(|name| name.contains("ddprofHotLoop") || name.contains("ddprofOuter"))
        {
            hot += values[0];
        }
    }
    assert!(all >= 100, "{all} samples of 2 s at 99 Hz\n{stderr}");
    let mut pids: Vec<u32> = pprof
        .labels()
        .iter()
        .flatten()
        .filter(|(key, _)| key == "process_id")
        .filter_map(|(_, value)| value.parse().ok())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    (hot as f64 / all as f64, pids)
}

/// Asserts that most samples of `out`'s profile name the script's
/// functions (without the runtime's map or jitdump: none), and
/// that ddprof's `/tmp` holds no perf map of the processes sampled (the
/// names came from elsewhere); returns those processes.
fn assert_named_without_a_host_map(out: &Path, stderr: &str) -> Vec<u32> {
    let (share, pids) = hot_share(out, stderr);
    for pid in &pids {
        assert!(
            !Path::new(&format!("/tmp/perf-{pid}.map")).exists(),
            "a perf map of {pid} in ddprof's /tmp: the test would not show where the names came from"
        );
    }
    assert!(
        share >= 0.6,
        "{:.0} % of the samples name ddprofHotLoop or ddprofOuter (a 2 s loop in them)\n{stderr}",
        share * 100.0
    );
    pids
}

/// `node --perf-basic-prof` in a mount namespace with a `/tmp` of its own:
/// its map is not in ddprof's `/tmp`, only in the process's
/// (`/proc/PID/root/tmp/perf-PID.map`), and its JS function is named.
#[test]
fn node_in_a_mount_namespace_of_its_own_is_named_from_its_own_tmp() {
    let out = Scratch::new("jit-namespace");
    // node writes a V8 log (isolate-*-v8.log) in its working directory:
    // not in the source tree.
    let cwd = Scratch::new("jit-namespace-cwd");
    let script = "mount -t tmpfs ddprof-test-tmp /tmp && exec node --perf-basic-prof -e \"$0\"";
    let output = run(ddprof_tests::ddprof_command()
        .current_dir(&cwd.0)
        .arg("--output")
        .arg(&out.0)
        .args(["--", "unshare", "--mount", "--propagation", "private"])
        .args(["sh", "-c", script, &hot_js_text()]));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_named_without_a_host_map(&out.0, &stderr);
}

/// `node --perf-prof` writes no perf map but a jitdump (`jit-PID.dump` in
/// its working directory, mapped executable): its JS function is named
/// from it.
#[test]
fn node_is_named_from_its_jitdump() {
    let out = Scratch::new("jit-jitdump-out");
    let cwd = Scratch::new("jit-jitdump-cwd");
    let output = run(ddprof_tests::ddprof_command()
        .current_dir(&cwd.0)
        .arg("--output")
        .arg(&out.0)
        .args([
            "--",
            "node",
            "--perf-prof",
            "--interpreted-frames-native-stack",
        ])
        .args([&hot_js(), "2"]));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let pids = assert_named_without_a_host_map(&out.0, &stderr);
    assert!(
        pids.iter()
            .any(|pid| cwd.0.join(format!("jit-{pid}.dump")).exists()),
        "no jitdump of {pids:?} in {}",
        cwd.0.display()
    );
}

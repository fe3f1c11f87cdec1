//! Whose work a sample is: each process's container, from its cgroup, on
//! every one of its samples (`container_id`, as Datadog's C++ ddprof labels
//! them). Real cgroups, real processes moved into them as a container
//! runtime moves a container's first process: before its exec.
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::Stdio;

use ddprof_tests::e2e::Scratch;
use ddprof_tests::pprof::Profile;
use ddprof_tests::workloads::build_workload;

/// A cgroup named as Docker names a container's
/// (`docker-<64 hex digits>.scope`), in the cgroup v2 hierarchy if one is
/// mounted, else in v1's `pids`; removed when dropped.
struct ContainerCgroup {
    parent: PathBuf,
    path: PathBuf,
    id: String,
}

impl ContainerCgroup {
    fn new() -> Option<Self> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").ok()?;
        let mount = |kind: &str, option: Option<&str>| {
            mounts.lines().find_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                (fields.get(2) == Some(&kind)
                    && option.is_none_or(|option| fields[3].split(',').any(|o| o == option)))
                .then(|| PathBuf::from(fields[1]))
            })
        };
        let root = mount("cgroup2", None).or_else(|| mount("cgroup", Some("pids")))?;
        let random = std::fs::read("/proc/sys/kernel/random/uuid").ok()?;
        let half = String::from_utf8_lossy(&random).trim().replace('-', "");
        let id = format!("{half}{half}");
        let parent = root.join(format!("ddprof-test-{}", std::process::id()));
        let path = parent.join(format!("docker-{id}.scope"));
        std::fs::create_dir_all(&path).ok()?;
        Some(Self { parent, path, id })
    }
}

impl Drop for ContainerCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.path);
        let _ = std::fs::remove_dir(&self.parent);
    }
}

#[test]
fn samples_of_a_process_in_a_container_carry_its_container_id_bpf() {
    samples_of_a_process_in_a_container_carry_its_container_id("bpf");
}

#[test]
fn samples_of_a_process_in_a_container_carry_its_container_id_perf() {
    samples_of_a_process_in_a_container_carry_its_container_id("perf");
}

fn samples_of_a_process_in_a_container_carry_its_container_id(engine: &str) {
    let cgroup = ContainerCgroup::new().expect("a cgroup hierarchy this test can write (root)");
    let chain = build_workload("chain.c");
    let scratch = Scratch::new(&format!("identity-container-{engine}"));
    let out = scratch.0.join("out");
    // Two instances of the same program: one stays in the command's
    // cgroup, one joins the container's before its exec.
    let script = format!(
        "{chain} 2 & sh -c 'echo $$ > {procs} && exec {chain} 2'; wait",
        chain = chain.display(),
        procs = cgroup.path.join("cgroup.procs").display()
    );
    let output = ddprof_tests::ddprof_command()
        .args(["-l", "notice", "--engine", engine, "-e", "sCPU freq=999"])
        .arg("--output")
        .arg(&out)
        .args(["--", "sh", "-c", &script])
        .stdin(Stdio::null())
        .output()
        .expect("ddprof runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    let files = ddprof_tests::outputs::pprof_files(&out);
    assert_eq!(files.len(), 1, "{stderr}");
    let profile = Profile::read_gzipped(&files[0]).unwrap();
    // Each chain process's samples, and the container ids on them.
    let mut containers: BTreeMap<String, BTreeSet<Option<String>>> = BTreeMap::new();
    let mut samples: BTreeMap<String, usize> = BTreeMap::new();
    for labels in profile.labels() {
        let label = |key: &str| {
            labels
                .iter()
                .find(|(k, _)| k == key)
                .map(|(_, value)| value.clone())
        };
        if label("process_name").as_deref() != Some("chain") {
            continue;
        }
        let pid = label("process_id").unwrap();
        containers
            .entry(pid.clone())
            .or_default()
            .insert(label("container_id"));
        *samples.entry(pid).or_default() += 1;
    }
    println!("{containers:?} {samples:?}");
    let mut seen: Vec<&BTreeSet<Option<String>>> = containers.values().collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            &BTreeSet::from([None]),
            &BTreeSet::from([Some(cgroup.id.clone())])
        ],
        "one chain outside, one in the container, each with all its samples so labelled: {stderr}"
    );
}

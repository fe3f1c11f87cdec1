//! Whose work a sample is: each process's container, from its cgroup, on
//! every one of its samples (`container_id`, as Datadog's C++ ddprof labels
//! them), and with `-p`/`--global` each process's service, from its
//! OpenTelemetry process context or its environment, each service's
//! samples in a profile of its own, uploaded with its own container's
//! entity headers. Real cgroups, real processes moved into them as a
//! container runtime moves a container's first process (before its exec), a
//! publisher of OTEP 4719 written from the spec, and one of span ids
//! (`libdd-otel-thread-ctx`).
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use ddprof_tests::e2e::Scratch;
use ddprof_tests::guards::{cpus_alone, cpus_shared};
use ddprof_tests::intake::{Behaviour, Intake};
use ddprof_tests::launcher::Lines;
use ddprof_tests::pprof::label;
use ddprof_tests::workloads::build_workload;

// The machine is shared by this file's tests except the `--global` one,
// which profiles every process (the others' too) and runs `cpus_alone`.

/// A cgroup named as Docker names a container's
/// (`docker-<64 hex digits>.scope`), in the cgroup v2 hierarchy if one is
/// mounted, else in v1's `pids`; removed when dropped.
struct ContainerCgroup {
    parent: PathBuf,
    path: PathBuf,
    id: String,
}

impl ContainerCgroup {
    fn new(engine: &str) -> Option<Self> {
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
        let parent = root.join(format!("ddprof-test-{}-{engine}", std::process::id()));
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
    let _machine = cpus_shared();
    samples_of_a_process_in_a_container_carry_its_container_id("bpf");
}

#[test]
fn samples_of_a_process_in_a_container_carry_its_container_id_perf() {
    let _machine = cpus_shared();
    samples_of_a_process_in_a_container_carry_its_container_id("perf");
}

fn samples_of_a_process_in_a_container_carry_its_container_id(engine: &str) {
    let cgroup =
        ContainerCgroup::new(engine).expect("a cgroup hierarchy this test can write (root)");
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
    let profile = ddprof_tests::outputs::only_pprof(&out, &stderr);
    // Each chain process's samples, and the container ids on them.
    let mut containers: BTreeMap<String, BTreeSet<Option<String>>> = BTreeMap::new();
    let mut samples: BTreeMap<String, usize> = BTreeMap::new();
    for labels in profile.labels() {
        let label = |key: &str| label(&labels, key);
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
    // Outside: the test's own container, if it runs in one.
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let outside = ddprof::container::container_id_in(&own);
    let mut seen: Vec<&BTreeSet<Option<String>>> = containers.values().collect();
    seen.sort();
    let mut expected = [
        BTreeSet::from([outside]),
        BTreeSet::from([Some(cgroup.id.clone())]),
    ];
    expected.sort();
    assert_eq!(
        seen,
        expected.iter().collect::<Vec<_>>(),
        "one chain outside, one in the container, each with all its samples so labelled: {stderr}"
    );
}

/// A profile's tags, by key.
type Tags = BTreeMap<String, String>;
/// The (process name, process id) of a profile's samples.
type Programs = BTreeSet<(String, String)>;
/// An upload's `Datadog-Container-ID` and `Datadog-Entity-ID` headers.
type Entity = (Option<String>, Option<String>);

/// An upload's entity headers.
fn entity(received: &ddprof_tests::intake::Received) -> Entity {
    let header = |name: &str| received.header(name).map(str::to_string);
    (header("Datadog-Container-ID"), header("Datadog-Entity-ID"))
}

/// ddprof uploading to `intake` and writing to `out`, the run's service
/// `host-run` and its tags `-S`'s alone (whatever the runner's).
fn services_profiler(intake: &Intake, out: &std::path::Path) -> Command {
    let mut command = ddprof_tests::ddprof_command();
    command
        .env_remove("DD_ENV")
        .env_remove("DD_VERSION")
        .args(["-l", "info", "-S", "host-run", "-e", "sCPU freq=999"])
        .args(["-U", &intake.url, "--output"])
        .arg(out);
    command
}

/// With `-p`, each process that publishes its service (an OpenTelemetry
/// process context, OTEP 4719, or `DD_SERVICE` in its environment) has its
/// samples in a profile of that service's, uploaded under its tags and
/// with its own container's entity headers; the others stay in the run's.
#[test]
fn each_published_service_gets_a_profile_of_its_own_under_its_tags() {
    let _machine = cpus_shared();
    let chain = build_workload("chain.c");
    let publisher = build_workload("otel_process_ctx.c");
    let scratch = Scratch::new("identity-services");
    let out = scratch.0.join("out");
    let intake = Intake::http(Behaviour::Accept);
    let cgroup =
        ContainerCgroup::new("services").expect("a cgroup hierarchy this test can write (root)");
    // Started after the attach (the shell sleeps first): two programs
    // publish a service, one does not; the publisher joins a container's
    // cgroup before its exec.
    let script = format!(
        "sleep 1; DD_SERVICE=alpha DD_ENV=test {chain} 2 & \
         sh -c 'echo $$ > {procs} && exec {publisher} 2 gamma staging 3.1 i-7' & \
         {chain} 2 & wait",
        chain = chain.display(),
        publisher = publisher.display(),
        procs = cgroup.path.join("cgroup.procs").display()
    );
    let mut shell = Command::new("sh")
        .args(["-c", &script])
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let output = services_profiler(&intake, &out)
        .args(["-p", &shell.id().to_string()])
        .stdin(Stdio::null())
        .output()
        .expect("ddprof runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(shell.wait().unwrap().success());
    assert!(output.status.success(), "{stderr}");
    assert_eq!(intake.violations(), Vec::<String>::new(), "{stderr}");
    // By service: its tags, and the programs and pids of its samples; and
    // the entity headers of its uploads.
    let mut by_service: BTreeMap<String, (Tags, Programs)> = BTreeMap::new();
    let mut entities: BTreeMap<String, BTreeSet<Entity>> = BTreeMap::new();
    for received in intake.received() {
        let tags: BTreeMap<String, String> = received.tags().into_iter().collect();
        let service = tags["service"].clone();
        entities
            .entry(service.clone())
            .or_default()
            .insert(entity(&received));
        let entry = by_service
            .entry(service)
            .or_insert_with(|| (tags, BTreeSet::new()));
        for labels in received.profile().labels() {
            let label = |key: &str| label(&labels, key).unwrap_or_default();
            entry.1.insert((label("process_name"), label("process_id")));
        }
    }
    println!("{by_service:#?}");
    let (alpha_tags, alpha) = &by_service["alpha"];
    assert_eq!(alpha_tags.get("env").map(String::as_str), Some("test"));
    assert_eq!(alpha.len(), 1, "one process: {alpha:?}");
    assert!(alpha.iter().all(|(name, _)| name == "chain"), "{alpha:?}");
    let (gamma_tags, gamma) = &by_service["gamma"];
    assert_eq!(gamma_tags.get("env").map(String::as_str), Some("staging"));
    assert_eq!(gamma_tags.get("version").map(String::as_str), Some("3.1"));
    // Its `service.instance.id` (a tracer's runtime id) is its runtime-id.
    assert_eq!(
        gamma_tags.get("runtime-id").map(String::as_str),
        Some("i-7")
    );
    assert_ne!(
        alpha_tags.get("runtime-id").map(String::as_str),
        Some("i-7")
    );
    assert!(
        gamma.len() == 1
            && gamma
                .iter()
                .all(|(name, _)| name.starts_with("otel_process")),
        "{gamma:?}"
    );
    let (run_tags, run) = &by_service["host-run"];
    assert_eq!(run_tags.get("env"), None);
    let run_chains: Vec<_> = run.iter().filter(|(name, _)| name == "chain").collect();
    assert_eq!(run_chains.len(), 1, "the chain without a service: {run:?}");
    assert!(!run
        .iter()
        .any(|sample| alpha.contains(sample) || gamma.contains(sample)));
    assert_eq!(by_service.len(), 3, "{:?}", by_service.keys());
    // Each service's uploads name its processes' container: gamma's the
    // cgroup it joined, alpha's the test's own (none outside containers).
    println!("{entities:#?}");
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap();
    let outside = ddprof::container::container_id_in(&own);
    assert_eq!(
        entities["gamma"],
        BTreeSet::from([(Some(cgroup.id.clone()), Some(format!("ci-{}", cgroup.id)))])
    );
    assert_eq!(
        entities["alpha"],
        BTreeSet::from([(outside.clone(), outside.map(|id| format!("ci-{id}")))])
    );
    // Written under each service's name too.
    let files: Vec<String> = ddprof_tests::outputs::pprof_files(&out)
        .iter()
        .map(|path| path.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    for service in ["alpha-", "gamma-", "host-run-"] {
        assert!(
            files.iter().any(|file| file.starts_with(service)),
            "{files:?}"
        );
    }
}

/// With `--global`, on a host running three services in containers of
/// their own (each publishes an OpenTelemetry process context and joins a
/// `docker-<id>.scope` cgroup before its exec), a service that publishes
/// span ids (`libdd-otel-thread-ctx`), and an unrelated program: one
/// profile per service, each under its tags, its uploads with its own
/// container's entity headers and its samples with its `container_id`; the
/// span ids on the traced service's samples; the rest in the run's.
#[test]
fn global_mode_profiles_each_service_under_its_own_container() {
    // Alone: `--global` profiles the other tests' processes too.
    let _machine = cpus_alone();
    const TRACE_REQUESTS: &str = env!("CARGO_BIN_EXE_trace-requests");
    let chain = build_workload("chain.c");
    let publisher = build_workload("otel_process_ctx.c");
    let scratch = Scratch::new("identity-global");
    let out = scratch.0.join("out");
    let intake = Intake::http(Behaviour::Accept);
    let cgroups: Vec<ContainerCgroup> = (0..3)
        .map(|index| {
            ContainerCgroup::new(&format!("global-{index}"))
                .expect("a cgroup hierarchy this test can write (root)")
        })
        .collect();
    let mut workloads: Vec<std::process::Child> = cgroups
        .iter()
        .enumerate()
        .map(|(index, cgroup)| {
            let script = format!(
                "echo $$ > {procs} && exec {publisher} 30 svc-{index} env-{index} 1.{index} i-{index}",
                procs = cgroup.path.join("cgroup.procs").display(),
                publisher = publisher.display()
            );
            Command::new("sh")
                .args(["-c", &script])
                .stdin(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    workloads.push(
        Command::new(TRACE_REQUESTS)
            .args(["otel", "30", "2"])
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // (Killed once the profiler is done.)
    workloads.push(Command::new(&chain).arg("30").spawn().unwrap());
    // The shells have joined their cgroups and exec'd their publishers
    // before the profiler reads `/proc`.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let mut profiler = services_profiler(&intake, &out)
        .args(["--global", "-u", "1"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("ddprof runs");
    // Four seconds from the end of the start-up, in periods of one: the
    // samples taken while the BPF program is verified (1.9 s beside two
    // CPU burners, 0.9 s in CI at 04e6850) are unwound by the perf engine
    // once it is, without the trace context only the program reads, and
    // they are in the first period's profiles. Judged over the whole run,
    // a slow start-up once left 1,124 of the traced service's 2,482
    // samples with span ids.
    let mut lines = Lines::new(profiler.stderr.take().unwrap());
    let started = lines.find("start-up: done", Duration::from_secs(60));
    if started.is_some() {
        std::thread::sleep(Duration::from_secs(4));
    }
    // SAFETY: kill sends a signal to our own child; it touches no memory.
    unsafe { libc::kill(profiler.id() as i32, libc::SIGINT) };
    let status = profiler.wait().unwrap();
    let stderr = lines.rest(Duration::from_secs(60)).join("\n");
    for mut workload in workloads {
        let _ = workload.kill();
        let _ = workload.wait();
    }
    assert!(started.is_some(), "no start-up in a minute: {stderr}");
    assert!(status.success(), "{stderr}");
    assert_eq!(intake.violations(), Vec::<String>::new(), "{stderr}");
    // By service: its tags, its uploads' entity headers, its samples'
    // container ids, and how many of its samples carry a span id.
    #[derive(Debug, Default)]
    struct Seen {
        tags: Tags,
        entities: BTreeSet<Entity>,
        containers: BTreeSet<Option<String>>,
        samples: usize,
        with_span_ids: usize,
        /// Past its first upload: samples in `request_work` (spinning
        /// with its request's context published) and `idle_work` (with
        /// none), and how many of each carry a span id.
        requests: (i64, i64),
        idle: (i64, i64),
    }
    let mut by_service: BTreeMap<String, Seen> = BTreeMap::new();
    for received in intake.received() {
        let tags: Tags = received.tags().into_iter().collect();
        let seen = by_service.entry(tags["service"].clone()).or_default();
        let after_the_first = !seen.entities.is_empty();
        seen.entities.insert(entity(&received));
        seen.tags = tags;
        let profile = received.profile();
        for (labels, (names, values)) in profile.labels().iter().zip(profile.stacks()) {
            let label = |key: &str| label(labels, key);
            seen.containers.insert(label("container_id"));
            seen.samples += 1;
            let with_span_id = label("span id").is_some();
            seen.with_span_ids += usize::from(with_span_id);
            let has = |function: &str| names.iter().any(|name| name.contains(function));
            let part = if has("request_work") {
                &mut seen.requests
            } else if has("idle_work") {
                &mut seen.idle
            } else {
                continue;
            };
            if after_the_first {
                part.0 += values[0];
                part.1 += if with_span_id { values[0] } else { 0 };
            }
        }
    }
    for (service, seen) in &by_service {
        println!(
            "{service}: tags {:?}, entities {:?}, containers {:?}, {} samples, {} with span ids; \
             past the first upload, (samples, with span ids) in requests {:?}, idle {:?}",
            seen.tags,
            seen.entities,
            seen.containers,
            seen.samples,
            seen.with_span_ids,
            seen.requests,
            seen.idle
        );
    }
    for (index, cgroup) in cgroups.iter().enumerate() {
        let seen = &by_service[&format!("svc-{index}")];
        assert_eq!(seen.tags.get("env"), Some(&format!("env-{index}")));
        assert_eq!(seen.tags.get("version"), Some(&format!("1.{index}")));
        assert_eq!(seen.tags.get("runtime-id"), Some(&format!("i-{index}")));
        assert_eq!(
            seen.entities,
            BTreeSet::from([(Some(cgroup.id.clone()), Some(format!("ci-{}", cgroup.id)))]),
            "svc-{index}"
        );
        assert_eq!(
            seen.containers,
            BTreeSet::from([Some(cgroup.id.clone())]),
            "svc-{index}"
        );
    }
    let traced = &by_service["trace-requests"];
    let (requests, with_ids) = traced.requests;
    assert!(
        requests > 100 && with_ids * 10 >= requests * 9,
        "the traced service's samples in requests carry their span ids: {with_ids} of \
         {requests}: {stderr}"
    );
    let (idle, with_ids) = traced.idle;
    assert!(
        idle > 20 && with_ids * 10 <= idle,
        "the traced service's samples between requests carry no span ids: {with_ids} of \
         {idle}: {stderr}"
    );
    assert!(
        by_service.contains_key("host-run"),
        "{:?}",
        by_service.keys()
    );
}

//! The export stage end to end: the real ddprof binary profiles the chain
//! workload and uploads to a stand-in intake (`harness/intake.rs`) over
//! loopback HTTP or a Unix socket, which reads every request as the intake
//! does. The reference test sends libdatadog's own exporter's request for the
//! same profile bytes and tags to the same stand-in and compares the two.
use std::collections::{BTreeSet, HashMap};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ddprof_tests::e2e::Scratch;
use ddprof_tests::intake::{Behaviour, Intake, Received};
use ddprof_tests::workloads::build_workload;

// `Scratch`: each test's scratch directory, also the profiler's working
// directory (it must not write `ddprof-out` there when an agent is set).
fn ddprof(cwd: &Path, url: &str) -> Command {
    let mut command = ddprof_tests::ddprof_command();
    command
        .current_dir(cwd)
        .args(["-l", "notice", "-U", url, "-e", "sCPU freq=999"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    command
}

/// Runs to the end (stderr closes when the detached profiler exits).
fn run(command: &mut Command) -> (std::process::ExitStatus, String) {
    let output = command.output().expect("ddprof runs");
    (
        output.status,
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

fn chain() -> PathBuf {
    build_workload("chain.c")
}

/// The checks every profile of the chain workload passes.
fn assert_chain_profile(received: &Received, stderr: &str) {
    let profile = received.profile();
    let functions = profile.function_names();
    for wanted in [
        "chain_leaf_70",
        "chain_leaf_30",
        "chain_e",
        "chain_a",
        "main",
    ] {
        assert!(
            functions.contains(wanted),
            "{wanted} not in {functions:?}\n{stderr}"
        );
    }
    let labels = profile.labels();
    assert!(!labels.is_empty(), "no samples\n{stderr}");
    for sample_labels in &labels {
        let keys: BTreeSet<&str> = sample_labels.iter().map(|(k, _)| k.as_str()).collect();
        assert!(
            keys.contains("process_id") && keys.contains("thread_name"),
            "{sample_labels:?}"
        );
    }
    assert!(
        labels
            .iter()
            .flatten()
            .any(|(key, value)| key == "thread_name" && value == "chain"),
        "{labels:?}"
    );
}

fn summary_samples(stderr: &str) -> u64 {
    ddprof_tests::outputs::summary_fields(stderr)["samples"]
}

#[test]
fn profiles_reach_an_http_agent_in_the_exporters_wire_format() {
    let intake = Intake::http(Behaviour::Accept);
    let scratch = Scratch::new("http");
    let (status, stderr) = run(ddprof(&scratch.0, &intake.url)
        .args([
            "-S",
            "export-chain",
            "-E",
            "test",
            "-V",
            "1.2.3",
            "-T",
            "team:core,region:eu",
        ])
        .env("DD_EXTERNAL_ENV", "it-false,cn-chain,pu-123")
        .arg("--")
        .arg(chain())
        .arg("2"));
    assert!(status.success(), "{stderr}");
    assert_eq!(intake.violations(), Vec::<String>::new(), "{stderr}");
    let received = intake.received();
    assert_eq!(received.len(), 1, "one period, one profile:\n{stderr}");
    let request = &received[0];
    assert_chain_profile(request, &stderr);

    // Headers.
    assert_eq!(request.header("DD-EVP-ORIGIN"), Some("ddprof"));
    assert_eq!(
        request.header("DD-EVP-ORIGIN-VERSION"),
        Some(env!("CARGO_PKG_VERSION"))
    );
    assert!(request
        .header("User-Agent")
        .is_some_and(|ua| ua.starts_with("ddprof/")));
    assert_eq!(
        request.header("Datadog-External-Env"),
        Some("it-false,cn-chain,pu-123")
    );
    let entity = request.header("Datadog-Entity-ID").unwrap_or_default();
    assert!(
        entity.starts_with("in-") || entity.starts_with("ci-"),
        "{:?}",
        request.headers
    );
    assert_eq!(request.header("DD-API-KEY"), None);

    // Tags.
    let tags: HashMap<String, String> = request.tags().into_iter().collect();
    let expected = [
        ("service", "export-chain"),
        ("env", "test"),
        ("version", "1.2.3"),
        ("team", "core"),
        ("region", "eu"),
        ("language", "native"),
        ("profiler_version", env!("CARGO_PKG_VERSION")),
        // Go's name, as the C++ ddprof sends it.
        (
            "cpu_arch",
            if cfg!(target_arch = "x86_64") {
                "amd64"
            } else {
                "arm64"
            },
        ),
        ("profile_seq", "0"),
        ("include_kernel", "false"),
    ];
    for (key, value) in expected {
        assert_eq!(
            tags.get(key).map(String::as_str),
            Some(value),
            "{key} in {tags:?}"
        );
    }
    assert!(
        tags["runtime_platform"].starts_with("x86_64-unknown-linux-"),
        "{tags:?}"
    );
    // The machine's, not the profiler's single pinned CPU.
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    let cores: usize = online
        .trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((a, b)) => b.parse::<usize>().unwrap() - a.parse::<usize>().unwrap() + 1,
            None => 1,
        })
        .sum();
    assert_eq!(tags["number_of_cpu_cores"], cores.to_string(), "{tags:?}");
    let runtime_id = &tags["runtime-id"];
    assert_eq!(
        runtime_id.split('-').map(str::len).collect::<Vec<_>>(),
        [8, 4, 4, 4, 12],
        "{runtime_id}"
    );
    assert!(
        !tags.contains_key("host"),
        "no host unless the user sets one: {tags:?}"
    );

    // event.json.
    let event = &request.event;
    assert_eq!(
        event["attachments"],
        serde_json::json!(["code-provenance.json", "profile.pprof"])
    );
    assert!(event["endpoint_counts"].is_null());
    assert_eq!(event["process_tags"], format!("entrypoint.name:chain"));
    let internal = &event["internal"];
    assert_eq!(
        internal["samples"].as_u64(),
        Some(summary_samples(&stderr)),
        "{event}"
    );
    assert!(
        internal["profiler_cpu_nanos"].as_u64().unwrap() > 0,
        "{event}"
    );
    assert!(
        internal["profiler_rss_kib"].as_u64().unwrap() > 0,
        "{event}"
    );
    assert_eq!(internal["dropped_profiles"], 0);
    let wall = request.end.duration_since(request.start).unwrap();
    assert!(
        wall > Duration::from_secs(1) && wall < Duration::from_secs(10),
        "{event}"
    );

    // One notice line says where it went; nothing written locally.
    let sent: Vec<&str> = stderr
        .lines()
        .filter(|line| line.contains(&format!("sent to {}", intake.url)))
        .collect();
    assert_eq!(sent.len(), 1, "{stderr}");
    assert!(sent[0].contains("bytes"), "{}", sent[0]);
    assert!(
        !scratch.0.join("ddprof-out").exists(),
        "no local output beside an agent"
    );
}

#[test]
fn profiles_reach_an_agent_on_a_unix_socket_and_a_local_directory_together() {
    let intake = Intake::unix(Behaviour::Accept, "unix");
    let scratch = Scratch::new("unix");
    let local = scratch.0.join("profiles");
    let (status, stderr) = run(ddprof(&scratch.0, &intake.url)
        .args(["--engine", "perf", "--output"])
        .arg(&local)
        .env("DD_PROFILING_RUNTIME_ID", "0e7a4c1d-runtime-id-from-env")
        .env("DD_TAGS", "host:box-1")
        .arg("--")
        .arg(chain())
        .arg("2"));
    assert!(status.success(), "{stderr}");
    assert_eq!(intake.violations(), Vec::<String>::new(), "{stderr}");
    let received = intake.received();
    assert_eq!(received.len(), 1, "{stderr}");
    assert_chain_profile(&received[0], &stderr);
    assert_eq!(received[0].header("Host"), Some("localhost"));
    assert_eq!(
        received[0].tag("runtime-id").as_deref(),
        Some("0e7a4c1d-runtime-id-from-env")
    );
    assert_eq!(received[0].tag("host").as_deref(), Some("box-1"));
    assert_eq!(
        received[0].tag("service").as_deref(),
        Some("chain"),
        "default service: the command"
    );
    assert_eq!(
        ddprof_tests::outputs::pprof_files(&local).len(),
        1,
        "--output keeps working beside an agent:\n{stderr}"
    );
}

#[test]
fn refused_uploads_are_retried_and_every_period_arrives_once_in_order_without_gaps() {
    let intake = Intake::http(Behaviour::RefuseFirst(3));
    let scratch = Scratch::new("refused");
    let (status, stderr) = run(ddprof(&scratch.0, &intake.url)
        .args(["-u", "1", "--"])
        .arg(chain())
        .arg("5"));
    assert!(status.success(), "{stderr}");
    assert_eq!(intake.violations(), Vec::<String>::new(), "{stderr}");
    let received = intake.received();
    assert!(
        received.len() >= 4,
        "{} profiles in 5 s at -u 1:\n{stderr}",
        received.len()
    );
    assert_eq!(
        intake.attempts(),
        received.len() + 3,
        "3 refused, then each once:\n{stderr}"
    );
    for (index, request) in received.iter().enumerate() {
        assert_eq!(
            request.tag("profile_seq"),
            Some(index.to_string()),
            "in order, once each"
        );
        assert_eq!(request.event["internal"]["dropped_profiles"], 0);
    }
    for pair in received.windows(2) {
        assert_eq!(pair[0].end, pair[1].start, "each end is the next start");
    }
    let total: u64 = received
        .iter()
        .map(|r| r.event["internal"]["samples"].as_u64().unwrap())
        .sum();
    assert_eq!(total, summary_samples(&stderr), "every sample arrived once");
    let warnings = stderr.matches("cannot upload profiles to").count();
    assert_eq!(warnings, 1, "one warning per failure streak:\n{stderr}");
    assert!(
        stderr.contains("takes profiles again (after 3 failed attempts)"),
        "{stderr}"
    );
}

#[test]
fn an_agent_down_longer_than_the_bound_loses_the_oldest_and_says_how_many() {
    // Refuses for ~4 s of backoff (0.25 + 0.5 + 1 + 2 s) while a profile
    // comes every second; the queue holds 2.
    let intake = Intake::http(Behaviour::RefuseFirst(5));
    let scratch = Scratch::new("bound");
    let (status, stderr) = run(ddprof(&scratch.0, &intake.url)
        .args(["-u", "1", "--upload-queue-profiles", "2", "--"])
        .arg(chain())
        .arg("7"));
    assert!(status.success(), "{stderr}");
    assert_eq!(intake.violations(), Vec::<String>::new(), "{stderr}");
    let received = intake.received();
    let summary_line = stderr
        .lines()
        .find(|line| line.contains("profiles sent,"))
        .unwrap_or_else(|| panic!("no export summary:\n{stderr}"));
    // `export to URL: S profiles sent, D dropped, U not sent at exit`.
    let counts: Vec<u64> = summary_line
        .rsplit(": ")
        .next()
        .unwrap()
        .split(", ")
        .map(|field| field.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    let number_before = |word: &str| -> u64 {
        match word {
            "sent" => counts[0],
            _ => counts[1],
        }
    };
    let (sent, dropped) = (number_before("sent"), number_before("dropped"));
    assert_eq!(sent as usize, received.len(), "{summary_line}");
    assert!(dropped >= 1, "{summary_line}\n{stderr}");
    // The drops are said in the log, and counted in the profiles that
    // went out next: the sequence numbers' gaps are exactly the drops.
    assert!(
        stderr.contains("dropped the 1 oldest waiting to go out"),
        "{stderr}"
    );
    let reported: u64 = received
        .iter()
        .map(|r| r.event["internal"]["dropped_profiles"].as_u64().unwrap())
        .sum();
    assert_eq!(reported, dropped, "{summary_line}");
    let sequences: Vec<u64> = received
        .iter()
        .map(|r| r.tag("profile_seq").unwrap().parse().unwrap())
        .collect();
    let last = *sequences.last().unwrap();
    assert_eq!(
        last + 1,
        sent + dropped,
        "every period sent or counted: {sequences:?}"
    );
    assert!(
        sequences.windows(2).all(|w| w[0] < w[1]),
        "in order: {sequences:?}"
    );
    // Never more than the bound waiting: the drops happen as soon as a
    // third profile would wait.
    assert!(dropped + 2 >= last, "{sequences:?} dropped {dropped}");
}

#[test]
fn a_closed_port_keeps_at_most_the_bound_waiting_and_counts_the_rest() {
    // A port nothing listens on: every connection is refused.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("http://127.0.0.1:{port}");
    let scratch = Scratch::new("closed");
    // Built before the clock starts.
    let workload = chain();
    ddprof_tests::ddprof_bin();
    let started = Instant::now();
    let (status, stderr) = run(ddprof(&scratch.0, &url)
        .args([
            "-u",
            "1",
            "--upload-queue-profiles",
            "2",
            "--upload-exit-grace",
            "1",
            "--",
        ])
        .arg(&workload)
        .arg("5"));
    let elapsed = started.elapsed();
    assert!(status.success(), "{stderr}");
    let summary_line = stderr
        .lines()
        .find(|line| line.contains("profiles sent,"))
        .unwrap_or_else(|| panic!("no export summary:\n{stderr}"));
    // `export to URL: S profiles sent, D dropped, U not sent at exit`.
    let counts: Vec<u64> = summary_line
        .rsplit(": ")
        .next()
        .unwrap()
        .split(", ")
        .map(|field| field.split_whitespace().next().unwrap().parse().unwrap())
        .collect();
    let (sent, dropped, unsent) = (counts[0], counts[1], counts[2]);
    assert_eq!(sent, 0, "{summary_line}");
    assert!(
        unsent <= 2,
        "never more than the bound waiting: {summary_line}"
    );
    assert!(dropped >= 2, "5 periods, 2 kept: {summary_line}\n{stderr}");
    let profiles = ddprof_tests::outputs::summary_fields(&stderr)["profiles"];
    assert_eq!(sent + dropped + unsent, profiles, "{summary_line}");
    assert_eq!(
        stderr.matches("cannot upload profiles to").count(),
        1,
        "one warning per failure streak:\n{stderr}"
    );
    assert!(
        stderr.contains("Connection refused") || stderr.contains("connection refused"),
        "{stderr}"
    );
    assert!(elapsed < Duration::from_secs(15), "{elapsed:?}");
}

#[test]
fn an_agent_that_never_answers_delays_the_exit_by_at_most_the_grace_period() {
    let intake = Intake::http(Behaviour::NeverAnswer);
    let scratch = Scratch::new("silent");
    // Built before the clock starts.
    let workload = chain();
    ddprof_tests::ddprof_bin();
    let started = Instant::now();
    let mut child = ddprof(&scratch.0, &intake.url)
        .args(["--upload-timeout", "60", "--upload-exit-grace", "2", "--"])
        .arg(&workload)
        .arg("1")
        .spawn()
        .unwrap();
    let mut stderr_pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut text = String::new();
        stderr_pipe.read_to_string(&mut text).unwrap();
        (text, Instant::now())
    });
    let status = child.wait().unwrap();
    let command_exit = started.elapsed();
    let (stderr, closed) = reader.join().unwrap();
    let profiler_exit = closed.duration_since(started);
    assert!(status.success(), "{stderr}");
    // Room for a slow machine's start-up, last symbolization and encoding
    // (here ~0.2 s; over 1 s once on CI); an upload that ignored the grace
    // would hold the exit for its 60 s timeout.
    assert!(
        command_exit < Duration::from_secs(5),
        "the command ran 1 s: {command_exit:?}"
    );
    let delay = profiler_exit.saturating_sub(command_exit);
    assert!(
        delay < Duration::from_secs(2) + Duration::from_secs(4),
        "the profiler exited {delay:?} after the command (grace 2 s, upload timeout 60 s):\n{stderr}"
    );
    assert!(intake.attempts() >= 1, "{stderr}");
    assert!(stderr.contains("1 profile(s) not sent"), "{stderr}");
}

#[test]
fn a_refused_profile_is_said_once_with_the_response_body_and_not_sent_again() {
    let body = "{\"errors\":[\"tags_profiler: invalid tag\"]}";
    let intake = Intake::http(Behaviour::BadRequest(body.into()));
    let scratch = Scratch::new("refused-for-good");
    let (status, stderr) = run(ddprof(&scratch.0, &intake.url)
        .arg("--")
        .arg(chain())
        .arg("1"));
    assert!(status.success(), "{stderr}");
    assert_eq!(intake.attempts(), 1, "a 400 is not retried:\n{stderr}");
    assert_eq!(stderr.matches(body).count(), 1, "{stderr}");
    assert!(stderr.contains("HTTP 400"), "{stderr}");
}

#[test]
fn bad_export_settings_are_errors_at_start_and_the_key_is_never_shown() {
    let key = "abcdef0123456789abcdef0123456789";
    let scratch = Scratch::new("settings");
    // No key: the command runs, unprofiled, and the variable is named.
    let (status, stderr) =
        run(ddprof(&scratch.0, "http://127.0.0.1:1").args(["--agentless", "--", "true"]));
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("running the command without profiling"),
        "{stderr}"
    );
    assert!(stderr.contains("set DD_API_KEY"), "{stderr}");
    // A short key: named, not quoted.
    let (status, stderr) = run(ddprof(&scratch.0, "http://127.0.0.1:1")
        .args(["--agentless", "--", "true"])
        .env("DD_API_KEY", "0123short"));
    assert!(status.success(), "{stderr}");
    assert!(
        stderr.contains("DD_API_KEY: a 9-character value is not an API key"),
        "{stderr}"
    );
    assert!(!stderr.contains("0123short"), "{stderr}");
    // A malformed tag on the command line: a usage error quoting it.
    let (status, stderr) =
        run(ddprof(&scratch.0, "http://127.0.0.1:1").args(["-T", "team:core,oops", "--", "true"]));
    assert_eq!(status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("`oops` is not a key:value tag"), "{stderr}");
    // From DD_TAGS: quoted and named, the command runs.
    let (status, stderr) = run(ddprof(&scratch.0, "http://127.0.0.1:1")
        .args(["--", "true"])
        .env("DD_TAGS", "oops"));
    assert!(status.success(), "{stderr}");
    assert!(stderr.contains("DD_TAGS: invalid value `oops`"), "{stderr}");
    // --print-config never prints the key.
    let output = ddprof_tests::ddprof_command()
        .args(["--agentless", "--print-config", "--", "true"])
        .env("DD_API_KEY", key)
        .output()
        .unwrap();
    let shown = String::from_utf8_lossy(&output.stdout);
    assert!(shown.contains("agentless = true"), "{shown}");
    assert!(!shown.contains(key), "{shown}");
}

/// libdatadog's exporter (`libdd-profiling` 1.0.0, run as the program
/// `tests/reference-exporter`) and ours, for the same
/// profile bytes, times and tags, sent to the same stand-in intake:
/// the same parts, the same event.json keys (and values, except those
/// listed), the same header names.
#[test]
fn the_request_matches_the_one_libdatadogs_exporter_builds() {
    // libdatadog reads it from its own process's environment.
    let external_env = "it-false,cn-chain";
    let ours_intake = Intake::http(Behaviour::Accept);
    let scratch = Scratch::new("reference");
    let (status, stderr) = run(ddprof(&scratch.0, &ours_intake.url)
        .args(["-S", "reference", "-E", "test", "-T", "team:core", "--"])
        .env("DD_EXTERNAL_ENV", external_env)
        .arg(chain())
        .arg("1"));
    assert!(status.success(), "{stderr}");
    let ours = ours_intake.received().pop().expect("our request");

    // The same profile bytes and tags through libdatadog's exporter.
    let theirs_intake = Intake::http(Behaviour::Accept);
    let profile_part = ours
        .parts
        .iter()
        .find(|p| p.name == "profile.pprof")
        .unwrap();
    let profile_file = scratch.0.join("profile.pprof");
    std::fs::write(&profile_file, &profile_part.bytes).unwrap();
    // Our code provenance, given to libdatadog to compress and send as
    // the tracers give it.
    let provenance_file = scratch.0.join("code-provenance.json");
    std::fs::write(
        &provenance_file,
        serde_json::to_vec(
            ours.code_provenance
                .as_ref()
                .expect("ddprof sends code-provenance.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let nanos = |time: std::time::SystemTime| {
        time.duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            .to_string()
    };
    let sent = Command::new(ddprof_tests::workloads::reference_exporter())
        .arg(&theirs_intake.url)
        .args([nanos(ours.start), nanos(ours.end)])
        .arg(&profile_file)
        .arg(&provenance_file)
        .arg(ours.event["internal"].to_string())
        .arg(ours.event["info"].to_string())
        .arg(env!("CARGO_PKG_VERSION"))
        // libdatadog adds its own runtime_platform.
        .args(
            ours.tags()
                .into_iter()
                .filter(|(key, _)| key != "runtime_platform")
                .map(|(key, value)| format!("{key}:{value}")),
        )
        .env("DD_EXTERNAL_ENV", external_env)
        .output()
        .expect("the reference exporter runs");
    assert!(
        sent.status.success(),
        "{}",
        String::from_utf8_lossy(&sent.stderr)
    );
    assert_eq!(theirs_intake.violations(), Vec::<String>::new());
    assert_eq!(String::from_utf8_lossy(&sent.stdout).trim(), "202");
    let theirs = theirs_intake
        .received()
        .pop()
        .expect("libdatadog's request");

    // Print both for the record (headers, event.json).
    for (who, request) in [("ddprof", &ours), ("libdatadog", &theirs)] {
        let mut headers: Vec<_> = request.headers.iter().collect();
        headers.sort();
        println!("=== {who}: POST {}", request.path);
        for (name, value) in headers {
            println!("{name}: {value}");
        }
        for part in &request.parts {
            println!(
                "part name={:?} filename={:?} content-type={:?} bytes={}",
                part.name,
                part.filename,
                part.content_type,
                part.bytes.len()
            );
        }
        println!(
            "event.json: {}",
            serde_json::to_string_pretty(&request.event).unwrap()
        );
    }

    // Parts: same names, file names, content types, and the same profile.
    let describe = |r: &Received| -> Vec<(String, Option<String>, Option<String>)> {
        r.parts
            .iter()
            .map(|p| (p.name.clone(), p.filename.clone(), p.content_type.clone()))
            .collect()
    };
    assert_eq!(describe(&ours), describe(&theirs));
    assert_eq!(ours.pprof, theirs.pprof);
    assert_eq!(ours.code_provenance, theirs.code_provenance);

    // event.json: the same keys; ours adds `process_tags` (newer exporters
    // send it; libdatadog 1.0.0 does not).
    let keys = |r: &Received| -> BTreeSet<String> {
        r.event.as_object().unwrap().keys().cloned().collect()
    };
    let mut expected_keys = keys(&theirs);
    expected_keys.insert("process_tags".into());
    assert_eq!(keys(&ours), expected_keys);
    for key in [
        "attachments",
        "start",
        "end",
        "family",
        "version",
        "endpoint_counts",
        "info",
    ] {
        assert_eq!(ours.event[key], theirs.event[key], "{key}");
    }
    // Values that differ by design: the tag order (libdatadog puts
    // runtime_platform last) and `internal.libdatadog_version`.
    let tag_set = |r: &Received| -> BTreeSet<(String, String)> { r.tags().into_iter().collect() };
    assert_eq!(tag_set(&ours), tag_set(&theirs));
    let mut their_internal = theirs.event["internal"].clone();
    their_internal
        .as_object_mut()
        .unwrap()
        .remove("libdatadog_version");
    assert_eq!(ours.event["internal"], their_internal);

    // Headers: the same names, except by design: the body's framing
    // (ours `Content-Length`, libdatadog's form is streamed `chunked`),
    // reqwest's `Accept: */*`, and the entity headers (libdatadog describes
    // its own process and here sent none; ddprof describes the profiled
    // command: `Datadog-Entity-ID: in-<cgroup inode>`). Values that differ
    // by design: User-Agent (`ddprof/<ours>` vs `DDProf/<libdatadog>`),
    // the multipart boundary, Host (two stand-ins).
    let by_design = [
        "accept",
        "content-length",
        "transfer-encoding",
        "datadog-entity-id",
        "datadog-container-id",
    ];
    let names = |r: &Received| -> BTreeSet<String> {
        r.headers
            .keys()
            .filter(|name| !by_design.contains(&name.as_str()))
            .cloned()
            .collect()
    };
    assert_eq!(names(&ours), names(&theirs));
    for same in [
        "dd-evp-origin",
        "dd-evp-origin-version",
        "datadog-external-env",
        "connection",
    ] {
        assert_eq!(ours.header(same), theirs.header(same), "{same}");
    }
}

#[test]
fn a_profiler_stopped_by_sigterm_uploads_its_last_period_before_exiting() {
    let intake = Intake::http(Behaviour::Accept);
    let scratch = Scratch::new("sigterm");
    ddprof_tests::ddprof_bin();
    let workload = std::process::Command::new(chain())
        .arg("30")
        .stdin(Stdio::null())
        .spawn()
        .unwrap();
    let mut workload = ddprof_tests::guards::KillOnDrop(workload);
    let profiler = ddprof(&scratch.0, &intake.url)
        .args(["-u", "1", "-p"])
        .arg(workload.0.id().to_string())
        .spawn()
        .unwrap();
    let mut profiler = ddprof_tests::guards::KillOnDrop(profiler);
    // Two whole periods, then a stop in the middle of the third.
    if !intake.wait_for(Duration::from_secs(20), |received| received.len() >= 2) {
        profiler.stop();
        let mut stderr = String::new();
        let _ = profiler
            .0
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr);
        panic!("two periods not uploaded in 20 s:\n{stderr}");
    }
    std::thread::sleep(Duration::from_millis(500));
    let stopped = Instant::now();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(profiler.0.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let status = profiler.0.wait().unwrap();
    let mut stderr = String::new();
    profiler
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(status.success(), "{status:?}\n{stderr}");
    assert!(stopped.elapsed() < Duration::from_secs(5), "{stderr}");
    workload.stop();
    assert_eq!(intake.violations(), Vec::<String>::new(), "{stderr}");
    let received = intake.received();
    assert!(
        received.len() >= 3,
        "{} profiles:\n{stderr}",
        received.len()
    );
    for pair in received.windows(2) {
        assert_eq!(pair[0].end, pair[1].start, "contiguous periods");
    }
    // The last one is the part-period the stop cut short.
    let last = received.last().unwrap();
    let last_length = last.end.duration_since(last.start).unwrap();
    assert!(last_length < Duration::from_millis(1500), "{last_length:?}");
    assert_eq!(
        received
            .iter()
            .map(|r| r.event["internal"]["samples"].as_u64().unwrap())
            .sum::<u64>(),
        summary_samples(&stderr),
        "{stderr}"
    );
    assert_chain_profile(&received[0], &stderr);
}

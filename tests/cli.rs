//! The real binary's command line, config file and environment: what is a
//! usage error (typed on the command line), what only turns profiling off
//! (the environment and the config file: the command still runs), where
//! each setting comes from, and the output directory's checks.
use std::path::{Path, PathBuf};
use std::process::Command;

use ddprof_tests::ddprof_bin;
use ddprof_tests::outputs::pprof_files;
use ddprof_tests::{run_without_input as run, text};

/// CPU for the profiler to sample (about a second of shell arithmetic),
/// then a line on stderr that says the command has finished.
const BUSY_THEN_FINISHED: &str =
    "i=0; while [ $i -lt 400000 ]; do i=$((i+1)); done; echo finished >&2";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("ddprof-cli-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn ddprof() -> Command {
    ddprof_tests::ddprof_command_with_scratch_output("cli")
}

/// ddprof's warning lines but the accounting's (samples lost or never
/// taken, which a busy machine may add to any run): what the settings and
/// the outputs warned of.
fn settings_warnings(stderr: &str) -> Vec<&str> {
    stderr
        .lines()
        .filter(|line| line.contains("warning:"))
        .filter(|line| {
            ![
                "samples' worth",
                " samples were ",
                "records could not be read",
            ]
            .iter()
            .any(|accounting| line.contains(accounting))
        })
        .collect()
}

fn max_sample_rate() -> u64 {
    std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

#[test]
fn unknown_options_before_the_command_are_usage_errors() {
    let output = run(ddprof().args(["--foo", "--", "sh", "-c", "echo ran"]));
    assert_eq!(output.status.code(), Some(2));
    assert_eq!(text(&output.stdout), "", "the command must not run");
    let stderr = text(&output.stderr);
    assert!(stderr.contains("unexpected argument '--foo'"), "{stderr}");

    // After the command, or after `--`, options are the command's own.
    let output = run(ddprof().args(["echo", "-l", "--foo", "-p", "1"]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "-l --foo -p 1\n");
    let output = run(ddprof().args(["--", "echo", "--foo"]));
    assert_eq!(text(&output.stdout), "--foo\n");
}

#[test]
fn environment_and_config_file_errors_run_the_command_unprofiled() {
    let dir = scratch("unprofiled");
    let bad_value = dir.join("bad-value.toml");
    std::fs::write(&bad_value, "upload_period = \"weekly\"\n").unwrap();
    let not_toml = dir.join("not-toml.toml");
    std::fs::write(&not_toml, "service = checkout\n").unwrap();
    let above_max = format!("sCPU freq={}", max_sample_rate() + 1);
    // (variables, flags, what the warning must say)
    type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<&'a str>, String);
    let cases: Vec<Case> = vec![
        (
            vec![("DD_PROFILING_UPLOAD_PERIOD", "soon")],
            vec![],
            "DD_PROFILING_UPLOAD_PERIOD: invalid value `soon`: expected a number of seconds from 1 to 3600"
                .into(),
        ),
        (
            vec![("DD_TAGS", "notakeyvalue")],
            vec![],
            "DD_TAGS: invalid value `notakeyvalue`: `notakeyvalue` is not a key:value tag".into(),
        ),
        (
            vec![("DD_TRACE_AGENT_URL", "not a url")],
            vec![],
            "DD_TRACE_AGENT_URL: invalid value `not a url`: `not a url` is not an agent URL".into(),
        ),
        (
            vec![("DD_PROFILING_NATIVE_EVENTS", &above_max)],
            vec![],
            format!(
                "is above kernel.perf_event_max_sample_rate ({} on this machine)",
                max_sample_rate()
            ),
        ),
        (
            vec![],
            vec!["--config", bad_value.to_str().unwrap()],
            format!(
                "config file {}: `upload_period`: invalid value `weekly`: expected a number of seconds",
                bad_value.display()
            ),
        ),
        (
            vec![("DD_PROFILING_CONFIG", not_toml.to_str().unwrap())],
            vec![],
            format!("config file {} is not valid TOML: line 1, column", not_toml.display()),
        ),
        (
            vec![],
            vec!["--config", "/nonexistent/ddprof.toml"],
            "cannot read the config file /nonexistent/ddprof.toml".into(),
        ),
    ];
    for (environment, flags, expected) in cases {
        let output = run(ddprof()
            .envs(environment.iter().copied())
            .args(&flags)
            .args(["--log-level", "notice", "sh", "-c", "echo ran; exit 7"]));
        let stderr = text(&output.stderr);
        assert_eq!(
            output.status.code(),
            Some(7),
            "{environment:?} {flags:?}: {stderr}"
        );
        assert_eq!(text(&output.stdout), "ran\n");
        // One line, even at the notice level: no profiler started.
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("warning: running the command without profiling: "),
            "{stderr}"
        );
        assert!(
            stderr.contains(&expected),
            "expected `{expected}` in {stderr}"
        );
    }
    std::fs::remove_dir_all(dir).unwrap();
}

/// The command lines and environments of Datadog's C++ ddprof README and
/// docs, unchanged: each runs the command and profiles its CPU time and its
/// allocations (the live heap for `cpu_live_heap`, as the C++ ddprof's
/// `sALLOC mode=l`), with no warning.
#[test]
fn the_cpp_ddprofs_own_examples_profile_cpu_time_and_allocations() {
    // (variables, flags before the command)
    type Case<'a> = (Vec<(&'a str, &'a str)>, Vec<&'a str>);
    let cases: Vec<Case> = vec![
        (
            vec![],
            vec![
                "-S",
                "svc",
                "--preset",
                "cpu_live_heap",
                "-l",
                "warn",
                "--worker-period",
                "15000",
            ],
        ),
        (vec![("DD_PROFILING_NATIVE_EVENTS", "sCPU;sALLOC")], vec![]),
        (
            vec![("DD_PROFILING_NATIVE_PRESET", "default")],
            vec!["--upload_period", "10"],
        ),
    ];
    for (index, (environment, flags)) in cases.into_iter().enumerate() {
        let out = scratch(&format!("cpp-example-{index}"));
        let output = run(ddprof_tests::ddprof_command()
            .envs(environment.iter().copied())
            .arg("--output")
            .arg(&out)
            .args(&flags)
            .args(["sh", "-c", BUSY_THEN_FINISHED]));
        let stderr = text(&output.stderr);
        assert!(
            output.status.success(),
            "{environment:?} {flags:?}: {stderr}"
        );
        assert!(stderr.contains("finished"), "{stderr}");
        let warnings = settings_warnings(&stderr);
        assert!(warnings.is_empty(), "{environment:?} {flags:?}: {stderr}");
        let files = pprof_files(&out);
        assert!(
            !files.is_empty(),
            "{environment:?} {flags:?}: no profile written\n{stderr}"
        );
        let types: Vec<String> = ddprof_tests::pprof::Profile::read_gzipped(&files[0])
            .unwrap()
            .sample_types()
            .into_iter()
            .map(|(kind, _)| kind)
            .collect();
        let allocations = if index == 0 {
            ["inuse-objects", "inuse-space"]
        } else {
            ["alloc-samples", "alloc-space"]
        };
        assert_eq!(
            types,
            ["cpu-samples", "cpu-time", allocations[0], allocations[1]],
            "{environment:?} {flags:?}"
        );
        let _ = std::fs::remove_dir_all(out);
    }
}

/// The C++ ddprof's `--show_config` prints the settings and profiles; the
/// print-and-exit of before is `--print-config` (which never runs the
/// command). Without anything to profile, `--show-config` prints and exits.
#[test]
fn show_config_prints_the_settings_then_profiles_the_command() {
    let out = scratch("show-config-continues");
    let output = run(ddprof_tests::ddprof_command()
        .args(["--show_config", "-S", "shown-svc", "--output"])
        .arg(&out)
        .args(["--", "sh", "-c"])
        .arg(format!("{BUSY_THEN_FINISHED}; echo on-stdout")));
    let (stdout, stderr) = (text(&output.stdout), text(&output.stderr));
    assert!(output.status.success(), "{stderr}");
    // The command's stdout is its own; the settings go to stderr, first.
    assert_eq!(stdout, "on-stdout\n", "{stderr}");
    let service = stderr
        .find("service = \"shown-svc\"")
        .unwrap_or_else(|| panic!("no settings on stderr:\n{stderr}"));
    let finished = stderr.find("finished").expect("the command ran");
    assert!(service < finished, "{stderr}");
    assert!(
        !pprof_files(&out).is_empty(),
        "no profile written:\n{stderr}"
    );
    let _ = std::fs::remove_dir_all(&out);

    let printed = run(ddprof().args(["--print-config", "-S", "x", "--", "sh", "-c", "echo ran"]));
    assert!(printed.status.success(), "{}", text(&printed.stderr));
    let printed_stdout = text(&printed.stdout);
    assert!(
        printed_stdout.contains("service = \"x\""),
        "{printed_stdout}"
    );
    assert!(
        !printed_stdout.lines().any(|line| line == "ran"),
        "the command must not run: {printed_stdout}"
    );

    let alone = run(ddprof().args(["--show-config", "-S", "y"]));
    assert!(alone.status.success(), "{}", text(&alone.stderr));
    assert!(text(&alone.stdout).contains("service = \"y\""));
}

/// As the C++ ddprof, `./ddprof.toml` is read when no file is named, but
/// only a file nobody else controls: one that another user planted in a
/// shared working directory is left out with one warning, and the command
/// is profiled with the other settings.
#[test]
fn a_ddprof_toml_in_the_working_directory_is_read_unless_another_user_owns_it() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch("default-config");
    let file = dir.join("ddprof.toml");
    std::fs::write(
        &file,
        "service = \"from-default-file\"\nupload_period = 7\n",
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let print = |dir: &Path, extra: &[&str]| {
        let output = run(ddprof_tests::ddprof_command()
            .current_dir(dir)
            .arg("--print-config")
            .args(extra));
        assert!(output.status.success(), "{}", text(&output.stderr));
        (text(&output.stdout), text(&output.stderr))
    };
    let (shown, _) = print(&dir, &[]);
    assert!(
        shown.contains("# config file: ./ddprof.toml (default)")
            && shown.contains("service = \"from-default-file\"  # from ./ddprof.toml (service)")
            && shown.contains("upload_period = 7"),
        "{shown}"
    );
    // A file named instead: ./ddprof.toml is not read.
    let named = dir.join("named.toml");
    std::fs::write(&named, "environment = \"named\"\n").unwrap();
    let (shown, _) = print(&dir, &["--config", named.to_str().unwrap()]);
    assert!(!shown.contains("from-default-file"), "{shown}");
    assert!(shown.contains("environment = \"named\""), "{shown}");

    if nix::unistd::geteuid().is_root() {
        std::os::unix::fs::chown(&file, Some(65534), None).unwrap();
        let (shown, stderr) = print(&dir, &[]);
        assert!(!shown.contains("from-default-file"), "{shown}");
        assert!(shown.contains("# config file: none"), "{shown}");
        assert!(
            stderr.contains(
                "warning: ./ddprof.toml left out: it belongs to uid 65534, neither root nor \
                 this user (uid 0); name it with --config to read it anyway"
            ),
            "{stderr}"
        );
        // And the command runs, profiled, with the other settings.
        let out = dir.join("out");
        let output = run(ddprof_tests::ddprof_command()
            .current_dir(&dir)
            .arg("--output")
            .arg(&out)
            .args(["sh", "-c", BUSY_THEN_FINISHED]));
        let stderr = text(&output.stderr);
        assert!(output.status.success(), "{stderr}");
        assert!(stderr.contains("finished"), "{stderr}");
        assert!(!pprof_files(&out).is_empty(), "no profile:\n{stderr}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The C++ ddprof's options without a meaning here start the command, each
/// said to be ignored in one line; `--no-timeline` turns the timeline off;
/// those it would be wrong to drop are refused with what to do instead.
#[test]
fn the_cpp_ddprofs_other_options_start_the_command_or_say_what_to_do() {
    let out = scratch("cpp-options");
    let ignored = [
        ("--fault_info", Some("1")),
        ("--cpu_affinity", Some("0xa4")),
        ("--maximum_pids", Some("8")),
        ("--no-reorder-events", None),
        ("--disable_symbolization", None),
    ];
    let mut command = ddprof_tests::ddprof_command();
    command.arg("--output").arg(&out).arg("--no-timeline");
    for (option, value) in ignored {
        command.arg(option).args(value);
    }
    let output = run(command.args(["sh", "-c", BUSY_THEN_FINISHED]));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(stderr.contains("finished"), "{stderr}");
    let warnings = settings_warnings(&stderr);
    assert_eq!(warnings.len(), ignored.len(), "{stderr}");
    for (option, value) in ignored {
        let shown = format!("ignored: {}", option.replace('_', "-"));
        let shown = match value {
            Some(value) => format!("{shown} {value}, an option of the C++ ddprof ("),
            None => format!("{shown}, an option of the C++ ddprof ("),
        };
        assert!(
            warnings.iter().any(|warning| warning.contains(&shown)),
            "{shown}: {stderr}"
        );
    }
    assert!(!pprof_files(&out).is_empty(), "no profile:\n{stderr}");
    let printed = run(ddprof().args(["--no_timeline", "--print-config"]));
    assert!(
        text(&printed.stdout).contains("timeline = false  # from --timeline"),
        "{}",
        text(&printed.stdout)
    );
    for (option, what_to_do) in [
        ("--api_key", "give the key in DD_API_KEY"),
        ("--runtime_id", "DD_PROFILING_RUNTIME_ID"),
        ("--capture_config", "--print-config"),
    ] {
        let output = run(ddprof().args([option, "x", "--", "sh", "-c", "echo ran"]));
        assert_eq!(output.status.code(), Some(2), "{option}");
        assert_eq!(
            text(&output.stdout),
            "",
            "{option}: the command must not run"
        );
        assert!(
            text(&output.stderr).contains(what_to_do),
            "{}",
            text(&output.stderr)
        );
    }
    let _ = std::fs::remove_dir_all(&out);
}

#[test]
fn bad_values_typed_on_the_command_line_are_usage_errors_quoting_them() {
    let max = max_sample_rate();
    let above_max = format!("sCPU freq={}", max + 1);
    for (args, expected) in [
        (
            ["-T", "notakeyvalue"],
            "`notakeyvalue` is not a key:value tag".to_string(),
        ),
        (
            ["-U", "not a url"],
            "`not a url` is not an agent URL (expected http://HOST:PORT".to_string(),
        ),
        (
            ["--internal-stats", "localhost"],
            "`localhost`: expected unix:///PATH, /PATH, udp://HOST:PORT or HOST:PORT".to_string(),
        ),
        (
            ["-e", above_max.as_str()],
            format!(
                "freq={} is above kernel.perf_event_max_sample_rate ({max} on this machine)",
                max + 1
            ),
        ),
    ] {
        let output = run(ddprof().args(args).args(["sh", "-c", "echo ran"]));
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
        assert_eq!(text(&output.stdout), "", "the command must not run");
        assert!(stderr.contains(&expected), "{args:?}: {stderr}");
    }
    // Valid values pass.
    let output = run(ddprof().args([
        "-T",
        "team:core,region:eu",
        "-U",
        "unix:///var/run/datadog/apm.socket",
        "--show-config",
    ]));
    assert!(output.status.success(), "{}", text(&output.stderr));
}

#[test]
fn an_unknown_switch_user_never_runs_the_command() {
    let config = scratch("switch-user").join("broken.toml");
    std::fs::write(&config, "switch_user = nobody\n").unwrap();
    let mut typed = ddprof();
    typed.args(["--switch-user", "no-such-user-ddprof"]);
    let mut from_environment = ddprof();
    from_environment.env("DD_PROFILING_SWITCH_USER", "no-such-user-ddprof");
    let mut from_broken_file = ddprof();
    from_broken_file.arg("--config").arg(&config);
    let runs = [
        // Typed: a usage error.
        (typed, 2),
        // From the environment: as the caller it would have more rights
        // than asked, so it does not run either.
        (from_environment, 1),
        // A config file that cannot be parsed and may set the user.
        (from_broken_file, 1),
    ];
    for (mut command, status) in runs {
        let output = run(command.args(["sh", "-c", "echo ran"]));
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(status), "{stderr}");
        assert_eq!(text(&output.stdout), "", "the command must not run");
        if status == 1 {
            assert_eq!(stderr.lines().count(), 1, "{stderr}");
            assert!(
                stderr.contains(
                    "the command does not run (it must not run with more privileges than asked)"
                ),
                "{stderr}"
            );
        }
        assert!(
            stderr.contains("no user `no-such-user-ddprof`") || stderr.contains("switch_user"),
            "{stderr}"
        );
    }
    std::fs::remove_dir_all(config.parent().unwrap()).unwrap();
}

/// The value and the origin comment of `key` in `--show-config`'s output.
fn shown<'a>(text: &'a str, table: &'a toml::Table, key: &str) -> (&'a toml::Value, &'a str) {
    let line = text
        .lines()
        .find(|line| line.starts_with(&format!("{key} = ")))
        .unwrap_or_else(|| panic!("no `{key}` in\n{text}"));
    let origin = line
        .rsplit_once("  # ")
        .map(|(_, origin)| origin)
        .unwrap_or("");
    (&table[key], origin)
}

#[test]
fn show_config_is_toml_with_flag_over_file_over_environment() {
    let config = scratch("show-config").join("ddprof.toml");
    std::fs::write(
        &config,
        "service = \"from-file\"\nenvironment = \"file-env\"\nupload_period = 10\ntags = \"a:b\"\n",
    )
    .unwrap();
    let output = run(ddprof()
        .arg("--config")
        .arg(&config)
        .env("DD_ENV", "from-env")
        .env("DD_TAGS", "c:d")
        .env("DD_VERSION", "1.0")
        .args(["--tags", "e:f", "--print-config", "true"]));
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stdout = text(&output.stdout);
    let table: toml::Table = stdout
        .parse()
        .unwrap_or_else(|error| panic!("not TOML: {error}\n{stdout}"));
    let from_file = format!("from {}", config.display());
    let (value, origin) = shown(&stdout, &table, "tags");
    assert_eq!(
        (value.as_str(), origin),
        (Some("e:f"), "from --tags"),
        "flag over all"
    );
    let (value, origin) = shown(&stdout, &table, "environment");
    assert_eq!(value.as_str(), Some("file-env"), "file over environment");
    assert_eq!(origin, format!("{from_file} (environment)"));
    let (value, origin) = shown(&stdout, &table, "upload_period");
    assert_eq!(value.as_integer(), Some(10));
    assert_eq!(origin, format!("{from_file} (upload_period)"));
    let (value, origin) = shown(&stdout, &table, "service_version");
    assert_eq!((value.as_str(), origin), (Some("1.0"), "from DD_VERSION"));
    let (value, origin) = shown(&stdout, &table, "stack_sample_size");
    assert_eq!((value.as_integer(), origin), (Some(32000), "default"));
    let (value, origin) = shown(&stdout, &table, "output");
    assert_eq!(origin, "from DD_PROFILING_OUTPUT_DIR");
    assert!(value.as_str().unwrap().contains("ddprof-cli-"), "{value}");
    std::fs::remove_dir_all(config.parent().unwrap()).unwrap();
}

/// `ddprof ARGS` in a private mount namespace, after `setup` (shell) has
/// mounted what the test needs there: nothing leaks out of the test.
fn in_private_mounts(setup: &str, args: &[&str]) -> Command {
    let mut command = Command::new("unshare");
    command
        .args(["--mount", "--propagation", "private", "sh", "-c"])
        .arg(format!("{setup} && exec \"$0\" \"$@\""))
        .arg(ddprof_bin())
        .args(args);
    for (key, _) in std::env::vars_os() {
        if key.to_string_lossy().starts_with("DD_") {
            command.env_remove(key);
        }
    }
    command
}

#[test]
fn an_unwritable_output_directory_is_found_at_start_and_the_profile_kept() {
    let dir = scratch("read-only");
    let read_only = dir.join("ro");
    let fallback_parent = dir.join("tmp");
    std::fs::create_dir_all(&read_only).unwrap();
    std::fs::create_dir_all(&fallback_parent).unwrap();
    let output = run(in_private_mounts(
        &format!(
            "mount -t tmpfs -o ro,size=64k ddprof-test {}",
            read_only.display()
        ),
        &[
            "--output",
            read_only.join("out").to_str().unwrap(),
            "--",
            "sh",
            "-c",
            BUSY_THEN_FINISHED,
        ],
    )
    .env("TMPDIR", &fallback_parent));
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    let warnings = settings_warnings(&stderr);
    assert_eq!(warnings.len(), 1, "{stderr}");
    let warning = warnings[0];
    assert!(
        warning.contains(&format!(
            "cannot write in {}/out: Read-only file system",
            read_only.display()
        )),
        "{warning}"
    );
    // Said at start, while the command still ran.
    let lines: Vec<&str> = stderr.lines().collect();
    let position = |needle: &str| lines.iter().position(|line| line.contains(needle));
    assert!(position("warning:") < position("finished"), "{stderr}");
    let fallback = Path::new(
        warning
            .rsplit_once("the outputs go to ")
            .and_then(|(_, rest)| rest.strip_suffix(" instead"))
            .unwrap_or_else(|| panic!("no fallback named in {warning}")),
    );
    assert!(fallback.starts_with(&fallback_parent), "{warning}");
    assert_eq!(
        pprof_files(fallback).len(),
        1,
        "{:?}",
        std::fs::read_dir(fallback)
    );
    assert!(fallback.join("flamegraph.svg").is_file());
    assert!(fallback.join("stacks.folded").is_file());
    std::fs::remove_dir_all(dir).unwrap();
}

#[test]
fn on_a_full_disk_the_error_names_every_file() {
    let dir = scratch("full");
    let full = dir.join("full");
    let full_tmp = dir.join("tmp");
    std::fs::create_dir_all(&full).unwrap();
    std::fs::create_dir_all(&full_tmp).unwrap();
    // Two tiny file systems, filled up: the output directory and the fallback.
    let setup = [&full, &full_tmp]
        .iter()
        .map(|mount| {
            format!(
                "mount -t tmpfs -o size=64k ddprof-test {0} && \
                 {{ dd if=/dev/zero of={0}/fill bs=4k 2>/dev/null; true; }}",
                mount.display()
            )
        })
        .collect::<Vec<_>>()
        .join(" && ");
    let output = run(in_private_mounts(
        &setup,
        &[
            "--output",
            full.join("out").to_str().unwrap(),
            "--",
            "sh",
            "-c",
            BUSY_THEN_FINISHED,
        ],
    )
    .env("TMPDIR", &full_tmp));
    let stderr = text(&output.stderr);
    assert!(
        output.status.success(),
        "the command is unaffected: {stderr}"
    );
    let error = stderr
        .lines()
        .find(|line| line.contains("could not write"))
        .unwrap_or_else(|| panic!("no error naming the files in {stderr}"));
    for file in ["stacks.folded", "flamegraph.svg", ".pprof"] {
        assert!(error.contains(file), "{file} not named: {error}");
    }
    assert!(error.contains("No space left on device"), "{error}");
    // The start-up check said it first, before the command finished.
    let lines: Vec<&str> = stderr.lines().collect();
    let position = |needle: &str| lines.iter().position(|line| line.contains(needle));
    assert!(
        position("cannot write in") < position("finished"),
        "{stderr}"
    );
    std::fs::remove_dir_all(dir).unwrap();
}

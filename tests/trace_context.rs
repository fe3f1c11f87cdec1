//! Whose request a sample is: the span ids a thread publishes while it
//! serves a request, read by the BPF program at each sample from the
//! thread's TLS, on the sample as Datadog's backend links them to traces
//! (`span id`, `local root span id`, numbers) with the other attributes
//! the publisher names. The publishers are the real crates tracers use:
//! `libdd-otel-thread-ctx` (OTEP 4947, its keys named by an OTEP 4719
//! process context) and Polar Signals' `custom-labels`; and a library of
//! ours that defines the OTEP's TLS pointer itself, reached through a TLS
//! descriptor, loaded at start (static TLS) or `dlopen`ed (its TLS found
//! through each thread's DTV); and Go's pprof labels, set as dd-trace-go
//! sets them, read from the running goroutine.
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ddprof_tests::e2e::Scratch;
use ddprof_tests::pprof::label;
use ddprof_tests::workloads::{build_go_workload, build_workload};

const TRACE_REQUESTS: &str = env!("CARGO_BIN_EXE_trace-requests");

/// Samples (by their count) of the request and idle functions, and how
/// many of each carry the labels they must.
#[derive(Debug, Default)]
struct Tally {
    in_requests: i64,
    in_requests_labelled: i64,
    idle: i64,
    idle_unlabelled: i64,
}

/// Profiles `command` (a server of `trace-requests`' kind) with the BPF
/// engine and checks each sample's labels with
/// `request_labels_are_right(labels, thread id, span id)`, and that the
/// log names the publisher in a line with `publisher_line`; the tally and
/// the log.
fn profile_requests(
    abi: &str,
    command: &[&str],
    publisher_line: &str,
    request_labels_are_right: impl Fn(&dyn Fn(&str) -> Option<String>, u64, u64) -> bool,
) -> (Tally, String) {
    let scratch = Scratch::new(&format!("trace-context-{abi}"));
    let (profile, stderr) = profile_with_bpf(&scratch, command);
    let mut tally = Tally::default();
    for ((names, values), labels) in profile.stacks().into_iter().zip(profile.labels()) {
        let label = |key: &str| label(&labels, key);
        let count = values[0];
        let span = label("span id").and_then(|span| span.parse::<u64>().ok());
        if names.iter().any(|name| name.contains("request_work")) {
            tally.in_requests += count;
            let thread: u64 = label("thread id").unwrap().parse().unwrap();
            if span.is_some_and(|span| request_labels_are_right(&label, thread, span)) {
                tally.in_requests_labelled += count;
            }
        } else if names.iter().any(|name| name.contains("idle_work")) {
            tally.idle += count;
            if span.is_none() && label("local root span id").is_none() {
                tally.idle_unlabelled += count;
            }
        }
    }
    println!("{abi}: {tally:?}");
    assert!(
        tally.in_requests >= 800 && tally.idle >= 200,
        "too few samples to judge: {tally:?}: {stderr}"
    );
    assert!(
        tally.in_requests_labelled * 100 >= tally.in_requests * 95,
        "samples of requests that carry their own request's ids: {tally:?}: {stderr}"
    );
    assert!(
        tally.idle_unlabelled * 100 >= tally.idle * 95,
        "samples between requests that carry no ids: {tally:?}: {stderr}"
    );
    assert!(
        stderr
            .lines()
            .any(|line| line.contains("trace context: process") && line.contains(publisher_line)),
        "the publisher is named at start ({publisher_line}): {stderr}"
    );
    (tally, stderr)
}

/// Runs `command` under ddprof (BPF engine, 999 Hz, `info` log) with its
/// output in `scratch`; its one profile and its log.
fn profile_with_bpf(scratch: &Scratch, command: &[&str]) -> (ddprof_tests::pprof::Profile, String) {
    let out = scratch.0.join("out");
    let output = ddprof_tests::ddprof_command()
        .args(["-l", "info", "--engine", "bpf", "-e", "sCPU freq=999"])
        .arg("--output")
        .arg(&out)
        .arg("--")
        .args(command)
        .stdin(Stdio::null())
        .output()
        .expect("ddprof runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    (ddprof_tests::outputs::only_pprof(&out, &stderr), stderr)
}

/// A request's span id names its thread and request (`tid << 24 | k`),
/// its local root span id is the span id with bit 62 set.
fn ids_are_the_requests(label: &dyn Fn(&str) -> Option<String>, thread: u64, span: u64) -> bool {
    span >> 24 == thread
        && label("local root span id").and_then(|root| root.parse::<u64>().ok())
            == Some(span | 1 << 62)
}

#[test]
fn otel_thread_contexts_give_each_requests_samples_its_span_ids() {
    profile_requests(
        "otel",
        &[TRACE_REQUESTS, "otel", "4", "3"],
        "publishes otel_thread_ctx_v1",
        |label, thread, span| {
            // `http.route` is key 1 of the process context's key map.
            ids_are_the_requests(label, thread, span)
                && label("http.route") == Some(format!("/thread/{thread}"))
        },
    );
}

#[test]
fn custom_labels_give_each_requests_samples_its_labels() {
    profile_requests(
        "labels",
        &[TRACE_REQUESTS, "labels", "4", "3"],
        "publishes custom_labels_current_set",
        |label, thread, span| {
            ids_are_the_requests(label, thread, span)
                && label("customer").as_deref() == Some("acme")
        },
    );
}

/// How a publishing library gets into `trace_ctx_library`'s process.
enum Loaded {
    /// `LD_PRELOAD`: at start, in the static TLS block.
    AtStart,
    /// `dlopen`ed 300 ms in, its block too big for the static reserve.
    Dlopened,
}

/// Serves requests with `server` (a build of `trace_ctx_library.c`, or of
/// a program that links the publisher in: `library` `None`), publishing
/// through `library` loaded as `loaded`; each request's samples must carry
/// its ids, and ddprof must name where it found the variable
/// (`publisher_line`).
fn library_publishes(
    name: &str,
    server: &str,
    library: Option<(&str, Loaded)>,
    publisher_line: &str,
) {
    let server = build_workload(server);
    let server = server.to_str().unwrap();
    let (command, preload): (Vec<String>, Option<String>) = match library {
        None => (vec![server.into(), "preloaded".into(), "-".into()], None),
        Some((library, loaded)) => {
            let library = build_workload(library).display().to_string();
            match loaded {
                Loaded::AtStart => (
                    vec![server.into(), "preloaded".into(), library.clone()],
                    Some(format!("LD_PRELOAD={library}")),
                ),
                Loaded::Dlopened => (vec![server.into(), "dlopen".into(), library], None),
            }
        }
    };
    let command: Vec<&str> = ["env"]
        .into_iter()
        .chain(preload.as_deref())
        .chain(command.iter().map(String::as_str))
        .chain(["3", "3"])
        .collect();
    // No process context: key 0 is the local root span id (libdatadog's
    // convention).
    profile_requests(name, &command, publisher_line, ids_are_the_requests);
}

/// A library that defines the OTEP's TLS pointer, loaded at start: its
/// descriptor's argument is the variable's offset from the thread pointer.
#[test]
fn a_library_loaded_at_start_publishes_through_static_tls() {
    library_publishes(
        "library-static",
        "trace_ctx_library.c",
        Some(("trace_ctx_tlsdesc_plugin.c", Loaded::AtStart)),
        "at thread pointer -",
    );
}

/// A library `dlopen`ed after start with a TLS block too big for the
/// static reserve: each thread's copy is found through its DTV.
#[test]
fn a_dlopened_library_publishes_through_each_threads_dtv() {
    library_publishes(
        "library-dtv",
        "trace_ctx_library.c",
        Some(("trace_ctx_dynamic_tlsdesc_plugin.c", Loaded::Dlopened)),
        "of the DTV",
    );
}

/// A program linked statically with musl, its own TLS pointer: musl puts
/// the program's block below the thread pointer where glibc does.
#[test]
fn a_musl_program_publishes_through_static_tls() {
    library_publishes(
        "musl",
        "trace_ctx_program_musl_static.c",
        None,
        "at thread pointer -",
    );
}

/// A library built by musl-gcc (`__tls_get_addr`), `dlopen`ed by a program
/// of musl's loader, its block too big for static TLS: found through
/// musl's DTV (one word an entry, its count first).
#[test]
fn a_library_dlopened_under_musl_publishes_through_musls_dtv() {
    assert_uses_tls_get_addr(&build_workload("trace_ctx_dynamic_musl_plugin.c"));
    library_publishes(
        "musl-dtv",
        "trace_ctx_library_musl.c",
        Some(("trace_ctx_dynamic_musl_plugin.c", Loaded::Dlopened)),
        "of the DTV (musl's)",
    );
}

/// The same through a TLS descriptor (musl's `__tlsdesc_dynamic`, whose
/// argument points to the module and offset as glibc's does).
#[test]
fn a_tlsdesc_library_dlopened_under_musl_publishes_through_musls_dtv() {
    library_publishes(
        "musl-tlsdesc-dtv",
        "trace_ctx_library_musl.c",
        Some(("trace_ctx_dynamic_musl_tlsdesc_plugin.c", Loaded::Dlopened)),
        "of the DTV (musl's)",
    );
}

/// A static PIE (`gcc -static-pie`; Rust's programs for its musl targets
/// are built so): no interpreter, a program by its `DF_1_PIE` flag.
#[test]
fn a_static_pie_program_publishes_through_static_tls() {
    library_publishes(
        "static-pie",
        "trace_ctx_program_static_pie.c",
        None,
        "at thread pointer -",
    );
}

/// A library whose code reaches its TLS through `__tls_get_addr` (the
/// general-dynamic model: what `gcc -fPIC` and Rust's `cdylib`s use by
/// default), loaded at start: its GOT's `{module, offset}` pair, read
/// through each thread's DTV, whose entry points into the static block.
#[test]
fn a_library_calling_tls_get_addr_loaded_at_start_publishes_through_the_dtv() {
    assert_uses_tls_get_addr(&build_workload("trace_ctx_gd_plugin.c"));
    library_publishes(
        "library-gd",
        "trace_ctx_library.c",
        Some(("trace_ctx_gd_plugin.c", Loaded::AtStart)),
        "of the DTV",
    );
}

/// The same `__tls_get_addr` library `dlopen`ed, its block too big for
/// the static reserve: each thread's copy is allocated at its first call.
#[test]
fn a_dlopened_library_calling_tls_get_addr_publishes_through_the_dtv() {
    assert_uses_tls_get_addr(&build_workload("trace_ctx_dynamic_gd_plugin.c"));
    library_publishes(
        "library-gd-dtv",
        "trace_ctx_library.c",
        Some(("trace_ctx_dynamic_gd_plugin.c", Loaded::Dlopened)),
        "of the DTV",
    );
}

/// The library's variable has the relocations of the general-dynamic
/// model, and no TLS descriptor (as `readelf -r` shows them).
fn assert_uses_tls_get_addr(library: &Path) {
    let output = Command::new("readelf")
        .args(["-r", "-W"])
        .arg(library)
        .output()
        .expect("readelf (binutils) runs");
    let text = String::from_utf8_lossy(&output.stdout);
    let of_variable = |kind: &str| {
        text.lines()
            .any(|line| line.contains(kind) && line.contains("otel_thread_ctx_v1"))
    };
    assert!(
        of_variable("R_X86_64_DTPMOD64") && !of_variable("R_X86_64_TLSDESC"),
        "{text}"
    );
}

/// Go's pprof labels, set per request as dd-trace-go sets them (`span
/// id`, `local root span id`, `trace endpoint`: decimal ids), read from
/// `g.m.curg.labels` of the thread's running goroutine. Each serving
/// goroutine is locked to its thread, so that a sample's thread tells its
/// request. Runs `server` (a build of `go_trace_requests`); the log.
fn go_labels_give_each_requests_samples_its_span_ids(
    name: &str,
    server: &Path,
    publisher_line: &str,
) -> String {
    let (_, stderr) = profile_requests(
        &format!("go-{name}"),
        &[server.to_str().unwrap(), "3", "3"],
        publisher_line,
        endpoint_and_ids_are_the_requests,
    );
    stderr
}

/// The ids as [`ids_are_the_requests`] says, and the endpoint names the
/// thread.
fn endpoint_and_ids_are_the_requests(
    label: &dyn Fn(&str) -> Option<String>,
    thread: u64,
    span: u64,
) -> bool {
    ids_are_the_requests(label, thread, span)
        && label("trace endpoint") == Some(format!("GET /thread/{thread}"))
}

/// A copy of a Go program whose build information says it is Go 1.99 (the
/// release's minor version rewritten in place): a release whose layout
/// ddprof does not know.
fn as_an_unknown_go_release(program: &Path, scratch: &Scratch) -> PathBuf {
    let mut bytes = std::fs::read(program).unwrap();
    let magic = b"\xff Go buildinf:";
    let at = bytes
        .windows(magic.len())
        .position(|window| window == magic)
        .expect("a Go program's build information");
    // Go 1.18 on: the version inline at byte 32, after its length.
    let version = at + 33;
    assert_eq!(
        &bytes[version..version + 4],
        b"go1.",
        "{:?}",
        &bytes[version..version + 8]
    );
    bytes[version + 4..version + 6].copy_from_slice(b"99");
    let copy = scratch.0.join("go-1.99");
    std::fs::write(&copy, &bytes).unwrap();
    std::fs::set_permissions(&copy, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    copy
}

/// Pure Go: the goroutine just below the thread pointer; the runtime's
/// offsets from the release's known layout.
#[test]
fn go_pprof_labels_give_each_requests_samples_its_span_ids() {
    let server = build_go_workload("go_trace_requests", "pure", &[]);
    go_labels_give_each_requests_samples_its_span_ids(
        "pure",
        &server,
        "the goroutine at thread pointer -0x8, g.labels at +",
    );
}

/// Linked with the C library, a C thread-local beside the runtime's: the
/// goroutine at `runtime.tlsg`, not at -8.
#[test]
fn go_pprof_labels_of_a_cgo_program_give_each_requests_samples_its_span_ids() {
    let server = build_go_workload("go_trace_requests", "cgo", &["-tags=with_cgo"]);
    let stderr = go_labels_give_each_requests_samples_its_span_ids(
        "cgo",
        &server,
        "publishes Go pprof labels",
    );
    assert!(
        !stderr.contains("the goroutine at thread pointer -0x8,"),
        "runtime.tlsg is not the block's last 8 bytes here: {stderr}"
    );
}

/// A release ddprof does not know (its version rewritten to 1.99): the
/// offsets, and the labels' layout, from the program's DWARF (by its
/// version alone, 1.99's labels would be a slice: this Go's are a map).
#[test]
fn go_pprof_labels_of_a_release_not_known_here_come_from_its_dwarf() {
    let scratch = Scratch::new("go-unknown-release");
    let server = build_go_workload("go_trace_requests", "pure", &[]);
    let unknown = as_an_unknown_go_release(&server, &scratch);
    go_labels_give_each_requests_samples_its_span_ids("dwarf", &unknown, "offsets from its DWARF");
}

/// The same release built without DWARF (`-ldflags=-w`): nothing to find
/// the offsets by, one line says so, and no sample carries labels.
#[test]
fn go_labels_of_an_unknown_release_without_dwarf_are_not_read_and_said_so() {
    let scratch = Scratch::new("go-unknown-release-nodwarf");
    let server = build_go_workload("go_trace_requests", "nodwarf", &["-ldflags=-w"]);
    let unknown = as_an_unknown_go_release(&server, &scratch);
    let (profile, stderr) = profile_with_bpf(&scratch, &[unknown.to_str().unwrap(), "2", "1"]);
    assert!(
        stderr
            .lines()
            .any(|line| line.contains("program built without DWARF")
                && line.contains("its goroutines' pprof labels are not on its samples")),
        "{stderr}"
    );
    let labelled = profile
        .labels()
        .iter()
        .filter(|labels| label(labels, "span id").is_some())
        .count();
    assert_eq!(labelled, 0, "{stderr}");
    assert!(profile.stacks().len() > 10, "{stderr}");
}

/// Go 1.24's labels, a sorted slice, as a C stand-in lays them out (no Go
/// 1.24 toolchain here: see `go124_labels_standin.c`).
#[test]
fn go_1_24_pprof_labels_as_a_slice_give_each_requests_samples_its_span_ids() {
    let standin = build_workload("go124_labels_standin.c");
    profile_requests(
        "go-1.24-standin",
        &[standin.to_str().unwrap(), "3", "3"],
        "go1.24.0: the goroutine at thread pointer -0x8, g.labels at +352 (a slice)",
        endpoint_and_ids_are_the_requests,
    );
}

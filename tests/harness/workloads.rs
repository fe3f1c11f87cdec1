//! Builds the workloads of `tests/workloads/` (programs with known call
//! chains) into the target directory, and starts them for profiling.
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;

/// Serialises builds between the tests of one binary; builds of separate
/// binaries are made safe by writing a temporary file and renaming it.
static BUILD_LOCK: Mutex<()> = Mutex::new(());

pub fn workloads_source_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads")
}

/// Where built workloads go: `<target dir>/workloads`.
pub fn workloads_build_dir() -> PathBuf {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../target"));
    target.join("workloads")
}

/// Builds `tests/workloads/<source>` (e.g. `chain.c`, `chain.cpp`, `chain.rs`)
/// unless an executable newer than the source is there, and returns its path
/// (built as [`crate::workload_build::compile_command`] says).
/// The executable is named after the source: `chain`, `chain_cpp`, `chain_rs`;
/// a C source named `*_plugin.c` is a shared library, `lib*_plugin.so`.
pub fn build_workload(source: &str) -> PathBuf {
    let source_path = workloads_source_dir().join(source);
    let (stem, extension) = source
        .rsplit_once('.')
        .unwrap_or_else(|| panic!("workload `{source}` has no extension"));
    let shared_library = source.ends_with("_plugin.c");
    let name = match extension {
        "c" if shared_library => format!("lib{stem}.so"),
        "c" => stem.to_string(),
        "cpp" => format!("{stem}_cpp"),
        "rs" => format!("{stem}_rs"),
        other => panic!("workload `{source}`: unknown language `.{other}`"),
    };
    let out_dir = created_build_dir();
    let output = out_dir.join(&name);
    let _guard = BUILD_LOCK
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    // The headers the workloads share count as part of every source.
    let newest_header = std::fs::read_dir(workloads_source_dir())
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.path().extension().is_some_and(|ext| ext == "h"))
        .filter_map(|entry| entry.metadata().and_then(|m| m.modified()).ok())
        .max();
    let source_time = std::fs::metadata(&source_path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|e| panic!("workload source {}: {e}", source_path.display()))
        .max(newest_header.unwrap_or(std::time::SystemTime::UNIX_EPOCH));
    if let Ok(built) = std::fs::metadata(&output).and_then(|m| m.modified()) {
        if built >= source_time {
            return output;
        }
    }
    let temporary = out_dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let mut command = crate::workload_build::compile_command(&source_path, &temporary)
        .unwrap_or_else(|e| panic!("{e}"));
    let result = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run the compiler for {source}: {e}"));
    assert!(
        result.status.success(),
        "building workload {source} failed:\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
    std::fs::rename(&temporary, &output).expect("move the built workload in place");
    output
}

/// [`workloads_build_dir`], created, canonical (as the kernel reports
/// mapped files).
fn created_build_dir() -> PathBuf {
    std::fs::create_dir_all(workloads_build_dir()).expect("create the workloads build directory");
    workloads_build_dir()
        .canonicalize()
        .expect("canonicalize the workloads build directory")
}

/// Datadog's own exporter as a program (`tests/reference-exporter`, a
/// workspace of its own: see its Cargo.toml), built unoptimized (it sends
/// one request; aws-lc's C compiles in half the time) into
/// `<target>/reference-exporter` (cargo's lock there makes a test wait for
/// a build `cargo xtask test` started ahead of it, rather than run a second
/// one); its path.
pub fn reference_exporter() -> PathBuf {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("reference-exporter/Cargo.toml");
    let target_dir = workloads_build_dir()
        .parent()
        .expect("the workloads directory is inside the target directory")
        .join("reference-exporter");
    let output = Command::new("cargo")
        .args(["build", "--locked", "--quiet", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target_dir)
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo for {}: {e}", manifest.display()));
    assert!(
        output.status.success(),
        "building the reference exporter failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    target_dir.join("debug/reference-exporter")
}

/// Builds the Go program of `tests/workloads/<directory>` (a module of its
/// own, the standard library only) with `go build` arguments `arguments`
/// (tags, linker flags), named `<directory>_<variant>`, and returns its
/// path. `go build` runs each time: its cache (in the build directory, as
/// its module cache: nothing is fetched) makes an unchanged program's
/// build quick.
pub fn build_go_workload(directory: &str, variant: &str, arguments: &[&str]) -> PathBuf {
    let out_dir = created_build_dir();
    let name = format!("{directory}_{variant}");
    let output = out_dir.join(&name);
    let _guard = BUILD_LOCK
        .lock()
        .unwrap_or_else(|poison| poison.into_inner());
    let temporary = out_dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let result = Command::new("go")
        .current_dir(workloads_source_dir().join(directory))
        .args(["build", "-o"])
        .arg(&temporary)
        .args(arguments)
        .arg(".")
        .env("GOCACHE", out_dir.join("go-cache"))
        .env("GOPATH", out_dir.join("go-path"))
        .env("GOFLAGS", "-mod=mod")
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run `go build` for {directory} ({e}): apt-get install golang-go")
        });
    assert!(
        result.status.success(),
        "building Go workload {directory} failed:\n{}",
        String::from_utf8_lossy(&result.stderr)
    );
    std::fs::rename(&temporary, &output).expect("move the built workload in place");
    output
}

/// Starts `program args` stopped, before its exec: a shell stops itself
/// (SIGSTOP) and, once continued with [`resume`], execs the program under
/// the same pid. Events opened on the pid in between see the whole life of
/// the program, as the launcher's do.
pub fn spawn_stopped(program: &Path, args: &[&str]) -> Child {
    let child = Command::new("/bin/sh")
        .arg("-c")
        .arg("kill -STOP $$; exec \"$0\" \"$@\"")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    match nix::sys::wait::waitpid(pid, Some(nix::sys::wait::WaitPidFlag::WUNTRACED)) {
        Ok(nix::sys::wait::WaitStatus::Stopped(_, _)) => child,
        other => panic!("{} did not stop before exec: {other:?}", program.display()),
    }
}

/// Continues a child started by [`spawn_stopped`].
pub fn resume(child: &Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGCONT,
    )
    .expect("continue the stopped workload");
}

/// Waits for a workload and panics unless it exited with status 0.
pub fn expect_success(mut child: Child, what: &str) {
    let status = child.wait().expect("wait for the workload");
    assert!(
        status.success(),
        "{what} failed: {status:?} (signal {:?})",
        status.signal()
    );
}

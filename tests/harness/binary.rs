//! Locating (and building once) the ddprof binary under test.
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The ddprof binary, built once per test process (see the crate docs).
pub fn ddprof_bin() -> &'static Path {
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("DDPROF_BIN") {
            return PathBuf::from(path);
        }
        let test_exe = std::env::current_exe().expect("the test executable's path");
        // target/<profile>/deps/<test-binary>
        let profile_dir = test_exe
            .parent()
            .and_then(Path::parent)
            .expect("test executables live in target/<profile>/deps")
            .to_path_buf();
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ is inside the workspace");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .current_dir(workspace)
            .args(["build", "--quiet", "-p", "ddprof", "--bin", "ddprof"]);
        // Cargo hands the test process its package's variables
        // (CARGO_MANIFEST_DIR, CARGO_PKG_NAME, …). Some build scripts
        // (ring's) rerun when those change, which rebuilt ddprof and its TLS
        // stack (~40 s) at every switch between `cargo test` and this build.
        const PER_PACKAGE: [&str; 7] = [
            "CARGO_PKG_",
            "CARGO_BIN_",
            "CARGO_MANIFEST_",
            "CARGO_CRATE_",
            "CARGO_PRIMARY_PACKAGE",
            "CARGO_TARGET_TMPDIR",
            "CARGO_RUSTC_CURRENT_DIR",
        ];
        for (key, _) in std::env::vars_os() {
            let name = key.to_string_lossy();
            if PER_PACKAGE.iter().any(|prefix| name.starts_with(prefix)) {
                build.env_remove(&key);
            }
        }
        if profile_dir
            .file_name()
            .is_some_and(|name| name == "release")
        {
            build.arg("--release");
        }
        let status = build.status().expect("running cargo to build ddprof");
        assert!(status.success(), "`cargo build -p ddprof` failed: {status}");
        let binary = profile_dir.join("ddprof");
        assert!(binary.is_file(), "no ddprof binary at {}", binary.display());
        binary
    })
}

/// The statically linked (musl) ddprof `cargo xtask dist` builds:
/// `DDPROF_STATIC_BIN` when set, else built once per test process (a no-op
/// when up to date) into `target/<arch>-unknown-linux-musl/<profile>/` (the
/// test machine's architecture),
/// with the same settings as `cargo xtask dist` (the musl target and
/// `musl-gcc` for crates that compile C must be installed; `cargo xtask
/// dist` installs them).
pub fn static_ddprof_bin() -> &'static Path {
    const MUSL_TARGET: &str = if cfg!(target_arch = "aarch64") {
        "aarch64-unknown-linux-musl"
    } else {
        "x86_64-unknown-linux-musl"
    };
    static BINARY: OnceLock<PathBuf> = OnceLock::new();
    BINARY.get_or_init(|| {
        if let Some(path) = std::env::var_os("DDPROF_STATIC_BIN") {
            return PathBuf::from(path);
        }
        let test_exe = std::env::current_exe().expect("the test executable's path");
        let profile_dir = test_exe
            .parent()
            .and_then(Path::parent)
            .expect("test executables live in target/<profile>/deps")
            .to_path_buf();
        let release = profile_dir
            .file_name()
            .is_some_and(|name| name == "release");
        let target_dir = profile_dir.parent().expect("target/<profile>");
        let workspace = Path::new(env!("CARGO_MANIFEST_DIR"))
            .parent()
            .expect("tests/ is inside the workspace");
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut build = Command::new(cargo);
        build
            .current_dir(workspace)
            .args(["build", "--quiet", "-p", "ddprof", "--bin", "ddprof"])
            .args(["--target", MUSL_TARGET])
            .env(format!("CC_{}", MUSL_TARGET.replace('-', "_")), "musl-gcc");
        if release {
            build.arg("--release");
        }
        let status = build.status().expect("running cargo to build ddprof");
        assert!(
            status.success(),
            "building the static ddprof failed ({status}): run `cargo xtask dist` once (it installs the musl target and musl-gcc)"
        );
        let binary = target_dir
            .join(MUSL_TARGET)
            .join(if release { "release" } else { "debug" })
            .join("ddprof");
        assert!(binary.is_file(), "no ddprof binary at {}", binary.display());
        binary
    })
}

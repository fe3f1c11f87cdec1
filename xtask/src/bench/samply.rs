//! samply, pinned and patched for a PMU-less VM, installed on first use.
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::{say, target_dir, workspace_root};

/// The samply version the bench measures.
pub(super) const SAMPLY_VERSION: &str = "0.13.1";

/// The one-line fix that lets samply run on machines without a hardware PMU
/// (it reads the ENOENT of the `cycles` event as EPERM and exits instead of
/// falling back to cpu-clock), kept beside the project.
pub(super) fn samply_patch() -> PathBuf {
    workspace_root().join("../shared/bench/samply-pmu-less.patch")
}

/// samply from crates.io, patched with [`samply_patch`] when the patch is
/// there, built once into target/bench-tools. The report says which.
pub(super) fn samply() -> Option<PathBuf> {
    let root = target_dir().join("bench-tools");
    let binary = root.join("bin/samply");
    if binary.is_file() {
        return Some(binary);
    }
    let patch = samply_patch();
    if !patch.is_file() {
        say(&format!(
            "installing samply {SAMPLY_VERSION} from crates.io, unpatched ({} not found: it \
             will fail on machines without a hardware PMU)",
            patch.display()
        ));
        let status = Command::new("cargo")
            .args([
                "install",
                "samply",
                "--version",
                SAMPLY_VERSION,
                "--locked",
                "--root",
            ])
            .arg(&root)
            .status()
            .ok()?;
        return (status.success() && binary.is_file()).then_some(binary);
    }
    say(&format!(
        "building samply {SAMPLY_VERSION} from crates.io with {} into target/bench-tools (once)",
        patch.display()
    ));
    let source = samply_source(&root)?;
    let patched = Command::new("patch")
        .current_dir(&source)
        .args(["-p1", "--forward", "-i"])
        .arg(&patch)
        .status()
        .ok()?;
    if !patched.success() {
        say("the samply patch did not apply");
        return None;
    }
    let status = Command::new("cargo")
        .args(["install", "--locked", "--root"])
        .arg(&root)
        .arg("--path")
        .arg(&source)
        .status()
        .ok()?;
    (status.success() && binary.is_file()).then_some(binary)
}

/// A fresh copy of samply's published source under `root`, fetched through
/// a throw-away crate that depends on its binary (an artifact dependency:
/// samply has no library, and cargo ignores an ordinary dependency on it).
pub(super) fn samply_source(root: &Path) -> Option<PathBuf> {
    let fetcher = root.join("samply-fetch");
    std::fs::create_dir_all(fetcher.join("src")).ok()?;
    std::fs::write(
        fetcher.join("Cargo.toml"),
        format!(
            "[package]\nname = \"samply-fetch\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             [dependencies]\nsamply = {{ version = \"={SAMPLY_VERSION}\", artifact = \"bin\" }}\n\
             [workspace]\n"
        ),
    )
    .ok()?;
    std::fs::write(fetcher.join("src/lib.rs"), "").ok()?;
    let nightly = crate::bpf_toolchain::pinned_nightly().ok()?;
    let metadata = Command::new("cargo")
        .current_dir(&fetcher)
        .arg(format!("+{nightly}"))
        .args(["metadata", "-Z", "bindeps", "--format-version", "1"])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&metadata.stdout);
    // The manifest path of the samply package, e.g.
    // "…/registry/src/…/samply-0.13.1/Cargo.toml".
    let marker = format!("samply-{SAMPLY_VERSION}/Cargo.toml");
    let end = text.find(&marker)? + marker.len() - "/Cargo.toml".len();
    let start = text[..end].rfind('"')? + 1;
    let registry_copy = PathBuf::from(&text[start..end]);
    let source = root.join(format!("samply-{SAMPLY_VERSION}-patched"));
    let _ = std::fs::remove_dir_all(&source);
    let copied = Command::new("cp")
        .arg("-r")
        .arg(&registry_copy)
        .arg(&source)
        .status()
        .ok()?;
    if !copied.success() {
        return None;
    }
    // The copy sits under this workspace's target/: keep cargo from taking
    // it for one of the workspace's members.
    let manifest = source.join("Cargo.toml");
    let mut text = std::fs::read_to_string(&manifest).ok()?;
    text.push_str("\n[workspace]\n");
    std::fs::write(&manifest, text).ok()?;
    Some(source)
}

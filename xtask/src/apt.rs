//! Debian packages the tasks need, installed by the tasks themselves
//! (as root, non-interactive): CI starts from a clean Debian 12 machine.
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{bail, Context, Result};

use crate::{run_checked, say};

/// Whether xtask runs as root (apt-get and dpkg need it).
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

pub fn apt_get() -> Command {
    let mut command = Command::new("apt-get");
    command
        .env("DEBIAN_FRONTEND", "noninteractive")
        // `apt-get download` as root into a directory the `_apt` user
        // cannot write: download as root instead of warning about it.
        .args(["-o", "APT::Sandbox::User=root"])
        // No progress bars in CI logs.
        .args(["-o", "Dpkg::Use-Pty=0"]);
    command
}

/// Whether this run of xtask updated the package lists since the last
/// change of dpkg's architectures.
static APT_UPDATED: AtomicBool = AtomicBool::new(false);

/// `apt-get update`, once per run of xtask: the package lists must know
/// the arm64 packages once the architecture is added, and a stale list
/// names versions the mirror no longer has.
pub fn apt_update() -> Result<()> {
    if APT_UPDATED.load(Ordering::Relaxed) {
        return Ok(());
    }
    say("updating the package lists (apt-get update)");
    run_checked(apt_get().args(["update", "-qq"]))
        .context("apt-get update failed: check the network and /etc/apt/sources.list*")?;
    APT_UPDATED.store(true, Ordering::Relaxed);
    Ok(())
}

pub fn require_root(what: &str) -> Result<()> {
    if !is_root() {
        bail!("{what} needs root (it runs apt-get/dpkg): run xtask as root, or do it by hand once");
    }
    Ok(())
}

/// Adds arm64 to dpkg's foreign architectures (so apt knows the arm64
/// packages; nothing arm64 gets installed) and updates the lists.
pub fn ensure_arm64_packages_known() -> Result<()> {
    let foreign = Command::new("dpkg")
        .arg("--print-foreign-architectures")
        .output()
        .context("cannot run dpkg: the arm64 VM needs a Debian host")?;
    let known = String::from_utf8_lossy(&foreign.stdout)
        .lines()
        .any(|line| line.trim() == "arm64");
    if !known {
        require_root("adding the arm64 architecture to dpkg")?;
        say("adding the arm64 architecture to dpkg (for apt-get download of arm64 packages)");
        run_checked(Command::new("dpkg").args(["--add-architecture", "arm64"]))?;
        // Lists fetched before know no arm64 package.
        APT_UPDATED.store(false, Ordering::Relaxed);
    }
    require_root("downloading arm64 packages")?;
    apt_update()
}

/// Whether the Debian package `package` (`name` or `name:arch`) is installed.
pub fn installed(package: &str) -> bool {
    Command::new("dpkg-query")
        .args(["-W", "-f=${Status}", package])
        .output()
        .is_ok_and(|out| String::from_utf8_lossy(&out.stdout).contains("ok installed"))
}

/// Installs `packages` (without their recommendations), for `why`.
pub fn install(packages: &[&str], why: &str) -> Result<()> {
    if !is_root() {
        bail!(
            "{why} needs {}: install them (apt-get install --no-install-recommends {})",
            packages.join(", "),
            packages.join(" ")
        );
    }
    say(&format!("installing {} ({why})", packages.join(" ")));
    apt_update()?;
    run_checked(
        apt_get()
            .args(["install", "-y", "-qq", "--no-install-recommends"])
            .args(packages),
    )
    .with_context(|| format!("cannot install {}", packages.join(" ")))
}

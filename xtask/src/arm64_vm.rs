//! An arm64 Linux guest under qemu (TCG emulation) for testing ddprof on
//! arm64 from an x86-64 host: a Debian arm64 kernel, a tiny userland
//! (busybox and the arm64 glibc runtime) and the files under test packed
//! into an initramfs, one shell script run as the guest's only job, and the
//! console output back.
//!
//! Everything comes from Debian packages fetched by this code (the arm64
//! ones with `apt-get download`, which needs the arm64 architecture added
//! to dpkg but installs nothing for it), so a clean Debian 12 machine needs
//! no manual step. The downloads are cached under `target/arm64-vm/`.
//!
//! No disk, no network, no modules: the initramfs is the root file system,
//! and everything the tests use (BPF, perf events, tracefs, uprobes) is
//! built into the Debian kernel.
use std::collections::BTreeMap;
use std::fs;
use std::io::{BufWriter, Read, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::apt::{apt_get, ensure_arm64_packages_known, install};
use crate::{have, run_checked, say, target_dir};

/// The Debian meta-package whose dependency names the guest kernel. The
/// cloud flavour is small (few drivers) and boots fast on qemu's `virt`
/// machine; it has BTF, BPF, perf events and the PL011 serial console.
pub const KERNEL_META_PACKAGE: &str = "linux-image-cloud-arm64";

/// The line the guest prints when the script is over, followed by the
/// script's exit status.
pub const EXIT_MARKER: &str = "ARM64-VM-EXIT=";

/// Where, in the guest, the script given to [`build_initramfs`] is written.
pub const GUEST_SCRIPT: &str = "/ddprof-vm/script.sh";

/// Kernel options the tests need, printed by [`guest_kernel`]; the first
/// two are required (without them no profiler works at all).
const KERNEL_OPTIONS: &[&str] = &[
    "CONFIG_BPF_SYSCALL",
    "CONFIG_PERF_EVENTS",
    "CONFIG_DEBUG_INFO_BTF",
    "CONFIG_UPROBE_EVENTS",
    "CONFIG_SERIAL_AMBA_PL011_CONSOLE",
];
const REQUIRED_KERNEL_OPTIONS: &[&str] = &["CONFIG_BPF_SYSCALL", "CONFIG_PERF_EVENTS"];

/// What one boot of the guest gave.
#[derive(Debug, Clone)]
pub struct VmRun {
    /// Everything qemu printed (the guest's console and qemu's own
    /// messages), line ends normalised to `\n`.
    pub output: String,
    /// The script's exit status, from the [`EXIT_MARKER`] line; `None` if
    /// the guest never printed it (it crashed, or the init failed).
    pub exit_status: Option<i32>,
    /// From qemu's start to the marker line (or to qemu's end without it).
    pub elapsed: Duration,
}

fn vm_dir() -> PathBuf {
    target_dir().join("arm64-vm")
}

/// What the arm64 VM needs on the host: a command on PATH or a file, and
/// the Debian package that provides it. The cross C library is only a
/// Recommends of the cross compiler, so `--no-install-recommends` would
/// leave gcc without headers or libc.a.
const HOST_TOOLS: &[(&str, &str)] = &[
    ("qemu-system-aarch64", "qemu-system-arm"),
    ("aarch64-linux-gnu-gcc", "gcc-aarch64-linux-gnu"),
    (
        "/usr/aarch64-linux-gnu/include/stdio.h",
        "libc6-dev-arm64-cross",
    ),
    ("/usr/aarch64-linux-gnu/lib/libc.a", "libc6-dev-arm64-cross"),
];

fn host_tool_present(tool: &str) -> bool {
    if tool.starts_with('/') {
        Path::new(tool).exists()
    } else {
        have(tool)
    }
}

/// Makes sure the host has qemu for arm64 and the arm64 cross compiler
/// (with its C library, for dynamic and `-static` programs), installing
/// them with apt-get when missing (CI starts from a clean Debian 12).
pub fn ensure_tools() -> Result<()> {
    let mut missing: Vec<&str> = HOST_TOOLS
        .iter()
        .filter(|(tool, _)| !host_tool_present(tool))
        .map(|(_, package)| *package)
        .collect();
    missing.dedup();
    if missing.is_empty() {
        return Ok(());
    }
    install(&missing, "the arm64 VM")?;
    for (tool, package) in HOST_TOOLS {
        if !host_tool_present(tool) {
            bail!("{package} is installed but {tool} is still missing");
        }
    }
    Ok(())
}

/// The package `meta` (e.g. `linux-image-cloud-arm64:arm64`) depends on
/// first whose name starts with `prefix`, as the candidate version says.
fn resolve_dependency(meta: &str, prefix: &str) -> Result<String> {
    let output = Command::new("apt-cache")
        .args(["show", "--no-all-versions", meta])
        .output()
        .context("cannot run apt-cache")?;
    if !output.status.success() {
        bail!(
            "apt-cache show {meta} failed ({}): is arm64 in `dpkg --print-foreign-architectures` and are the lists updated?",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let depends = text
        .lines()
        .find_map(|line| line.strip_prefix("Depends:"))
        .with_context(|| format!("apt-cache show {meta}: no Depends field"))?;
    depends
        .split([',', '|'])
        .map(|item| item.split_whitespace().next().unwrap_or(""))
        .find(|name| name.starts_with(prefix))
        .map(|name| name.split(':').next().unwrap_or(name).to_string())
        .with_context(|| format!("{meta} depends on no {prefix}* package (Depends: {depends})"))
}

/// Downloads the arm64 `package` and extracts it into `into` (which is
/// created); returns the package's file name (name_version_arch.deb).
fn download_and_extract(package: &str, into: &Path) -> Result<String> {
    let download = into.with_extension("download");
    let _ = fs::remove_dir_all(&download);
    fs::create_dir_all(&download)
        .with_context(|| format!("cannot create {}", download.display()))?;
    let qualified = if package.contains(':') {
        package.to_string()
    } else {
        format!("{package}:arm64")
    };
    say(&format!("downloading {qualified}"));
    run_checked(
        apt_get()
            .current_dir(&download)
            .args(["download", "-qq", &qualified]),
    )
    .with_context(|| format!("cannot download {qualified}"))?;
    let deb = fs::read_dir(&download)?
        .filter_map(|entry| entry.ok())
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "deb"))
        .with_context(|| format!("apt-get download {qualified} left no .deb"))?;
    fs::create_dir_all(into)?;
    run_checked(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(into))
        .with_context(|| format!("cannot extract {}", deb.display()))?;
    let name = deb
        .file_name()
        .map(|name| name.to_string_lossy().into_owned())
        .unwrap_or_default();
    let _ = fs::remove_dir_all(&download);
    Ok(name)
}

/// Builds a cache directory: `fill` fills a fresh temporary directory
/// which then becomes `dir`, so an interrupted download never leaves a
/// half-filled cache behind, and two xtasks at once do not collide.
fn cached_dir(dir: &Path, fill: impl FnOnce(&Path) -> Result<()>) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    let parent = dir.parent().context("cache directory without a parent")?;
    fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
    let temporary = parent.join(format!(
        ".{}.{}",
        dir.file_name().unwrap_or_default().to_string_lossy(),
        std::process::id()
    ));
    let _ = fs::remove_dir_all(&temporary);
    fs::create_dir_all(&temporary)?;
    let filled = fill(&temporary);
    if let Err(error) = filled {
        let _ = fs::remove_dir_all(&temporary);
        let _ = fs::remove_dir_all(temporary.with_extension("download"));
        return Err(error);
    }
    if let Err(error) = fs::rename(&temporary, dir) {
        let _ = fs::remove_dir_all(&temporary);
        if !dir.is_dir() {
            return Err(error).with_context(|| format!("cannot create {}", dir.display()));
        }
    }
    Ok(())
}

/// The first file in `dir` whose name starts with `prefix`.
fn find_prefixed(dir: &Path, prefix: &str) -> Option<PathBuf> {
    let mut found: Vec<PathBuf> = fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| entry.ok())
        .filter(|entry| entry.file_name().to_string_lossy().starts_with(prefix))
        .map(|entry| entry.path())
        .collect();
    found.sort();
    found.into_iter().next()
}

/// The options of a kernel's `config-*` file that are set (`y` or `m`).
pub fn kernel_config(config: &Path) -> Result<BTreeMap<String, String>> {
    let text = fs::read_to_string(config)
        .with_context(|| format!("cannot read the kernel config {}", config.display()))?;
    Ok(text
        .lines()
        .filter(|line| line.starts_with("CONFIG_"))
        .filter_map(|line| line.split_once('='))
        .map(|(name, value)| (name.to_string(), value.to_string()))
        .collect())
}

/// The kernel's config file next to `kernel` (`boot/config-VERSION` for
/// `boot/vmlinuz-VERSION`).
pub fn kernel_config_path(kernel: &Path) -> Option<PathBuf> {
    let name = kernel.file_name()?.to_string_lossy().into_owned();
    let version = name.strip_prefix("vmlinuz-")?;
    Some(kernel.with_file_name(format!("config-{version}")))
}

/// The arm64 Debian kernel image to boot (the one the cloud meta-package
/// currently depends on: Debian 12 has 6.1, with BTF and `bpf_loop`),
/// extracted under `target/arm64-vm/kernel/`; once there, no network.
/// Fails when the kernel lacks BPF or perf events; prints the other
/// options the tests care about.
pub fn guest_kernel() -> Result<PathBuf> {
    let dir = vm_dir().join("kernel");
    cached_dir(&dir, |temporary| {
        ensure_arm64_packages_known()?;
        let meta = format!("{KERNEL_META_PACKAGE}:arm64");
        let package = resolve_dependency(&meta, "linux-image-")?;
        let deb = download_and_extract(&package, temporary)?;
        fs::write(temporary.join("PACKAGE"), format!("{deb}\n"))?;
        // Only boot/ is used (the features the tests need are built in,
        // the initramfs has no modules): drop the ~80 MB of modules.
        for entry in fs::read_dir(temporary)? {
            let entry = entry?;
            if entry.file_type()?.is_dir() && entry.file_name() != "boot" {
                fs::remove_dir_all(entry.path())?;
            }
        }
        Ok(())
    })?;
    let boot = dir.join("boot");
    let kernel = find_prefixed(&boot, "vmlinuz-").with_context(|| {
        format!(
            "no boot/vmlinuz-* in {}: remove that directory and run again",
            dir.display()
        )
    })?;
    if let Some(config) = kernel_config_path(&kernel).filter(|path| path.is_file()) {
        let options = kernel_config(&config)?;
        let value = |name: &str| options.get(name).map(String::as_str).unwrap_or("n");
        let missing: Vec<&str> = REQUIRED_KERNEL_OPTIONS
            .iter()
            .copied()
            .filter(|name| !matches!(value(name), "y"))
            .collect();
        if !missing.is_empty() {
            bail!(
                "the guest kernel {} lacks {}: ddprof cannot run on it (set KERNEL_META_PACKAGE to another flavour)",
                kernel.display(),
                missing.join(", ")
            );
        }
        let summary: Vec<String> = KERNEL_OPTIONS
            .iter()
            .map(|name| format!("{}={}", name.trim_start_matches("CONFIG_"), value(name)))
            .collect();
        say(&format!(
            "guest kernel {}: {}",
            kernel.display(),
            summary.join(" ")
        ));
    } else {
        say(&format!(
            "guest kernel {}: no config file beside it, options not checked",
            kernel.display()
        ));
    }
    Ok(kernel)
}

/// Copies `from` (a file, a symlink or a directory tree) to `to`, keeping
/// symlinks as symlinks (glibc's packages have some) and modes.
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    let metadata =
        fs::symlink_metadata(from).with_context(|| format!("cannot read {}", from.display()))?;
    if let Some(parent) = to.parent() {
        fs::create_dir_all(parent)?;
    }
    if metadata.file_type().is_symlink() {
        let target = fs::read_link(from)?;
        let _ = fs::remove_file(to);
        std::os::unix::fs::symlink(&target, to)
            .with_context(|| format!("cannot create the symlink {}", to.display()))?;
    } else if metadata.is_dir() {
        fs::create_dir_all(to)?;
        for entry in fs::read_dir(from)? {
            let entry = entry?;
            copy_tree(&entry.path(), &to.join(entry.file_name()))?;
        }
    } else {
        fs::copy(from, to)
            .with_context(|| format!("cannot copy {} to {}", from.display(), to.display()))?;
    }
    Ok(())
}

/// What a dynamic arm64 program and a shell need in the guest: busybox
/// (static, with every applet) in `bin/`, and the arm64 glibc runtime
/// (the loader `lib/ld-linux-aarch64.so.1` and `lib/aarch64-linux-gnu/`,
/// from libc6 and libgcc-s1) as Debian ships it, so that what
/// `aarch64-linux-gnu-gcc` builds runs unchanged. Cached under
/// `target/arm64-vm/userland/`.
pub fn guest_userland() -> Result<PathBuf> {
    let dir = vm_dir().join("userland");
    cached_dir(&dir, |temporary| {
        ensure_arm64_packages_known()?;
        let packages = temporary.join("../.packages");
        let _ = fs::remove_dir_all(&packages);
        let result = (|| -> Result<()> {
            let busybox = packages.join("busybox");
            download_and_extract("busybox-static", &busybox)?;
            copy_tree(&busybox.join("bin/busybox"), &temporary.join("bin/busybox"))
                .context("busybox-static has no bin/busybox")?;
            for package in ["libc6", "libgcc-s1"] {
                let extracted = packages.join(package);
                download_and_extract(package, &extracted)?;
                // Debian 12 ships the runtime under /lib (usrmerge happens
                // at install); later releases under /usr/lib.
                for lib in ["lib", "usr/lib"] {
                    let lib_dir = extracted.join(lib);
                    if !lib_dir.is_dir() {
                        continue;
                    }
                    for entry in fs::read_dir(&lib_dir)? {
                        let entry = entry?;
                        let name = entry.file_name();
                        let name = name.to_string_lossy();
                        if name.starts_with("ld-linux") || name == "aarch64-linux-gnu" {
                            copy_tree(&entry.path(), &temporary.join(lib).join(&*name))?;
                        }
                    }
                }
            }
            // Character set converters and audit modules: not needed, a few MB.
            let multiarch = temporary.join("usr/lib/aarch64-linux-gnu");
            let _ = fs::remove_dir_all(multiarch.join("gconv"));
            let _ = fs::remove_dir_all(multiarch.join("audit"));
            // Then usr/ if that left it empty (remove_dir fails otherwise).
            let _ = fs::remove_dir(&multiarch);
            let _ = fs::remove_dir(temporary.join("usr/lib"));
            let _ = fs::remove_dir(temporary.join("usr"));
            if !temporary.join("lib").exists() && temporary.join("usr/lib").is_dir() {
                std::os::unix::fs::symlink("usr/lib", temporary.join("lib"))?;
            }
            if !temporary.join("lib/ld-linux-aarch64.so.1").exists() {
                bail!("libc6:arm64 has no ld-linux-aarch64.so.1 under lib/ or usr/lib/");
            }
            Ok(())
        })();
        let _ = fs::remove_dir_all(&packages);
        result
    })?;
    Ok(dir)
}

/// One entry of the initramfs.
enum Node {
    Dir { mode: u32 },
    File { source: FileSource, mode: u32 },
    Symlink { target: String },
    CharDevice { mode: u32, major: u32, minor: u32 },
}

enum FileSource {
    Host(PathBuf),
    Bytes(Vec<u8>),
}

/// The guest path as the archive names it: relative, no `.` or `..`.
fn archive_name(guest_path: &str) -> Result<String> {
    let mut parts = Vec::new();
    for part in guest_path.split('/') {
        match part {
            "" | "." => {}
            ".." => bail!("the guest path {guest_path:?} has a `..`: give a plain absolute path such as /opt/name"),
            part => parts.push(part),
        }
    }
    if parts.is_empty() {
        bail!("the guest path {guest_path:?} names no file");
    }
    Ok(parts.join("/"))
}

/// Adds `name`'s parent directories (0755) that are not there yet.
fn add_parents(nodes: &mut BTreeMap<String, Node>, name: &str) {
    let mut end = 0;
    while let Some(slash) = name[end..].find('/') {
        end += slash;
        nodes
            .entry(name[..end].to_string())
            .or_insert(Node::Dir { mode: 0o755 });
        end += 1;
    }
}

/// Adds the host `path` as `name`: directories recursively; symlinks kept
/// when `keep_symlinks`, else followed.
fn add_host(
    nodes: &mut BTreeMap<String, Node>,
    path: &Path,
    name: &str,
    keep_symlinks: bool,
) -> Result<()> {
    let metadata = if keep_symlinks {
        fs::symlink_metadata(path)
    } else {
        fs::metadata(path)
    }
    .with_context(|| format!("cannot read {} (for the initramfs)", path.display()))?;
    add_parents(nodes, name);
    let mode = metadata.permissions().mode() & 0o7777;
    if metadata.file_type().is_symlink() {
        let target = fs::read_link(path)?;
        nodes.insert(
            name.to_string(),
            Node::Symlink {
                target: target.to_string_lossy().into_owned(),
            },
        );
    } else if metadata.is_dir() {
        nodes.insert(name.to_string(), Node::Dir { mode });
        let mut entries: Vec<_> = fs::read_dir(path)?.collect::<std::io::Result<_>>()?;
        entries.sort_by_key(|entry| entry.file_name());
        for entry in entries {
            let child = format!("{name}/{}", entry.file_name().to_string_lossy());
            add_host(nodes, &entry.path(), &child, keep_symlinks)?;
        }
    } else if metadata.is_file() {
        nodes.insert(
            name.to_string(),
            Node::File {
                source: FileSource::Host(path.to_path_buf()),
                mode,
            },
        );
    } else {
        bail!(
            "{} is neither a file, a directory nor a symlink: it cannot go in the initramfs",
            path.display()
        );
    }
    Ok(())
}

/// Writes cpio "newc" (SVR4, no CRC) entries, the format the kernel
/// unpacks an initramfs from.
struct CpioWriter<W: Write> {
    out: W,
    written: u64,
    next_inode: u32,
}

impl<W: Write> CpioWriter<W> {
    fn pad(&mut self) -> Result<()> {
        let padding = (4 - self.written % 4) % 4;
        self.out.write_all(&[0u8; 3][..padding as usize])?;
        self.written += padding;
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<()> {
        self.out.write_all(bytes)?;
        self.written += bytes.len() as u64;
        Ok(())
    }

    /// One header and name; the caller writes `size` bytes of data after.
    fn header(
        &mut self,
        name: &str,
        mode: u32,
        size: u64,
        nlink: u32,
        rdev: (u32, u32),
    ) -> Result<()> {
        let size = u32::try_from(size).map_err(|_| {
            anyhow::anyhow!("{name} is 4 GiB or more: too big for a cpio newc archive")
        })?;
        self.next_inode += 1;
        let fields = [
            self.next_inode,
            mode,
            0, // uid: root
            0, // gid: root
            nlink,
            0, // mtime
            size,
            0, // devmajor
            0, // devminor
            rdev.0,
            rdev.1,
            name.len() as u32 + 1,
            0, // check
        ];
        let mut header = String::with_capacity(110);
        header.push_str("070701");
        for field in fields {
            header.push_str(&format!("{field:08x}"));
        }
        self.write(header.as_bytes())?;
        self.write(name.as_bytes())?;
        self.write(&[0])?;
        self.pad()
    }

    fn entry(&mut self, name: &str, node: &Node) -> Result<()> {
        const S_IFDIR: u32 = 0o040000;
        const S_IFREG: u32 = 0o100000;
        const S_IFLNK: u32 = 0o120000;
        const S_IFCHR: u32 = 0o020000;
        match node {
            Node::Dir { mode } => self.header(name, S_IFDIR | mode, 0, 2, (0, 0)),
            Node::Symlink { target } => {
                self.header(name, S_IFLNK | 0o777, target.len() as u64, 1, (0, 0))?;
                self.write(target.as_bytes())?;
                self.pad()
            }
            Node::CharDevice { mode, major, minor } => {
                self.header(name, S_IFCHR | mode, 0, 1, (*major, *minor))
            }
            Node::File { source, mode } => {
                match source {
                    FileSource::Bytes(bytes) => {
                        self.header(name, S_IFREG | mode, bytes.len() as u64, 1, (0, 0))?;
                        self.write(bytes)?;
                    }
                    FileSource::Host(path) => {
                        let mut file = fs::File::open(path)
                            .with_context(|| format!("cannot open {}", path.display()))?;
                        let size = file.metadata()?.size();
                        self.header(name, S_IFREG | mode, size, 1, (0, 0))?;
                        let copied = std::io::copy(&mut (&mut file).take(size), &mut self.out)
                            .with_context(|| format!("cannot read {}", path.display()))?;
                        if copied != size {
                            bail!("{} changed size while being archived", path.display());
                        }
                        self.written += copied;
                    }
                }
                self.pad()
            }
        }
    }

    fn finish(mut self) -> Result<W> {
        self.header("TRAILER!!!", 0, 0, 1, (0, 0))?;
        self.out.flush()?;
        Ok(self.out)
    }
}

/// The guest's `/init`: mounts what a profiler needs (proc, sysfs, dev,
/// tracefs, debugfs, bpffs, cgroup2, a tmpfs /tmp), installs the busybox
/// applets, runs the script, prints [`EXIT_MARKER`] with its status and
/// powers off (if that fails, init exits, the kernel panics and, with
/// `panic=-1` and qemu's `-no-reboot`, qemu ends anyway).
fn init_program() -> String {
    format!(
        r#"#!/bin/busybox sh
/bin/busybox mkdir -p /bin /sbin /usr/bin /usr/sbin
/bin/busybox --install -s /bin
export PATH=/bin:/sbin:/usr/bin:/usr/sbin HOME=/root TERM=dumb
mkdir -p /proc /sys /dev /tmp /run /root
mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /dev/pts /dev/shm
mount -t tmpfs tmpfs /tmp
mount -t tmpfs tmpfs /dev/shm
mount -t tracefs tracefs /sys/kernel/tracing
mount -t debugfs debugfs /sys/kernel/debug
mount -t bpf bpf /sys/fs/bpf
mount -t cgroup2 cgroup2 /sys/fs/cgroup
ulimit -l unlimited 2>/dev/null
cd /
sh {GUEST_SCRIPT} </dev/null
rc=$?
echo
echo "{EXIT_MARKER}$rc"
sync
poweroff -f
echo o > /proc/sysrq-trigger
"#
    )
}

/// Writes an uncompressed cpio "newc" initramfs to `out`: the `userland`
/// tree (see [`guest_userland`], symlinks kept), each `extra` host file
/// (or directory, recursively; symlinks followed) at its guest path, the
/// `init_script` at [`GUEST_SCRIPT`] and an `/init` that mounts the file
/// systems a profiler needs, runs the script with `sh`, prints an empty
/// line then [`EXIT_MARKER`] and the script's status, and powers off.
/// Uncompressed because the emulated guest would spend seconds on gunzip.
pub fn build_initramfs(
    out: &Path,
    userland: &Path,
    extra: &[(PathBuf, String)],
    init_script: &str,
) -> Result<()> {
    let mut nodes: BTreeMap<String, Node> = BTreeMap::new();
    if !userland.join("bin/busybox").is_file() {
        bail!(
            "{} has no bin/busybox: pass the directory guest_userland() returns",
            userland.display()
        );
    }
    let mut entries: Vec<_> = fs::read_dir(userland)
        .with_context(|| format!("cannot read {}", userland.display()))?
        .collect::<std::io::Result<_>>()?;
    entries.sort_by_key(|entry| entry.file_name());
    for entry in entries {
        add_host(
            &mut nodes,
            &entry.path(),
            &entry.file_name().to_string_lossy(),
            true,
        )?;
    }
    for (host, guest) in extra {
        let name = archive_name(guest)?;
        add_host(&mut nodes, host, &name, false)?;
    }
    for dir in ["dev", "proc", "sys", "tmp", "run", "root"] {
        nodes
            .entry(dir.to_string())
            .or_insert(Node::Dir { mode: 0o755 });
    }
    // The kernel opens /dev/console for init's stdio before init can mount
    // devtmpfs.
    nodes.insert(
        "dev/console".to_string(),
        Node::CharDevice {
            mode: 0o600,
            major: 5,
            minor: 1,
        },
    );
    let script = archive_name(GUEST_SCRIPT)?;
    add_parents(&mut nodes, &script);
    nodes.insert(
        script,
        Node::File {
            source: FileSource::Bytes(init_script.as_bytes().to_vec()),
            mode: 0o755,
        },
    );
    nodes.insert(
        "init".to_string(),
        Node::File {
            source: FileSource::Bytes(init_program().into_bytes()),
            mode: 0o755,
        },
    );
    if let Some(parent) = out.parent().filter(|parent| !parent.as_os_str().is_empty()) {
        fs::create_dir_all(parent)
            .with_context(|| format!("cannot create {}", parent.display()))?;
    }
    let file = fs::File::create(out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut writer = CpioWriter {
        out: BufWriter::new(file),
        written: 0,
        next_inode: 0,
    };
    // BTreeMap order puts every directory before what it holds.
    for (name, node) in &nodes {
        writer
            .entry(name, node)
            .with_context(|| format!("cannot write {name} into {}", out.display()))?;
    }
    writer.finish()?;
    Ok(())
}

/// The qemu command line for one boot (TCG: the host is x86-64).
/// `pauth-impdef=on` makes pointer authentication (which Debian's arm64
/// userland uses) cheap to emulate; `-no-reboot` with `panic=-1` turns a
/// guest panic into qemu's exit.
pub fn qemu_command(kernel: &Path, initramfs: &Path) -> Command {
    let mut command = Command::new("qemu-system-aarch64");
    command
        .args([
            "-M",
            "virt",
            "-cpu",
            "max,pauth-impdef=on",
            "-smp",
            "2",
            "-m",
            "1G",
        ])
        .args(["-accel", "tcg,thread=multi"])
        // No network: the default NIC would also need iPXE's ROM (a
        // Recommends of qemu-system-arm, so not installed).
        .args(["-nographic", "-no-reboot", "-nic", "none"])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initramfs)
        .args(["-append", "console=ttyAMA0 panic=-1 quiet"]);
    command
}

/// Boots the guest, echoing its console to stderr line by line (prefixed
/// `arm64| `), and returns what it printed. See [`boot_with`].
pub fn boot(kernel: &Path, initramfs: &Path, timeout: Duration) -> Result<VmRun> {
    boot_with(kernel, initramfs, timeout, &mut |line| {
        eprintln!("arm64| {line}")
    })
}

/// The last `count` lines of `text`, for error messages.
fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

/// The status on the last [`EXIT_MARKER`] line of `output`.
pub fn parse_exit_status(output: &str) -> Option<i32> {
    output
        .lines()
        .rev()
        .find_map(|line| line.trim().strip_prefix(EXIT_MARKER))
        .and_then(|status| status.trim().parse().ok())
}

/// Boots `kernel` with `initramfs` in qemu, calls `on_line` with each line
/// of output as it comes, and returns all of it once qemu ends. qemu's
/// stdin is null (so it never touches the terminal's modes); qemu is killed
/// when `timeout` passes (an error, with the last lines of output) or when
/// it has not ended a few seconds after the end marker.
pub fn boot_with(
    kernel: &Path,
    initramfs: &Path,
    timeout: Duration,
    on_line: &mut dyn FnMut(&str),
) -> Result<VmRun> {
    for (what, path) in [("kernel", kernel), ("initramfs", initramfs)] {
        if !path.is_file() {
            bail!("the {what} {} does not exist", path.display());
        }
    }
    if !have("qemu-system-aarch64") {
        bail!("qemu-system-aarch64 is not installed: call arm64_vm::ensure_tools() first (apt-get install qemu-system-arm)");
    }
    let mut command = qemu_command(kernel, initramfs);
    command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let start = Instant::now();
    let mut child = command
        .spawn()
        .with_context(|| format!("cannot start {command:?}"))?;
    // Two readers (stdout: the console; stderr: qemu's own messages) feed
    // one channel, so the loop below can wait with a deadline.
    let (sender, receiver) = mpsc::channel::<Vec<u8>>();
    let mut readers = Vec::new();
    let streams: [Option<Box<dyn Read + Send>>; 2] = [
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    ];
    for mut stream in streams.into_iter().flatten() {
        let sender = sender.clone();
        readers.push(std::thread::spawn(move || {
            let mut buffer = [0u8; 8192];
            loop {
                match stream.read(&mut buffer) {
                    Ok(0) | Err(_) => break,
                    Ok(count) => {
                        if sender.send(buffer[..count].to_vec()).is_err() {
                            break;
                        }
                    }
                }
            }
        }));
    }
    drop(sender);

    let mut output = String::new();
    let mut pending: Vec<u8> = Vec::new();
    let mut marker_at: Option<Instant> = None;
    let mut timed_out = false;
    let mut take_lines = |pending: &mut Vec<u8>, output: &mut String, flush: bool| -> bool {
        let mut saw_marker = false;
        loop {
            let end = match pending.iter().position(|&byte| byte == b'\n') {
                Some(end) => end + 1,
                None if flush && !pending.is_empty() => pending.len(),
                None => break,
            };
            let line: Vec<u8> = pending.drain(..end).collect();
            let line = String::from_utf8_lossy(&line);
            let line = line.trim_end_matches(['\n', '\r']).replace('\r', "");
            if line.trim().starts_with(EXIT_MARKER) {
                saw_marker = true;
            }
            on_line(&line);
            output.push_str(&line);
            output.push('\n');
        }
        saw_marker
    };
    // After the marker the guest only syncs and powers off.
    const AFTER_MARKER: Duration = Duration::from_secs(10);
    loop {
        let now = Instant::now();
        let deadline = match marker_at {
            Some(marker) => (marker + AFTER_MARKER).min(start + timeout + AFTER_MARKER),
            None => start + timeout,
        };
        if now >= deadline {
            timed_out = marker_at.is_none();
            break;
        }
        match receiver.recv_timeout(deadline - now) {
            Ok(chunk) => {
                pending.extend_from_slice(&chunk);
                if take_lines(&mut pending, &mut output, false) && marker_at.is_none() {
                    marker_at = Some(Instant::now());
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => continue,
            // Both streams closed: qemu is ending.
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
    // Ends qemu if it is still there (only our own child, by its handle),
    // then reaps it; the readers end when its pipes close. When its output
    // ended, qemu is exiting by itself: give it a moment first.
    let mut status = None;
    if !timed_out && marker_at.is_none_or(|marker| marker.elapsed() < AFTER_MARKER) {
        let deadline = Instant::now() + Duration::from_secs(2);
        while Instant::now() < deadline {
            if let Ok(Some(done)) = child.try_wait() {
                status = Some(done);
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    if status.is_none() {
        if let Ok(Some(done)) = child.try_wait() {
            status = Some(done);
        } else {
            let _ = child.kill();
            status = child.wait().ok();
        }
    }
    while let Ok(chunk) = receiver.recv_timeout(Duration::from_millis(200)) {
        pending.extend_from_slice(&chunk);
    }
    take_lines(&mut pending, &mut output, true);
    for reader in readers {
        let _ = reader.join();
    }
    let elapsed = marker_at.unwrap_or_else(Instant::now) - start;
    if timed_out {
        bail!(
            "the arm64 guest did not finish within {} s (qemu killed); its last lines:\n{}",
            timeout.as_secs(),
            last_lines(&output, 30)
        );
    }
    let exit_status = parse_exit_status(&output);
    if exit_status.is_none() {
        let how = status.map(|status| status.to_string()).unwrap_or_default();
        say(&format!(
            "the arm64 guest ended ({how}) without printing {EXIT_MARKER}: the guest kernel panicked or /init failed (see its output)"
        ));
    }
    Ok(VmRun {
        output,
        exit_status,
        elapsed,
    })
}

//! `cargo xtask test-arm64` (and the last step of `cargo xtask test`): the
//! static arm64 ddprof, run in an arm64 guest under qemu, profiles arm64
//! programs with both engines, and its stacks are checked as the x86-64
//! end-to-end tests check them.
//!
//! The guest (see [`crate::arm64_vm`]) runs one script: `ddprof --check`,
//! then `chain` (a fixed six-deep call chain whose leaves split the CPU
//! 70/30) built three ways — with frame pointers, without, and with return
//! addresses signed by pointer authentication (`-mbranch-protection=pac-ret`,
//! which the guest's CPU implements) — profiled by each engine, and
//! `allocations` under `sALLOC` by each engine. Each run's folded stacks,
//! log lines and pprof file (in base64) come back on the console between
//! markers, and are judged here. Last, `arm64_snapshots` records stacks of
//! three programs as a perf sample would copy them, and the differential
//! test (`tests/unwind_diff.rs`) walks them with ddprof's walker and
//! framehop's aarch64 unwinder on this machine.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use ddprof_build::BpfArch;

use crate::{arm64_vm, run_checked, say, target_dir, workspace_root};

/// How `chain` is built: a name and the compiler flags beside `-O2 -g`.
const CHAIN_BUILDS: [(&str, &str); 3] = [
    ("fp", "-fno-omit-frame-pointer"),
    ("nofp", "-fomit-frame-pointer"),
    ("pac", "-fomit-frame-pointer -mbranch-protection=pac-ret"),
];
const ENGINES: [&str; 2] = ["bpf", "perf"];
/// Where the guest finds ddprof and the workloads.
const GUEST_DIR: &str = "/opt/ddprof";
/// The leaves of `chain`, and the whole chain above them, root first.
const CHAIN: &str = "main;chain_a;chain_b;chain_c;chain_d;chain_e;";
const CHAIN_LEAVES: [&str; 2] = ["chain_leaf_70", "chain_leaf_30"];
/// The functions of `allocations` that allocate.
const ALLOCATING: [&str; 4] = [
    "alloc_small",
    "alloc_medium",
    "alloc_large",
    "alloc_aligned",
];
/// `tests/workloads` programs whose recorded stacks the differential test
/// walks: (recording name, source, flags beside `-O2 -g`).
const RECORDED: [(&str, &str, &str); 3] = [
    ("chain-nofp", "unwind_chain", "-fomit-frame-pointer"),
    (
        "chain-pac",
        "unwind_chain",
        "-fomit-frame-pointer -mbranch-protection=pac-ret",
    ),
    ("qsort", "unwind_qsort", "-fomit-frame-pointer"),
];
/// Stops recorded per program.
const RECORDED_STOPS: u32 = 300;
/// The whole guest run's limit: it takes about a minute under emulation.
const GUEST_TIMEOUT: Duration = Duration::from_secs(600);

/// Builds, boots, profiles and judges; prints one line per run.
pub fn run() -> Result<()> {
    run_prepared(prepare(&target_dir(), false)?)
}

/// What the guest run needs, made beforehand.
pub struct Prepared {
    kernel: PathBuf,
    initramfs: PathBuf,
    userland: PathBuf,
}

/// Installs the tools, builds the static arm64 ddprof (in `build_dir`,
/// cargo's output `quiet` or not) and the workloads, fetches the guest's
/// kernel and userland and packs the initramfs.
pub fn prepare(build_dir: &Path, quiet: bool) -> Result<Prepared> {
    arm64_vm::ensure_tools()?;
    let ddprof = crate::dist::run_into(BpfArch::Aarch64, build_dir, quiet)?;
    let workloads = build_workloads()?;
    let kernel = arm64_vm::guest_kernel()?;
    let userland = arm64_vm::guest_userland()?;
    let mut files = vec![(ddprof, format!("{GUEST_DIR}/ddprof"))];
    files.extend(workloads.into_iter().map(|path| {
        let name = path
            .file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned();
        (path, format!("{GUEST_DIR}/{name}"))
    }));
    let initramfs = target_dir().join("arm64-vm/test-initramfs.cpio");
    arm64_vm::build_initramfs(&initramfs, &userland, &files, &guest_script())?;
    Ok(Prepared {
        kernel,
        initramfs,
        userland,
    })
}

/// What [`prepare`] made (run before, by another process): its kernel and
/// userland are found in their caches.
pub fn prepared() -> Result<Prepared> {
    Ok(Prepared {
        kernel: arm64_vm::guest_kernel()?,
        initramfs: target_dir().join("arm64-vm/test-initramfs.cpio"),
        userland: arm64_vm::guest_userland()?,
    })
}

/// Boots the guest made by [`prepare`], and judges what it printed.
pub fn run_prepared(prepared: Prepared) -> Result<()> {
    let Prepared {
        kernel,
        initramfs,
        userland,
    } = prepared;
    say("booting the arm64 guest (qemu, emulated)");
    let run = arm64_vm::boot(&kernel, &initramfs, GUEST_TIMEOUT)?;
    if run.exit_status != Some(0) {
        bail!(
            "the arm64 guest's script ended with {:?} (see its console above)",
            run.exit_status
        );
    }
    let sections = sections(&run.output);
    let mut failures = judge(&sections);
    if let Err(error) = differential_test(&sections, &userland) {
        failures.push(format!("{error:#}"));
    }
    say(&format!(
        "the arm64 guest ran for {:.0} s",
        run.elapsed.as_secs_f64()
    ));
    if !failures.is_empty() {
        bail!("arm64: {}", failures.join("\n  "));
    }
    say("arm64: every check passed");
    Ok(())
}

/// `chain` in its three builds and `allocations`, for arm64 (glibc,
/// dynamically linked, as a distribution builds programs).
fn build_workloads() -> Result<Vec<PathBuf>> {
    let sources = workspace_root().join("tests/workloads");
    let out = target_dir().join("arm64-vm/workloads");
    std::fs::create_dir_all(&out).with_context(|| format!("cannot create {}", out.display()))?;
    let mut built = Vec::new();
    let mut compile = |name: &str, source: &Path, flags: &str| -> Result<()> {
        let binary = out.join(name);
        run_checked(
            Command::new("aarch64-linux-gnu-gcc")
                .args(["-O2", "-g", "-pthread"])
                .args(flags.split_whitespace())
                .arg("-o")
                .arg(&binary)
                .arg(source),
        )
        .with_context(|| format!("cannot build {name} for arm64"))?;
        built.push(binary);
        Ok(())
    };
    for (build, flags) in CHAIN_BUILDS {
        compile(&format!("chain-{build}"), &sources.join("chain.c"), flags)?;
    }
    compile("allocations", &sources.join("allocations.c"), "")?;
    for (name, source, flags) in RECORDED {
        compile(
            &format!("{source}-{}", name.split('-').nth(1).unwrap_or("nofp")),
            &sources.join(format!("{source}.c")),
            flags,
        )?;
    }
    compile(
        "arm64_snapshots",
        &workspace_root().join("xtask/src/arm64_snapshots.c"),
        "",
    )?;
    Ok(built)
}

/// The recordings, written where the differential test reads them (with a
/// `sysroot/` in which the guest's paths lead to the same files here), and
/// that test run on them.
fn differential_test(sections: &BTreeMap<String, Section>, userland: &Path) -> Result<()> {
    let dir = target_dir().join("arm64-vm/recorded");
    let _ = std::fs::remove_dir_all(&dir);
    let sysroot = dir.join("sysroot");
    std::fs::create_dir_all(sysroot.join("opt"))?;
    std::os::unix::fs::symlink(
        target_dir().join("arm64-vm/workloads"),
        sysroot.join("opt/ddprof"),
    )?;
    std::os::unix::fs::symlink(userland.join("lib"), sysroot.join("lib"))?;
    for (name, _, _) in RECORDED {
        let section = sections
            .get(&format!("snapshots {name}"))
            .with_context(|| format!("no recording of {name} in the guest's output"))?;
        let gzipped = base64_decode(&section.base64)
            .with_context(|| format!("the recording of {name} does not decode"))?;
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gzipped[..]), &mut bytes)
            .with_context(|| format!("the recording of {name} is not gzip"))?;
        std::fs::write(dir.join(format!("snapshots-{name}.bin")), bytes)?;
    }
    say("walking the recorded arm64 stacks with ddprof's walker and framehop's (tests/unwind_diff.rs)");
    run_checked(
        Command::new("cargo")
            .current_dir(workspace_root())
            .args([
                "test",
                "--release",
                "-p",
                "ddprof-tests",
                "--test",
                "unwind_diff",
            ])
            .args([
                "--",
                "--ignored",
                "--exact",
                "aarch64_recorded_stacks_match_framehop",
            ])
            .arg("--nocapture")
            .env("DDPROF_ARM64_SNAPSHOTS", &dir),
    )
    .context("the arm64 differential unwind test failed")
}

/// The guest's script. Each run's stderr goes through a pipe, which ends
/// only when the profiler (which inherited it, and outlives the command)
/// has written its files and exited.
fn guest_script() -> String {
    let mut script = format!(
        "D={GUEST_DIR}/ddprof\n\
         echo '@@ check'; $D --check; echo '@@ end'\n"
    );
    for engine in ENGINES {
        for (build, _) in CHAIN_BUILDS {
            script.push_str(&run_lines(
                &format!("cpu {engine} {build}"),
                &format!("--engine {engine} -e 'sCPU freq=199' -- {GUEST_DIR}/chain-{build} 3"),
            ));
        }
        script.push_str(&run_lines(
            &format!("alloc {engine}"),
            &format!("--engine {engine} -e 'sCPU;sALLOC' -- {GUEST_DIR}/allocations 512"),
        ));
        // Most of its time in the kernel, clearing pages for read(2).
        script.push_str(&run_lines(
            &format!("kernel {engine}"),
            &format!(
                "--engine {engine} --include-kernel -e 'sCPU freq=199' -- \
                 /bin/busybox dd if=/dev/zero of=/dev/null bs=1M count=2000"
            ),
        ));
    }
    for (name, source, _) in RECORDED {
        let binary = format!("{source}-{}", name.split('-').nth(1).unwrap_or("nofp"));
        script.push_str(&format!(
            "{GUEST_DIR}/arm64_snapshots {RECORDED_STOPS} /tmp/recorded {GUEST_DIR}/{binary} 60\n\
             echo '@@ snapshots {name}'; echo '@@ base64'; gzip -c /tmp/recorded | base64\n\
             echo '@@ end'\n"
        ));
    }
    script
}

/// One profiled run: its folded stacks (of CPU time), its log's
/// accounting lines, and its first pprof file (every sample type).
fn run_lines(name: &str, arguments: &str) -> String {
    format!(
        "rm -rf /tmp/out; $D -l info --output /tmp/out {arguments} 2>&1 >/dev/null | cat > /tmp/log\n\
         echo '@@ {name}'; cat /tmp/out/stacks.folded\n\
         echo '@@ log'; grep -E 'summary:|engine: |unwound in the kernel|warn|error' /tmp/log\n\
         echo '@@ base64'; base64 $(ls /tmp/out/*.pprof | head -n 1)\n\
         echo '@@ end'\n"
    )
}

/// One section of the console: the lines between `@@ NAME` and `@@ end`,
/// split at `@@ log` and `@@ base64` into the folded stacks, the log lines
/// and a file's base64 (a pprof file, a recording).
#[derive(Default, Debug)]
struct Section {
    folded: Vec<String>,
    log: Vec<String>,
    base64: String,
}

/// Which part of a section a line belongs to.
#[derive(Clone, Copy)]
enum Part {
    Folded,
    Log,
    Base64,
}

fn sections(output: &str) -> BTreeMap<String, Section> {
    let mut sections = BTreeMap::new();
    let mut current: Option<(String, Section, Part)> = None;
    for line in output.lines() {
        let line = line.trim_end();
        if let Some(mark) = line.strip_prefix("@@ ") {
            match (mark, current.as_mut()) {
                ("end", _) => {
                    if let Some((name, section, _)) = current.take() {
                        sections.insert(name, section);
                    }
                }
                ("log", Some((_, _, part))) => *part = Part::Log,
                ("base64", Some((_, _, part))) => *part = Part::Base64,
                (name, _) => current = Some((name.to_string(), Section::default(), Part::Folded)),
            }
            continue;
        }
        if let Some((_, section, part)) = current.as_mut() {
            match part {
                Part::Folded => section.folded.push(line.to_string()),
                Part::Log => section.log.push(line.to_string()),
                Part::Base64 => section.base64.push_str(line.trim()),
            }
        }
    }
    sections
}

/// Standard base64 (with padding), as busybox's `base64` writes it.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    let value = |byte: u8| -> Option<u32> {
        Some(match byte {
            b'A'..=b'Z' => byte - b'A',
            b'a'..=b'z' => byte - b'a' + 26,
            b'0'..=b'9' => byte - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        } as u32)
    };
    let text = text.trim_end_matches('=').as_bytes();
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for chunk in text.chunks(4) {
        let mut word = 0u32;
        for (i, byte) in chunk.iter().enumerate() {
            word |= value(*byte)? << (18 - 6 * i);
        }
        let bytes = word.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Some(out)
}

/// A folded line's stack and count.
fn folded_line(line: &str) -> Option<(&str, u64)> {
    let (stack, count) = line.rsplit_once(' ')?;
    Some((stack, count.parse().ok()?))
}

/// The `key=value` numbers of the log's summary line.
fn summary(log: &[String]) -> BTreeMap<String, u64> {
    log.iter()
        .find(|line| line.contains("summary:"))
        .map(|line| {
            line.split_whitespace()
                .filter_map(|word| {
                    let (key, value) = word.split_once('=')?;
                    Some((key.to_string(), value.parse().ok()?))
                })
                .collect()
        })
        .unwrap_or_default()
}

/// Every check; what failed, one line each. The measured figures are
/// printed as they are read.
fn judge(sections: &BTreeMap<String, Section>) -> Vec<String> {
    let mut failures = Vec::new();
    match sections.get("check") {
        Some(check) => {
            for line in &check.folded {
                say(&format!("arm64 --check: {line}"));
            }
            for expected in [
                "BPF program bpf_loop (Linux >= 5.17): loads and verifies",
                "engine (auto): BPF",
            ] {
                if !check.folded.iter().any(|line| line.starts_with(expected)) {
                    failures.push(format!("--check has no line `{expected}…`"));
                }
            }
        }
        None => failures.push("no --check output".into()),
    }
    for engine in ENGINES {
        for (build, _) in CHAIN_BUILDS {
            let name = format!("cpu {engine} {build}");
            match sections.get(&name) {
                Some(section) => failures.extend(judge_chain(&name, engine, section)),
                None => failures.push(format!("{name}: no output")),
            }
        }
        let name = format!("alloc {engine}");
        match sections.get(&name) {
            Some(section) => failures.extend(judge_allocations(&name, engine, section)),
            None => failures.push(format!("{name}: no output")),
        }
        let name = format!("kernel {engine}");
        match sections.get(&name) {
            Some(section) => failures.extend(judge_kernel_frames(&name, section)),
            None => failures.push(format!("{name}: no output")),
        }
    }
    failures
}

/// `dd` reading `/dev/zero` with `--include-kernel`: its system calls'
/// kernel frames, named from kallsyms, follow its user frames (arm64's
/// entry `el0_svc`, then `__arm64_sys_read` in ≥ 10 % of the samples).
fn judge_kernel_frames(name: &str, section: &Section) -> Vec<String> {
    let mut failures = Vec::new();
    let (mut total, mut in_syscalls, mut in_read) = (0, 0, 0);
    for (stack, count) in section.folded.iter().filter_map(|line| folded_line(line)) {
        total += count;
        let frames: Vec<&str> = stack.split(';').collect();
        if let Some(entry) = frames.iter().position(|frame| *frame == "el0_svc") {
            in_syscalls += count;
            if frames[entry..].contains(&"__arm64_sys_read") {
                in_read += count;
            }
        }
    }
    say(&format!(
        "arm64 {name}: {total} samples, {in_syscalls} with kernel frames from el0_svc, \
         {in_read} in __arm64_sys_read"
    ));
    at_least(&mut failures, name, "samples", total, 100);
    share_at_least(
        &mut failures,
        name,
        "samples in __arm64_sys_read",
        in_read,
        total,
        10,
    );
    failures
}

/// `chain`: the engine asked for ran; ≥ 95 % of the samples in the chain's
/// leaves have the whole chain up to `main`, and the profiler says ≥ 95 %
/// of all its stacks reached their root; the leaves split about 70/30.
fn judge_chain(name: &str, engine: &str, section: &Section) -> Vec<String> {
    let mut failures = Vec::new();
    let engine_line = if engine == "bpf" {
        "engine: BPF"
    } else {
        "engine: perf"
    };
    if !section.log.iter().any(|line| line.contains(engine_line)) {
        failures.push(format!(
            "{name}: the log does not say `{engine_line}`: {:?}",
            section.log
        ));
    }
    let (mut in_leaves, mut whole_chain, mut leaf_70) = (0, 0, 0);
    for (stack, count) in section.folded.iter().filter_map(|line| folded_line(line)) {
        let Some(leaf) = stack.rsplit(';').next() else {
            continue;
        };
        if !CHAIN_LEAVES.contains(&leaf) {
            continue;
        }
        in_leaves += count;
        if stack.contains(&format!("{CHAIN}{leaf}")) {
            whole_chain += count;
        }
        if leaf == CHAIN_LEAVES[0] {
            leaf_70 += count;
        }
    }
    let summary = summary(&section.log);
    let (samples, full) = (
        summary.get("samples").copied().unwrap_or(0),
        summary.get("full_stacks").copied().unwrap_or(0),
    );
    let percent = |part: u64, whole: u64| 100.0 * part as f64 / whole.max(1) as f64;
    say(&format!(
        "arm64 {name}: {samples} samples, {:.1} % full stacks; {in_leaves} in the leaves, \
         {:.1} % with the whole chain, {:.1} % in chain_leaf_70",
        percent(full, samples),
        percent(whole_chain, in_leaves),
        percent(leaf_70, in_leaves)
    ));
    at_least(
        &mut failures,
        name,
        "samples in the chain's leaves",
        in_leaves,
        100,
    );
    share_at_least(
        &mut failures,
        name,
        "leaf samples have the whole chain",
        whole_chain,
        in_leaves,
        95,
    );
    share_at_least(&mut failures, name, "stacks complete", full, samples, 95);
    let share = percent(leaf_70, in_leaves);
    if !(55.0..=85.0).contains(&share) {
        failures.push(format!(
            "{name}: chain_leaf_70 has {share:.1} % of the leaf samples"
        ));
    }
    failures
}

/// A failure when `count` of `what` is below `minimum`.
fn at_least(failures: &mut Vec<String>, name: &str, what: &str, count: u64, minimum: u64) {
    if count < minimum {
        failures.push(format!("{name}: {count} {what} (< {minimum})"));
    }
}

/// A failure when `part` is below `percent` % of `whole`.
fn share_at_least(
    failures: &mut Vec<String>,
    name: &str,
    what: &str,
    part: u64,
    whole: u64,
    percent: u64,
) {
    if part * 100 < whole * percent {
        failures.push(format!("{name}: {part} of {whole} {what} (< {percent} %)"));
    }
}

/// `allocations` under `sALLOC`: samples came (the library is preloaded
/// and its marker probed), ≥ 90 % of them in an allocating function with
/// `main` above it; with the BPF engine, most unwound in the kernel.
fn judge_allocations(name: &str, engine: &str, section: &Section) -> Vec<String> {
    let mut failures = Vec::new();
    let profile = base64_decode(&section.base64)
        .context("the pprof file's base64 does not decode")
        .and_then(|bytes| crate::pprof::parse(&bytes));
    let profile = match profile {
        Ok(profile) => profile,
        Err(error) => return vec![format!("{name}: no pprof file read: {error:#}")],
    };
    let Some(index) = profile.sample_type("alloc-samples") else {
        return vec![format!(
            "{name}: no alloc-samples in {:?}",
            profile.sample_types
        )];
    };
    let (mut total, mut placed) = (0, 0);
    for sample in &profile.samples {
        let count = sample.values.get(index).copied().unwrap_or(0);
        if count <= 0 {
            continue;
        }
        total += 1;
        let leaf = sample.functions.first().map_or("", String::as_str);
        if ALLOCATING.contains(&leaf) && sample.functions.iter().any(|f| f == "main") {
            placed += 1;
        }
    }
    let taken = summary(&section.log)
        .get("alloc_samples")
        .copied()
        .unwrap_or(0);
    let in_kernel: u64 = section
        .log
        .iter()
        .filter_map(|line| {
            let (before, _) = line.split_once(" allocation samples unwound in the kernel")?;
            before.split_whitespace().last()?.parse::<u64>().ok()
        })
        .sum();
    say(&format!(
        "arm64 {name}: {taken} allocation samples; of the pprof's {total} allocation stacks, {placed} \
         in an allocating function under main; {in_kernel} unwound in the kernel"
    ));
    at_least(
        &mut failures,
        name,
        "allocation stacks in the pprof file",
        total,
        100,
    );
    share_at_least(
        &mut failures,
        name,
        "allocation stacks in an allocating function under main",
        placed,
        total,
        90,
    );
    if engine == "bpf" && in_kernel * 2 < taken {
        failures.push(format!(
            "{name}: {in_kernel} of {taken} allocation samples unwound in the kernel (< 50 %)"
        ));
    }
    failures
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sections_split_the_console_at_the_markers() {
        let console =
            "boot noise\n@@ cpu bpf fp\nchain;main 3\n@@ log\nsummary: samples=3\n@@ end\n\
                       @@ check\nkernel: Linux\n@@ end\n";
        let sections = sections(console);
        assert_eq!(sections["cpu bpf fp"].folded, ["chain;main 3"]);
        assert_eq!(sections["cpu bpf fp"].log, ["summary: samples=3"]);
        assert_eq!(summary(&sections["cpu bpf fp"].log)["samples"], 3);
        assert_eq!(sections["check"].folded, ["kernel: Linux"]);
    }

    #[test]
    fn base64_decodes_as_busybox_encodes() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGVsbG8h").unwrap(), b"hello!");
        assert_eq!(base64_decode("").unwrap(), b"");
        assert!(base64_decode("a$==").is_none());
    }

    #[test]
    fn a_chain_without_its_middle_fails() {
        let section = Section {
            base64: String::new(),
            folded: vec![
                format!("chain;_start;{CHAIN}chain_leaf_70 140"),
                "chain;[truncated];chain_leaf_30 60".into(),
            ],
            log: vec![
                "engine: BPF".into(),
                "summary: samples=200 lost=0 full_stacks=140".into(),
            ],
        };
        let failures = judge_chain("cpu bpf fp", "bpf", &section);
        assert_eq!(failures.len(), 2, "{failures:?}");
        let complete = Section {
            base64: String::new(),
            folded: vec![
                format!("chain;_start;{CHAIN}chain_leaf_70 140"),
                format!("chain;_start;{CHAIN}chain_leaf_30 60"),
            ],
            log: vec![
                "engine: BPF".into(),
                "summary: samples=200 lost=0 full_stacks=200".into(),
            ],
        };
        assert!(judge_chain("cpu bpf fp", "bpf", &complete).is_empty());
        assert_eq!(judge_chain("cpu perf fp", "perf", &complete).len(), 1);
    }
}

//! Differential test of ddprof's stack walker against framehop (a
//! reference DWARF unwinder) on real processes: the one walker
//! (`ddprof_common::unwind::Walker`) that the BPF program and the perf
//! engine's unwinder both drive, here through the latter.
//!
//! Each workload is built with `cc -O2 -fomit-frame-pointer -g` (so only
//! CFI unwinds it), run, and stopped at random moments with
//! `PTRACE_INTERRUPT`; its registers and the stack bytes from SP are read
//! (`process_vm_readv`, as the kernel's `PERF_SAMPLE_STACK_USER` copy would
//! give them) and both unwinders walk the very same bytes. The frames must
//! agree for >= 99.5 % of the samples and ours must reach `main` (or the
//! thread's start function) and the thread's root for >= 99 %. Two more
//! workloads cover a thread's root (glibc's clone3 child) and signal frames
//! (`__restore_rt`).
//!
//! arm64: the same comparison against framehop's aarch64 unwinder, on
//! stacks recorded the same way in the emulated arm64 guest of `cargo
//! xtask test-arm64` (`xtask/src/arm64_snapshots.c`), which then runs the
//! ignored test below with the recordings.
use ddprof::process::ProcessTable;
use ddprof::sample::StackEnd;
use ddprof::unwind::{Unwinder, UserRegs};
use framehop::aarch64::{CacheAarch64, UnwindRegsAarch64, UnwinderAarch64};
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder as _};
use nix::sys::ptrace;
use nix::sys::signal::{kill, Signal};
use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use std::io::{BufRead, BufReader, IoSliceMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SAMPLES: usize = 300;
const MAX_FRAMES: usize = 1024;

fn workload_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads")
}

/// A directory of its own for one run's binaries (removed when the run ends).
fn scratch_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ddprof-unwind-diff-{}-{name}", std::process::id()))
}

/// Compiles `tests/workloads/<name>.c` into a fresh temporary directory.
fn build_workload(name: &str) -> PathBuf {
    let out_dir = scratch_dir(name);
    std::fs::create_dir_all(&out_dir).unwrap();
    let binary = out_dir.join(name);
    let source = workload_dir().join(format!("{name}.c"));
    let status = Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-g", "-o"])
        .arg(&binary)
        .arg(&source)
        .status()
        .expect("a C compiler `cc` is needed to build the workloads");
    assert!(status.success(), "cc failed on {}", source.display());
    binary
}

/// Builds `name` without `.eh_frame` for its own code
/// (`-fno-asynchronous-unwind-tables`: its CFI is in `.debug_frame` only),
/// moves the debug sections to `.debug/<name>.debug` and links them with
/// `.gnu_debuglink`, as distributions ship stripped binaries.
fn build_split_debug_workload(name: &str) -> PathBuf {
    let out_dir = scratch_dir(&format!("{name}-split"));
    std::fs::create_dir_all(out_dir.join(".debug")).unwrap();
    let binary = out_dir.join(name);
    let debug = out_dir.join(".debug").join(format!("{name}.debug"));
    let source = workload_dir().join(format!("{name}.c"));
    let run = |command: &mut Command| {
        let status = command.status().unwrap();
        assert!(status.success(), "{command:?} failed");
    };
    run(Command::new("cc")
        .args(["-O2", "-fomit-frame-pointer", "-g"])
        .args([
            "-fno-asynchronous-unwind-tables",
            "-fno-unwind-tables",
            "-o",
        ])
        .arg(&binary)
        .arg(&source));
    run(Command::new("objcopy")
        .arg("--only-keep-debug")
        .arg(&binary)
        .arg(&debug));
    run(Command::new("strip").arg("--strip-debug").arg(&binary));
    run(Command::new("objcopy")
        .arg(format!("--add-gnu-debuglink={}", debug.display()))
        .arg(&binary));
    binary
}

/// A running workload, killed on drop.
struct Workload {
    child: Child,
    pid: Pid,
    /// The thread to sample: the one that printed "ready <tid>", else the
    /// main thread.
    tid: Pid,
}

impl Workload {
    fn start(binary: &Path) -> Workload {
        let mut child = Command::new(binary).stdout(Stdio::piped()).spawn().unwrap();
        // Wait until it runs its main loop (all libraries are mapped).
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("ready"), "{line:?}");
        let pid = Pid::from_raw(child.id() as i32);
        let tid = words
            .next()
            .map_or(pid, |tid| Pid::from_raw(tid.parse().unwrap()));
        Workload { child, pid, tid }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = kill(self.pid, Signal::SIGKILL);
        // A traced thread that is not the leader must be reaped by its
        // tracer (us) before the process can be.
        if self.tid != self.pid {
            while let Ok(status) = waitpid(self.tid, Some(WaitPidFlag::__WALL)) {
                if matches!(status, WaitStatus::Exited(..) | WaitStatus::Signaled(..)) {
                    break;
                }
            }
        }
        let _ = self.child.wait();
    }
}

/// One stop of the workload: its registers and the stack copied from SP.
struct Snapshot {
    regs: UserRegs,
    stack: Vec<u8>,
}

/// End of the stack mapping that holds `sp` (the main thread's `[stack]`,
/// or a thread's anonymous stack mapping).
fn stack_top(pid: Pid, sp: u64) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    maps.lines()
        .filter_map(|line| {
            let (start, end) = line.split_whitespace().next()?.split_once('-')?;
            Some((
                u64::from_str_radix(start, 16).ok()?,
                u64::from_str_radix(end, 16).ok()?,
            ))
        })
        .find(|&(start, end)| sp >= start && sp < end)
        .expect("SP is in a mapping")
        .1
}

/// Stops the (seized) thread `tid` of `pid`, reads its registers and up to
/// `stack_bytes` of its stack, and lets it run again.
fn snapshot(pid: Pid, tid: Pid, stack_bytes: usize) -> Snapshot {
    ptrace::interrupt(tid).unwrap();
    loop {
        match waitpid(tid, Some(WaitPidFlag::__WALL)).unwrap() {
            WaitStatus::PtraceEvent(_, _, event) if event == libc::PTRACE_EVENT_STOP => break,
            // A signal on its way: deliver it and wait for our stop.
            WaitStatus::Stopped(_, signal) => ptrace::cont(tid, Some(signal)).unwrap(),
            other => panic!("unexpected wait status {other:?}"),
        }
    }
    let regs = ptrace::getregs(tid).unwrap();
    let len = stack_bytes.min((stack_top(pid, regs.rsp) - regs.rsp) as usize);
    let mut stack = vec![0u8; len];
    let read = process_vm_readv(
        pid,
        &mut [IoSliceMut::new(&mut stack)],
        &[RemoteIoVec {
            base: regs.rsp as usize,
            len,
        }],
    )
    .unwrap();
    stack.truncate(read);
    ptrace::cont(tid, None).unwrap();
    Snapshot {
        // All of them, as a perf sample carries them (by DWARF number).
        regs: UserRegs {
            others: [
                regs.rax, regs.rdx, regs.rcx, regs.rbx, regs.rsi, regs.rdi, 0, 0, regs.r8, regs.r9,
                regs.r10, regs.r11, regs.r12, regs.r13, regs.r14, regs.r15,
            ],
            known: UserRegs::ALL_KNOWN,
            ..UserRegs::new(regs.rip, regs.rsp, regs.rbp)
        },
        stack,
    }
}

/// framehop, set up from the same mappings, reading the ELF files itself.
fn reference_unwinder(processes: &ProcessTable, pid: u32) -> UnwinderX86_64<Vec<u8>> {
    let mut unwinder = UnwinderX86_64::new();
    for module in reference_modules(processes, pid, &|path| PathBuf::from(path)) {
        unwinder.add_module(module);
    }
    unwinder
}

/// framehop's modules for the mappings of `pid`, whose files are read at
/// `host_path(the mapped path)`.
fn reference_modules(
    processes: &ProcessTable,
    pid: u32,
    host_path: &dyn Fn(&str) -> PathBuf,
) -> Vec<Module<Vec<u8>>> {
    let mut modules = Vec::new();
    for mapping in &processes.get(pid).unwrap().mappings {
        if !mapping.file.path.starts_with('/') {
            continue;
        }
        let data = std::fs::read(host_path(&mapping.file.path)).unwrap();
        let file = object::File::parse(data.as_slice()).unwrap();
        // The executable segment holding this mapping's file offset.
        let Some((p_offset, p_vaddr)) = file.segments().find_map(|segment| {
            let (offset, size) = segment.file_range();
            let executable = matches!(segment.flags(),
                object::SegmentFlags::Elf { p_flags, .. } if p_flags.0 & object::elf::PF_X.0 != 0);
            (executable
                && mapping.file_offset >= offset & !0xfff
                && mapping.file_offset < offset + size)
                .then(|| (offset, segment.address()))
        }) else {
            continue;
        };
        let base_avma = mapping.start - mapping.file_offset + p_offset - p_vaddr;
        let section = |name: &str| {
            file.section_by_name(name).map(|s| {
                (
                    s.address()..s.address() + s.size(),
                    s.uncompressed_data().unwrap().into_owned(),
                )
            })
        };
        let text = section(".text");
        let eh_frame = section(".eh_frame");
        let eh_frame_hdr = section(".eh_frame_hdr");
        let info = ExplicitModuleSectionInfo {
            base_svma: 0,
            text_svma: text.map(|t| t.0),
            got_svma: section(".got").map(|g| g.0),
            eh_frame_svma: eh_frame.as_ref().map(|e| e.0.clone()),
            eh_frame: eh_frame.map(|e| e.1),
            eh_frame_hdr_svma: eh_frame_hdr.as_ref().map(|e| e.0.clone()),
            eh_frame_hdr: eh_frame_hdr.map(|e| e.1),
            debug_frame: section(".debug_frame").map(|d| d.1),
            ..Default::default()
        };
        modules.push(Module::new(
            mapping.file.path.clone(),
            mapping.start..mapping.end,
            base_avma,
            info,
        ));
    }
    modules
}

/// Address range of function `name` of the workload, in the running process.
fn function_range(
    processes: &ProcessTable,
    pid: u32,
    binary: &Path,
    name: &str,
) -> std::ops::Range<u64> {
    function_range_mapped(processes, pid, binary, binary.to_str().unwrap(), name)
}

/// [`function_range`] of a binary read at `binary` but mapped as `mapped`.
fn function_range_mapped(
    processes: &ProcessTable,
    pid: u32,
    binary: &Path,
    mapped: &str,
    name: &str,
) -> std::ops::Range<u64> {
    let data = std::fs::read(binary).unwrap();
    let file = object::File::parse(data.as_slice()).unwrap();
    let function = file.symbols().find(|s| s.name() == Ok(name)).unwrap();
    let binary = mapped;
    let mapping = processes
        .get(pid)
        .unwrap()
        .mappings
        .iter()
        .find(|m| m.file.path == binary)
        .unwrap();
    let (p_offset, p_vaddr) = file
        .segments()
        .find(|s| {
            let (offset, size) = s.file_range();
            mapping.file_offset >= offset & !0xfff && mapping.file_offset < offset + size
        })
        .map(|s| (s.file_range().0, s.address()))
        .unwrap();
    let bias = mapping.start - mapping.file_offset + p_offset - p_vaddr;
    bias + function.address()..bias + function.address() + function.size()
}

/// framehop's frames of one walk (at most [`MAX_FRAMES`]), from its
/// iterator's `next`, and whether it reached the thread's root.
fn reference_frames<E>(mut next: impl FnMut() -> Result<Option<u64>, E>) -> (Vec<u64>, bool) {
    let mut frames = Vec::new();
    let complete = loop {
        match next() {
            Ok(Some(address)) if frames.len() < MAX_FRAMES => frames.push(address),
            Ok(Some(_)) => break false,
            Ok(None) => break true,
            Err(_) => break false,
        }
    };
    (frames, complete)
}

/// Index of the first frame in `function` (frames after the first are
/// return addresses: the call is at pc - 1).
fn frame_in(frames: &[u64], function: &std::ops::Range<u64>) -> Option<usize> {
    frames
        .iter()
        .enumerate()
        .position(|(i, &pc)| function.contains(&if i == 0 { pc } else { pc - 1 }))
}

#[derive(Debug, Default)]
struct Figures {
    samples: usize,
    equal: usize,
    ours_reached_root: usize,
    reference_reached_root: usize,
    /// Samples whose stack (ours) goes through the signal handler.
    in_signal_handler: usize,
    max_depth: usize,
    frame_pointer_steps: u64,
}

struct Case<'a> {
    workload: &'a str,
    stack_bytes: usize,
    /// The function every stack must pass through before the thread's root.
    root_function: &'a str,
    /// A signal handler: framehop cannot evaluate the signal frame's
    /// `DW_OP_deref` expressions, so in stacks through the handler frames
    /// are compared up to the handler's return into the signal trampoline.
    signal_handler: Option<&'a str>,
    /// Build with CFI only in a split debug file (framehop is not given it,
    /// so only our unwinder's figures count).
    split_debug: bool,
}

fn case(workload: &str, stack_bytes: usize) -> Case<'_> {
    Case {
        workload,
        stack_bytes,
        root_function: "main",
        signal_handler: None,
        split_debug: false,
    }
}

fn run_workload(case: &Case) -> Figures {
    let label = if case.split_debug {
        format!("{} (CFI only in a split .debug_frame)", case.workload)
    } else {
        case.workload.to_string()
    };
    let name = label.as_str();
    let binary = if case.split_debug {
        build_split_debug_workload(case.workload)
    } else {
        build_workload(case.workload)
    };
    let workload = Workload::start(&binary);
    let (pid, tid) = (workload.pid, workload.tid);
    let raw_pid = pid.as_raw() as u32;
    let mut processes = ProcessTable::new();
    processes.load_from_proc(raw_pid).unwrap();
    let reference = reference_unwinder(&processes, raw_pid);
    let root = function_range(&processes, raw_pid, &binary, case.root_function);
    let handler = case
        .signal_handler
        .map(|f| function_range(&processes, raw_pid, &binary, f));
    ptrace::seize(tid, ptrace::Options::empty()).unwrap();

    let mut unwinder = Unwinder::new();
    let mut cache = CacheX86_64::<_>::new();
    let mut figures = Figures::default();
    let mut shown = 0;
    // Informational only (no assertion on time), without the first sample,
    // which builds our tables.
    let (mut ours_time, mut theirs_time) = (Duration::ZERO, Duration::ZERO);
    let mut random = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    for _ in 0..SAMPLES {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        std::thread::sleep(Duration::from_micros(200 + random % 3000));
        let Snapshot { regs, stack } = snapshot(pid, tid, case.stack_bytes);

        let mut ours = Vec::new();
        let started = Instant::now();
        let end = unwinder.unwind(&processes, raw_pid, &regs, &stack, MAX_FRAMES, &mut ours);
        if figures.samples > 0 {
            ours_time += started.elapsed();
        }
        let reached_root = end == StackEnd::Complete && frame_in(&ours, &root).is_some();

        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let offset = addr.checked_sub(regs.sp).ok_or(())? as usize;
            let bytes = stack.get(offset..offset + 8).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().unwrap()))
        };
        let mut iter = reference.iter_frames(
            regs.ip,
            UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp),
            &mut cache,
            &mut read_stack,
        );
        let started = Instant::now();
        let (theirs, reference_complete) =
            reference_frames(|| iter.next().map(|frame| frame.map(|f| f.address())));
        if figures.samples > 0 {
            theirs_time += started.elapsed();
        }

        figures.samples += 1;
        figures.max_depth = figures.max_depth.max(ours.len());
        let mut compared = (ours.as_slice(), theirs.as_slice());
        if let Some(index) = handler.as_ref().and_then(|h| frame_in(&ours, h)) {
            figures.in_signal_handler += 1;
            // Up to and including the handler's return address.
            let len = index + 2;
            compared = (
                &ours[..len.min(ours.len())],
                &theirs[..len.min(theirs.len())],
            );
        }
        if compared.0 == compared.1 {
            figures.equal += 1;
        } else if shown < 5 && !case.split_debug {
            shown += 1;
            eprintln!(
                "{name}: mismatch at ip {:#x} sp {:#x} ({end:?}):\n  ours   {:x?}\n  theirs {:x?}",
                regs.ip,
                regs.sp,
                &ours[..ours.len().min(12)],
                &theirs[..theirs.len().min(12)]
            );
        }
        if reached_root {
            figures.ours_reached_root += 1;
        } else if shown < 5 {
            shown += 1;
            eprintln!(
                "{name}: incomplete ({end:?}) at ip {:#x}: {:x?}",
                regs.ip,
                &ours[..ours.len().min(12)]
            );
        }
        if reference_complete {
            figures.reference_reached_root += 1;
        }
    }
    let stats = unwinder.stats();
    eprintln!(
        "{name}: {} samples, {} equal to framehop ({:.1} %), ours reached {} and the root in {} ({:.1} %), \
         framehop reached the root in {} ({:.1} %), {} through a signal handler, deepest {} frames; \
         table steps {}, frame-pointer steps {}",
        figures.samples,
        figures.equal,
        100.0 * figures.equal as f64 / figures.samples as f64,
        case.root_function,
        figures.ours_reached_root,
        100.0 * figures.ours_reached_root as f64 / figures.samples as f64,
        figures.reference_reached_root,
        100.0 * figures.reference_reached_root as f64 / figures.samples as f64,
        figures.in_signal_handler,
        figures.max_depth,
        stats.table_steps,
        stats.frame_pointer_steps,
    );
    eprintln!(
        "{name}: unwind time per sample after the first: ours {:.1} us, framehop {:.1} us",
        ours_time.as_secs_f64() * 1e6 / (figures.samples - 1) as f64,
        theirs_time.as_secs_f64() * 1e6 / (figures.samples - 1) as f64,
    );
    figures.frame_pointer_steps = stats.frame_pointer_steps;
    drop(workload);
    if let Some(dir) = binary.parent() {
        let _ = std::fs::remove_dir_all(dir);
    }
    figures
}

fn check_reached_root(figures: &Figures, name: &str) {
    assert!(figures.samples >= 200, "{name}: {figures:?}");
    assert!(
        figures.ours_reached_root * 100 >= figures.samples * 99,
        "{name}: too few stacks reach the root: {figures:?}"
    );
}

fn check(figures: &Figures, name: &str) {
    check_reached_root(figures, name);
    assert!(
        figures.equal * 1000 >= figures.samples * 995,
        "{name}: frames differ from framehop's too often: {figures:?}"
    );
}

#[test]
fn six_deep_chain_matches_framehop() {
    let figures = run_workload(&case("unwind_chain", 32000));
    check(&figures, "unwind_chain");
    assert!(figures.max_depth >= 10, "{figures:?}");
}

#[test]
fn qsort_callback_through_libc_matches_framehop() {
    let figures = run_workload(&case("unwind_qsort", 32000));
    check(&figures, "unwind_qsort");
}

#[test]
fn deep_recursion_matches_framehop() {
    let figures = run_workload(&case("unwind_recursion", 64 * 1024));
    check(&figures, "unwind_recursion");
    assert!(figures.max_depth >= 300, "{figures:?}");
}

#[test]
fn thread_stacks_end_at_the_thread_root() {
    let figures = run_workload(&Case {
        root_function: "thread_main",
        ..case("unwind_thread", 32000)
    });
    check(&figures, "unwind_thread");
}

#[test]
fn signal_frames_unwind_back_into_the_interrupted_code() {
    let figures = run_workload(&Case {
        signal_handler: Some("on_signal"),
        ..case("unwind_signal", 32000)
    });
    check(&figures, "unwind_signal");
    // The handler spins far longer than the rest of the loop runs.
    assert!(
        figures.in_signal_handler * 2 >= figures.samples,
        "{figures:?}"
    );
}

#[test]
fn debug_frame_from_a_split_debug_file() {
    let figures = run_workload(&Case {
        split_debug: true,
        ..case("unwind_chain", 32000)
    });
    check_reached_root(&figures, "unwind_chain (split .debug_frame)");
    // Every frame was unwound with rows (from the debug file's
    // .debug_frame), none with frame pointers.
    assert_eq!(figures.frame_pointer_steps, 0, "{figures:?}");
    assert!(figures.max_depth >= 10, "{figures:?}");
}

/// One stop recorded in the arm64 guest: X0-X30, SP, PC, PSTATE and the
/// stack bytes from SP.
struct Arm64Snapshot {
    registers: [u64; 34],
    stack: Vec<u8>,
}

/// A recording of `arm64_snapshots`: the process's maps, then its stops.
fn parse_arm64_snapshots(bytes: &[u8]) -> (String, Vec<Arm64Snapshot>) {
    assert_eq!(
        &bytes[..8],
        b"DDSNAP1\n",
        "not a recording of arm64_snapshots"
    );
    let mut at = 8;
    let u64_at = |at: &mut usize| {
        let value = u64::from_le_bytes(bytes[*at..*at + 8].try_into().unwrap());
        *at += 8;
        value
    };
    let maps_len = u64_at(&mut at) as usize;
    let maps = String::from_utf8_lossy(&bytes[at..at + maps_len]).into_owned();
    at += maps_len;
    let mut snapshots = Vec::new();
    while at < bytes.len() {
        let mut registers = [0u64; 34];
        for register in &mut registers {
            *register = u64_at(&mut at);
        }
        let len = u64_at(&mut at) as usize;
        snapshots.push(Arm64Snapshot {
            registers,
            stack: bytes[at..at + len].to_vec(),
        });
        at += len;
    }
    (maps, snapshots)
}

/// What a recorded arm64 stack is compared with.
enum Arm64Reference<'a> {
    /// framehop's aarch64 unwinder, on the same bytes.
    Framehop,
    /// The program's call chain, innermost first: the frames of ours in
    /// the program must be a tail of it (`chain6 … chain1 main`). For code
    /// whose return addresses are signed: framehop 0.16 reads no
    /// `DW_CFA_AARCH64_negate_ra_state` (its CFI parser is not told the
    /// file is arm64's), so it loses those functions' CFI and skips frames.
    CallChain(&'a [&'a str]),
}

/// Walks the recorded stacks of `workload` (`snapshots-WORKLOAD.bin` in
/// `dir`, its files under `dir/sysroot`) with ours, and compares them
/// with `reference`.
fn run_arm64_recording(
    dir: &Path,
    workload: &str,
    binary: &str,
    reference_kind: Arm64Reference,
) -> Figures {
    use ddprof::files::{ContentKey, Digest};
    use ddprof::unwind::compile::compile_elf;
    use ddprof_common::unwind::Isa;

    let bytes = std::fs::read(dir.join(format!("snapshots-{workload}.bin"))).unwrap();
    let (maps, snapshots) = parse_arm64_snapshots(&bytes);
    let sysroot = dir.join("sysroot");
    let host_path = |path: &str| sysroot.join(path.trim_start_matches('/'));
    let pid = 1;
    let mut processes = ProcessTable::new();
    let mut vdso = 0..0;
    for line in maps.lines() {
        let Some(record) = ddprof::process::parse_maps_line(pid, line) else {
            continue;
        };
        if record.path == "[vdso]" {
            vdso = record.start..record.start + record.len;
        }
        processes.add_mapping(&record);
    }
    // Ours: the tables of the same files, compiled here (the guest's paths
    // are not this machine's).
    let mut unwinder = Unwinder::for_isa(Isa::Aarch64);
    for mapping in &processes.get(pid).unwrap().mappings {
        if !mapping.file.path.starts_with('/') {
            continue;
        }
        let data = std::fs::read(host_path(&mapping.file.path)).unwrap();
        let table = compile_elf(data.as_slice(), None).unwrap();
        let key = ContentKey {
            file: Digest::of_bytes(&data),
            debug_file: None,
        };
        unwinder.tables().preload(mapping.file.clone(), key, table);
    }
    let mut reference = UnwinderAarch64::new();
    for module in reference_modules(&processes, pid, &host_path) {
        reference.add_module(module);
    }
    let root = function_range_mapped(&processes, pid, &host_path(binary), binary, "main");
    let chain: Vec<(&str, std::ops::Range<u64>)> = match reference_kind {
        Arm64Reference::Framehop => Vec::new(),
        Arm64Reference::CallChain(names) => names
            .iter()
            .map(|name| {
                let range =
                    function_range_mapped(&processes, pid, &host_path(binary), binary, name);
                (*name, range)
            })
            .collect(),
    };
    let mut cache = CacheAarch64::<_>::new();
    let mut figures = Figures::default();
    let mut shown = 0;
    let mut in_vdso = 0;
    for snapshot in &snapshots {
        let r = &snapshot.registers;
        let (sp, pc, fp, lr) = (r[31], r[32], r[29], r[30]);
        // The vDSO's code is not on this machine: those stops are left out.
        if vdso.contains(&pc) {
            in_vdso += 1;
            continue;
        }
        let mut regs = UserRegs::new(pc, sp, fp);
        regs.lr = lr;
        regs.others.copy_from_slice(&r[..16]);
        regs.known = UserRegs::ALL_KNOWN;
        let mut ours = Vec::new();
        let end = unwinder.unwind(
            &processes,
            pid,
            &regs,
            &snapshot.stack,
            MAX_FRAMES,
            &mut ours,
        );
        let reached_root = end == StackEnd::Complete && frame_in(&ours, &root).is_some();
        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let offset = addr.checked_sub(sp).ok_or(())? as usize;
            let bytes = snapshot.stack.get(offset..offset + 8).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().unwrap()))
        };
        let mut iter = reference.iter_frames(
            pc,
            UnwindRegsAarch64::new(lr, sp, fp),
            &mut cache,
            &mut read_stack,
        );
        let (theirs, reference_complete) =
            reference_frames(|| iter.next().map(|frame| frame.map(|f| f.address())));
        figures.samples += 1;
        figures.max_depth = figures.max_depth.max(ours.len());
        let agrees = if chain.is_empty() {
            ours == theirs
        } else {
            // Our frames in the program, by name: a tail of the chain.
            let named: Vec<&str> = ours
                .iter()
                .enumerate()
                .filter_map(|(i, &pc)| {
                    let at = if i == 0 { pc } else { pc - 1 };
                    chain
                        .iter()
                        .find(|(_, range)| range.contains(&at))
                        .map(|(name, _)| *name)
                })
                .collect();
            let names: Vec<&str> = chain.iter().map(|(name, _)| *name).collect();
            !named.is_empty() && names.ends_with(&named)
        };
        if agrees {
            figures.equal += 1;
        } else if shown < 5 {
            shown += 1;
            eprintln!(
                "arm64 {workload}: mismatch at pc {pc:#x} sp {sp:#x} ({end:?}):\n  ours   {:x?}\n  theirs {:x?}",
                &ours[..ours.len().min(12)],
                &theirs[..theirs.len().min(12)]
            );
        }
        if reached_root {
            figures.ours_reached_root += 1;
        }
        if reference_complete {
            figures.reference_reached_root += 1;
        }
    }
    let stats = unwinder.stats();
    let compared_with = if chain.is_empty() {
        "equal to framehop's aarch64 unwinder"
    } else {
        "with the program's whole call chain"
    };
    eprintln!(
        "arm64 {workload}: {} samples ({in_vdso} more in the vDSO, left out), {} {compared_with} \
         ({:.1} %), ours reached main and the root in {} ({:.1} %), framehop reached the root in {}, \
         deepest {} frames; table steps {}, frame-pointer steps {}",
        figures.samples,
        figures.equal,
        100.0 * figures.equal as f64 / figures.samples.max(1) as f64,
        figures.ours_reached_root,
        100.0 * figures.ours_reached_root as f64 / figures.samples.max(1) as f64,
        figures.reference_reached_root,
        figures.max_depth,
        stats.table_steps,
        stats.frame_pointer_steps,
    );
    figures
}

#[test]
#[ignore = "needs stacks recorded in the arm64 guest: `cargo xtask test-arm64` runs it with them"]
fn aarch64_recorded_stacks_match_framehop() {
    let dir = PathBuf::from(std::env::var_os("DDPROF_ARM64_SNAPSHOTS").expect(
        "DDPROF_ARM64_SNAPSHOTS (a directory of recordings): run `cargo xtask test-arm64`",
    ));
    let chain = [
        "chain6", "chain5", "chain4", "chain3", "chain2", "chain1", "main",
    ];
    for (workload, binary, reference) in [
        (
            "chain-nofp",
            "/opt/ddprof/unwind_chain-nofp",
            Arm64Reference::Framehop,
        ),
        (
            "qsort",
            "/opt/ddprof/unwind_qsort-nofp",
            Arm64Reference::Framehop,
        ),
        // Return addresses signed by pointer authentication.
        (
            "chain-pac",
            "/opt/ddprof/unwind_chain-pac",
            Arm64Reference::CallChain(&chain),
        ),
    ] {
        let figures = run_arm64_recording(&dir, workload, binary, reference);
        check(&figures, &format!("arm64 {workload}"));
        assert!(figures.max_depth >= 10, "arm64 {workload}: {figures:?}");
    }
}

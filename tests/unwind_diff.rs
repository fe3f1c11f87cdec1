//! Differential test of ddprof's user-side unwinder against framehop (a
//! reference DWARF unwinder) on real processes.
//!
//! Each workload is built with `cc -O2 -fomit-frame-pointer -g` (so only
//! CFI unwinds it), run, and stopped at random moments with
//! `PTRACE_INTERRUPT`; its registers and the stack bytes from SP are read
//! (`process_vm_readv`, as the kernel's `PERF_SAMPLE_STACK_USER` copy would
//! give them) and both unwinders walk the very same bytes. The frames must
//! agree for >= 99.5 % of the samples and ours must reach `main` and the
//! thread's root for >= 99 %.
use ddprof::process::ProcessTable;
use ddprof::sample::StackEnd;
use ddprof::unwind::{Unwinder, UserRegs};
use framehop::x86_64::{CacheX86_64, UnwindRegsX86_64, UnwinderX86_64};
use framehop::{ExplicitModuleSectionInfo, Module, Unwinder as _};
use nix::sys::ptrace;
use nix::sys::signal::{kill, Signal};
use nix::sys::uio::{process_vm_readv, RemoteIoVec};
use nix::sys::wait::{waitpid, WaitStatus};
use nix::unistd::Pid;
use object::{Object, ObjectSection, ObjectSegment, ObjectSymbol};
use std::io::{BufRead, BufReader, IoSliceMut};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SAMPLES: usize = 300;
const MAX_FRAMES: usize = 1024;

fn workload_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads")
}

/// Compiles `tests/workloads/<name>.c` into a fresh temporary directory.
fn build_workload(name: &str) -> PathBuf {
    let out_dir = std::env::temp_dir().join(format!("ddprof-unwind-diff-{}", std::process::id()));
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

/// A running workload, killed on drop.
struct Workload {
    child: Child,
    pid: Pid,
}

impl Workload {
    fn start(binary: &Path) -> Workload {
        let mut child = Command::new(binary).stdout(Stdio::piped()).spawn().unwrap();
        // Wait until it runs its main loop (all libraries are mapped).
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(line.trim(), "ready");
        let pid = Pid::from_raw(child.id() as i32);
        Workload { child, pid }
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        let _ = kill(self.pid, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

/// One stop of the workload: its registers and the stack copied from SP.
struct Snapshot {
    regs: UserRegs,
    stack: Vec<u8>,
}

/// End of the main thread's stack (`[stack]` in /proc/PID/maps).
fn stack_top(pid: Pid) -> u64 {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap();
    let line = maps.lines().find(|l| l.ends_with("[stack]")).unwrap();
    let range = line.split_whitespace().next().unwrap();
    u64::from_str_radix(range.split_once('-').unwrap().1, 16).unwrap()
}

/// Stops the (seized) workload, reads registers and up to `stack_bytes` of
/// stack, and lets it run again.
fn snapshot(pid: Pid, stack_top: u64, stack_bytes: usize) -> Snapshot {
    ptrace::interrupt(pid).unwrap();
    loop {
        match waitpid(pid, None).unwrap() {
            WaitStatus::PtraceEvent(_, _, event) if event == libc::PTRACE_EVENT_STOP => break,
            // A signal on its way: deliver it and wait for our stop.
            WaitStatus::Stopped(_, signal) => ptrace::cont(pid, Some(signal)).unwrap(),
            other => panic!("unexpected wait status {other:?}"),
        }
    }
    let regs = ptrace::getregs(pid).unwrap();
    let len = stack_bytes.min((stack_top - regs.rsp) as usize);
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
    ptrace::cont(pid, None).unwrap();
    Snapshot {
        regs: UserRegs {
            ip: regs.rip,
            sp: regs.rsp,
            bp: regs.rbp,
        },
        stack,
    }
}

/// framehop, set up from the same mappings, reading the ELF files itself.
fn reference_unwinder(processes: &ProcessTable, pid: u32) -> UnwinderX86_64<Vec<u8>> {
    let mut unwinder = UnwinderX86_64::new();
    for mapping in &processes.get(pid).unwrap().mappings {
        if !mapping.file.path.starts_with('/') {
            continue;
        }
        let data = std::fs::read(&mapping.file.path).unwrap();
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
        unwinder.add_module(Module::new(
            mapping.file.path.clone(),
            mapping.start..mapping.end,
            base_avma,
            info,
        ));
    }
    unwinder
}

/// Address range of `main` in the running workload.
fn main_range(processes: &ProcessTable, pid: u32, binary: &Path) -> std::ops::Range<u64> {
    let data = std::fs::read(binary).unwrap();
    let file = object::File::parse(data.as_slice()).unwrap();
    let main = file.symbols().find(|s| s.name() == Ok("main")).unwrap();
    let binary = binary.to_str().unwrap();
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
    bias + main.address()..bias + main.address() + main.size()
}

#[derive(Debug, Default)]
struct Figures {
    samples: usize,
    equal: usize,
    ours_reached_main_and_root: usize,
    reference_reached_root: usize,
    max_depth: usize,
}

fn run_workload(name: &str, stack_bytes: usize) -> Figures {
    let binary = build_workload(name);
    let workload = Workload::start(&binary);
    let pid = workload.pid;
    let mut processes = ProcessTable::new();
    processes.load_from_proc(pid.as_raw() as u32).unwrap();
    let reference = reference_unwinder(&processes, pid.as_raw() as u32);
    let main = main_range(&processes, pid.as_raw() as u32, &binary);
    let top = stack_top(pid);
    ptrace::seize(pid, ptrace::Options::empty()).unwrap();

    let mut unwinder = Unwinder::new();
    let mut cache = CacheX86_64::<_>::new();
    let mut figures = Figures::default();
    let mut mismatches_shown = 0;
    let mut random = 0x9e37_79b9_7f4a_7c15u64 ^ u64::from(std::process::id());
    for _ in 0..SAMPLES {
        random ^= random << 13;
        random ^= random >> 7;
        random ^= random << 17;
        std::thread::sleep(Duration::from_micros(200 + random % 3000));
        let Snapshot { regs, stack } = snapshot(pid, top, stack_bytes);

        let mut ours = Vec::new();
        let end = unwinder.unwind(
            &processes,
            pid.as_raw() as u32,
            &regs,
            &stack,
            MAX_FRAMES,
            &mut ours,
        );

        let mut read_stack = |addr: u64| -> Result<u64, ()> {
            let offset = addr.checked_sub(regs.sp).ok_or(())? as usize;
            let bytes = stack.get(offset..offset + 8).ok_or(())?;
            Ok(u64::from_le_bytes(bytes.try_into().unwrap()))
        };
        let mut theirs = Vec::new();
        let mut iter = reference.iter_frames(
            regs.ip,
            UnwindRegsX86_64::new(regs.ip, regs.sp, regs.bp),
            &mut cache,
            &mut read_stack,
        );
        let reference_complete = loop {
            match iter.next() {
                Ok(Some(frame)) if theirs.len() < MAX_FRAMES => theirs.push(frame.address()),
                Ok(Some(_)) => break false,
                Ok(None) => break true,
                Err(_) => break false,
            }
        };

        figures.samples += 1;
        figures.max_depth = figures.max_depth.max(ours.len());
        if ours == theirs {
            figures.equal += 1;
        } else if mismatches_shown < 5 {
            mismatches_shown += 1;
            eprintln!(
                "{name}: mismatch at ip {:#x} sp {:#x} ({end:?}):\n  ours   {:x?}\n  theirs {:x?}",
                regs.ip,
                regs.sp,
                &ours[..ours.len().min(12)],
                &theirs[..theirs.len().min(12)]
            );
        }
        // Return addresses point after the call: the caller is at pc - 1.
        let in_main = ours
            .iter()
            .enumerate()
            .any(|(i, &pc)| main.contains(&if i == 0 { pc } else { pc - 1 }));
        if end == StackEnd::Complete && in_main {
            figures.ours_reached_main_and_root += 1;
        } else if mismatches_shown < 5 {
            mismatches_shown += 1;
            eprintln!(
                "{name}: incomplete ({end:?}) at ip {:#x}: {} frames",
                regs.ip,
                ours.len()
            );
        }
        if reference_complete {
            figures.reference_reached_root += 1;
        }
    }
    let stats = unwinder.stats();
    eprintln!(
        "{name}: {} samples, {} equal to framehop ({:.1} %), ours reached main and the root in {} ({:.1} %), \
         framehop reached the root in {} ({:.1} %), deepest {} frames; table steps {}, frame-pointer steps {}",
        figures.samples,
        figures.equal,
        100.0 * figures.equal as f64 / figures.samples as f64,
        figures.ours_reached_main_and_root,
        100.0 * figures.ours_reached_main_and_root as f64 / figures.samples as f64,
        figures.reference_reached_root,
        100.0 * figures.reference_reached_root as f64 / figures.samples as f64,
        figures.max_depth,
        stats.table_steps,
        stats.frame_pointer_steps,
    );
    drop(workload);
    figures
}

fn check(figures: &Figures, name: &str) {
    assert!(figures.samples >= 200, "{name}: {figures:?}");
    assert!(
        figures.equal * 1000 >= figures.samples * 995,
        "{name}: frames differ from framehop's too often: {figures:?}"
    );
    assert!(
        figures.ours_reached_main_and_root * 100 >= figures.samples * 99,
        "{name}: too few stacks reach main and the root: {figures:?}"
    );
}

#[test]
fn six_deep_chain_matches_framehop() {
    let figures = run_workload("unwind_chain", 32000);
    check(&figures, "unwind_chain");
    assert!(figures.max_depth >= 10, "{figures:?}");
}

#[test]
fn qsort_callback_through_libc_matches_framehop() {
    let figures = run_workload("unwind_qsort", 32000);
    check(&figures, "unwind_qsort");
}

#[test]
fn deep_recursion_matches_framehop() {
    let figures = run_workload("unwind_recursion", 64 * 1024);
    check(&figures, "unwind_recursion");
    assert!(figures.max_depth >= 300, "{figures:?}");
}

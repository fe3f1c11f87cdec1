//! Loading the programs of a variant: a program of the object by name, the
//! tail-call continuation put in its prog array, load errors classified.
use aya::programs::{PerfEvent, Program};
use aya::Ebpf;
use ddprof_common::bpf_maps::names;

use super::load::{
    classify, classify_load, first_line, kernel_version, load_error_text, BpfError, MapProblem,
};
use super::variant::BpfVariant;

/// A perf_event program of the object, by name.
pub(super) fn perf_program_mut<'a>(
    ebpf: &'a mut Ebpf,
    name: &str,
) -> Result<&'a mut PerfEvent, BpfError> {
    ebpf.program_mut(name)
        .ok_or_else(|| BpfError::Rejected(format!("the object has no program `{name}`")))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| classify(&e))
}

/// A refused program load, classified (with the end of the verifier's log
/// on stderr when `DDPROF_BPF_VERIFIER_LOG` is set, for diagnosis).
pub(super) fn load_error(error: aya::programs::ProgramError, name: &str) -> BpfError {
    if std::env::var_os("DDPROF_BPF_VERIFIER_LOG").is_some() {
        let full = error.to_string();
        let start = full.len().saturating_sub(6000);
        let start = (start..full.len())
            .find(|&i| full.is_char_boundary(i))
            .unwrap_or(0);
        eprintln!("verifier log of {name} (tail): {}", &full[start..]);
    }
    classify_load(error, name)
}

/// On a kernel older than the engine's 5.10, any refusal but a permission
/// one says so: the kernel's own error (an unknown map type or helper) is
/// kept as the detail. (The version only words the message; what is loaded
/// is decided by probing.)
pub(super) fn too_old(error: BpfError) -> BpfError {
    match (error, kernel_version()) {
        (BpfError::Rejected(text), Some((major, minor))) if (major, minor) < (5, 10) => {
            BpfError::KernelTooOld(format!("Linux {major}.{minor}: {text}"))
        }
        (error @ BpfError::Map { .. }, Some((major, minor))) if (major, minor) < (5, 10) => {
            BpfError::KernelTooOld(format!("Linux {major}.{minor}: {error}"))
        }
        (error, _) => error,
    }
}

/// Loads the tail-call variant's continuation `name` and puts it in slot 0
/// of `WALK_PROGRAMS`, where the entry program tail-calls it (before the
/// entry is loaded, so that no chain finds the slot empty). Returns its
/// program info, for the verifier's figures.
pub(super) fn load_continuation(
    ebpf: &mut Ebpf,
    name: &str,
) -> Result<Option<aya::programs::ProgramInfo>, BpfError> {
    const MAP: &str = names::WALK_PROGRAMS;
    let program = perf_program_mut(ebpf, name)?;
    program.load().map_err(|e| load_error(e, name))?;
    let info = program.info().ok();
    let fd = program
        .fd()
        .and_then(|fd| fd.try_clone().map_err(Into::into))
        .map_err(|e| classify(&e))?;
    let map_error = |problem: MapProblem| BpfError::Map { map: MAP, problem };
    let map = ebpf
        .map_mut(MAP)
        .ok_or_else(|| map_error(MapProblem::Missing))?;
    let mut slots = aya::maps::ProgramArray::try_from(map).map_err(|e| map_error(e.into()))?;
    slots.set(0, &fd, 0).map_err(|e| map_error(e.into()))?;
    Ok(info)
}

/// Loads the `sWALL` program (a BTF tracepoint on `sched_switch`): on the
/// `bpf_loop` variant's kernels only (it walks with the loop). `Err`: why
/// not, in words for the log.
pub(super) fn load_wall_program(ebpf: &mut Ebpf, variant: BpfVariant) -> Result<(), String> {
    if variant != BpfVariant::Loop {
        return Err(
            "wall time walks stacks with bpf_loop, which this kernel lacks (Linux 5.17+)".into(),
        );
    }
    let started = std::time::Instant::now();
    let btf = aya::Btf::from_sys_fs()
        .map_err(|e| format!("the kernel's BTF is not readable ({})", first_line(&e)))?;
    log::info!(
        "start-up: BTF read in {:.0} ms",
        started.elapsed().as_secs_f64() * 1e3
    );
    let name = names::WALL_PROGRAM;
    let program: &mut aya::programs::BtfTracePoint = side_program(ebpf.program_mut(name), name)?;
    program
        .load("sched_switch", &btf)
        .map_err(|error| refused(error, name, "sched_switch"))
}

/// A program of the object loaded beside the entry (`sWALL`'s,
/// `sALLOC`'s), as its type; `Err`: why not, in words for the log.
fn side_program<'a, T>(program: Option<&'a mut Program>, name: &str) -> Result<&'a mut T, String>
where
    &'a mut T: TryFrom<&'a mut Program, Error = aya::programs::ProgramError>,
{
    program
        .ok_or_else(|| format!("the object has no program `{name}`"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| first_line(&e))
}

/// A side program's refused load in words for the log (with
/// `DDPROF_BPF_VERIFIER_LOG`, the verifier log's tail on stderr).
fn refused(error: aya::programs::ProgramError, name: &str, what: &str) -> String {
    let refused = load_error_text(&error);
    load_error(error, name);
    format!("the kernel refused the {what} program: {refused}")
}

/// Loads the variant's entry program `entry` and, when `allocation` asks
/// for it (`sALLOC`'s event) on the `bpf_loop` variant, the allocation
/// uprobe's program beside it, on a second thread: each verification takes
/// ~60 ms of one CPU, and the kernel verifies two loads at once, so the
/// command does not wait twice as long for its start on a machine of two
/// CPUs or more. `Err`: the entry was refused; `Ok`: how the allocation
/// program's load went (`None`: not asked for), in words for the log.
pub(super) fn load_entry_beside_allocation(
    ebpf: &mut Ebpf,
    entry: &str,
    allocation: Option<u16>,
    variant: BpfVariant,
) -> Result<Option<Result<(), String>>, BpfError> {
    let allocation_name = names::ALLOCATION_PROGRAM;
    let mut entry_program = None;
    let mut allocation_program = None;
    for (name, program) in ebpf.programs_mut() {
        if name == entry {
            entry_program = Some(program);
        } else if name == allocation_name {
            allocation_program = Some(program);
        }
    }
    let entry_program: &mut PerfEvent = entry_program
        .ok_or_else(|| BpfError::Rejected(format!("the object has no program `{entry}`")))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| classify(&e))?;
    let allocation_program = match (allocation, variant) {
        (None, _) => None,
        (Some(_), BpfVariant::TailCall) => {
            return entry_program
                .load()
                .map_err(|e| load_error(e, entry))
                .map(|()| {
                    Some(Err(
                        "the kernel walks allocation stacks with bpf_loop, which \
                              this kernel lacks (Linux 5.17+)"
                            .into(),
                    ))
                })
        }
        (Some(_), BpfVariant::Loop) => Some(allocation_program),
    };
    std::thread::scope(|scope| {
        let allocation = allocation_program.map(|program| {
            scope.spawn(move || -> Result<(), String> {
                run_on_any_cpu();
                let program: &mut aya::programs::UProbe = side_program(program, allocation_name)?;
                program
                    .load()
                    .map_err(|error| refused(error, allocation_name, "allocation"))
            })
        });
        let entry_loaded = entry_program.load().map_err(|e| load_error(e, entry));
        let allocation_loaded = allocation.map(|thread| {
            thread
                .join()
                .unwrap_or_else(|_| Err("the thread that loaded it panicked".into()))
        });
        entry_loaded.map(|()| allocation_loaded)
    })
}

/// Lets the calling thread run on every online CPU: the profiler pins
/// itself to one (it competes with the profiled work on one CPU only), and
/// a thread that verifies a program while the command waits for the
/// set-up would otherwise take turns with the one verifying the other.
/// (The kernel keeps it within the process's cpuset.) Nothing happens
/// where it cannot.
fn run_on_any_cpu() {
    use nix::sched::{sched_setaffinity, CpuSet};
    let mut every = CpuSet::new();
    for cpu in crate::events::online_cpus() {
        let _ = every.set(cpu as usize);
    }
    if let Err(error) = sched_setaffinity(nix::unistd::Pid::from_raw(0), &every) {
        log::debug!("BPF engine: the allocation program's loader stays on one CPU: {error}");
    }
}

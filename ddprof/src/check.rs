//! `ddprof --check`: what this machine allows and what ddprof would do, one
//! line each, and whether profiling is possible at all.
//!
//! Every line is a real probe, not a guess from the kernel version: a
//! task-clock event is opened on this process, the BPF program is loaded
//! (and verified) with the smallest maps, and the engine `auto` would pick
//! is decided from those results exactly as when profiling.
use std::fmt::Write as _;

use crate::bpf::{self, BpfError, BpfProgram, BpfVariant, Engine, EngineChoice, MapSizes};
use crate::confine::capabilities::{self, cap};
use crate::events::{self, EventOptions, OpenError, Scope};
use crate::events::{EventSpec, SampleRate};

/// The result of the checks: the lines to print and whether profiling is
/// possible.
#[derive(Debug)]
pub struct CheckReport {
    pub lines: Vec<String>,
    pub can_profile: bool,
}

/// A BPF program variant the running kernel may or may not accept.
/// Variants are listed by [`bpf_variants`]; each gets its own line.
pub struct BpfVariantCheck {
    /// Its name in the report (which kernels it is for).
    pub name: &'static str,
    pub variant: BpfVariant,
}

impl BpfVariantCheck {
    /// A throw-away load of the variant with the smallest maps; the
    /// `bpf_loop` variant's with `sWALL`'s program beside it (loaded only
    /// there), for the wall-time line, and `sALLOC`'s asked for.
    fn load(&self) -> Result<BpfProgram, BpfError> {
        let settings = bpf::ProgramSettings {
            allocation: (self.variant == BpfVariant::Loop).then_some(2),
            wall: (self.variant == BpfVariant::Loop).then_some(crate::wall::WallSampling {
                event: 1,
                max_probability: ddprof_common::sample::WALL_PROBABILITY_ONE,
                threshold_ns: 0,
            }),
            ..bpf::ProgramSettings::with_kernel_stacks(false)
        };
        BpfProgram::load_with(MapSizes::minimal(), settings, Some(self.variant))
    }
}

/// The BPF program variants built into this binary, the one `auto` prefers
/// first.
pub fn bpf_variants() -> Vec<BpfVariantCheck> {
    BpfVariant::ALL
        .iter()
        .map(|&variant| BpfVariantCheck {
            name: match variant {
                BpfVariant::Loop => "bpf_loop (Linux >= 5.17)",
                BpfVariant::TailCall => "tail-call (Linux >= 5.10)",
            },
            variant,
        })
        .collect()
}

/// Capabilities ddprof uses, in the order they are reported.
const RELEVANT_CAPS: &[(u32, &str)] = &[
    (cap::SYS_ADMIN, "CAP_SYS_ADMIN"),
    (cap::PERFMON, "CAP_PERFMON"),
    (cap::BPF, "CAP_BPF"),
    (cap::SYS_PTRACE, "CAP_SYS_PTRACE"),
    (cap::DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH"),
    (cap::IPC_LOCK, "CAP_IPC_LOCK"),
    (cap::CHECKPOINT_RESTORE, "CAP_CHECKPOINT_RESTORE"),
];

fn kernel_line() -> String {
    let read = |path: &str| {
        std::fs::read_to_string(path)
            .map(|text| text.trim().to_string())
            .unwrap_or_else(|_| "unknown".into())
    };
    format!(
        "kernel: Linux {} ({})",
        read("/proc/sys/kernel/osrelease"),
        std::env::consts::ARCH
    )
}

fn btf_line() -> String {
    const VMLINUX: &str = "/sys/kernel/btf/vmlinux";
    match std::fs::metadata(VMLINUX) {
        Ok(metadata) => format!(
            "btf: {VMLINUX} ({:.1} MiB)",
            metadata.len() as f64 / (1 << 20) as f64
        ),
        Err(error) => format!(
            "btf: none ({VMLINUX}: {error}); the BPF engine needs a kernel built with CONFIG_DEBUG_INFO_BTF"
        ),
    }
}

fn paranoid_line() -> String {
    let level = events::paranoid_level();
    let meaning = match level.parse::<i32>() {
        Ok(i32::MIN..=-1) => "no restriction",
        Ok(0) => "unprivileged users: CPU-wide events, no raw tracepoints",
        Ok(1) => "unprivileged users: their own processes, kernel and user space",
        Ok(2) => "unprivileged users: their own processes, user space only",
        Ok(_) => "unprivileged users: denied where the kernel enforces levels above 2",
        Err(_) => "cannot read /proc/sys/kernel/perf_event_paranoid",
    };
    format!("perf_event_paranoid: {level} ({meaning})")
}

fn capabilities_line() -> String {
    match capabilities::current() {
        Ok(caps) => {
            let names = |held: bool| {
                RELEVANT_CAPS
                    .iter()
                    .filter(|(number, _)| caps.effective.contains(*number) == held)
                    .map(|(_, name)| *name)
                    .collect::<Vec<_>>()
            };
            let (held, lacking) = (names(true), names(false));
            let mut line = String::from("capabilities (effective): ");
            if held.is_empty() {
                line.push_str("none of those ddprof uses");
            } else {
                line.push_str(&held.join(" "));
            }
            if !lacking.is_empty() {
                let _ = write!(line, "; lacking {}", lacking.join(" "));
            }
            line
        }
        Err(error) => format!("capabilities (effective): {error}"),
    }
}

/// Opens a task-clock sampling event on this process as the engines do
/// (kernel time included when permitted, else user-only).
fn perf_event_probe() -> Result<&'static str, OpenError> {
    let spec = EventSpec::cpu_time(SampleRate::Frequency(99));
    let mut options = EventOptions {
        // Only whether the event opens matters: the smallest stack copy.
        stack_sample_size: 8,
        include_kernel: true,
        kernel_stacks: false,
    };
    let own = std::process::id() as i32;
    match events::open(&spec, Scope::Process(own), -1, &options) {
        Ok(_event) => Ok("user and kernel time"),
        Err(OpenError::Permission { .. }) => {
            options.include_kernel = false;
            events::open(&spec, Scope::Process(own), -1, &options).map(|_| "user time only")
        }
        Err(error) => Err(error),
    }
}

/// Whether `sWALL` can be sampled: its `sched_switch` program, loaded
/// with the `bpf_loop` variant (`loaded`), loaded and verified.
fn wall_line(loaded: &Result<BpfProgram, BpfError>) -> String {
    match why_not_loaded(loaded, BpfProgram::wall_loaded) {
        None => "wall time (sWALL): the sched_switch program loads and verifies".into(),
        Some(why) => format!("wall time (sWALL): not available: {}", first_line(&why)),
    }
}

/// Whether `sALLOC`'s samples can be unwound in the kernel: its uprobe
/// program, loaded beside the `bpf_loop` variant (`loaded`) and verified.
fn allocation_line(loaded: &Result<BpfProgram, BpfError>) -> String {
    match why_not_loaded(loaded, BpfProgram::allocation_loaded) {
        None => "allocations (sALLOC): the uprobe program loads and verifies (stacks unwound in \
                 the kernel)"
            .into(),
        Some(why) => format!(
            "allocations (sALLOC): unwound by the perf engine from stack copies: {}",
            first_line(&why)
        ),
    }
}

/// Why a program loaded beside the `bpf_loop` variant (`loaded`) is not
/// there (`outcome` says how its load went); `None`: it loaded.
fn why_not_loaded(
    loaded: &Result<BpfProgram, BpfError>,
    outcome: impl Fn(&BpfProgram) -> Option<Result<(), String>>,
) -> Option<String> {
    match loaded {
        Ok(program) => match outcome(program) {
            Some(Ok(())) => None,
            Some(Err(why)) => Some(why),
            None => Some("not loaded".into()),
        },
        Err(error) => Some(format!(
            "the bpf_loop variant does not load: {}",
            first_line(&error.to_string())
        )),
    }
}

fn first_line(text: &str) -> &str {
    text.lines().next().unwrap_or_default()
}

/// Runs every check. `perf_event_open` and the BPF loads are real.
pub fn run() -> CheckReport {
    let mut lines = vec![
        kernel_line(),
        btf_line(),
        paranoid_line(),
        capabilities_line(),
    ];
    let perf = perf_event_probe();
    lines.push(match &perf {
        Ok(scope) => format!("perf_event_open: task-clock opens ({scope})"),
        Err(error) => format!("perf_event_open: fails: {}", first_line(&error.to_string())),
    });
    // Each variant is loaded for its line; the first that loads is the one
    // `auto` would use.
    let mut preferred: Option<Result<(), BpfError>> = None;
    let mut wall = None;
    let mut allocation = None;
    for variant in bpf_variants() {
        let loaded = variant.load();
        if variant.variant == BpfVariant::Loop {
            wall = Some(wall_line(&loaded));
            allocation = Some(allocation_line(&loaded));
        }
        lines.push(match &loaded {
            Ok(program) => {
                let stats = program.stats();
                let mut line = format!("BPF program {}: loads and verifies", variant.name);
                if let (Some(instructions), Some(verified)) =
                    (stats.instructions, stats.verified_instructions)
                {
                    let _ = write!(
                        line,
                        " ({instructions} instructions, {verified} processed by the verifier)"
                    );
                }
                let _ = write!(line, " in {} ms", stats.load_time.as_millis());
                line
            }
            Err(error) => format!(
                "BPF program {}: does not load: {}",
                variant.name,
                first_line(&error.to_string())
            ),
        });
        match (&preferred, loaded) {
            (None, result) | (Some(Err(_)), result) => preferred = Some(result.map(drop)),
            (Some(Ok(())), _) => {}
        }
    }
    lines.extend(wall);
    lines.extend(allocation);
    let bpf_result = preferred.unwrap_or(Err(BpfError::NotBuilt));
    let can_profile = perf.is_ok();
    let engine_line = match perf {
        Err(error) => format!(
            "engine (auto): none: profiling is impossible here: {}",
            first_line(&error.to_string())
        ),
        Ok(_) => match bpf::choose_engine_with(EngineChoice::Auto, || bpf_result) {
            Ok((_, decision)) => {
                let name = match decision.engine {
                    Engine::Bpf => "BPF",
                    Engine::Perf => "perf",
                };
                let prefix = format!("{name} engine: ");
                let reason = decision
                    .reason
                    .strip_prefix(&prefix)
                    .unwrap_or(&decision.reason);
                format!("engine (auto): {name}: {reason}")
            }
            Err(error) => format!("engine (auto): {}", first_line(&error.to_string())),
        },
    };
    lines.push(engine_line);
    CheckReport { lines, can_profile }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_report_has_one_line_per_fact_and_decides_an_engine() {
        let report = run();
        let prefixes = [
            "kernel: Linux ",
            "btf: ",
            "perf_event_paranoid: ",
            "capabilities (effective): ",
            "perf_event_open: ",
        ];
        for (line, prefix) in report.lines.iter().zip(prefixes) {
            assert!(
                line.starts_with(prefix),
                "{line:?} should start with {prefix:?}"
            );
        }
        assert_eq!(
            report
                .lines
                .iter()
                .filter(|line| line.starts_with("BPF program "))
                .count(),
            bpf_variants().len()
        );
        let engine = report.lines.last().unwrap();
        assert!(engine.starts_with("engine (auto): "), "{engine}");
        assert!(report.lines.iter().all(|line| !line.contains('\n')));
        // perf_event_open of a task-clock event on oneself works on any
        // machine these tests run on (root or paranoid <= 2).
        assert!(report.can_profile, "{:#?}", report.lines);
    }
}

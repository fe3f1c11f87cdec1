//! Which variant of the BPF program runs: the kernel is probed for
//! `bpf_loop` (never judged by its version string, which distributions'
//! backports make meaningless), and `DDPROF_BPF_VARIANT` forces one.
//!
//! - [`BpfVariant::Loop`]: `ddprof_sample`, one frame per `bpf_loop`
//!   iteration (Linux 5.17+).
//! - [`BpfVariant::TailCall`]: `ddprof_sample_tail`, which walks
//!   `FRAMES_PER_TAIL_CALL_RUN` frames per program run and continues in
//!   `ddprof_walk_tail` through tail calls (Linux 5.10 to 5.16). Samples
//!   taken in kernel mode go to the perf engine: the helpers that find the
//!   task's saved user registers are 5.11 and 5.15.
use std::sync::{Mutex, OnceLock};

use aya::programs::ProgramType;
use aya::sys::{is_helper_supported, BpfHelper};
use ddprof_common::bpf_maps::names;

use super::load::{classify, BpfError, BpfProgram, MapSizes, ProgramStats};

/// Environment variable that forces a variant: `bpf_loop` or `tail-call`
/// (for tests, and to rule a variant out on a kernel that misbehaves).
pub const VARIANT_ENV: &str = "DDPROF_BPF_VARIANT";

/// A variant of the BPF program; both are built into the one object and
/// share the frame step, the maps and the record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum BpfVariant {
    /// Frames walked in a `bpf_loop` (Linux 5.17+).
    Loop,
    /// Frames walked in chunks continued through tail calls (Linux 5.10+).
    TailCall,
}

impl BpfVariant {
    /// Every variant, preferred first.
    pub const ALL: [BpfVariant; 2] = [BpfVariant::Loop, BpfVariant::TailCall];

    /// The program attached to the perf events.
    pub fn entry_program(self) -> &'static str {
        match self {
            BpfVariant::Loop => names::LOOP_ENTRY_PROGRAM,
            BpfVariant::TailCall => names::TAIL_CALL_ENTRY_PROGRAM,
        }
    }

    /// The program the entry tail-calls (slot 0 of `WALK_PROGRAMS`).
    pub fn tail_program(self) -> Option<&'static str> {
        match self {
            BpfVariant::Loop => None,
            BpfVariant::TailCall => Some(names::TAIL_CALL_WALK_PROGRAM),
        }
    }

    /// The value `DDPROF_BPF_VARIANT` takes for it.
    pub fn name(self) -> &'static str {
        match self {
            BpfVariant::Loop => "bpf_loop",
            BpfVariant::TailCall => "tail-call",
        }
    }

    fn parse(value: &str) -> Option<BpfVariant> {
        match value.trim() {
            "bpf_loop" | "loop" => Some(BpfVariant::Loop),
            "tail-call" | "tail_call" | "tailcall" => Some(BpfVariant::TailCall),
            _ => None,
        }
    }
}

impl std::fmt::Display for BpfVariant {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} variant", self.name())
    }
}

/// Whether the running kernel has `bpf_loop` for perf_event programs: a
/// two-instruction program calling it is loaded, and the verifier's answer
/// read (an unknown helper is named as such; any other complaint means the
/// kernel knows it). Probed once per process when it succeeds.
pub fn kernel_has_bpf_loop() -> Result<bool, BpfError> {
    static PROBED: OnceLock<bool> = OnceLock::new();
    if let Some(&known) = PROBED.get() {
        return Ok(known);
    }
    let known = is_helper_supported(ProgramType::PerfEvent, BpfHelper::BPF_FUNC_loop)
        .map_err(|error| classify(&error))?;
    Ok(*PROBED.get_or_init(|| known))
}

/// The variant to load, and why, in one line.
pub fn choose_variant() -> Result<(BpfVariant, String), BpfError> {
    choose_with(
        std::env::var(VARIANT_ENV).ok().as_deref(),
        kernel_has_bpf_loop,
    )
}

fn choose_with(
    forced: Option<&str>,
    has_bpf_loop: impl FnOnce() -> Result<bool, BpfError>,
) -> Result<(BpfVariant, String), BpfError> {
    if let Some(value) = forced.filter(|v| !v.trim().is_empty()) {
        let variant = BpfVariant::parse(value).ok_or_else(|| {
            BpfError::BadVariant(format!(
                "{VARIANT_ENV}={value:?}: use `bpf_loop` or `tail-call`, or unset it"
            ))
        })?;
        return Ok((variant, format!("{variant} (forced by {VARIANT_ENV})")));
    }
    Ok(if has_bpf_loop()? {
        (
            BpfVariant::Loop,
            "bpf_loop variant (kernel has bpf_loop)".into(),
        )
    } else {
        (
            BpfVariant::TailCall,
            "tail-call variant (no bpf_loop: kernel before 5.17)".into(),
        )
    })
}

/// [`choose_variant`], with the choice logged once per process (and again
/// whenever it changes).
pub(super) fn chosen_variant() -> Result<BpfVariant, BpfError> {
    static LOGGED: Mutex<Option<BpfVariant>> = Mutex::new(None);
    let (variant, reason) = choose_variant()?;
    let mut logged = LOGGED
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if *logged != Some(variant) {
        log::info!("BPF program: {reason}");
        *logged = Some(variant);
    }
    Ok(variant)
}

/// Each variant loaded with the smallest maps and verified by this kernel,
/// or why not (for `ddprof --check`: one line per variant).
pub fn probe_variants() -> Vec<(BpfVariant, Result<ProgramStats, BpfError>)> {
    BpfVariant::ALL
        .iter()
        .map(|&variant| {
            let loaded = BpfProgram::load_variant(MapSizes::minimal(), false, variant);
            (variant, loaded.map(|program| program.stats()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_chooses_and_the_environment_forces() {
        let (variant, reason) = choose_with(None, || Ok(true)).unwrap();
        assert_eq!(variant, BpfVariant::Loop);
        assert_eq!(reason, "bpf_loop variant (kernel has bpf_loop)");
        let (variant, reason) = choose_with(None, || Ok(false)).unwrap();
        assert_eq!(variant, BpfVariant::TailCall);
        assert_eq!(
            reason,
            "tail-call variant (no bpf_loop: kernel before 5.17)"
        );
        let (variant, reason) = choose_with(Some("tail-call"), || panic!("no probe")).unwrap();
        assert_eq!(variant, BpfVariant::TailCall);
        assert_eq!(reason, "tail-call variant (forced by DDPROF_BPF_VARIANT)");
        let (variant, _) = choose_with(Some("bpf_loop"), || Ok(false)).unwrap();
        assert_eq!(variant, BpfVariant::Loop);
        // Empty is unset.
        let (variant, _) = choose_with(Some(""), || Ok(false)).unwrap();
        assert_eq!(variant, BpfVariant::TailCall);
        let error = choose_with(Some("fast"), || Ok(true)).unwrap_err();
        assert_eq!(
            error.to_string(),
            "bad BPF program variant: DDPROF_BPF_VARIANT=\"fast\": use `bpf_loop` or \
             `tail-call`, or unset it"
        );
        let refused = choose_with(None, || {
            Err(BpfError::Permission("Operation not permitted".into()))
        });
        assert!(matches!(refused, Err(BpfError::Permission(_))));
        for variant in BpfVariant::ALL {
            assert_eq!(BpfVariant::parse(variant.name()), Some(variant));
        }
    }
}

//! Which engine samples: the decision and its one-line reason, in one place.
use super::load::{BpfError, BpfProgram, MapSizes};

/// `--engine`: what the user asked for.
#[derive(clap::ValueEnum, serde::Serialize, Debug, Clone, Copy, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum EngineChoice {
    Auto,
    Bpf,
    Perf,
}

/// The engine that will sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Engine {
    Bpf,
    Perf,
}

/// The engine chosen and why, in one line for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineDecision {
    pub engine: Engine,
    pub reason: String,
}

/// `auto` → BPF when the object is built in, loading BPF is permitted and the
/// verifier accepts the program (checked with a throw-away load with the
/// smallest maps), else perf with the reason; `bpf` → BPF or the error
/// (never a fallback); `perf` → perf.
pub fn choose_engine(choice: EngineChoice) -> Result<EngineDecision, BpfError> {
    choose_with(choice, probe)
}

/// The same decision, with `start_bpf` (e.g. `BpfEngine::new`) as the
/// check: when BPF is chosen, its result is returned with the decision, so
/// the program is loaded and verified once.
pub fn choose_engine_with<T>(
    choice: EngineChoice,
    start_bpf: impl FnOnce() -> Result<T, BpfError>,
) -> Result<(Option<T>, EngineDecision), BpfError> {
    let mut started = None;
    let decision = choose_with(choice, || {
        started = Some(start_bpf()?);
        Ok(())
    })?;
    Ok((started.filter(|_| decision.engine == Engine::Bpf), decision))
}

fn probe() -> Result<(), BpfError> {
    BpfProgram::load(MapSizes::minimal(), false).map(drop)
}

fn choose_with(
    choice: EngineChoice,
    probe: impl FnOnce() -> Result<(), BpfError>,
) -> Result<EngineDecision, BpfError> {
    match choice {
        EngineChoice::Perf => Ok(EngineDecision {
            engine: Engine::Perf,
            reason: "perf engine requested (--engine perf)".into(),
        }),
        EngineChoice::Bpf => {
            probe()?;
            Ok(EngineDecision {
                engine: Engine::Bpf,
                reason: "BPF engine requested (--engine bpf) and loaded".into(),
            })
        }
        EngineChoice::Auto => Ok(match probe() {
            Ok(()) => EngineDecision {
                engine: Engine::Bpf,
                reason: "BPF engine: program built in, permitted and accepted by the verifier"
                    .into(),
            },
            Err(error) => {
                // The reason is logged at info level only: a typo in the
                // variant's environment variable must not go unseen.
                if matches!(error, BpfError::BadVariant(_)) {
                    log::warn!("{error}");
                }
                EngineDecision {
                    engine: Engine::Perf,
                    reason: format!(
                        "perf engine: {}",
                        error.to_string().lines().next().unwrap_or("")
                    ),
                }
            }
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_falls_back_with_the_reason_and_bpf_never_does() {
        let refused = || {
            Err(BpfError::Permission(
                "Operation not permitted (os error 1)".into(),
            ))
        };
        let auto = choose_with(EngineChoice::Auto, refused).unwrap();
        assert_eq!(auto.engine, Engine::Perf);
        assert!(auto.reason.contains("CAP_BPF"), "{}", auto.reason);
        assert!(!auto.reason.contains('\n'));
        assert!(matches!(
            choose_with(EngineChoice::Bpf, refused),
            Err(BpfError::Permission(_))
        ));
        let rejected = || {
            Err(BpfError::Rejected(
                "invalid mem access 'scalar'\nmore".into(),
            ))
        };
        let auto = choose_with(EngineChoice::Auto, rejected).unwrap();
        assert_eq!(
            auto.reason,
            "perf engine: the kernel rejected the BPF program: invalid mem access 'scalar'"
        );
        let accepted = choose_with(EngineChoice::Auto, || Ok(())).unwrap();
        assert_eq!(accepted.engine, Engine::Bpf);
        let perf = choose_with(EngineChoice::Perf, || panic!("no probe for perf")).unwrap();
        assert_eq!(perf.engine, Engine::Perf);
        let (started, decision) = choose_engine_with(EngineChoice::Auto, || Ok(7)).unwrap();
        assert_eq!((started, decision.engine), (Some(7), Engine::Bpf));
        let (started, decision) =
            choose_engine_with(EngineChoice::Perf, || -> Result<u8, BpfError> { panic!() })
                .unwrap();
        assert_eq!((started, decision.engine), (None, Engine::Perf));
    }
}

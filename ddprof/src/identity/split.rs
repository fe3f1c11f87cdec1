//! One symbolized period split into a profile per service: each holds its
//! processes' samples and only the stacks and frames they use.
use std::collections::{BTreeMap, HashMap};

use super::{ServiceIdentity, Services, MAX_SERVICES_PER_PERIOD};
use crate::aggregate::{PeriodProfile, PeriodStats, StackSample};
use crate::symbolize::SymbolizedProfile;

/// The run's part (the samples of processes with no service of their own,
/// and of services past [`MAX_SERVICES_PER_PERIOD`]) and each service's,
/// in the order of their names; the run's part unchanged when no sample
/// has a service.
pub fn by_service(
    profile: SymbolizedProfile,
    services: &Services,
) -> (SymbolizedProfile, Vec<(ServiceIdentity, SymbolizedProfile)>) {
    // A sample is its process's service's when taken in the program the
    // service was read from (not in the shell that forked and exec'd it).
    let service_of = |sample: &StackSample| {
        let service = services.get(&sample.pid)?;
        let same_program = service.program.is_none()
            || sample.process_name.as_deref() == service.program.as_deref();
        same_program.then_some(&service.identity)
    };
    if !profile
        .period
        .samples
        .iter()
        .any(|sample| service_of(sample).is_some())
    {
        return (profile, Vec::new());
    }
    // By service and container: each profile's upload names one container.
    type Group<'a> = (&'a ServiceIdentity, Option<&'a str>);
    let mut groups: BTreeMap<Group, Vec<StackSample>> = BTreeMap::new();
    let mut own = Vec::new();
    for sample in &profile.period.samples {
        match service_of(sample).map(|identity| (identity, sample.container_id.as_deref())) {
            Some(group)
                if groups.len() < MAX_SERVICES_PER_PERIOD || groups.contains_key(&group) =>
            {
                groups.entry(group).or_default().push(sample.clone())
            }
            _ => own.push(sample.clone()),
        }
    }
    let parts = groups
        .into_iter()
        .map(|((identity, container), samples)| {
            let identity = ServiceIdentity {
                container_id: container.map(str::to_string),
                ..identity.clone()
            };
            (identity, subset(&profile, samples, PeriodStats::default()))
        })
        .collect();
    // The run's part keeps the period's figures (the overhead is the
    // profiler's, whoever's samples it took).
    let stats = profile.period.stats;
    (subset(&profile, own, stats), parts)
}

/// `samples` of `profile`, with the stacks and frames they use renumbered.
fn subset(
    profile: &SymbolizedProfile,
    mut samples: Vec<StackSample>,
    stats: PeriodStats,
) -> SymbolizedProfile {
    let period = &profile.period;
    let mut frame_ids: HashMap<u32, u32> = HashMap::new();
    let mut stack_ids: HashMap<u32, u32> = HashMap::new();
    let (mut frames, mut symbols, mut stacks) = (Vec::new(), Vec::new(), Vec::new());
    for sample in &mut samples {
        let old_stack = sample.stack;
        sample.stack = *stack_ids.entry(old_stack).or_insert_with(|| {
            let stack: Box<[u32]> = period.stacks[old_stack as usize]
                .iter()
                .map(|&frame| {
                    *frame_ids.entry(frame).or_insert_with(|| {
                        frames.push(period.frames[frame as usize].clone());
                        symbols.push(profile.frames[frame as usize].clone());
                        (frames.len() - 1) as u32
                    })
                })
                .collect();
            stacks.push(stack);
            (stacks.len() - 1) as u32
        });
    }
    SymbolizedProfile {
        period: PeriodProfile {
            start: period.start,
            end: period.end,
            files: period.files.clone(),
            perf_maps: period.perf_maps.clone(),
            frames,
            stacks,
            samples,
            stats,
        },
        frames: symbols,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::Frame;
    use crate::identity::ProcessService;
    use std::sync::Arc;

    fn sample(pid: u32, stack: u32) -> StackSample {
        StackSample {
            event: 0,
            pid,
            tid: pid,
            process_name: Some("app".into()),
            thread_name: None,
            container_id: None,
            trace: None,
            stack,
            count: 1,
            scaled_count: crate::events::COUNT_UNIT,
            cpu_nanos: 1,
            timeline: vec![],
        }
    }

    fn names(profile: &SymbolizedProfile, sample: &StackSample) -> Vec<String> {
        profile
            .stack_names(sample.stack)
            .map(|name| name.to_string())
            .collect()
    }

    #[test]
    fn each_service_gets_its_samples_and_only_the_frames_they_use() {
        let frame = |addr| Frame::Kernel { addr };
        let symbol = |name: &str| -> crate::symbolize::FrameSymbols {
            Arc::from([crate::symbolize::SymbolLine {
                function: Arc::from(name),
                system_name: Arc::from(name),
                file: Arc::from(""),
                line: 0,
            }])
        };
        let profile = SymbolizedProfile {
            period: PeriodProfile {
                start: std::time::UNIX_EPOCH,
                end: std::time::UNIX_EPOCH,
                files: vec![],
                perf_maps: Default::default(),
                frames: vec![frame(1), frame(2), frame(3)],
                stacks: vec![Box::new([0, 2]), Box::new([1, 2])],
                samples: vec![sample(10, 0), sample(20, 1), sample(30, 1)],
                stats: PeriodStats {
                    samples: 3,
                    ..PeriodStats::default()
                },
            },
            frames: vec![symbol("a"), symbol("b"), symbol("main")],
        };
        let identity = |service: &str| ServiceIdentity {
            service: service.into(),
            env: None,
            version: None,
            instance_id: None,
            container_id: None,
        };
        // No process with a service: the profile as it was.
        let (own, parts) = by_service(profile.clone(), &HashMap::new());
        assert!(parts.is_empty());
        assert_eq!(own.period.samples.len(), 3);
        let service = |name: &str, program: Option<&str>| ProcessService {
            identity: identity(name),
            program: program.map(str::to_string),
        };
        // Process 30's samples were taken as `app`, not the program its
        // service was read from.
        let services = Services::from([
            (20, service("beta", None)),
            (10, service("alpha", None)),
            (30, service("gamma", Some("published"))),
        ]);
        let (own, parts) = by_service(profile, &services);
        assert_eq!(own.period.stats.samples, 3);
        assert_eq!(own.period.samples.len(), 1);
        assert_eq!(names(&own, &own.period.samples[0]), ["main", "b"]);
        assert_eq!(own.period.frames.len(), 2);
        let described: Vec<(String, Vec<u32>, Vec<Vec<String>>)> = parts
            .iter()
            .map(|(identity, part)| {
                (
                    identity.service.clone(),
                    part.period.samples.iter().map(|s| s.pid).collect(),
                    part.period.samples.iter().map(|s| names(part, s)).collect(),
                )
            })
            .collect();
        assert_eq!(
            described,
            [
                (
                    "alpha".to_string(),
                    vec![10],
                    vec![vec!["main".to_string(), "a".to_string()]]
                ),
                (
                    "beta".to_string(),
                    vec![20],
                    vec![vec!["main".to_string(), "b".to_string()]]
                ),
            ]
        );
        assert!(parts.iter().all(|(_, part)| part.period.frames.len() == 2
            && part.frames.len() == 2
            && part.period.stats.samples == 0));
    }
}

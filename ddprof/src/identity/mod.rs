//! Which service a process is, for `-p` and `--global` (where the profiled
//! processes are not one command the user named with `-S`): its
//! OpenTelemetry process context (`process_context`, OTEP 4719: what an
//! SDK publishes for readers outside the process), else the Datadog
//! unified service tags of its environment (`environ`: `DD_SERVICE`,
//! `DD_ENV`, `DD_VERSION`). Each service's samples go out in a profile of
//! their own, under its tags; a process with neither keeps the run's.
use std::collections::{HashMap, HashSet};

use crate::process::ProcessTable;

pub mod environ;
pub mod process_context;
pub mod split;

/// A service's tags, as a process publishes them.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceIdentity {
    pub service: String,
    pub env: Option<String>,
    pub version: Option<String>,
    /// `service.instance.id` (the process context only).
    pub instance_id: Option<String>,
    /// The container its processes run in (set by [`split`] from their
    /// samples: a service's processes in two containers make two
    /// profiles), which its upload's entity headers name.
    pub container_id: Option<String>,
}

/// A process's service, and the program it was read from (its name then):
/// the samples it took before an exec, under another name, are not the
/// service's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessService {
    pub identity: ServiceIdentity,
    pub program: Option<String>,
}

/// The services of a period's processes, by process.
pub type Services = HashMap<u32, ProcessService>;

/// A tag value is at most this long.
pub const MAX_VALUE_BYTES: usize = 200;
/// Processes whose identity is read in one period at most (the others are
/// read in the next ones; their samples keep the run's service meanwhile).
pub const MAX_READS_PER_PERIOD: usize = 256;
/// Services with a profile of their own in one period at most (the
/// others' samples go out under the run's service).
pub const MAX_SERVICES_PER_PERIOD: usize = 64;

/// A value a process chose, as a tag can hold it: trimmed, at most
/// [`MAX_VALUE_BYTES`], the tag list's separator (`,`) and control
/// characters replaced; `None` when nothing is left.
pub fn tag_value(raw: &str) -> Option<String> {
    let cleaned: String = raw
        .trim()
        .chars()
        .map(|c| if c == ',' || c.is_control() { '_' } else { c })
        .collect();
    let mut end = cleaned.len().min(MAX_VALUE_BYTES);
    while !cleaned.is_char_boundary(end) {
        end -= 1;
    }
    let value = cleaned[..end].trim_matches('_').to_string();
    (!value.is_empty()).then_some(value)
}

/// What the worker knows of its processes' services: read at a process's
/// first sample of a period (while it runs: a short-lived process is gone
/// by the period's end), once per program it runs, and its process
/// context looked for again each period until found (an SDK publishes it
/// after the program starts).
#[derive(Debug, Default)]
pub struct Identities {
    known: HashMap<u32, Known>,
    /// The processes met this period whose service is settled for it.
    met: HashSet<u32>,
    /// The processes met this period without a published context yet, and
    /// their samples so far: read again at their 16th and 256th (an SDK
    /// publishes soon after its program starts, likely after the first
    /// sample), then settled.
    unsettled: HashMap<u32, u32>,
    /// Reads made this period.
    reads: usize,
    /// A read overran its bound (a process whose `OTEL_CTX` mapping does not
    /// answer): no process context is read by this worker any more.
    contexts_stopped: bool,
}

/// The samples of a process without a published context at which it is
/// read again (the first is read at once), and after which it is settled
/// for the period.
const READ_AGAIN_AT: [u32; 2] = [16, 256];

#[derive(Debug)]
struct Known {
    /// The execs the table counted when it was read: another program since
    /// is read again.
    execs: u32,
    identity: Option<ServiceIdentity>,
    /// Found in the process context (final for this program).
    published: bool,
    /// The process's name when it was read.
    program: Option<String>,
}

impl Identities {
    /// Notes a sample of `pid`: at its first of the period, its service is
    /// read if it is not known (at most [`MAX_READS_PER_PERIOD`] reads a
    /// period; the others' samples keep the run's service).
    pub fn met(&mut self, processes: &ProcessTable, pid: u32) {
        if self.met.contains(&pid) {
            return;
        }
        let samples = self.unsettled.entry(pid).or_insert(0);
        *samples += 1;
        let samples = *samples;
        if samples == 1 || READ_AGAIN_AT.contains(&samples) {
            self.read_if_stale(processes, pid);
        }
        let published = self.known.get(&pid).is_some_and(|known| known.published);
        if published || samples >= READ_AGAIN_AT[READ_AGAIN_AT.len() - 1] {
            self.unsettled.remove(&pid);
            self.met.insert(pid);
        }
    }

    fn read_if_stale(&mut self, processes: &ProcessTable, pid: u32) {
        let execs = processes.execs(pid);
        let stale = self
            .known
            .get(&pid)
            .is_none_or(|known| known.execs != execs || !known.published);
        if !stale || self.reads >= MAX_READS_PER_PERIOD || processes.exited(pid) {
            return;
        }
        self.reads += 1;
        // Its name now, as `/proc` says it with the service: the table's
        // may still be the program's before an exec whose record is not
        // applied yet (the samples are in time order, the reads are not).
        let program = std::fs::read_to_string(format!("/proc/{pid}/comm"))
            .ok()
            .map(|name| name.trim_end_matches('\n').to_string());
        let published = if self.contexts_stopped {
            None
        } else {
            match process_context::of_process(pid) {
                Ok(published) => published,
                Err(unanswered) => {
                    log::warn!(
                        "process {pid}'s OpenTelemetry process context: {unanswered}; no process \
                         context is read any more (services from the environment only)"
                    );
                    self.contexts_stopped = true;
                    None
                }
            }
        };
        let known = match published {
            Some(identity) => Known {
                execs,
                identity: Some(identity),
                published: true,
                program,
            },
            // The environment is read once per program.
            None => match self.known.remove(&pid).filter(|known| known.execs == execs) {
                Some(known) => known,
                None => Known {
                    execs,
                    identity: environ::of_process(pid),
                    published: false,
                    program,
                },
            },
        };
        self.known.insert(pid, known);
    }

    /// The services of the processes met this period that have one; the
    /// processes the table no longer has are forgotten, and the next
    /// period starts.
    pub fn of_period(&mut self, processes: &ProcessTable) -> Services {
        let found: Services = self
            .met
            .iter()
            .chain(self.unsettled.keys())
            .filter_map(|pid| {
                let known = self.known.get(pid)?;
                // Grouped by service, environment, version and instance id:
                // a tracer publishes its runtime id as `service.instance.id`
                // (dd-trace does), and the profile's `runtime-id` tag must be
                // that one for the backend to link its spans to the samples.
                // (The container is the samples', set by `split`.)
                let service = ProcessService {
                    identity: ServiceIdentity {
                        container_id: None,
                        ..known.identity.clone()?
                    },
                    program: known.program.clone(),
                };
                Some((*pid, service))
            })
            .collect();
        self.known
            .retain(|pid, _| found.contains_key(pid) || processes.get(*pid).is_some());
        self.met.clear();
        self.unsettled.clear();
        self.reads = 0;
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_values_are_bounded_and_keep_the_tag_list_whole() {
        assert_eq!(tag_value(" checkout "), Some("checkout".into()));
        assert_eq!(tag_value("a,b\nc"), Some("a_b_c".into()));
        assert_eq!(tag_value(" , "), None);
        let long = "é".repeat(MAX_VALUE_BYTES);
        let value = tag_value(&long).unwrap();
        assert!(value.len() <= MAX_VALUE_BYTES && value.chars().all(|c| c == 'é'));
    }

    #[test]
    fn a_process_is_read_once_per_program_and_forgotten_when_gone() {
        let mut table = ProcessTable::new();
        let own = std::process::id();
        table.load_from_proc(own).unwrap();
        let mut identities = Identities::default();
        // This test process publishes no context: its environment's
        // service, if the runner set one, and it is known.
        identities.met(&table, own);
        let expected = environ::of_process(own);
        assert_eq!(
            identities
                .of_period(&table)
                .remove(&own)
                .map(|s| s.identity),
            expected
        );
        assert!(identities.known.contains_key(&own));
        table.exit(own, own);
        assert!(identities.of_period(&table).is_empty());
        assert!(identities.known.is_empty());
    }
}

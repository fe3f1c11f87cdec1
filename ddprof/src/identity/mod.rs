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

/// `pid`'s service: its process context's, else its environment's.
pub fn of_process(pid: u32) -> Option<ServiceIdentity> {
    process_context::of_process(pid).or_else(|| environ::of_process(pid))
}

/// What the worker knows of its processes' services: read at a process's
/// first sample of a period (while it runs: a short-lived process is gone
/// by the period's end), once per program it runs, and its process
/// context looked for again each period until found (an SDK publishes it
/// after the program starts).
#[derive(Debug, Default)]
pub struct Identities {
    known: HashMap<u32, Known>,
    /// The processes met this period.
    met: HashSet<u32>,
    /// Reads made this period.
    reads: usize,
}

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
        if self.met.insert(pid) {
            self.read_if_stale(processes, pid);
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
        let known = match process_context::of_process(pid) {
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
            .filter_map(|pid| {
                let known = self.known.get(pid)?;
                let service = ProcessService {
                    identity: known.identity.clone()?,
                    program: known.program.clone(),
                };
                Some((*pid, service))
            })
            .collect();
        self.known
            .retain(|pid, _| found.contains_key(pid) || processes.get(*pid).is_some());
        self.met.clear();
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
        // This test process publishes nothing: no service, but it is known.
        identities.met(&table, own);
        assert!(identities.of_period(&table).is_empty());
        assert!(identities.known.contains_key(&own));
        table.exit(own, own);
        assert!(identities.of_period(&table).is_empty());
        assert!(identities.known.is_empty());
    }
}

//! Ordering records across ring buffers, and keeping the process table's
//! history whole (lazy /proc loads for processes that predate the events).
use std::collections::HashSet;

use super::record::Record;
use crate::process::{ProcessEvent, ProcessTable};

/// A decoded record waiting for its turn; `sequence` keeps the read order of
/// records with equal times.
struct Pending {
    time: u64,
    sequence: u64,
    record: Record,
}

/// Records read from every buffer, released in time order.
#[derive(Default)]
pub struct Reorder {
    pending: Vec<Pending>,
    next_sequence: u64,
}

impl Reorder {
    pub fn push(&mut self, time: u64, record: Record) {
        self.pending.push(Pending {
            time,
            sequence: self.next_sequence,
            record,
        });
        self.next_sequence += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Processes with a queued fork (the child), exec or executable mmap:
    /// the table's view of them is behind what the kernel already reported.
    pub fn pids_with_new_code(&self) -> HashSet<u32> {
        self.pending
            .iter()
            .filter_map(|pending| match &pending.record {
                Record::Process(ProcessEvent::Fork { pid, ppid, .. }) if pid != ppid => Some(*pid),
                Record::Process(ProcessEvent::Comm {
                    pid, exec: true, ..
                }) => Some(*pid),
                Record::Process(ProcessEvent::Map(mapping))
                    if mapping.prot & libc::PROT_EXEC as u32 != 0 =>
                {
                    Some(mapping.pid)
                }
                _ => None,
            })
            .collect()
    }

    /// Removes and returns, oldest first, the records timestamped at or
    /// before `cutoff`, or every record when `cutoff` is `None`.
    pub fn take_ready(&mut self, cutoff: Option<u64>) -> Vec<Record> {
        self.pending
            .sort_unstable_by_key(|pending| (pending.time, pending.sequence));
        let ready = match cutoff {
            Some(cutoff) => self
                .pending
                .partition_point(|pending| pending.time <= cutoff),
            None => self.pending.len(),
        };
        self.pending
            .drain(..ready)
            .map(|pending| pending.record)
            .collect()
    }
}

/// Knows which processes the table has the whole history of: seen born
/// (fork), exec'd, or loaded from /proc (successfully or not: a failure is
/// not retried). Any other process is loaded from /proc when a record first
/// names it, before that record is applied.
#[derive(Default)]
pub struct ProcessTracker {
    known_pids: HashSet<u32>,
}

impl ProcessTracker {
    /// Applies one process event to the table.
    pub fn apply(&mut self, processes: &mut ProcessTable, event: &ProcessEvent) {
        match *event {
            ProcessEvent::Fork { pid, ppid, .. } if pid != ppid => {
                // The child starts as a copy of its parent.
                self.ensure_known(processes, ppid);
                self.known_pids.insert(pid);
            }
            // An exec replaces everything the table could have loaded.
            ProcessEvent::Comm {
                pid, exec: true, ..
            } => {
                self.known_pids.insert(pid);
            }
            ProcessEvent::Fork { pid, .. } | ProcessEvent::Comm { pid, .. } => {
                self.ensure_known(processes, pid)
            }
            ProcessEvent::Map(ref mapping) => self.ensure_known(processes, mapping.pid),
            ProcessEvent::Exit { pid, tid } => {
                if pid == tid {
                    // A later process with the same pid is a new history.
                    self.known_pids.remove(&pid);
                }
            }
        }
        processes.apply(event);
    }

    /// Makes sure the table knows process `pid` before one of its samples.
    pub fn before_sample(&mut self, processes: &mut ProcessTable, pid: u32) {
        self.ensure_known(processes, pid);
    }

    fn ensure_known(&mut self, processes: &mut ProcessTable, pid: u32) {
        if pid == 0 || pid == u32::MAX || !self.known_pids.insert(pid) {
            return;
        }
        // Loaded by someone else (the launcher's target, another engine).
        if processes.get(pid).is_some() {
            return;
        }
        if let Err(error) = processes.load_from_proc(pid) {
            log::debug!(
                "process {pid} is not readable in /proc ({error}); its samples stay unresolved"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::MappingRecord;

    fn map(pid: u32, start: u64, path: &str) -> ProcessEvent {
        ProcessEvent::Map(MappingRecord {
            pid,
            start,
            len: 0x1000,
            file_offset: 0,
            dev: 1,
            inode: 2,
            prot: (libc::PROT_READ | libc::PROT_EXEC) as u32,
            path: path.into(),
        })
    }

    #[test]
    fn releases_records_in_time_order_up_to_the_cutoff() {
        let mut queue = Reorder::default();
        queue.push(30, Record::Ignored(3));
        queue.push(10, Record::Ignored(1));
        queue.push(20, Record::Ignored(2));
        queue.push(20, Record::Ignored(22));
        assert_eq!(
            queue.take_ready(Some(20)),
            vec![Record::Ignored(1), Record::Ignored(2), Record::Ignored(22)]
        );
        assert!(!queue.is_empty());
        queue.push(25, Record::Ignored(25));
        assert_eq!(
            queue.take_ready(None),
            vec![Record::Ignored(25), Record::Ignored(3)]
        );
        assert!(queue.is_empty());
    }

    /// A fork read from one CPU's buffer after the child's exec was read from
    /// another's: ordering by time keeps the child's own image.
    #[test]
    fn fork_then_exec_across_buffers_leaves_the_child_its_own_mappings() {
        // Pids far above pid_max: never live processes, never loaded from /proc.
        let (parent, child) = (1 << 30, (1 << 30) + 1);
        let mut queue = Reorder::default();
        let mut table = ProcessTable::new();
        let mut tracker = ProcessTracker::default();
        let records = [
            // Buffer of CPU 1, read first.
            (
                40,
                ProcessEvent::Comm {
                    pid: child,
                    tid: child,
                    name: "child".into(),
                    exec: true,
                },
            ),
            (41, map(child, 0x7000, "/child")),
            // Buffer of CPU 0.
            (
                10,
                ProcessEvent::Comm {
                    pid: parent,
                    tid: parent,
                    name: "parent".into(),
                    exec: true,
                },
            ),
            (11, map(parent, 0x1000, "/parent")),
            (
                30,
                ProcessEvent::Fork {
                    pid: child,
                    ppid: parent,
                    tid: child,
                    ptid: parent,
                },
            ),
        ];
        for (time, event) in records {
            queue.push(time, Record::Process(event));
        }
        for record in queue.take_ready(None) {
            let Record::Process(event) = record else {
                unreachable!()
            };
            tracker.apply(&mut table, &event);
        }
        assert_eq!(table.process_name(child), Some("child"));
        assert_eq!(
            table.find_mapping(child, 0x7000).unwrap().file.path,
            "/child"
        );
        assert!(table.find_mapping(child, 0x1000).is_none());
        assert_eq!(
            table.find_mapping(parent, 0x1000).unwrap().file.path,
            "/parent"
        );
    }

    #[test]
    fn a_process_first_seen_by_a_sample_is_loaded_from_proc_once() {
        let me = std::process::id();
        let mut table = ProcessTable::new();
        let mut tracker = ProcessTracker::default();
        tracker.before_sample(&mut table, me);
        let here = a_process_first_seen_by_a_sample_is_loaded_from_proc_once as *const () as u64;
        assert!(table.find_mapping(me, here).is_some());
        // Once known, records apply on top of what was loaded.
        tracker.apply(&mut table, &map(me, 0x1000, "/extra"));
        tracker.before_sample(&mut table, me);
        assert!(table.find_mapping(me, here).is_some());
        assert!(table.find_mapping(me, 0x1000).is_some());
        // A process that cannot be read stays empty but usable.
        let gone = 1 << 30;
        tracker.before_sample(&mut table, gone);
        assert!(table.get(gone).is_none());
        tracker.apply(&mut table, &map(gone, 0x1000, "/x"));
        assert!(table.find_mapping(gone, 0x1000).is_some());
    }
}

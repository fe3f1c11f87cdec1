//! Ordering records across ring buffers, and keeping the process table's
//! history whole (lazy /proc loads for processes that predate the events).
use std::collections::{HashMap, HashSet, VecDeque};

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
    /// A record was queued behind a later one since the last sort: the BPF
    /// engine's merge takes the ready records before each of its samples,
    /// and sorting a queue already in order each time cost a pass over it.
    unsorted: bool,
}

impl Reorder {
    pub fn push(&mut self, time: u64, record: Record) {
        if self.pending.last().is_some_and(|last| last.time > time) {
            self.unsorted = true;
        }
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
            .filter_map(|pending| new_code_of(&pending.record))
            .collect()
    }

    /// For each process with new code queued (see
    /// [`Reorder::pids_with_new_code`]), the time of the earliest such
    /// record: a sample of it taken before then is unwound right by the
    /// table as it is.
    pub fn new_code_times(&self) -> HashMap<u32, u64> {
        let mut times: HashMap<u32, u64> = HashMap::new();
        for pending in &self.pending {
            if let Some(pid) = new_code_of(&pending.record) {
                times
                    .entry(pid)
                    .and_modify(|time| *time = (*time).min(pending.time))
                    .or_insert(pending.time);
            }
        }
        times
    }

    /// The processes in `pids` as `processes` will have them once the
    /// queued records are applied, for those that the table and the
    /// records describe whole: a queued exec, a queued fork of a process
    /// described so, or a process the table has (with its queued mmaps).
    /// The others are not in the returned table. (A process that predates
    /// the events and that no record describes fully is read from `/proc`
    /// by whoever needs it.) Reading `/proc/PID/maps` costs ~0.1 ms; this
    /// is what the BPF engine needs of each process a program starts.
    /// A process whose exit is queued is not in the table either, but
    /// [`ProcessTable::exited`] says so: there is nothing left to read.
    pub fn preview(&self, processes: &ProcessTable, pids: &HashSet<u32>) -> ProcessTable {
        let mut queued: Vec<(&Pending, &ProcessEvent)> = self
            .pending
            .iter()
            .filter_map(|pending| match &pending.record {
                Record::Process(event) => Some((pending, event)),
                _ => None,
            })
            .collect();
        queued.sort_unstable_by_key(|(pending, _)| (pending.time, pending.sequence));
        // The processes asked for and, back through the queued forks, the
        // processes they were forked from.
        let mut involved = pids.clone();
        loop {
            let known = involved.len();
            for (_, event) in &queued {
                if let ProcessEvent::Fork { pid, ppid, .. } = **event {
                    if pid != ppid && involved.contains(&pid) {
                        involved.insert(ppid);
                    }
                }
            }
            if involved.len() == known {
                break;
            }
        }
        let mut table = ProcessTable::new();
        for &pid in &involved {
            table.copy_process(processes, pid);
        }
        for (_, event) in queued {
            match *event {
                ProcessEvent::Fork { pid, ppid, .. } if pid != ppid => {
                    if !involved.contains(&pid) {
                        continue;
                    }
                    if table.get(ppid).is_some() {
                        table.apply(event);
                    } else {
                        // Forked from a process nothing here describes:
                        // alive, but left to `/proc`.
                        table.forget(pid);
                    }
                }
                ProcessEvent::Comm {
                    pid, exec: true, ..
                } if involved.contains(&pid) => table.apply(event),
                ProcessEvent::Map(ref mapping) if table.get(mapping.pid).is_some() => {
                    table.apply(event)
                }
                ProcessEvent::Fork { pid, .. }
                | ProcessEvent::Comm { pid, .. }
                | ProcessEvent::Exit { pid, .. }
                    if table.get(pid).is_some() =>
                {
                    table.apply(event)
                }
                _ => {}
            }
        }
        table.retain(|pid| pids.contains(&pid));
        table
    }

    /// [`Reorder::take_ready_timed`] without the times.
    #[cfg(test)]
    pub fn take_ready(&mut self, cutoff: Option<u64>) -> Vec<Record> {
        self.take_ready_timed(cutoff)
            .into_iter()
            .map(|(_, record)| record)
            .collect()
    }

    /// Removes and returns, oldest first, the records timestamped at or
    /// before `cutoff` (every record when `None`), each with its time.
    pub fn take_ready_timed(&mut self, cutoff: Option<u64>) -> VecDeque<(u64, Record)> {
        if std::mem::take(&mut self.unsorted) {
            self.pending
                .sort_unstable_by_key(|pending| (pending.time, pending.sequence));
        }
        let ready = match cutoff {
            Some(cutoff) => self
                .pending
                .partition_point(|pending| pending.time <= cutoff),
            None => self.pending.len(),
        };
        self.pending
            .drain(..ready)
            .map(|pending| (pending.time, pending.record))
            .collect()
    }
}

/// The process whose code a record changes: a fork's child, an exec, an
/// executable mmap.
fn new_code_of(record: &Record) -> Option<u32> {
    match record {
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
    }
}

/// Knows which processes the table has the whole history of: seen born
/// (fork), exec'd, or loaded from /proc (successfully or not: a failure is
/// not retried). Any other process is loaded from /proc when a record first
/// names it, before that record is applied.
#[derive(Default)]
pub struct ProcessTracker {
    known_pids: HashSet<u32>,
    /// A sample of a process no record named is not a reason to read it
    /// from `/proc` (events that sample every CPU: it is not profiled).
    sampled_stay_unknown: bool,
}

impl ProcessTracker {
    /// Whether a sample of a process no record named has it read from
    /// `/proc` (the default), or leaves it unknown.
    pub fn load_sampled_from_proc(&mut self, load: bool) {
        self.sampled_stay_unknown = !load;
    }

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
                self.ensure_known(processes, pid);
            }
            ProcessEvent::Map(ref mapping) => {
                self.ensure_known(processes, mapping.pid);
            }
            ProcessEvent::Exit { pid, tid } => {
                if pid == tid {
                    // A later process with the same pid is a new history.
                    self.known_pids.remove(&pid);
                }
            }
        }
        processes.apply(event);
    }

    /// Makes sure the table knows process `pid` before one of its samples;
    /// returns whether it was read from `/proc` now.
    pub fn before_sample(&mut self, processes: &mut ProcessTable, pid: u32) -> bool {
        if self.sampled_stay_unknown {
            return false;
        }
        self.ensure_known(processes, pid)
    }

    fn ensure_known(&mut self, processes: &mut ProcessTable, pid: u32) -> bool {
        if pid == 0 || pid == u32::MAX || !self.known_pids.insert(pid) {
            return false;
        }
        // Loaded by someone else (the launcher's target, another engine).
        if processes.get(pid).is_some() {
            return false;
        }
        match processes.load_from_proc(pid) {
            Ok(()) => true,
            Err(error) => {
                log::debug!(
                    "process {pid} is not readable in /proc ({error}); its samples stay \
                     unresolved"
                );
                false
            }
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

    /// What the BPF engine needs of a new process before its records are
    /// applied, from the queued records alone: no `/proc` read (these pids
    /// are far above pid_max, so there is nothing to read).
    #[test]
    fn a_preview_describes_new_processes_from_the_queued_records() {
        let (parent, child, sibling, orphan, stranger) = (
            1 << 30,
            (1 << 30) + 1,
            (1 << 30) + 2,
            (1 << 30) + 3,
            (1 << 30) + 4,
        );
        let mut table = ProcessTable::new();
        table.apply(&ProcessEvent::Comm {
            pid: parent,
            tid: parent,
            name: "parent".into(),
            exec: true,
        });
        table.apply(&map(parent, 0x1000, "/parent"));
        let fork = |pid, ppid| {
            Record::Process(ProcessEvent::Fork {
                pid,
                ppid,
                tid: pid,
                ptid: ppid,
            })
        };
        let mut queue = Reorder::default();
        // The parent maps a library, then forks the child, which execs.
        queue.push(10, Record::Process(map(parent, 0x2000, "/library")));
        queue.push(20, fork(child, parent));
        queue.push(
            30,
            Record::Process(ProcessEvent::Comm {
                pid: child,
                tid: child,
                name: "child".into(),
                exec: true,
            }),
        );
        queue.push(31, Record::Process(map(child, 0x7000, "/child")));
        // Forked, not exec'd: the parent's image, library included.
        queue.push(25, fork(sibling, parent));
        // Forked from a process nothing describes.
        queue.push(40, fork(orphan, stranger));
        // Only an mmap: the rest of its mappings are unknown.
        queue.push(50, Record::Process(map(stranger, 0x9000, "/x")));
        let pids: HashSet<u32> = [child, sibling, orphan, stranger, parent].into();
        let preview = queue.preview(&table, &pids);
        let paths = |pid| {
            let mut paths: Vec<String> = preview
                .get(pid)
                .unwrap()
                .mappings
                .iter()
                .map(|m| m.file.path.clone())
                .collect();
            paths.sort();
            paths
        };
        assert_eq!(paths(child), ["/child"]);
        assert_eq!(paths(sibling), ["/library", "/parent"]);
        assert_eq!(paths(parent), ["/library", "/parent"]);
        assert!(preview.get(orphan).is_none());
        assert!(preview.get(stranger).is_none());
        // Neither said to have exited: both are left to `/proc`.
        assert!(!preview.exited(orphan) && !preview.exited(stranger));
        // The table itself is untouched, and the records still queued.
        assert!(table.get(child).is_none());
        assert!(table.find_mapping(parent, 0x2000).is_none());
        assert_eq!(queue.take_ready(None).len(), 7);
    }

    /// A new process that has already exited by the records still queued
    /// (`/bin/true` under a shell) is gone from the preview and said to
    /// have exited, so that nobody reads `/proc` for it; one forked again
    /// under the same pid afterwards is described.
    #[test]
    fn a_preview_says_which_new_processes_have_exited_already() {
        let (parent, child, reused) = (1 << 30, (1 << 30) + 1, (1 << 30) + 2);
        let mut table = ProcessTable::new();
        table.apply(&map(parent, 0x1000, "/parent"));
        let fork = |pid| {
            Record::Process(ProcessEvent::Fork {
                pid,
                ppid: parent,
                tid: pid,
                ptid: parent,
            })
        };
        let exit = |pid| Record::Process(ProcessEvent::Exit { pid, tid: pid });
        let mut queue = Reorder::default();
        queue.push(10, fork(child));
        queue.push(11, Record::Process(map(child, 0x7000, "/child")));
        queue.push(12, exit(child));
        queue.push(20, fork(reused));
        queue.push(21, exit(reused));
        queue.push(22, fork(reused));
        let pids: HashSet<u32> = [child, reused].into();
        let preview = queue.preview(&table, &pids);
        assert!(preview.get(child).is_none());
        assert!(preview.exited(child));
        assert!(preview.get(reused).is_some());
        assert!(!preview.exited(reused));
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

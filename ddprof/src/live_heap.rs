//! The live heap of `sALLOC mode=l`: the sampled allocations that were not
//! freed yet, each kept with its stack and its unbiased weights, and added
//! to every period's profile as `inuse-objects` / `inuse-space`.
//!
//! The preloaded library follows the addresses it sampled and reports their
//! frees ([`crate::events::allocation`]); the samples arrive here in time
//! order with the other samples ([`HeapEvent`]). A free of an address not
//! held (an allocation from before the profiler, a fork's copy of its
//! parent's heap) is ignored. A process that exits or execs takes its
//! entries with it at the period's end; what an exited process held then
//! is in that period's profile, as held at its exit.
//!
//! It survives the worker's restarts: at each period's end the worker
//! writes the set to an anonymous file the parent holds
//! ([`CarriedFile`]), and the next worker reads it back. The set keeps raw
//! addresses, normalized again each period with the table of the worker
//! of the time (a restarted worker reads the processes from `/proc`). A
//! worker that dies loses what changed since its last period's end.
//!
//! Bounded: at most [`MAX_LIVE_ALLOCATIONS`] entries (past that, new
//! allocations are left out of the live heap and counted), each with at
//! most [`MAX_FRAMES`] frames.
use std::collections::HashMap;

use crate::aggregate::Aggregator;
use crate::carried::{CarriedError, CarriedFile, Reader, Writer, MAX_FRAMES};
use crate::events::HeapEvent;
use crate::process::ProcessTable;
use crate::sample::Sample;

/// Live allocations followed at most. At the default mean (512 KiB) this
/// is about 32 GiB of live heap in allocations smaller than the mean.
pub const MAX_LIVE_ALLOCATIONS: usize = 65_536;

/// What the worker does with a sample after the live heap saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// A sample of the profile (an allocation of a summed event, any other
    /// event's sample).
    Profile,
    /// Taken by the live heap only (a free; an allocation of an event whose
    /// allocations are not summed, `mode=l`).
    LiveHeapOnly,
}

/// What the live heap left out or ignored, since the run started (the
/// snapshot carries them from worker to worker).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LiveHeapCounters {
    /// Sampled allocations the library could not follow (its table had no
    /// room): in `alloc-*`, not in `inuse-*`.
    pub not_followed: u64,
    /// Sampled allocations left out because the set was full.
    pub over_limit: u64,
    /// Frees of addresses the set did not hold.
    pub unknown_frees: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct LiveAllocation {
    /// The allocation's sample, its event already the live heap's index,
    /// its weight what is still held of it.
    sample: Sample,
    /// The process's exec count when it was sampled.
    execs: u32,
    /// The bytes allocated (the library reports what a mapping still holds
    /// in the same unit) and the weight of all of them.
    size: u64,
    whole_weight: u64,
}

impl LiveAllocation {
    /// Weighs what is left of it after `held` of its `size` bytes remain.
    fn hold(&mut self, held: u64) {
        if self.size != 0 {
            let held = u128::from(held.min(self.size));
            self.sample.weight =
                (u128::from(self.whole_weight) * held / u128::from(self.size)) as u64;
        }
    }
}

/// The sampled allocations not freed yet, by (pid, address).
#[derive(Debug, Default)]
pub struct LiveHeap {
    /// The live `sALLOC` events' indices, and whether their allocations
    /// are summed too (`mode=sl`).
    events: Vec<(u16, bool)>,
    allocations: HashMap<(u32, u64), LiveAllocation>,
    counters: LiveHeapCounters,
}

impl LiveHeap {
    /// A live heap for the events of the profile: those with a live heap
    /// column ([`crate::profile::ProfiledEvent::live_heap`]).
    pub fn new(events: &[crate::profile::ProfiledEvent]) -> Self {
        let live = events
            .iter()
            .filter(|event| event.live_heap)
            .filter_map(|event| crate::events::allocation_of_live_heap(event.index))
            .map(|index| {
                let summed = events
                    .iter()
                    .any(|event| event.allocation && event.index == index);
                (index, summed)
            })
            .collect();
        Self {
            events: live,
            ..Self::default()
        }
    }

    /// Whether any event has a live heap.
    pub fn is_active(&self) -> bool {
        !self.events.is_empty()
    }

    /// Allocations held now.
    pub fn len(&self) -> usize {
        self.allocations.len()
    }

    pub fn is_empty(&self) -> bool {
        self.allocations.is_empty()
    }

    pub fn counters(&self) -> LiveHeapCounters {
        self.counters
    }

    /// Takes what `sample` says of the heap; where the sample goes next.
    pub fn take(&mut self, processes: &ProcessTable, sample: &Sample) -> Route {
        let Some(heap) = sample.heap else {
            return Route::Profile;
        };
        let event = match heap {
            HeapEvent::Freed { .. } => crate::events::allocation_of_frees(sample.event),
            _ => Some(sample.event),
        };
        let Some(&(event, summed)) =
            event.and_then(|event| self.events.iter().find(|(index, _)| *index == event))
        else {
            // An allocation of an event without a live heap.
            return Route::Profile;
        };
        match heap {
            HeapEvent::Allocated { address, size } => {
                let key = (sample.pid, address);
                if self.allocations.len() >= MAX_LIVE_ALLOCATIONS
                    && !self.allocations.contains_key(&key)
                {
                    self.counters.over_limit += 1;
                } else {
                    let mut kept = sample.clone();
                    kept.event = crate::events::live_heap_index(event);
                    kept.heap = None;
                    // Not kept (nor carried to the next worker).
                    kept.time = 0;
                    kept.cpu = 0;
                    kept.frames.truncate(MAX_FRAMES);
                    kept.kernel_frames.truncate(MAX_FRAMES);
                    let execs = processes.execs(sample.pid);
                    let whole_weight = kept.weight;
                    self.allocations.insert(
                        key,
                        LiveAllocation {
                            sample: kept,
                            execs,
                            size,
                            whole_weight,
                        },
                    );
                }
            }
            HeapEvent::NotFollowed => self.counters.not_followed += 1,
            HeapEvent::Freed {
                address,
                held,
                renamed,
            } => {
                match self.allocations.remove(&(sample.pid, address)) {
                    None => self.counters.unknown_frees += 1,
                    // A mapping of which a part is still mapped.
                    Some(mut live) if held != 0 => {
                        live.hold(held);
                        let name = if renamed != 0 { renamed } else { address };
                        self.allocations.insert((sample.pid, name), live);
                    }
                    Some(_) => {}
                }
                return Route::LiveHeapOnly;
            }
        }
        if summed {
            Route::Profile
        } else {
            Route::LiveHeapOnly
        }
    }

    /// Drops the allocations of processes that exited or exec'd, and adds
    /// the others to the period of `aggregator` (not as samples of the
    /// period: they are what is held at its end).
    ///
    /// What a process that exited since the last period held then (what
    /// it never freed: the leak a short-lived command shows at its exit)
    /// is added too, named with its mappings as they were
    /// ([`ProcessTable::as_it_ended`]), and then dropped; what a process
    /// held before an exec (its code replaced), or one that exited among
    /// more than [`ENDED_PROCESSES_NAMED`] in a period, is dropped
    /// unnamed. One line of the log says both. The caller then forgets the
    /// ended processes ([`ProcessTable::forget_ended`]).
    pub fn add_to(&mut self, processes: &ProcessTable, aggregator: &mut Aggregator) {
        let mut ended = Ended::default();
        let mut as_they_ended: HashMap<u32, Option<ProcessTable>> = HashMap::new();
        let gone = self.allocations.extract_if(|&(pid, _), live| {
            processes.get(pid).is_none() || processes.execs(pid) != live.execs
        });
        for ((pid, _), live) in gone {
            let table = as_they_ended
                .entry(pid)
                .or_insert_with(|| {
                    processes
                        .get(pid)
                        .is_none()
                        .then(|| processes.as_it_ended(pid))
                        .flatten()
                })
                .as_ref()
                .filter(|table| table.execs(pid) == live.execs);
            let named = table.is_some();
            if let Some(table) = table {
                aggregator.add_held(table, &live.sample);
            }
            ended.add(pid, live.sample.weight, named);
        }
        if ended.allocations > 0 {
            log::info!(
                "live heap: {} processes ended holding {} sampled allocations ({} bytes \
                 estimated): {} ({} bytes) in this profile as held at their exit, {} ({} bytes) \
                 dropped unnamed (an exec replaced their code, or more than {} processes ended)",
                ended.pids.len(),
                ended.allocations,
                ended.bytes,
                ended.named,
                ended.named_bytes,
                ended.allocations - ended.named,
                ended.bytes - ended.named_bytes,
                ENDED_PROCESSES_NAMED
            );
        }
        for live in self.allocations.values() {
            aggregator.add_held(processes, &live.sample);
        }
    }

    /// A restarted worker's table is new (exec counts from 0): the
    /// allocations read back belong to the processes as they are now.
    fn adopt(&mut self, processes: &ProcessTable) {
        for ((pid, _), live) in self.allocations.iter_mut() {
            live.execs = processes.execs(*pid);
        }
    }
}

/// Processes that exited whose held allocations are named at their exit,
/// per period at most (the process table keeps that many as they ended).
pub const ENDED_PROCESSES_NAMED: usize = 64;

/// What the processes that ended in a period held, and how much of it was
/// named.
#[derive(Debug, Default)]
struct Ended {
    allocations: u64,
    bytes: u64,
    named: u64,
    named_bytes: u64,
    pids: std::collections::HashSet<u32>,
}

impl Ended {
    fn add(&mut self, pid: u32, bytes: u64, named: bool) {
        self.allocations += 1;
        self.bytes = self.bytes.saturating_add(bytes);
        if named {
            self.named += 1;
            self.named_bytes = self.named_bytes.saturating_add(bytes);
        }
        self.pids.insert(pid);
    }
}

/// The magic of the live heap's snapshots ([`CarriedFile`]).
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"ddprofLH";

impl LiveHeap {
    /// Writes the set to `file`, for the next worker.
    pub fn save(&self, file: &CarriedFile) -> Result<(), CarriedError> {
        let mut writer = Writer::default();
        let counters = self.counters;
        for value in [
            counters.not_followed,
            counters.over_limit,
            counters.unknown_frees,
            self.allocations.len() as u64,
        ] {
            writer.u64(value);
        }
        for (&(_, address), live) in &self.allocations {
            writer.u64(address);
            writer.u64(live.size);
            writer.u64(live.whole_weight);
            writer.sample(&live.sample);
        }
        file.save(writer)
    }

    /// Replaces what the set holds by what the last worker saved in `file`
    /// (nothing before any), for this set's events and with the processes
    /// as `processes` knows them; on an error the set is left as it was.
    pub fn load(
        &mut self,
        file: &CarriedFile,
        processes: &ProcessTable,
    ) -> Result<(), CarriedError> {
        let Some(bytes) = file.load()? else {
            return Ok(());
        };
        let mut loaded = LiveHeap {
            events: self.events.clone(),
            ..LiveHeap::default()
        };
        parse_snapshot(&bytes, &mut loaded).ok_or(CarriedError::NotASnapshot)?;
        loaded.adopt(processes);
        *self = loaded;
        Ok(())
    }
}

/// Reads the entries of a snapshot into `heap`; `None` when the bytes are
/// not one (every length is checked).
fn parse_snapshot(bytes: &[u8], heap: &mut LiveHeap) -> Option<()> {
    let mut reader = Reader::new(bytes);
    heap.counters = LiveHeapCounters {
        not_followed: reader.u64()?,
        over_limit: reader.u64()?,
        unknown_frees: reader.u64()?,
    };
    let count = reader.u64()?;
    if count > MAX_LIVE_ALLOCATIONS as u64 {
        return None;
    }
    for _ in 0..count {
        let address = reader.u64()?;
        let size = reader.u64()?;
        let whole_weight = reader.u64()?;
        let sample = reader.sample()?;
        // Only the events of this run's live heap.
        let known = crate::events::allocation_of_live_heap(sample.event)
            .is_some_and(|index| heap.events.iter().any(|(live, _)| *live == index));
        if !known {
            return None;
        }
        heap.allocations.insert(
            (sample.pid, address),
            LiveAllocation {
                sample,
                execs: 0,
                size,
                whole_weight,
            },
        );
    }
    reader.is_empty().then_some(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{frees_index, live_heap_index};
    use crate::profile::ProfiledEvent;
    use crate::sample::StackEnd;

    fn events(sum: bool) -> Vec<ProfiledEvent> {
        let mut events = vec![ProfiledEvent {
            index: live_heap_index(1),
            cpu_time: false,
            allocation: false,
            live_heap: true,
            wall_time: false,
            label: "sALLOC".into(),
        }];
        if sum {
            events.push(ProfiledEvent {
                index: 1,
                allocation: true,
                live_heap: false,
                ..events[0].clone()
            });
        }
        events
    }

    fn sample(pid: u32, event: u16, heap: HeapEvent, frames: Vec<u64>) -> Sample {
        Sample {
            pid,
            tid: pid,
            time: 1,
            cpu: 0,
            event,
            weight: 1000,
            scaled_count: 2000,
            frames,
            kernel_frames: vec![],
            end: StackEnd::Complete,
            heap: Some(heap),
            off_cpu: None,
            trace: None,
        }
    }

    fn table(pids: &[u32]) -> ProcessTable {
        let mut table = ProcessTable::new();
        for &pid in pids {
            table.set_comm(pid, pid, "program", false);
        }
        table
    }

    /// A process kept as it ended is given once, and never for a pid that
    /// came back: another process.
    #[test]
    fn an_ended_process_is_named_until_its_pid_comes_back() {
        let mut processes = table(&[10, 11]);
        processes.keep_ended(ENDED_PROCESSES_NAMED);
        processes.exit(10, 10);
        processes.exit(11, 11);
        assert!(processes.get(10).is_none());
        assert_eq!(
            processes
                .as_it_ended(10)
                .and_then(|t| t.process_name(10).map(String::from)),
            Some("program".to_string())
        );
        processes.set_comm(10, 10, "another", false);
        assert!(processes.as_it_ended(10).is_none(), "pid 10 came back");
        assert!(processes.as_it_ended(11).is_some());
        processes.forget_ended();
        assert!(processes.as_it_ended(11).is_none());
        // Without a live heap nothing is kept.
        let mut plain = table(&[12]);
        plain.exit(12, 12);
        assert!(plain.as_it_ended(12).is_none());
    }

    #[test]
    fn frees_take_allocations_out_and_unknown_frees_are_ignored() {
        let processes = table(&[10, 11]);
        let mut heap = LiveHeap::new(&events(false));
        let allocated = |address| HeapEvent::Allocated { address, size: 10 };
        assert_eq!(
            heap.take(&processes, &sample(10, 1, allocated(0x1000), vec![1, 2])),
            Route::LiveHeapOnly
        );
        heap.take(&processes, &sample(10, 1, allocated(0x2000), vec![1, 3]));
        // The same address in another process is another allocation.
        heap.take(&processes, &sample(11, 1, allocated(0x1000), vec![1, 4]));
        assert_eq!(heap.len(), 3);
        let freed = |address| HeapEvent::Freed {
            address,
            held: 0,
            renamed: 0,
        };
        assert_eq!(
            heap.take(
                &processes,
                &sample(10, frees_index(1), freed(0x1000), vec![])
            ),
            Route::LiveHeapOnly
        );
        heap.take(
            &processes,
            &sample(10, frees_index(1), freed(0x9999), vec![]),
        );
        assert_eq!(heap.len(), 2);
        assert!(!heap.allocations.contains_key(&(10, 0x1000)));
        assert!(heap.allocations.contains_key(&(11, 0x1000)));
        assert_eq!(heap.counters().unknown_frees, 1);
        heap.take(&processes, &sample(10, 1, HeapEvent::NotFollowed, vec![1]));
        assert_eq!(heap.counters().not_followed, 1);
        // Another event's samples are the profile's.
        assert_eq!(
            heap.take(&processes, &sample(10, 0, allocated(0x3000), vec![1])),
            Route::Profile
        );
        let mut summed = LiveHeap::new(&events(true));
        assert_eq!(
            summed.take(&processes, &sample(10, 1, allocated(0x1000), vec![1])),
            Route::Profile
        );
    }

    /// A mapping partly unmapped is held for what is left (weighed in
    /// proportion), under its new name when its first pages went; wholly
    /// unmapped, it is freed.
    #[test]
    fn a_mapping_partly_unmapped_holds_the_rest_under_its_new_name() {
        let processes = table(&[10]);
        let mut heap = LiveHeap::new(&events(false));
        let mapped = HeapEvent::Allocated {
            address: 0x10_0000,
            size: 6 << 20,
        };
        heap.take(&processes, &sample(10, 1, mapped, vec![1]));
        let unmapped = |address, held, renamed| {
            sample(
                10,
                frees_index(1),
                HeapEvent::Freed {
                    address,
                    held,
                    renamed,
                },
                vec![],
            )
        };
        let weight = |heap: &LiveHeap, address| heap.allocations[&(10, address)].sample.weight;
        // Its last 2 MiB unmapped: a third of the weight (1000) goes.
        heap.take(&processes, &unmapped(0x10_0000, 4 << 20, 0));
        assert_eq!(weight(&heap, 0x10_0000), 666);
        // Its first MiB unmapped: named by its first page left.
        heap.take(&processes, &unmapped(0x10_0000, 3 << 20, 0x20_0000));
        assert!(!heap.allocations.contains_key(&(10, 0x10_0000)));
        assert_eq!(weight(&heap, 0x20_0000), 500);
        // A new mapping at the old name is another allocation.
        heap.take(&processes, &sample(10, 1, mapped, vec![2]));
        assert_eq!(heap.len(), 2);
        // Moved by mremap, then unmapped whole.
        heap.take(&processes, &unmapped(0x20_0000, 3 << 20, 0x90_0000));
        assert_eq!(weight(&heap, 0x90_0000), 500);
        heap.take(&processes, &unmapped(0x90_0000, 0, 0));
        assert_eq!(heap.len(), 1);
        assert_eq!(weight(&heap, 0x10_0000), 1000);
        assert_eq!(heap.counters().unknown_frees, 0);
        // Carried to the next worker with its whole weight and size.
        heap.take(&processes, &unmapped(0x10_0000, 1 << 20, 0));
        let file = CarriedFile::create("test", SNAPSHOT_MAGIC).unwrap();
        heap.save(&file).unwrap();
        let mut again = LiveHeap::new(&events(false));
        again.load(&file, &processes).unwrap();
        assert_eq!(again.allocations, heap.allocations);
        again.take(&processes, &unmapped(0x10_0000, 3 << 20, 0));
        assert_eq!(weight(&again, 0x10_0000), 500);
    }

    #[test]
    fn exits_and_execs_drop_a_processes_allocations() {
        let mut processes = table(&[10, 11, 12]);
        let mut heap = LiveHeap::new(&events(false));
        for (pid, address) in [(10, 1), (11, 2), (12, 3)] {
            heap.take(
                &processes,
                &sample(pid, 1, HeapEvent::Allocated { address, size: 1 }, vec![1]),
            );
        }
        processes.keep_ended(ENDED_PROCESSES_NAMED);
        processes.exit(11, 11);
        processes.set_comm(12, 12, "other", true);
        let mut aggregator = Aggregator::new(crate::aggregate::AggregatorOptions::new(false));
        heap.add_to(&processes, &mut aggregator);
        assert_eq!(heap.len(), 1);
        assert!(heap.allocations.contains_key(&(10, 1)));
        let period =
            aggregator.take_period(std::time::SystemTime::now(), std::time::SystemTime::now());
        assert_eq!(period.stats.samples, 0, "held allocations are not samples");
        // The live process's allocation, and what the exited one held at
        // its exit; not the exec'd one's (its code was replaced).
        assert_eq!(period.samples.len(), 2);
        let mut pids: Vec<u32> = period.samples.iter().map(|sample| sample.pid).collect();
        pids.sort();
        assert_eq!(pids, [10, 11]);
        // Reported once: the next period has the live process's only.
        processes.forget_ended();
        heap.add_to(&processes, &mut aggregator);
        let period =
            aggregator.take_period(std::time::SystemTime::now(), std::time::SystemTime::now());
        assert_eq!(period.samples.len(), 1);
        assert_eq!(period.samples[0].event, live_heap_index(1));
        assert_eq!(period.samples[0].scaled_count, 2000);
        assert_eq!(period.samples[0].cpu_nanos, 1000);
    }

    #[test]
    fn a_snapshot_carries_the_heap_to_the_next_worker() {
        let processes = table(&[10]);
        let mut heap = LiveHeap::new(&events(false));
        for address in 0..100u64 {
            heap.take(
                &processes,
                &sample(
                    10,
                    1,
                    HeapEvent::Allocated {
                        address,
                        size: address * 3,
                    },
                    vec![address, 7, 8],
                ),
            );
        }
        heap.take(&processes, &sample(10, 1, HeapEvent::NotFollowed, vec![]));
        let file = CarriedFile::create("test", SNAPSHOT_MAGIC).unwrap();
        let loaded = |file: &CarriedFile| {
            let mut heap = LiveHeap::new(&events(false));
            heap.load(file, &processes).map(|()| heap)
        };
        let empty = loaded(&file).unwrap();
        assert!(empty.is_empty());
        heap.save(&file).unwrap();
        let again = loaded(&file).unwrap();
        assert_eq!(again.allocations, heap.allocations);
        assert_eq!(again.counters(), heap.counters());
        // A smaller snapshot over a bigger one: its length says where it ends.
        let mut smaller = LiveHeap::new(&events(false));
        smaller.take(
            &processes,
            &sample(
                10,
                1,
                HeapEvent::Allocated {
                    address: 5,
                    size: 1,
                },
                vec![1],
            ),
        );
        smaller.save(&file).unwrap();
        let again = loaded(&file).unwrap();
        assert_eq!(again.len(), 1);
        // Bytes that are not a snapshot are refused, whole: 255 entries
        // said, one there.
        let mut corrupt = file.load().unwrap().unwrap();
        corrupt[24] = 0xff;
        let mut writer = crate::carried::Writer::default();
        corrupt.iter().for_each(|byte| writer.u8(*byte));
        file.save(writer).unwrap();
        assert!(loaded(&file).is_err());
        // What the heap held stays.
        assert!(smaller.load(&file, &processes).is_err());
        assert_eq!(smaller.len(), 1);
    }
}

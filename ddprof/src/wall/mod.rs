//! Wall time (`sWALL`): where the profiled threads wait, not only where
//! they run.
//!
//! The BPF engine's `sched_switch` program draws some of the profiled
//! threads' switch-outs and emits the stack of each drawn one (the user
//! stack unwound as a CPU sample's is, and the kernel stack that says why
//! the thread left the CPU), then, when that thread runs again, a record
//! with the time it did. This stage pairs the two: the stack is held
//! ("parked") until its thread's switch-in, and then weighs the time off
//! the CPU over the probability its switch-out was drawn with, an unbiased
//! estimate of the off-CPU time of all the switch-outs it stands for. A
//! wait that spans the end of a period is split at it: each period gets the
//! part of the wait it holds. With the CPU-time samples (whose weight is
//! CPU time), the profile's `wall-time` column is each thread's time on and
//! off a CPU.
pub mod seed;

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::io::BufRead;

use ddprof_common::sample::WALL_PROBABILITY_ONE;

use crate::aggregate::Aggregator;
use crate::carried::{CarriedError, CarriedFile, Reader, Writer};
use crate::process::ProcessTable;
use crate::sample::{OffCpu, Sample};

/// Stacks a CPU walks a second at most on average, over all the profiled
/// threads' switch-outs (the program's budget: `WALL_WALKS_PER_WINDOW` per
/// 100 ms window). A walk costs what a CPU sample's does (1-25 µs here),
/// so this bounds the walks to ~0.5 % of a CPU whatever the switching rate.
pub const WALKS_PER_CPU_SECOND: u64 = 1000;

/// Threads parked at once, at most (one stack each): beyond it, a new
/// stack of a thread not parked yet is dropped and counted.
const MAX_PARKED_THREADS: usize = 65_536;

/// The magic of the snapshots of waits under way that a retiring worker
/// leaves to the next ([`CarriedFile`]).
pub const SNAPSHOT_MAGIC: &[u8; 8] = b"ddprofWT";

/// What the BPF engine needs to sample `sWALL`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WallSampling {
    /// The event's index (its samples' `event`).
    pub event: u16,
    /// The highest probability with which a switch-out is drawn, in
    /// [`WALL_PROBABILITY_ONE`]ths.
    pub max_probability: u64,
    /// Waits shorter than this (nanoseconds) are left out.
    pub threshold_ns: u64,
}

/// The kernel's scheduler functions (and the tracing ones the program runs
/// under), by address range, from kallsyms: a wait's kernel stack is
/// folded to the first frame outside them, the wait's reason
/// (`futex_do_wait`, `do_nanosleep`, `anon_pipe_read`, `do_epoll_wait`).
#[derive(Debug, Clone, Default)]
pub struct SchedulerFunctions {
    /// Sorted `[start, end)` ranges.
    ranges: Vec<(u64, u64)>,
}

/// Whether the kernel function `name` only switches tasks (or is the
/// program's own tracing path): never the reason for a wait.
fn is_scheduler_function(name: &str) -> bool {
    const NAMES: [&str; 13] = [
        "__schedule",
        "schedule",
        "schedule_idle",
        "schedule_preempt_disabled",
        "schedule_timeout",
        "schedule_hrtimeout",
        "schedule_hrtimeout_range",
        "schedule_hrtimeout_range_clock",
        "preempt_schedule",
        "preempt_schedule_common",
        "preempt_schedule_notrace",
        "__cond_resched",
        "_cond_resched",
    ];
    const PREFIXES: [&str; 5] = [
        "__traceiter_",
        "__bpf_trace_",
        "bpf_trace_run",
        "bpf_prog_",
        "finish_task_switch",
    ];
    NAMES.contains(&name) || PREFIXES.iter().any(|prefix| name.starts_with(prefix))
}

impl SchedulerFunctions {
    /// Reads them from a kallsyms listing (`ADDRESS TYPE NAME [MODULE]`,
    /// in address order within the kernel image): each function ends where
    /// the next text symbol starts. Modules' symbols are skipped. One pass over the
    /// listing's ~10 MB, one line buffer: collecting every symbol first
    /// took ~60 ms and ~15 MiB at every start.
    pub fn from_kallsyms(mut listing: impl BufRead) -> Self {
        let mut ranges = Vec::new();
        // The scheduler function whose end is the next text symbol.
        let mut open: Option<u64> = None;
        let mut line = Vec::new();
        loop {
            line.clear();
            match listing.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
            let mut fields = line
                .split(|byte| byte.is_ascii_whitespace())
                .filter(|field| !field.is_empty());
            let (Some(address), Some(kind), Some(name)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if fields.next().is_some() {
                // A module's symbol (`[module]`, `[bpf]`): modules list
                // theirs in their own order, not by address, and the
                // scheduler's functions are all in the kernel image.
                open = None;
                continue;
            }
            if !matches!(kind, b"t" | b"T") {
                continue;
            }
            let Some(address) = std::str::from_utf8(address)
                .ok()
                .and_then(|text| u64::from_str_radix(text, 16).ok())
            else {
                continue;
            };
            if let Some(start) = open.take() {
                if address > start {
                    ranges.push((start, address));
                }
            }
            // `finish_task_switch.isra.0`: the compiler's suffix.
            let base = name.split(|&byte| byte == b'.').next().unwrap_or(name);
            if std::str::from_utf8(base).is_ok_and(is_scheduler_function) {
                open = Some(address);
            }
        }
        ranges.sort_unstable();
        Self { ranges }
    }

    fn contains(&self, address: u64) -> bool {
        let index = self.ranges.partition_point(|&(start, _)| start <= address);
        index > 0 && address < self.ranges[index - 1].1
    }

    /// How many of these functions' ranges are known (0: kallsyms was not
    /// readable, and waits keep their whole kernel stack).
    pub fn len(&self) -> usize {
        self.ranges.len()
    }

    pub fn is_empty(&self) -> bool {
        self.ranges.is_empty()
    }

    /// A wait's kernel frames, innermost first, folded to one: the first
    /// after the scheduler's own functions, the wait's reason. (The frames
    /// before the scheduler's are the program's own and its tracing path:
    /// a BPF program's range is not in kallsyms' order.) Unchanged with
    /// `all` (`--include-kernel`), or when no function is known.
    pub fn fold(&self, frames: &mut Vec<u64>, all: bool) {
        if all || self.ranges.is_empty() {
            return;
        }
        let scheduler = frames
            .iter()
            .position(|&address| self.contains(address))
            .unwrap_or(0);
        let reason = frames[scheduler..]
            .iter()
            .position(|&address| !self.contains(address))
            .map_or(frames.len().saturating_sub(1), |index| scheduler + index);
        frames.drain(..reason);
        frames.truncate(1);
        if reason > 0 {
            // A return address, now first, where the aggregator takes the
            // first frame as the exact PC: the call instruction's address
            // names its function even where the call ends it.
            if let Some(first) = frames.first_mut() {
                *first -= 1;
            }
        }
    }
}

/// A period's figures of wall time, and how its waits were sampled.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct WallPeriod {
    pub threshold_ns: u64,
    /// `probability=` (the program lowers it to keep to its budget).
    pub max_probability: f64,
    /// Switch-outs of the profiled threads (and of processes not
    /// described yet: `undescribed`).
    pub switch_outs: u64,
    pub undescribed: u64,
    /// Stacks taken, and lost with the ring buffer full.
    pub stacks: u64,
    pub stacks_lost: u64,
    /// Records of a thread's switch-in lost with the ring buffer full.
    pub ends_lost: u64,
    /// Waits weighed, and left out under the threshold.
    pub waits: u64,
    pub under_threshold: u64,
    /// Threads off a CPU at the period's end, with a stack.
    pub off_cpu_now: usize,
    /// Stacks whose switch-in never came (their wait ended at the thread's
    /// next CPU sample, its next stack or its process's end), switch-ins
    /// without their stack, stacks over the limit of parked threads.
    pub unpaired: u64,
    pub orphan_resumes: u64,
    pub over_limit: u64,
}

impl std::fmt::Display for WallPeriod {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "wall time: {} switch-outs of profiled threads ({} of processes not described \
             yet), {} stacks taken ({} lost: ring buffer full; {} ends of waits lost), {} \
             waits weighed, {} under the threshold, {} threads off a CPU now; {} stacks \
             without their switch-in, {} switch-ins without their stack, {} stacks over the \
             limit of parked threads",
            self.switch_outs,
            self.undescribed,
            self.stacks,
            self.stacks_lost,
            self.ends_lost,
            self.waits,
            self.under_threshold,
            self.off_cpu_now,
            self.unpaired,
            self.orphan_resumes,
            self.over_limit
        )
    }
}

impl WallPeriod {
    /// `ddprof.wall_time.NAME=VALUE` comments, for the pprof profile: how
    /// its `wall-time` was sampled.
    pub fn comments(&self) -> Vec<String> {
        vec![
            format!("ddprof.wall_time.threshold_ns={}", self.threshold_ns),
            format!("ddprof.wall_time.max_probability={}", self.max_probability),
            format!("ddprof.wall_time.stacks_per_cpu_second_at_most={WALKS_PER_CPU_SECOND}"),
            format!("ddprof.wall_time.switch_outs={}", self.switch_outs),
            format!("ddprof.wall_time.stacks={}", self.stacks),
            format!("ddprof.wall_time.stacks_lost={}", self.stacks_lost),
            format!("ddprof.wall_time.ends_lost={}", self.ends_lost),
            format!("ddprof.wall_time.waits={}", self.waits),
            format!("ddprof.wall_time.under_threshold={}", self.under_threshold),
        ]
    }
}

/// What the stage counted since the start.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WallCounters {
    /// Stacks of switch-outs received.
    pub stacks: u64,
    /// Waits ended (their thread ran again) and weighed.
    pub waits: u64,
    /// Waits ended below the threshold, left out.
    pub below_threshold: u64,
    /// Stacks whose thread's switch-in was never seen: a newer stack of
    /// the thread came first (the switch-in's record was lost), or the
    /// process ended. Their wait was counted up to the last period's end.
    pub unpaired: u64,
    /// Switch-ins without their stack (it was lost with a full ring
    /// buffer, or the process was not known yet).
    pub orphan_resumes: u64,
    /// Stacks dropped with [`MAX_PARKED_THREADS`] parked already.
    pub over_limit: u64,
}

/// A thread off the CPU, with its stack, until it runs again.
#[derive(Debug)]
struct Parked {
    sample: Sample,
    /// The probability its switch-out was drawn with.
    probability: u64,
    /// Its wait was weighed up to here already (the end of a period).
    accounted_until: u64,
}

/// The pairing of stacks and switch-ins (see the module's comment).
#[derive(Debug)]
pub struct WallTime {
    /// `sWALL`'s index (its records' `event`).
    event: u16,
    /// The CPU-time events, whose samples say a thread ran.
    cpu_time_events: Vec<u16>,
    threshold_ns: u64,
    /// `probability=`, in `WALL_PROBABILITY_ONE`ths.
    max_probability: u64,
    /// `--include-kernel`: keep every kernel frame of a wait.
    all_kernel_frames: bool,
    scheduler: SchedulerFunctions,
    parked: HashMap<u32, Parked>,
    /// The latest time of a sample delivered: the samples come in time
    /// order, so no record older than it is still to come.
    delivered_until: u64,
    counters: WallCounters,
    /// The program's counters and this stage's at the last period line.
    last_line: ([u64; 5], WallCounters),
}

impl Parked {
    /// Its stack, weighing the part of its wait from `accounted_until` to
    /// `until` over its probability (an unbiased estimate of the off-CPU
    /// time of the switch-outs it stands for), taken at `until`.
    fn weighed_until(&self, until: u64) -> Sample {
        let nanos = until.saturating_sub(self.accounted_until);
        let weight = u128::from(nanos) * u128::from(WALL_PROBABILITY_ONE)
            / u128::from(self.probability.max(1));
        Sample {
            weight: weight.min(u128::from(u64::MAX)) as u64,
            time: until,
            ..self.sample.clone()
        }
    }
}

impl WallTime {
    pub fn new(
        sampling: WallSampling,
        cpu_time_events: Vec<u16>,
        all_kernel_frames: bool,
        scheduler: SchedulerFunctions,
    ) -> Self {
        Self {
            event: sampling.event,
            cpu_time_events,
            threshold_ns: sampling.threshold_ns,
            max_probability: sampling.max_probability,
            all_kernel_frames,
            scheduler,
            parked: HashMap::new(),
            delivered_until: 0,
            counters: WallCounters::default(),
            last_line: ([0; 5], WallCounters::default()),
        }
    }

    /// Notes a delivered sample of any event. A CPU-time sample of a thread
    /// parked since before it was taken while the thread ran: the record of
    /// its switch-in was lost (the ring buffer full, or the program's map
    /// of parked threads full). Its wait ends here, at the latest. (Only
    /// CPU time says the thread ran: `sCS` and the other events sample in
    /// the switch itself, after the switch-out's stack.)
    pub fn delivered(
        &mut self,
        processes: &ProcessTable,
        sample: &Sample,
        aggregator: &mut Aggregator,
    ) {
        self.delivered_until = self.delivered_until.max(sample.time);
        if sample.off_cpu.is_some() || !self.cpu_time_events.contains(&sample.event) {
            return;
        }
        let Entry::Occupied(entry) = self.parked.entry(sample.tid) else {
            return;
        };
        let parked = &entry.get().sample;
        if parked.pid != sample.pid || sample.time <= parked.time {
            return;
        }
        let parked = entry.remove();
        self.counters.unpaired += 1;
        self.weigh_into(processes, parked, sample.time, aggregator);
    }

    /// Adds the rest of `parked`'s wait, up to `until`, to `aggregator`
    /// (unless the whole wait was under the threshold).
    fn weigh_into(
        &mut self,
        processes: &ProcessTable,
        parked: Parked,
        until: u64,
        aggregator: &mut Aggregator,
    ) {
        if until.saturating_sub(parked.sample.time) < self.threshold_ns {
            self.counters.below_threshold += 1;
            return;
        }
        self.counters.waits += 1;
        aggregator.add(processes, &parked.weighed_until(until));
    }

    /// Takes an `sWALL` record: parks a stack, or weighs the parked stack
    /// of a thread that ran again into `aggregator`.
    pub fn take(&mut self, processes: &ProcessTable, sample: &Sample, aggregator: &mut Aggregator) {
        match sample.off_cpu {
            Some(OffCpu::SwitchedOut { probability }) => {
                self.counters.stacks += 1;
                if self.parked.len() >= MAX_PARKED_THREADS && !self.parked.contains_key(&sample.tid)
                {
                    self.counters.over_limit += 1;
                    return;
                }
                // A stack older than the parked one (a switch-out the
                // program took before a thread was parked from `/proc`,
                // still in the buffer): that wait ended before.
                if self
                    .parked
                    .get(&sample.tid)
                    .is_some_and(|parked| parked.sample.time > sample.time)
                {
                    self.counters.unpaired += 1;
                    return;
                }
                let mut parked = sample.clone();
                self.scheduler
                    .fold(&mut parked.kernel_frames, self.all_kernel_frames);
                let replaced = self.parked.insert(
                    sample.tid,
                    Parked {
                        sample: parked,
                        probability,
                        accounted_until: sample.time,
                    },
                );
                if replaced.is_some() {
                    self.counters.unpaired += 1;
                }
            }
            Some(OffCpu::Resumed { switched_out }) => {
                // Only the switch-in of the parked switch-out: a stale
                // one (a thread's record from before its stack) leaves it.
                match self.parked.entry(sample.tid) {
                    Entry::Occupied(entry) if entry.get().sample.time == switched_out => {
                        let parked = entry.remove();
                        self.weigh_into(processes, parked, sample.time, aggregator);
                    }
                    _ => self.counters.orphan_resumes += 1,
                }
            }
            None => {}
        }
    }

    /// At the end of a period: the threads still off the CPU get the part
    /// of their wait up to `settled` (every record before it was delivered;
    /// the latest sample's time if later), in the period's profile (not as
    /// samples of it), and those of processes that ended are forgotten.
    pub fn close_period(
        &mut self,
        processes: &ProcessTable,
        aggregator: &mut Aggregator,
        settled: u64,
    ) {
        let until = self.delivered_until.max(settled);
        let threshold = self.threshold_ns;
        let before = self.parked.len();
        self.parked
            .retain(|_, parked| processes.get(parked.sample.pid).is_some());
        self.counters.unpaired += (before - self.parked.len()) as u64;
        for parked in self.parked.values_mut() {
            let waited = until.saturating_sub(parked.sample.time);
            if until <= parked.accounted_until || waited < threshold {
                continue;
            }
            aggregator.add_held(processes, &parked.weighed_until(until));
            parked.accounted_until = until;
        }
    }

    /// What the program (`program`: its counters `WallSwitchOuts`,
    /// `WallSampled`, `WallBufferFull`, `WallResumeLost`, `WallUndescribed`
    /// since it was loaded) and this stage did since the last period, with
    /// how waits are sampled: for the period's line and its profile.
    pub fn period_figures(&mut self, program: [u64; 5]) -> WallPeriod {
        let counters = self.counters;
        let last = std::mem::replace(&mut self.last_line, (program, counters));
        let delta = |index: usize| program[index].saturating_sub(last.0[index]);
        WallPeriod {
            threshold_ns: self.threshold_ns,
            max_probability: self.max_probability as f64 / WALL_PROBABILITY_ONE as f64,
            switch_outs: delta(0),
            undescribed: delta(4),
            stacks: delta(1),
            stacks_lost: delta(2),
            ends_lost: delta(3),
            waits: counters.waits - last.1.waits,
            under_threshold: counters.below_threshold - last.1.below_threshold,
            off_cpu_now: self.parked.len(),
            unpaired: counters.unpaired - last.1.unpaired,
            orphan_resumes: counters.orphan_resumes - last.1.orphan_resumes,
            over_limit: counters.over_limit - last.1.over_limit,
        }
    }

    /// Counts the program's figures from `program` (its counters when this
    /// stage starts: a worker that replaces another reports its own).
    pub fn count_program_from(&mut self, program: [u64; 5]) {
        self.last_line.0 = program;
    }

    /// Writes the threads parked now to `file`, for the next worker: a
    /// worker that retires hands the waits under way over with the buffers,
    /// where their switch-ins are.
    pub fn save(&self, file: &CarriedFile) -> Result<(), CarriedError> {
        let mut writer = Writer::default();
        writer.u64(self.parked.len() as u64);
        for parked in self.parked.values() {
            writer.sample(&parked.sample);
            writer.u64(parked.probability);
            writer.u64(parked.accounted_until);
        }
        file.save(writer)
    }

    /// Parks the threads the previous worker saved in `file` (none if it
    /// saved none), and clears it: a later worker must not take the same
    /// waits again (their switch-ins may have gone to this one). Returns
    /// how many; on an error, none is parked.
    pub fn load(&mut self, file: &CarriedFile) -> Result<usize, CarriedError> {
        let Some(bytes) = file.load()? else {
            return Ok(0);
        };
        file.clear()?;
        let parked = self
            .parse_parked(&bytes)
            .ok_or(CarriedError::NotASnapshot)?;
        let count = parked.len();
        self.parked.extend(parked);
        Ok(count)
    }

    /// The parked threads of a snapshot of this event; `None` when the
    /// bytes are not one.
    fn parse_parked(&self, bytes: &[u8]) -> Option<HashMap<u32, Parked>> {
        let mut reader = Reader::new(bytes);
        let count = reader.u64()?;
        if count > MAX_PARKED_THREADS as u64 {
            return None;
        }
        let mut parked = HashMap::with_capacity(count as usize);
        for _ in 0..count {
            let mut sample = reader.sample()?;
            let probability = reader.u64()?;
            let accounted_until = reader.u64()?;
            if sample.event != self.event
                || !(1..=WALL_PROBABILITY_ONE).contains(&probability)
                || accounted_until < sample.time
            {
                return None;
            }
            sample.off_cpu = Some(OffCpu::SwitchedOut { probability });
            parked.insert(
                sample.tid,
                Parked {
                    sample,
                    probability,
                    accounted_until,
                },
            );
        }
        reader.is_empty().then_some(parked)
    }

    /// Threads off the CPU now, with a stack.
    pub fn parked(&self) -> usize {
        self.parked.len()
    }

    pub fn counters(&self) -> WallCounters {
        self.counters
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::AggregatorOptions;
    use crate::sample::StackEnd;

    const KALLSYMS: &str = "\
ffffffff81000000 T _stext
ffffffff81100000 t finish_task_switch.isra.0
ffffffff81100400 T do_nanosleep
ffffffff81100800 T __schedule
ffffffff81101000 T schedule
ffffffff81101100 T futex_wait_queue
ffffffff81101200 D some_data
ffffffff81101300 T pipe_read
ffffffffc0001000 t __traceiter_xfs_thing	[xfs]
ffffffffc0000000 t xfs_wait	[xfs]
";

    fn scheduler() -> SchedulerFunctions {
        SchedulerFunctions::from_kallsyms(KALLSYMS.as_bytes())
    }

    #[test]
    fn a_waits_kernel_stack_folds_to_its_reason() {
        let scheduler = scheduler();
        assert_eq!(scheduler.len(), 3);
        // The program's frame (no range: BPF programs are listed out of
        // address order), __schedule, schedule, then the reason and its
        // callers.
        let stack = vec![
            0xffff_ffff_c000_1000,
            0xffff_ffff_8110_0810,
            0xffff_ffff_8110_1010,
            0xffff_ffff_8110_1110,
            0xffff_ffff_8110_1310,
        ];
        let mut folded = stack.clone();
        scheduler.fold(&mut folded, false);
        assert_eq!(folded, vec![0xffff_ffff_8110_110f]);
        // A stack without the scheduler's frames keeps its first frame.
        let mut unknown = vec![0xffff_ffff_c000_1000, 0xffff_ffff_8110_1310];
        scheduler.fold(&mut unknown, false);
        assert_eq!(unknown, vec![0xffff_ffff_c000_1000]);
        let mut all = stack.clone();
        scheduler.fold(&mut all, true);
        assert_eq!(all, stack);
        // finish_task_switch.isra.0 is the scheduler's; do_nanosleep not.
        let mut sleeping = vec![
            0xffff_ffff_c000_1000,
            0xffff_ffff_8110_0010,
            0xffff_ffff_8110_0410,
        ];
        scheduler.fold(&mut sleeping, false);
        assert_eq!(sleeping, vec![0xffff_ffff_8110_040f]);
        // A module's wait (listed out of address order, after a module's
        // tracing function) is no scheduler function.
        let mut module_wait = vec![0xffff_ffff_8110_0810, 0xffff_ffff_c000_0010];
        scheduler.fold(&mut module_wait, false);
        assert_eq!(module_wait, vec![0xffff_ffff_c000_000f]);
        // Without kallsyms, nothing is folded.
        let mut kept = stack.clone();
        SchedulerFunctions::default().fold(&mut kept, false);
        assert_eq!(kept, stack);
    }

    fn table() -> ProcessTable {
        let mut table = ProcessTable::new();
        table.set_comm(7, 7, "waiter", false);
        table
    }

    fn switched_out(tid: u32, time: u64, probability: u64) -> Sample {
        Sample {
            pid: 7,
            tid,
            time,
            cpu: 0,
            event: 1,
            weight: 0,
            scaled_count: crate::events::COUNT_UNIT,
            frames: vec![0x1000],
            kernel_frames: vec![0xffff_ffff_8110_1010, 0xffff_ffff_8110_1110],
            end: StackEnd::Complete,
            heap: None,
            off_cpu: Some(OffCpu::SwitchedOut { probability }),
            trace: None,
        }
    }

    fn resumed(tid: u32, time: u64, switched_out: u64) -> Sample {
        Sample {
            frames: Vec::new(),
            kernel_frames: Vec::new(),
            off_cpu: Some(OffCpu::Resumed { switched_out }),
            ..switched_out_sample(tid, time)
        }
    }

    fn switched_out_sample(tid: u32, time: u64) -> Sample {
        switched_out(tid, time, WALL_PROBABILITY_ONE)
    }

    fn total_weight(aggregator: &mut Aggregator) -> (u64, usize) {
        let period = aggregator.take_period(std::time::UNIX_EPOCH, std::time::UNIX_EPOCH);
        (
            period.samples.iter().map(|sample| sample.cpu_nanos).sum(),
            period.stacks.len(),
        )
    }

    /// `sWALL` as event 1 with `threshold_ns`, CPU time as event 0.
    fn sampling(threshold_ns: u64) -> WallSampling {
        WallSampling {
            event: 1,
            max_probability: WALL_PROBABILITY_ONE,
            threshold_ns,
        }
    }

    /// A wall-time stage of `sampling`, and an aggregator.
    fn stage(sampling: WallSampling) -> (WallTime, Aggregator) {
        (
            WallTime::new(sampling, vec![0], false, scheduler()),
            Aggregator::new(AggregatorOptions::new(false)),
        )
    }

    #[test]
    fn a_wait_weighs_its_time_off_the_cpu_over_its_probability_split_at_period_ends() {
        let processes = table();
        let (mut wall, mut aggregator) = stage(sampling(1_000));
        // Thread 8 drawn with probability 1/4 at t=1000, runs again at 3000.
        wall.take(
            &processes,
            &switched_out(8, 1_000, WALL_PROBABILITY_ONE / 4),
            &mut aggregator,
        );
        // Thread 9 drawn with probability 1 at 1500: still off at the
        // period's end (2500), back at 4500.
        wall.take(&processes, &switched_out_sample(9, 1_500), &mut aggregator);
        wall.close_period(&processes, &mut aggregator, 2_500);
        assert_eq!(wall.parked(), 2);
        // 9: 1000 ns so far; 8: 1500 ns over 1/4.
        assert_eq!(total_weight(&mut aggregator).0, 1_000 + 6_000);
        wall.take(&processes, &resumed(8, 3_000, 1_000), &mut aggregator);
        wall.take(&processes, &resumed(9, 4_500, 1_500), &mut aggregator);
        // 8: the rest, 500 ns over 1/4; 9: 2000 ns.
        let (weight, stacks) = total_weight(&mut aggregator);
        assert_eq!(weight, 2_000 + 2_000);
        // The kernel stack was folded to its reason: one stack for both.
        assert_eq!(stacks, 1);
        // Below the threshold: left out; a switch-in without its stack
        // (or of another switch-out) is counted, not weighed.
        wall.take(&processes, &switched_out_sample(8, 5_000), &mut aggregator);
        wall.take(&processes, &resumed(8, 5_500, 5_000), &mut aggregator);
        wall.take(&processes, &resumed(9, 6_000, 5_900), &mut aggregator);
        assert_eq!(total_weight(&mut aggregator).0, 0);
        let counters = wall.counters();
        assert_eq!(
            (
                counters.stacks,
                counters.waits,
                counters.below_threshold,
                counters.orphan_resumes
            ),
            (3, 2, 1, 1)
        );
        // A sample of a parked thread taken later (its switch-in's record
        // was lost) ends its wait there.
        wall.take(&processes, &switched_out_sample(8, 6_500), &mut aggregator);
        // (Another event's sample, `sCS`'s in the switch itself, says
        // nothing of the thread running again: only CPU time does.)
        let switching = Sample {
            off_cpu: None,
            event: 2,
            ..switched_out_sample(8, 6_600)
        };
        wall.delivered(&processes, &switching, &mut aggregator);
        assert_eq!(wall.parked(), 1);
        let running = Sample {
            off_cpu: None,
            event: 0,
            weight: 1_000_000,
            ..switched_out_sample(8, 8_000)
        };
        wall.delivered(&processes, &running, &mut aggregator);
        assert_eq!((wall.parked(), wall.counters().unpaired), (0, 1));
        assert_eq!(total_weight(&mut aggregator).0, 1_500);
        // A process that ended takes its parked threads with it.
        wall.take(&processes, &switched_out_sample(8, 9_000), &mut aggregator);
        wall.close_period(&ProcessTable::new(), &mut aggregator, 0);
        assert_eq!((wall.parked(), wall.counters().unpaired), (0, 2));
    }

    /// A retiring worker hands its parked threads to the next one, which
    /// weighs each wait from where the last period's end left it, once.
    #[test]
    fn waits_under_way_go_to_the_next_worker_once() {
        let processes = table();
        let (mut retiring, mut aggregator) = stage(sampling(0));
        retiring.take(
            &processes,
            &switched_out(8, 1_000, WALL_PROBABILITY_ONE / 2),
            &mut aggregator,
        );
        retiring.close_period(&processes, &mut aggregator, 2_000);
        // 1000 ns over 1/2, in the retiring worker's last profile.
        assert_eq!(total_weight(&mut aggregator).0, 2_000);
        let file = CarriedFile::create("test", SNAPSHOT_MAGIC).unwrap();
        retiring.save(&file).unwrap();
        let (mut next, _) = stage(sampling(0));
        assert_eq!(next.load(&file).unwrap(), 1);
        // The thread runs again at 3000: the rest, 1000 ns over 1/2.
        next.take(&processes, &resumed(8, 3_000, 1_000), &mut aggregator);
        assert_eq!(total_weight(&mut aggregator).0, 2_000);
        assert_eq!((next.parked(), next.counters().orphan_resumes), (0, 0));
        // Taken once: the file is empty for a worker after this one.
        let (mut later, _) = stage(sampling(0));
        assert_eq!(later.load(&file).unwrap(), 0);
        // Another event's snapshot is not this one's.
        retiring.save(&file).unwrap();
        let (mut another, _) = stage(WallSampling {
            event: 4,
            ..sampling(0)
        });
        assert!(another.load(&file).is_err());
        assert_eq!(another.parked(), 0);
    }

    /// A thread parked from `/proc` at the start: a stack the program took
    /// before (still in the buffer, its wait over) does not replace it.
    #[test]
    fn an_older_stack_does_not_replace_a_thread_parked_since() {
        let processes = table();
        let (mut wall, mut aggregator) = stage(sampling(0));
        wall.take(&processes, &switched_out_sample(8, 2_000), &mut aggregator);
        wall.take(&processes, &switched_out_sample(8, 1_500), &mut aggregator);
        assert_eq!((wall.parked(), wall.counters().unpaired), (1, 1));
        wall.take(&processes, &resumed(8, 2_500, 2_000), &mut aggregator);
        assert_eq!(total_weight(&mut aggregator).0, 500);
        assert_eq!(wall.counters().orphan_resumes, 0);
    }
}

//! Folds samples per upload period into (process, thread, stack) counts.
//!
//! Addresses are normalized when a sample arrives, not when the period is
//! flushed: a process that exits before the flush takes its mappings with it,
//! but its frames are already stored as (file, file offset) and can still be
//! symbolized. Identical frames and identical stacks are stored once per
//! period; everything is dropped when the period is taken.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::SystemTime;

use crate::files::target::{JitSymbols, PerfMapRefused};
use crate::files::{open_mapped, MappedFile, ObjectFile, OpenedMapped};
use crate::process::{Mapping, ProcessTable};
use crate::sample::Sample;
use crate::timestamp::WallClock;
use perf_maps::PerfMapsFound;

mod perf_maps;

/// The per-sample tables hash small keys millions of times; they need no
/// protection against adversarial keys, so a fast hasher fits.
type FastMap<K, V> = HashMap<K, V, ahash::RandomState>;

/// Timestamped samples kept per period for the timeline view; past this,
/// samples are still counted but without their own timestamp. At 99 Hz this
/// covers ~17 fully busy threads over a 60-second period.
pub const DEFAULT_MAX_TIMELINE_EVENTS: usize = 100_000;
/// Distinct stacks per period; past this, new stacks are counted under a
/// single `[stack table full]` frame so memory stays bounded.
pub const DEFAULT_MAX_STACKS: usize = 200_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AggregatorOptions {
    /// Keep one timestamp per sample (`end_timestamp_ns` in pprof).
    pub timeline: bool,
    pub max_timeline_events: usize,
    pub max_stacks: usize,
}

impl AggregatorOptions {
    pub fn new(timeline: bool) -> Self {
        Self {
            timeline,
            max_timeline_events: DEFAULT_MAX_TIMELINE_EVENTS,
            max_stacks: DEFAULT_MAX_STACKS,
        }
    }
}

/// The most files held open at once, and the share of the descriptor
/// limit they may take (blazesym holds one more descriptor per file it
/// has parsed; the perf events need theirs).
const MAX_HELD_FILES: usize = 4096;
const HELD_FILES_SHARE_OF_LIMIT: usize = 4;

fn held_files_limit() -> usize {
    use nix::sys::resource::{getrlimit, Resource};
    let soft = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
    let share = usize::try_from(soft).unwrap_or(usize::MAX) / HELD_FILES_SHARE_OF_LIMIT;
    share.min(MAX_HELD_FILES)
}

/// Index of a file in [`PeriodProfile::files`]; stable for the whole run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct FileId(pub u32);

/// A normalized frame: everything needed to symbolize it later, without the
/// process that produced it.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Frame {
    /// Code in a mapped file. `offset` is the file offset to look up; for a
    /// return address it already points back into the call instruction.
    File { file: FileId, offset: u64 },
    /// Anonymous executable memory or memory outside every known mapping:
    /// JIT code is looked up in the process's perf map (`/tmp/perf-PID.map`).
    /// `region` is the mapping's name when it has one (`[vdso]`, a memfd, a
    /// deleted file).
    Anonymous {
        pid: u32,
        addr: u64,
        region: Option<Arc<str>>,
    },
    /// A kernel address (already moved back into the call for return addresses).
    Kernel { addr: u64 },
    /// Stands for a stack that had no frame at all.
    Unknown,
    /// The outermost frame of a stack whose walk stopped before its root.
    Truncated,
    /// The frame counted instead of a stack once the stack table is full.
    StackTableFull,
}

/// Samples of one (process, thread, names, stack) in a period.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StackSample {
    /// The event that took the samples ([`crate::sample::Sample::event`]).
    pub event: u16,
    pub pid: u32,
    pub tid: u32,
    /// The process's name when the samples were taken: a process that
    /// exec'd during the period has samples under each program's name.
    pub process_name: Option<Arc<str>>,
    /// The thread's name when the samples were taken.
    pub thread_name: Option<Arc<str>>,
    /// The container the process ran in ([`crate::container`]).
    pub container_id: Option<Arc<str>>,
    /// What the thread was serving ([`crate::trace_context`]).
    pub trace: Option<Arc<crate::trace_context::TraceLabels>>,
    /// Index in [`PeriodProfile::stacks`].
    pub stack: u32,
    pub count: u64,
    /// Sum of what the samples stand for, in thousandths of an event
    /// ([`crate::sample::Sample::scaled_count`]): `count` thousands but
    /// for `sALLOC`.
    pub scaled_count: u64,
    /// Sum of the samples' weights (CPU nanoseconds for `sCPU`).
    pub cpu_nanos: u64,
    /// Samples kept individually for the timeline (a subset of `count`).
    pub timeline: Vec<TimedSample>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimedSample {
    /// Wall-clock time of the sample, in nanoseconds since the Unix epoch.
    pub end_timestamp_ns: u64,
    pub cpu_nanos: u64,
    /// [`StackSample::scaled_count`]'s share of this sample.
    pub scaled_count: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PeriodStats {
    pub samples: u64,
    /// Samples whose user stack reached its root.
    pub full_stacks: u64,
    /// Samples counted under `[stack table full]`.
    pub stacks_dropped: u64,
    /// Samples counted without a timestamp because the timeline was full.
    pub timeline_dropped: u64,
    /// Samples counted without their trace context because the period
    /// had [`MAX_TRACE_CONTEXTS`] (or [`MAX_TRACE_CONTEXT_BYTES`]) already.
    pub trace_contexts_dropped: u64,
}

/// One upload period's aggregate, ready to be symbolized.
#[derive(Debug, Clone)]
pub struct PeriodProfile {
    pub start: SystemTime,
    pub end: SystemTime,
    /// Every file seen so far in the run, indexed by [`FileId`].
    pub files: Vec<Arc<ObjectFile>>,
    /// The perf maps of the processes with anonymous frames this period,
    /// opened while they ran (see [`crate::files::target::open_perf_map`]),
    /// or why the one found was refused.
    pub perf_maps: HashMap<u32, Result<Arc<JitSymbols>, PerfMapRefused>>,
    /// Distinct frames of the period.
    pub frames: Vec<Frame>,
    /// Distinct stacks, as indexes into `frames`, innermost first.
    pub stacks: Vec<Box<[u32]>>,
    pub samples: Vec<StackSample>,
    pub stats: PeriodStats,
}

impl PeriodProfile {
    pub fn file(&self, id: FileId) -> &Arc<ObjectFile> {
        &self.files[id.0 as usize]
    }
}

/// Files seen during the run, with their build ids; lives across periods so
/// each build id is read once.
///
/// Every file is held open from the first sample of a period that uses it
/// (the process that maps it is alive then) until the end of the first
/// period that does not use it: the symbolizer, which reads the files after
/// the period, finds them even when the process has exited and the file
/// was deleted meanwhile, and files no longer used are let go.
#[derive(Debug)]
struct FileRegistry {
    files: Vec<Arc<ObjectFile>>,
    /// The period each file was last used in, by [`FileId`].
    last_used: Vec<u64>,
    /// The current period's number.
    period: u64,
    held: usize,
    max_held: usize,
    by_identity: HashMap<MappedFile, FileId>,
    /// Fast path keyed by the process table's shared file; holding the `Arc`
    /// keeps the pointer from being reused by another file.
    by_pointer: FastMap<usize, (Arc<MappedFile>, FileId)>,
    /// Names of anonymous regions (`[vdso]`, memfds), shared by their frames.
    regions: FastMap<usize, (Arc<MappedFile>, Arc<str>)>,
}

impl Default for FileRegistry {
    fn default() -> Self {
        Self {
            files: Vec::new(),
            last_used: Vec::new(),
            period: 0,
            held: 0,
            max_held: held_files_limit(),
            by_identity: HashMap::new(),
            by_pointer: FastMap::default(),
            regions: FastMap::default(),
        }
    }
}

impl FileRegistry {
    fn intern(&mut self, pid: u32, mapping: &Mapping) -> FileId {
        let mapped = &mapping.file;
        let pointer = Arc::as_ptr(mapped) as usize;
        let id = match self.by_pointer.get(&pointer) {
            Some((_, id)) => *id,
            None => {
                let id = self.intern_new(pid, mapping);
                self.by_pointer.insert(pointer, (mapped.clone(), id));
                id
            }
        };
        let index = id.0 as usize;
        if self.last_used[index] != self.period {
            self.last_used[index] = self.period;
            // Let go at the end of a period that did not use it: hold it
            // again now that a live process does.
            if !self.files[index].is_held() {
                if let Some(held) = self.open(pid, mapping, &self.files[index].path.clone()) {
                    self.files[index] = Arc::new(self.files[index].with_handle(Some(held)));
                }
            }
        }
        id
    }

    fn intern_new(&mut self, pid: u32, mapping: &Mapping) -> FileId {
        let mapped = &mapping.file;
        let path = mapped
            .path
            .strip_suffix(" (deleted)")
            .unwrap_or(&mapped.path);
        let identity = MappedFile {
            path: path.to_string(),
            dev: mapped.dev,
            inode: mapped.inode,
        };
        if let Some(id) = self.by_identity.get(&identity) {
            return *id;
        }
        let id = FileId(self.files.len() as u32);
        let held = self.open(pid, mapping, path);
        self.files.push(Arc::new(ObjectFile::new(
            path,
            mapped.dev,
            mapped.inode,
            held,
        )));
        self.last_used.push(self.period);
        self.by_identity.insert(identity, id);
        id
    }

    fn open(&mut self, pid: u32, mapping: &Mapping, path: &str) -> Option<OpenedMapped> {
        if self.held >= self.max_held {
            return None;
        }
        // The mapped inode or nothing: another file now at that path would
        // give another program's names.
        let mapped = MappedFile {
            path: path.to_string(),
            ..mapping.file.as_ref().clone()
        };
        let opened = open_mapped(pid, &mapped, Some((mapping.start, mapping.end))).ok()?;
        self.held += 1;
        Some(opened)
    }

    /// Ends the current period: files it did not use are let go (the
    /// periods that used them have been symbolized: they hold their own
    /// reference until then).
    fn end_period(&mut self) {
        for (file, last_used) in self.files.iter_mut().zip(&self.last_used) {
            if *last_used != self.period && file.is_held() {
                *file = Arc::new(file.with_handle(None));
                self.held -= 1;
            }
        }
        self.period += 1;
    }

    fn region_name(&mut self, mapped: &Arc<MappedFile>) -> Option<Arc<str>> {
        if mapped.path.is_empty() {
            return None;
        }
        let pointer = Arc::as_ptr(mapped) as usize;
        let (_, name) = self
            .regions
            .entry(pointer)
            .or_insert_with(|| (mapped.clone(), Arc::from(mapped.path.as_str())));
        Some(name.clone())
    }
}

/// Mapping names that are not files the symbolizer could open.
fn is_anonymous_path(path: &str) -> bool {
    path.is_empty()
        || path.starts_with('[')
        || path.starts_with("//anon")
        || path.starts_with("/memfd:")
}

/// What a [`StackSample`] counts: event, pid, tid, stack, the ids of the
/// process and thread names and of the container in force at the samples'
/// time, and of the thread's trace context.
type SampleKey = (
    u16,
    u32,
    u32,
    u32,
    Option<u32>,
    Option<u32>,
    Option<u32>,
    Option<u32>,
);

/// Distinct trace contexts (span ids, mostly) kept per period; the samples
/// of further ones are counted without theirs
/// ([`PeriodStats::trace_contexts_dropped`]).
const MAX_TRACE_CONTEXTS: usize = 100_000;
/// And at most about this much memory of them.
const MAX_TRACE_CONTEXT_BYTES: usize = 64 << 20;

/// The period's process and thread names, each stored once.
#[derive(Debug, Default)]
struct NameTable {
    ids: FastMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
}

impl NameTable {
    /// The id of `name` (`None` for no name or an empty one).
    fn id(&mut self, name: Option<&str>) -> Option<u32> {
        let name = name.filter(|name| !name.is_empty())?;
        if let Some(id) = self.ids.get(name) {
            return Some(*id);
        }
        let id = self.names.len() as u32;
        let name: Arc<str> = Arc::from(name);
        self.names.push(name.clone());
        self.ids.insert(name, id);
        Some(id)
    }

    fn name(&self, id: Option<u32>) -> Option<Arc<str>> {
        id.map(|id| self.names[id as usize].clone())
    }
}

#[derive(Debug, Default)]
struct PeriodState {
    frames: Vec<Frame>,
    frame_ids: FastMap<Frame, u32>,
    stacks: Vec<Box<[u32]>>,
    stack_ids: FastMap<Box<[u32]>, u32>,
    samples: Vec<StackSample>,
    sample_ids: FastMap<SampleKey, u32>,
    names: NameTable,
    /// The period's distinct trace contexts, each stored once.
    trace_ids: FastMap<Arc<crate::trace_context::TraceLabels>, u32>,
    traces: Vec<Arc<crate::trace_context::TraceLabels>>,
    /// [`crate::trace_context::TraceLabels::approximate_bytes`] of `traces`.
    trace_bytes: usize,
    thread_names: FastMap<(u32, u32), ThreadNameIds>,
    /// Perf maps looked for this period.
    perf_maps: PerfMapsFound,
    timeline_events: usize,
    stats: PeriodStats,
    raw_stacks: RawStackCache,
}

/// The name ids of a thread and of its process, as the process table names
/// them at the process's [`ProcessTable::names_generation`]. Names change
/// only with it, so a thread's next samples skip the table's and the name
/// table's lookups (four hashes, two of them of the names) until it changes.
#[derive(Debug, Clone, Copy)]
struct ThreadNameIds {
    generation: u64,
    process: Option<u32>,
    thread: Option<u32>,
    /// The container's id (it changes only at an exec, as names do).
    container: Option<u32>,
}

/// Stacks already normalized this period, by their raw addresses: a stack
/// seen before costs one hash of its addresses instead of a mapping lookup
/// and a frame-table probe per frame (300 of them for a deep recursion).
/// Addresses mean the same stack only while their process's mappings are
/// unchanged, so an entry holds the process's code generation and is
/// dropped when met after it moved on; other processes' entries stay.
///
/// A sample is looked up in place (no key is built for it): the hash covers
/// the pid, the flags, both lengths and at most [`Self::HASHED_ENDS`] frames
/// at each end of each stack, and a candidate is then compared frame by
/// frame. Hashing and copying all 300 frames of a deep stack was ~15 % of
/// the BPF engine's work per sample; stacks that differ only in the middle
/// share a hash and are told apart by the comparison.
#[derive(Debug, Default)]
struct RawStackCache {
    hasher: ahash::RandomState,
    stacks: hashbrown::HashTable<RawStack>,
    /// The hash of the sample last looked up, for [`RawStackCache::remember`].
    last_hash: u64,
}

#[derive(Debug)]
struct RawStack {
    hash: u64,
    /// pid, truncation flag, kernel frame count, kernel frames, user frames.
    key: Box<[u64]>,
    /// The process's [`ProcessTable::code_generation`] when it was normalized.
    code_generation: u64,
    stack: u32,
}

/// The parts of a sample that say which raw stack it has.
struct RawKey<'a> {
    pid: u64,
    truncated: u64,
    kernel: &'a [u64],
    user: &'a [u64],
}

impl<'a> RawKey<'a> {
    fn of(sample: &'a Sample) -> Self {
        Self {
            pid: u64::from(sample.pid),
            truncated: u64::from(sample.truncated() && !sample.frames.is_empty()),
            kernel: &sample.kernel_frames,
            user: &sample.frames,
        }
    }

    fn matches(&self, key: &[u64]) -> bool {
        let split = 3 + self.kernel.len();
        key.len() == split + self.user.len()
            && key[..3] == [self.pid, self.truncated, self.kernel.len() as u64]
            && key[3..split] == *self.kernel
            && key[split..] == *self.user
    }

    fn to_key(&self) -> Box<[u64]> {
        [self.pid, self.truncated, self.kernel.len() as u64]
            .iter()
            .chain(self.kernel)
            .chain(self.user)
            .copied()
            .collect()
    }
}

impl RawStackCache {
    /// Entries kept at most; past it the cache starts over (one period of
    /// address-randomized short-lived processes can make every raw stack
    /// distinct).
    const MAX_ENTRIES: usize = 65_536;
    /// Frames hashed at each end of a stack.
    const HASHED_ENDS: usize = 16;

    fn hash(&self, key: &RawKey<'_>) -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut hasher = self.hasher.build_hasher();
        hasher.write_u64(key.pid);
        hasher.write_u64(key.truncated);
        for frames in [key.kernel, key.user] {
            hasher.write_usize(frames.len());
            let head = &frames[..frames.len().min(Self::HASHED_ENDS)];
            let tail = &frames[frames.len().saturating_sub(Self::HASHED_ENDS)..];
            for &frame in head.iter().chain(tail) {
                hasher.write_u64(frame);
            }
        }
        hasher.finish()
    }

    /// The stack id of `sample` if known and still true: `code_generation`
    /// is that of the sample's process now (an entry made before its
    /// mappings last changed is dropped).
    fn lookup(&mut self, code_generation: u64, sample: &Sample) -> Option<u32> {
        if self.stacks.len() >= Self::MAX_ENTRIES {
            self.stacks.clear();
        }
        let key = RawKey::of(sample);
        self.last_hash = self.hash(&key);
        match self
            .stacks
            .find_entry(self.last_hash, |entry| key.matches(&entry.key))
        {
            Ok(entry) if entry.get().code_generation == code_generation => Some(entry.get().stack),
            Ok(stale) => {
                stale.remove();
                None
            }
            Err(_) => None,
        }
    }

    /// Remembers the stack id of `sample`, just looked up and not found.
    fn remember(&mut self, code_generation: u64, sample: &Sample, stack: u32) {
        let key = RawKey::of(sample).to_key();
        self.stacks.insert_unique(
            self.last_hash,
            RawStack {
                hash: self.last_hash,
                key,
                code_generation,
                stack,
            },
            |entry| entry.hash,
        );
    }
}

impl PeriodState {
    fn frame_id(&mut self, frame: Frame) -> u32 {
        if let Some(id) = self.frame_ids.get(&frame) {
            return *id;
        }
        let id = self.frames.len() as u32;
        self.frames.push(frame.clone());
        self.frame_ids.insert(frame, id);
        id
    }
}

/// Folds [`Sample`]s into the current period.
#[derive(Debug)]
pub struct Aggregator {
    options: AggregatorOptions,
    files: FileRegistry,
    clock: WallClock,
    period: PeriodState,
    /// Reused buffer for one sample's frame ids.
    scratch: Vec<u32>,
}

impl Aggregator {
    pub fn new(options: AggregatorOptions) -> Self {
        Self {
            options,
            files: FileRegistry::default(),
            clock: WallClock::now(),
            period: PeriodState::default(),
            scratch: Vec::new(),
        }
    }

    /// Samples added since the last [`Aggregator::take_period`].
    pub fn stats(&self) -> PeriodStats {
        self.period.stats
    }

    /// Adds one sample, normalizing its addresses with the process table as
    /// it is now.
    pub fn add(&mut self, processes: &ProcessTable, sample: &Sample) {
        self.period.stats.samples += 1;
        if sample.end.is_complete() {
            self.period.stats.full_stacks += 1;
        }
        let stack = self.stack_of(processes, sample);
        self.count(processes, sample, stack, self.options.timeline);
    }

    /// Adds an allocation still held at the end of the period (the live
    /// heap, [`crate::live_heap`]): in the profile, but not a sample taken
    /// in the period (not in its stats, not in the timeline).
    pub fn add_held(&mut self, processes: &ProcessTable, sample: &Sample) {
        let stack = self.stack_of(processes, sample);
        self.count(processes, sample, stack, false);
    }

    fn stack_of(&mut self, processes: &ProcessTable, sample: &Sample) -> u32 {
        let code_generation = processes.code_generation(sample.pid);
        if let Some(stack) = self.period.raw_stacks.lookup(code_generation, sample) {
            return stack;
        }
        let stack = self.normalize_stack(processes, sample);
        self.period
            .raw_stacks
            .remember(code_generation, sample, stack);
        stack
    }

    /// The period's stack id of `sample`'s frames, normalized to files and
    /// offsets with the process table as it is now.
    fn normalize_stack(&mut self, processes: &ProcessTable, sample: &Sample) -> u32 {
        let period = &mut self.period;
        self.scratch.clear();
        // Every frame but the first is a return address: look up the call
        // instruction before it, which may even be in another function.
        for (index, &addr) in sample.kernel_frames.iter().enumerate() {
            let addr = if index > 0 {
                addr.saturating_sub(1)
            } else {
                addr
            };
            let id = period.frame_id(Frame::Kernel { addr });
            self.scratch.push(id);
        }
        for (index, &addr) in sample.frames.iter().enumerate() {
            let lookup = if index > 0 {
                addr.saturating_sub(1)
            } else {
                addr
            };
            let frame = match processes.find_mapping(sample.pid, lookup) {
                Some(mapping) if !is_anonymous_path(&mapping.file.path) => Frame::File {
                    file: self.files.intern(sample.pid, mapping),
                    offset: mapping.file_offset_of(lookup),
                },
                Some(mapping) => {
                    period.perf_maps.look_for(processes, sample.pid);
                    Frame::Anonymous {
                        pid: sample.pid,
                        addr: lookup,
                        region: self.files.region_name(&mapping.file),
                    }
                }
                None => {
                    period.perf_maps.look_for(processes, sample.pid);
                    Frame::Anonymous {
                        pid: sample.pid,
                        addr: lookup,
                        region: None,
                    }
                }
            };
            let id = period.frame_id(frame);
            self.scratch.push(id);
        }
        if self.scratch.is_empty() {
            let id = period.frame_id(Frame::Unknown);
            self.scratch.push(id);
        }
        if sample.truncated() && !sample.frames.is_empty() {
            let id = period.frame_id(Frame::Truncated);
            self.scratch.push(id);
        }

        match period.stack_ids.get(self.scratch.as_slice()) {
            Some(id) => *id,
            None if period.stacks.len() < self.options.max_stacks => {
                let id = period.stacks.len() as u32;
                let frames: Box<[u32]> = self.scratch.as_slice().into();
                period.stacks.push(frames.clone());
                period.stack_ids.insert(frames, id);
                id
            }
            None => {
                period.stats.stacks_dropped += 1;
                let full = period.frame_id(Frame::StackTableFull);
                let frames: Box<[u32]> = Box::new([full]);
                match period.stack_ids.get(&frames) {
                    Some(id) => *id,
                    None => {
                        let id = period.stacks.len() as u32;
                        period.stacks.push(frames.clone());
                        period.stack_ids.insert(frames, id);
                        id
                    }
                }
            }
        }
    }

    /// Counts one sample of `stack`, with its names and (`timed`) its
    /// timestamp.
    fn count(&mut self, processes: &ProcessTable, sample: &Sample, stack: u32, timed: bool) {
        let period = &mut self.period;
        // The names as they are now, which is as they were at the sample's
        // time: the engines apply the process events up to a sample's time
        // before they deliver it.
        let generation = processes.names_generation(sample.pid);
        let names = match period.thread_names.get(&(sample.pid, sample.tid)) {
            Some(known) if known.generation == generation => *known,
            _ => {
                let names = ThreadNameIds {
                    generation,
                    process: period.names.id(processes.process_name(sample.pid)),
                    thread: period
                        .names
                        .id(processes.thread_name(sample.pid, sample.tid)),
                    container: period.names.id(processes.container(sample.pid)),
                };
                period.thread_names.insert((sample.pid, sample.tid), names);
                names
            }
        };
        let (process_name, thread_name) = (names.process, names.thread);
        let trace = sample.trace.as_ref().and_then(|labels| {
            if let Some(&id) = period.trace_ids.get(labels) {
                return Some(id);
            }
            let bytes = labels.approximate_bytes();
            if period.traces.len() >= MAX_TRACE_CONTEXTS
                || period.trace_bytes + bytes > MAX_TRACE_CONTEXT_BYTES
            {
                period.stats.trace_contexts_dropped += 1;
                return None;
            }
            period.trace_bytes += bytes;
            let id = period.traces.len() as u32;
            period.traces.push(labels.clone());
            period.trace_ids.insert(labels.clone(), id);
            Some(id)
        });
        let key = (
            sample.event,
            sample.pid,
            sample.tid,
            stack,
            process_name,
            thread_name,
            names.container,
            trace,
        );
        let index = *period.sample_ids.entry(key).or_insert_with(|| {
            period.samples.push(StackSample {
                event: sample.event,
                pid: sample.pid,
                tid: sample.tid,
                process_name: period.names.name(process_name),
                thread_name: period.names.name(thread_name),
                container_id: period.names.name(names.container),
                trace: trace.map(|id| period.traces[id as usize].clone()),
                stack,
                count: 0,
                scaled_count: 0,
                cpu_nanos: 0,
                timeline: Vec::new(),
            });
            (period.samples.len() - 1) as u32
        });
        let entry = &mut period.samples[index as usize];
        entry.count += 1;
        entry.scaled_count = entry.scaled_count.saturating_add(sample.scaled_count);
        entry.cpu_nanos = entry.cpu_nanos.saturating_add(sample.weight);
        if timed {
            if period.timeline_events < self.options.max_timeline_events {
                period.timeline_events += 1;
                entry.timeline.push(TimedSample {
                    end_timestamp_ns: self.clock.wall_nanos(sample.time),
                    cpu_nanos: sample.weight,
                    scaled_count: sample.scaled_count,
                });
            } else {
                period.stats.timeline_dropped += 1;
            }
        }
    }

    /// Takes, before the period ends, the jitdumps its processes without a
    /// perf map have mapped since their first anonymous sample (from the
    /// table, while it still holds them: [`Self::take_period`] looks for
    /// the maps again with those paths).
    pub fn note_jitdumps(&mut self, processes: &ProcessTable) {
        self.period.perf_maps.note_jitdumps_mapped_since(processes);
    }

    /// Hands over the period's aggregate and starts a new, empty one.
    pub fn take_period(&mut self, start: SystemTime, end: SystemTime) -> PeriodProfile {
        let state = std::mem::take(&mut self.period);
        if state.stats.trace_contexts_dropped > 0 {
            log::info!(
                "period: {} samples counted without their trace context (the period's table \
                 of contexts was full: {MAX_TRACE_CONTEXTS} or {} MiB)",
                state.stats.trace_contexts_dropped,
                MAX_TRACE_CONTEXT_BYTES >> 20
            );
        }
        // Re-read the clock offset each period so wall-clock adjustments
        // (NTP steps) do not accumulate into the timestamps.
        self.clock = WallClock::now();
        let files = self.files.files.clone();
        self.files.end_period();
        PeriodProfile {
            start,
            end,
            files,
            perf_maps: state.perf_maps.look_again_for_missing(),
            frames: state.frames,
            stacks: state.stacks,
            samples: state.samples,
            stats: state.stats,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::MappingRecord;
    use crate::sample::StackEnd;

    /// The test binary's device and inode: only the mapped inode is ever
    /// opened, so the mappings of these tests name the real one.
    fn exe_identity() -> (u64, u64) {
        let metadata = std::fs::metadata(std::env::current_exe().unwrap()).unwrap();
        (
            std::os::unix::fs::MetadataExt::dev(&metadata),
            std::os::unix::fs::MetadataExt::ino(&metadata),
        )
    }

    fn table() -> ProcessTable {
        let mut table = ProcessTable::new();
        let exe = std::env::current_exe().unwrap();
        let (dev, inode) = exe_identity();
        table.add_mapping(&MappingRecord {
            pid: 10,
            start: 0x10000,
            len: 0x10000,
            file_offset: 0x2000,
            dev,
            inode,
            prot: (libc::PROT_READ | libc::PROT_EXEC) as u32,
            path: exe.to_string_lossy().into_owned(),
        });
        table.add_mapping(&MappingRecord {
            pid: 10,
            start: 0x50000,
            len: 0x1000,
            file_offset: 0,
            dev: 0,
            inode: 0,
            prot: (libc::PROT_READ | libc::PROT_EXEC) as u32,
            path: String::new(),
        });
        table.set_comm(10, 10, "proc", false);
        table.set_comm(10, 11, "worker", false);
        table
    }

    fn sample(tid: u32, frames: Vec<u64>, end: StackEnd) -> Sample {
        Sample {
            pid: 10,
            tid,
            time: 1_000,
            cpu: 0,
            event: 0,
            weight: 10_101_010,
            scaled_count: crate::events::COUNT_UNIT,
            frames,
            kernel_frames: vec![],
            heap: None,
            off_cpu: None,
            trace: None,
            end,
        }
    }

    #[test]
    fn normalizes_and_counts_identical_stacks_once() {
        let table = table();
        let mut aggregator = Aggregator::new(AggregatorOptions::new(true));
        for _ in 0..3 {
            aggregator.add(
                &table,
                &sample(11, vec![0x10100, 0x10201], StackEnd::Complete),
            );
        }
        aggregator.add(
            &table,
            &sample(10, vec![0x50010, 0x99999], StackEnd::NoUnwindInfo),
        );
        let now = SystemTime::now();
        let period = aggregator.take_period(now, now);
        assert_eq!(period.stats.samples, 4);
        assert_eq!(period.stats.full_stacks, 3);
        assert_eq!(period.stacks.len(), 2);
        let worker = period.samples.iter().find(|s| s.tid == 11).unwrap();
        assert_eq!((worker.count, worker.cpu_nanos), (3, 30_303_030));
        assert_eq!(worker.timeline.len(), 3);
        let frames: Vec<&Frame> = period.stacks[worker.stack as usize]
            .iter()
            .map(|&f| &period.frames[f as usize])
            .collect();
        // The leaf keeps its address; the return address moves back by one.
        assert_eq!(
            frames,
            [
                &Frame::File {
                    file: FileId(0),
                    offset: 0x2100
                },
                &Frame::File {
                    file: FileId(0),
                    offset: 0x2200
                }
            ]
        );
        assert!(
            period.files[0].build_id.is_some(),
            "test binary has a build id"
        );
        let main = period.samples.iter().find(|s| s.tid == 10).unwrap();
        let frames: Vec<&Frame> = period.stacks[main.stack as usize]
            .iter()
            .map(|&f| &period.frames[f as usize])
            .collect();
        assert!(matches!(
            frames[0],
            Frame::Anonymous {
                addr: 0x50010,
                region: None,
                ..
            }
        ));
        assert_eq!(frames.last(), Some(&&Frame::Truncated));
        assert_eq!(worker.thread_name.as_deref(), Some("worker"));
        assert_eq!(worker.process_name.as_deref(), Some("proc"));
        // The period's state is gone after the take.
        let next = aggregator.take_period(now, now);
        assert!(next.samples.is_empty() && next.stacks.is_empty());
        assert_eq!(next.files.len(), 1);
    }

    /// A process's normalized stacks stay cached while other processes
    /// map code (a build starts processes all the time), and are dropped
    /// when its own mappings change: the same raw address then names the
    /// new mapping's offset.
    #[test]
    fn a_stack_is_normalized_again_only_when_its_own_process_maps_code() {
        let mut table = table();
        let mut aggregator = Aggregator::new(AggregatorOptions::new(false));
        let raw = sample(11, vec![0x10100], StackEnd::Complete);
        aggregator.add(&table, &raw);
        let mut other = MappingRecord {
            pid: 20,
            start: 0x10000,
            len: 0x1000,
            file_offset: 0,
            dev: 3,
            inode: 4,
            prot: (libc::PROT_READ | libc::PROT_EXEC) as u32,
            path: "/other".to_string(),
        };
        table.add_mapping(&other);
        table.fork(21, 20, 21);
        table.exit(21, 21);
        assert!(
            aggregator
                .period
                .raw_stacks
                .lookup(table.code_generation(10), &raw)
                .is_some(),
            "other processes' changes dropped process 10's stacks"
        );
        // Process 10 maps the same range at another offset of the file.
        other.pid = 10;
        other.file_offset = 0x8000;
        other.path = std::env::current_exe()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        (other.dev, other.inode) = exe_identity();
        table.add_mapping(&other);
        aggregator.add(&table, &raw);
        let now = SystemTime::now();
        let period = aggregator.take_period(now, now);
        let offsets: Vec<&Frame> = period
            .samples
            .iter()
            .map(|s| &period.frames[period.stacks[s.stack as usize][0] as usize])
            .collect();
        assert_eq!(
            offsets,
            [
                &Frame::File {
                    file: FileId(0),
                    offset: 0x2100
                },
                &Frame::File {
                    file: FileId(0),
                    offset: 0x8100
                }
            ]
        );
    }

    /// The raw-stack cache hashes only the ends of a deep stack: stacks
    /// that differ only in the middle, or in the truncation flag, or in
    /// their kernel part, must still be told apart, and a repeated one found.
    #[test]
    fn deep_stacks_that_differ_only_in_the_middle_are_different_stacks() {
        let table = table();
        let mut aggregator = Aggregator::new(AggregatorOptions::new(false));
        let deep = |middle: u64| -> Vec<u64> {
            (0..300u64)
                .map(|i| if i == 150 { middle } else { 0x10100 + i * 0x10 })
                .collect()
        };
        let mut with_kernel = sample(11, deep(0x18000), StackEnd::Complete);
        with_kernel.kernel_frames = vec![0xffff_ffff_8100_0000];
        let samples = [
            sample(11, deep(0x18000), StackEnd::Complete),
            sample(11, deep(0x18800), StackEnd::Complete),
            sample(11, deep(0x18000), StackEnd::DepthLimit),
            with_kernel,
            sample(11, deep(0x18000), StackEnd::Complete),
        ];
        for sample in &samples {
            aggregator.add(&table, sample);
        }
        let now = SystemTime::now();
        let period = aggregator.take_period(now, now);
        assert_eq!(period.stacks.len(), 4, "four distinct stacks");
        let counts: Vec<u64> = period.samples.iter().map(|s| s.count).collect();
        assert_eq!(counts, [2, 1, 1, 1], "the repeated stack is counted twice");
        let middle = |sample: &StackSample| period.stacks[sample.stack as usize][150];
        assert_ne!(middle(&period.samples[0]), middle(&period.samples[1]));
    }

    #[test]
    fn a_thread_renamed_between_two_samples_is_counted_under_each_name() {
        let mut table = table();
        table.fork(10, 10, 11);
        table.set_comm(10, 11, "before", false);
        let mut aggregator = Aggregator::new(AggregatorOptions::new(false));
        let leaf = |tid| sample(tid, vec![0x10100], StackEnd::Complete);
        aggregator.add(&table, &leaf(11));
        aggregator.add(&table, &leaf(10));
        // prctl(PR_SET_NAME) in thread 11: its name changes, nothing else.
        table.set_comm(10, 11, "after", false);
        aggregator.add(&table, &leaf(11));
        aggregator.add(&table, &leaf(10));
        let now = SystemTime::now();
        let period = aggregator.take_period(now, now);
        let mut named: Vec<(u32, Option<&str>, Option<&str>, u64)> = period
            .samples
            .iter()
            .map(|s| {
                (
                    s.tid,
                    s.process_name.as_deref(),
                    s.thread_name.as_deref(),
                    s.count,
                )
            })
            .collect();
        named.sort();
        assert_eq!(
            named,
            [
                (10, Some("proc"), Some("proc"), 2),
                (11, Some("proc"), Some("after"), 1),
                (11, Some("proc"), Some("before"), 1)
            ]
        );
    }

    #[test]
    fn samples_keep_the_names_in_force_when_they_were_taken() {
        let mut table = table();
        let mut aggregator = Aggregator::new(AggregatorOptions::new(false));
        let leaf = || sample(10, vec![0x10100], StackEnd::Complete);
        aggregator.add(&table, &leaf());
        aggregator.add(&table, &leaf());
        // The process execs another program (same pid), which maps the same
        // file at the same place and runs the same code.
        table.set_comm(10, 10, "next", true);
        table.add_mapping(&MappingRecord {
            pid: 10,
            start: 0x10000,
            len: 0x10000,
            file_offset: 0x2000,
            dev: exe_identity().0,
            inode: exe_identity().1,
            prot: (libc::PROT_READ | libc::PROT_EXEC) as u32,
            path: std::env::current_exe()
                .unwrap()
                .to_string_lossy()
                .into_owned(),
        });
        aggregator.add(&table, &leaf());
        let now = SystemTime::now();
        let period = aggregator.take_period(now, now);
        let mut named: Vec<(Option<&str>, Option<&str>, u32, u64)> = period
            .samples
            .iter()
            .map(|s| {
                (
                    s.process_name.as_deref(),
                    s.thread_name.as_deref(),
                    s.stack,
                    s.count,
                )
            })
            .collect();
        named.sort();
        assert_eq!(
            named,
            [
                (Some("next"), Some("next"), 0, 1),
                (Some("proc"), Some("proc"), 0, 2)
            ]
        );
    }

    /// A process that runs anonymous code before it maps its jitdump (V8
    /// does) is named from the jitdump at the period's end, not left
    /// unnamed by the path noted at its first sample.
    #[test]
    fn a_jitdump_mapped_after_the_first_anonymous_sample_is_read() {
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("ddprof-jitdump-late-{pid}"));
        std::fs::create_dir_all(&dir).unwrap();
        let jitdump = dir.join(format!("jit-{pid}.dump"));
        std::fs::write(&jitdump, b"").unwrap();
        let mut table = ProcessTable::new();
        let anonymous = |start: u64, path: String| MappingRecord {
            pid,
            start,
            len: 0x1000,
            file_offset: 0,
            dev: 0,
            inode: 0,
            prot: (libc::PROT_READ | libc::PROT_EXEC) as u32,
            path,
        };
        table.add_mapping(&anonymous(0x50000, String::new()));
        let mut aggregator = Aggregator::new(AggregatorOptions::new(false));
        let mut jit_sample = sample(pid, vec![0x50010], StackEnd::Complete);
        jit_sample.pid = pid;
        aggregator.add(&table, &jit_sample);
        table.add_mapping(&anonymous(0x70000, jitdump.to_string_lossy().into_owned()));
        aggregator.add(&table, &jit_sample);
        aggregator.note_jitdumps(&table);
        let now = SystemTime::now();
        let period = aggregator.take_period(now, now);
        std::fs::remove_dir_all(&dir).unwrap();
        let opened = period.perf_maps.get(&pid).expect("the jitdump is opened");
        assert!(
            matches!(opened, Ok(map) if map.format == crate::files::target::JitFormat::JitDump),
            "{opened:?}"
        );
    }

    #[test]
    fn bounds_stacks_and_timeline() {
        let table = table();
        let mut aggregator = Aggregator::new(AggregatorOptions {
            timeline: true,
            max_timeline_events: 2,
            max_stacks: 2,
        });
        for leaf in 0..5u64 {
            aggregator.add(
                &table,
                &sample(11, vec![0x10100 + leaf], StackEnd::Complete),
            );
        }
        let now = SystemTime::now();
        let period = aggregator.take_period(now, now);
        assert_eq!(period.stats.stacks_dropped, 3);
        assert_eq!(period.stats.timeline_dropped, 3);
        assert_eq!(period.samples.iter().map(|s| s.count).sum::<u64>(), 5);
        assert!(period.frames.contains(&Frame::StackTableFull));
    }
}

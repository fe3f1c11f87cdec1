//! What the worker tells the parent, over their `SOCK_STREAM` socket pair:
//! length-prefixed frames (a little-endian `u32` length, then the message),
//! since an encoded period can be larger than any datagram.
//!
//! The parent trusts nothing it reads: a frame longer than [`MAX_FRAME`], a
//! message cut short or one that does not parse is an error that ends this
//! worker (the parent then restarts one), never a panic.
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::identity::ServiceIdentity;
use crate::overhead::{HeapSamples, Lost, Overhead, RunTotals, StackFigures, ThreadTimes};
use crate::provenance::Source;

/// The largest frame the parent accepts: far above any period's pprof.
pub const MAX_FRAME: usize = 512 << 20;

/// The byte the parent writes to ask the worker to flush and finish.
pub const STOP_REQUEST: u8 = b'S';

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ChannelError {
    #[error("the worker sent a frame of {0} bytes (at most {MAX_FRAME})")]
    FrameTooLong(usize),
    #[error("the worker's message ended early")]
    Truncated,
    #[error("the worker's message is not one the parent knows (tag {0})")]
    UnknownTag(u8),
    #[error("the worker's message has {0} bytes after its end")]
    TrailingBytes(usize),
    #[error("the worker's message has a name that is not UTF-8")]
    NotUtf8,
}

/// Folded stacks: process name first, then the frames from the root, and
/// their count.
pub type FoldedPeriod = Vec<(Vec<Arc<str>>, u64)>;

/// One period's profile as the worker encoded it.
#[derive(Debug, Clone, PartialEq)]
pub struct EncodedPeriod {
    /// The figures since the previous profile (pprof comments say the same).
    pub figures: Overhead,
    /// The worker's own peak RSS (`VmHWM`), in KiB.
    pub worker_peak_rss_kib: u64,
    /// The run's last period (the target is gone or a stop was asked for):
    /// a file that cannot be written now is reported once, at exit.
    pub last_of_run: bool,
    /// gzip'd pprof, for the files.
    pub pprof_gzip: Option<Vec<u8>>,
    /// zstd'd pprof, for the upload.
    pub pprof_zstd: Option<Vec<u8>>,
    /// The period's stacks for `stacks.folded`: process name first, then
    /// the frames from the root, and their count.
    pub folded: FoldedPeriod,
    /// Where the code of the folded stacks' functions comes from (the
    /// flame graph's colours).
    pub sources: FrameSources,
    /// `code-provenance.json`, for the upload.
    pub code_provenance: Option<Vec<u8>>,
    /// The profiles of the services the period's processes published
    /// (`-p`, `--global`): the pprofs above hold the other processes'
    /// samples, these each service's.
    pub services: Vec<ServiceProfile>,
}

/// One service's profile of a period.
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceProfile {
    pub identity: ServiceIdentity,
    pub pprof_gzip: Option<Vec<u8>>,
    pub pprof_zstd: Option<Vec<u8>>,
    pub code_provenance: Option<Vec<u8>>,
}

/// The source of each function name of a period's folded stacks.
pub type FrameSources = std::collections::HashMap<Arc<str>, Source>;

/// Why a worker is about to exit on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkerExit {
    /// It lived its `--worker-period` periods.
    Periods(u32),
    /// Its RSS passed `--worker-max-rss` (KiB).
    Rss(u64),
    /// The target is gone or a stop was asked for: the run is over.
    Finished,
}

/// What a worker that ends itself at a period's end (not at the run's end)
/// tells the parent before it symbolizes that period, so that the parent
/// can start the next worker at once: it drained the buffers, and the next
/// worker takes over from here.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Retirement {
    pub exit: WorkerExit,
    /// Where the next worker's first period starts (the end of the period
    /// being finished, or its start when that period had no samples).
    pub next_period_start: SystemTime,
    /// Whether a profile of the period being finished follows.
    pub profile_follows: bool,
    /// The profiler CPU time that profile reports.
    pub reported_cpu: Duration,
    /// The run's totals once that profile is counted (the next worker's
    /// accounting goes on from them).
    pub totals: RunTotals,
}

#[derive(Debug, Clone, PartialEq)]
pub enum ToParent {
    /// A period ended at `end`; `profile` is `None` when it had no samples
    /// (the next profile then covers it too).
    PeriodEnd {
        start: SystemTime,
        end: SystemTime,
        profile: Option<Box<EncodedPeriod>>,
    },
    /// The worker's last message before it exits with status 0.
    Exiting(WorkerExit),
    /// The worker will exit after sending the period it closed (one
    /// [`ToParent::PeriodEnd`], then [`ToParent::Exiting`]).
    Retiring(Retirement),
}

const TAG_PERIOD: u8 = 1;
const TAG_EXITING: u8 = 2;
const TAG_RETIRING: u8 = 3;
const EXIT_PERIODS: u8 = 1;
const EXIT_RSS: u8 = 2;
const EXIT_FINISHED: u8 = 3;

impl ToParent {
    /// The message as one frame, length prefix included.
    pub fn to_frame(&self) -> Vec<u8> {
        let mut out = Writer(vec![0; 4]);
        match self {
            ToParent::PeriodEnd {
                start,
                end,
                profile,
            } => {
                out.u8(TAG_PERIOD);
                out.time(*start);
                out.time(*end);
                match profile {
                    None => out.u8(0),
                    Some(profile) => {
                        out.u8(1);
                        out.figures(&profile.figures);
                        out.u64(profile.worker_peak_rss_kib);
                        out.bool(profile.last_of_run);
                        out.optional_bytes(profile.pprof_gzip.as_deref());
                        out.optional_bytes(profile.pprof_zstd.as_deref());
                        out.folded(&profile.folded, &profile.sources);
                        out.optional_bytes(profile.code_provenance.as_deref());
                        out.u64(profile.services.len() as u64);
                        for service in &profile.services {
                            out.service(service);
                        }
                    }
                }
            }
            ToParent::Exiting(exit) => {
                out.u8(TAG_EXITING);
                out.exit(exit);
            }
            ToParent::Retiring(retirement) => {
                out.u8(TAG_RETIRING);
                out.exit(&retirement.exit);
                out.time(retirement.next_period_start);
                out.bool(retirement.profile_follows);
                out.duration(retirement.reported_cpu);
                out.totals(&retirement.totals);
            }
        }
        let length = (out.0.len() - 4) as u32;
        out.0[..4].copy_from_slice(&length.to_le_bytes());
        out.0
    }

    /// Parses one message (a frame without its length prefix).
    pub fn parse(payload: &[u8]) -> Result<Self, ChannelError> {
        let mut input = Reader(payload);
        let message = match input.u8()? {
            TAG_PERIOD => {
                let start = input.time()?;
                let end = input.time()?;
                let profile = match input.u8()? {
                    0 => None,
                    1 => {
                        let figures = input.figures()?;
                        let worker_peak_rss_kib = input.u64()?;
                        let last_of_run = input.bool()?;
                        let pprof_gzip = input.optional_bytes()?;
                        let pprof_zstd = input.optional_bytes()?;
                        let (folded, sources) = input.folded()?;
                        Some(Box::new(EncodedPeriod {
                            figures,
                            worker_peak_rss_kib,
                            last_of_run,
                            pprof_gzip,
                            pprof_zstd,
                            folded,
                            sources,
                            code_provenance: input.optional_bytes()?,
                            services: {
                                // A service's least: its name's length and
                                // six flags.
                                let count = input.count(14)?;
                                let mut services = Vec::with_capacity(count);
                                for _ in 0..count {
                                    services.push(input.service()?);
                                }
                                services
                            },
                        }))
                    }
                    other => return Err(ChannelError::UnknownTag(other)),
                };
                ToParent::PeriodEnd {
                    start,
                    end,
                    profile,
                }
            }
            TAG_EXITING => ToParent::Exiting(input.exit()?),
            TAG_RETIRING => ToParent::Retiring(Retirement {
                exit: input.exit()?,
                next_period_start: input.time()?,
                profile_follows: input.bool()?,
                reported_cpu: input.duration()?,
                totals: input.totals()?,
            }),
            other => return Err(ChannelError::UnknownTag(other)),
        };
        if !input.0.is_empty() {
            return Err(ChannelError::TrailingBytes(input.0.len()));
        }
        Ok(message)
    }
}

/// Collects bytes as they arrive and cuts them into frames.
#[derive(Debug, Default)]
pub struct FrameReader {
    buffer: Vec<u8>,
}

impl FrameReader {
    /// Appends bytes read from the socket.
    pub fn extend(&mut self, bytes: &[u8]) {
        self.buffer.extend_from_slice(bytes);
    }

    /// The next complete message, if one has arrived.
    pub fn next_message(&mut self) -> Result<Option<ToParent>, ChannelError> {
        let Some(prefix) = self.buffer.get(..4) else {
            return Ok(None);
        };
        let length = u32::from_le_bytes(prefix.try_into().unwrap_or_default()) as usize;
        if length > MAX_FRAME {
            return Err(ChannelError::FrameTooLong(length));
        }
        if self.buffer.len() < 4 + length {
            return Ok(None);
        }
        let message = ToParent::parse(&self.buffer[4..4 + length]);
        self.buffer.drain(..4 + length);
        message.map(Some)
    }

    /// Bytes of a frame that has not fully arrived (at end of file: the
    /// worker died while writing it).
    pub fn pending_bytes(&self) -> usize {
        self.buffer.len()
    }
}

struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, value: u8) {
        self.0.push(value);
    }

    fn bool(&mut self, value: bool) {
        self.u8(u8::from(value));
    }

    fn u64(&mut self, value: u64) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    fn time(&mut self, time: SystemTime) {
        let nanos = time
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos() as u64);
        self.u64(nanos);
    }

    fn duration(&mut self, duration: Duration) {
        self.u64(duration.as_nanos() as u64);
    }

    fn exit(&mut self, exit: &WorkerExit) {
        let (kind, value) = match exit {
            WorkerExit::Periods(periods) => (EXIT_PERIODS, u64::from(*periods)),
            WorkerExit::Rss(kib) => (EXIT_RSS, *kib),
            WorkerExit::Finished => (EXIT_FINISHED, 0),
        };
        self.u8(kind);
        self.u64(value);
    }

    fn bytes(&mut self, bytes: &[u8]) {
        self.u64(bytes.len() as u64);
        self.0.extend_from_slice(bytes);
    }

    fn optional_bytes(&mut self, bytes: Option<&[u8]>) {
        match bytes {
            None => self.u8(0),
            Some(bytes) => {
                self.u8(1);
                self.bytes(bytes);
            }
        }
    }

    fn figures(&mut self, figures: &Overhead) {
        self.duration(figures.duration);
        self.u64(figures.samples);
        self.heap(&figures.heap);
        self.lost(&figures.lost);
        self.u64(figures.throttles);
        self.u64(figures.truncated);
        self.u64(figures.stacks.frames);
        self.u64(figures.stacks.depth_limited);
        self.u64(figures.stacks.stack_exhausted);
        self.u64(figures.stacks.walk_failed);
        self.duration(figures.profiler_cpu);
        self.duration(figures.target_cpu);
        self.u64(figures.rss_kib);
        self.u64(figures.peak_rss_kib);
        self.totals(&figures.run);
    }

    fn lost(&mut self, lost: &Lost) {
        self.u64(lost.ring_full);
        self.u64(lost.malformed);
        self.u64(lost.unsampled);
        self.u64(lost.worker);
        self.u64(lost.exiting);
    }

    fn heap(&mut self, heap: &HeapSamples) {
        self.u64(heap.allocations);
        self.u64(heap.frees);
    }

    fn totals(&mut self, totals: &RunTotals) {
        self.u64(totals.samples);
        self.heap(&totals.heap);
        self.u64(totals.truncated);
        self.u64(totals.weight_nanos);
        self.lost(&totals.lost);
        self.u64(totals.throttles);
        match totals.counted_nanos {
            None => self.u8(0),
            Some(counted) => {
                self.u8(1);
                self.u64(counted);
            }
        }
        self.duration(totals.losing_loop.on_cpu);
        self.duration(totals.losing_loop.waiting);
    }

    fn service(&mut self, service: &ServiceProfile) {
        let identity = &service.identity;
        self.bytes(identity.service.as_bytes());
        for tag in [
            &identity.env,
            &identity.version,
            &identity.instance_id,
            &identity.container_id,
        ] {
            self.optional_bytes(tag.as_deref().map(str::as_bytes));
        }
        self.optional_bytes(service.pprof_gzip.as_deref());
        self.optional_bytes(service.pprof_zstd.as_deref());
        self.optional_bytes(service.code_provenance.as_deref());
    }

    /// A name table, then each stack as ids into it, then the names with a
    /// known source (the name table's ids, and the source's code).
    fn folded(&mut self, stacks: &[(Vec<Arc<str>>, u64)], sources: &FrameSources) {
        let mut ids: std::collections::HashMap<&str, u64> = std::collections::HashMap::new();
        let mut names: Vec<&str> = Vec::new();
        let mut encoded: Vec<(Vec<u64>, u64)> = Vec::with_capacity(stacks.len());
        for (frames, count) in stacks {
            let frame_ids = frames
                .iter()
                .map(|name| {
                    *ids.entry(name).or_insert_with(|| {
                        names.push(name);
                        names.len() as u64 - 1
                    })
                })
                .collect();
            encoded.push((frame_ids, *count));
        }
        self.u64(names.len() as u64);
        for name in &names {
            self.bytes(name.as_bytes());
        }
        self.u64(encoded.len() as u64);
        for (frame_ids, count) in encoded {
            self.u64(count);
            self.u64(frame_ids.len() as u64);
            for id in frame_ids {
                self.u64(id);
            }
        }
        let known: Vec<(u64, Source)> = names
            .iter()
            .enumerate()
            .filter_map(|(id, name)| Some((id as u64, *sources.get(*name)?)))
            .collect();
        self.u64(known.len() as u64);
        for (id, source) in known {
            self.u64(id);
            self.u8(source_code(source));
        }
    }
}

/// A source's code on the channel.
fn source_code(source: Source) -> u8 {
    match source {
        Source::Application => 0,
        Source::Library => 1,
        Source::System => 2,
        Source::Kernel => 3,
    }
}

fn source_of_code(code: u8) -> Option<Source> {
    [
        Source::Application,
        Source::Library,
        Source::System,
        Source::Kernel,
    ]
    .into_iter()
    .find(|source| source_code(*source) == code)
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, count: usize) -> Result<&[u8], ChannelError> {
        if self.0.len() < count {
            return Err(ChannelError::Truncated);
        }
        let (taken, rest) = self.0.split_at(count);
        self.0 = rest;
        Ok(taken)
    }

    fn u8(&mut self) -> Result<u8, ChannelError> {
        Ok(self.take(1)?[0])
    }

    /// A flag written as one byte, 0 or 1.
    fn bool(&mut self) -> Result<bool, ChannelError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            other => Err(ChannelError::UnknownTag(other)),
        }
    }

    fn u64(&mut self) -> Result<u64, ChannelError> {
        let bytes = self.take(8)?;
        Ok(u64::from_le_bytes(bytes.try_into().unwrap_or_default()))
    }

    /// A count of items of at least `item_size` bytes each, checked against
    /// what is left (so that garbage cannot make the parent allocate much).
    fn count(&mut self, item_size: usize) -> Result<usize, ChannelError> {
        let count = self.u64()?;
        if count > (self.0.len() / item_size.max(1)) as u64 {
            return Err(ChannelError::Truncated);
        }
        Ok(count as usize)
    }

    fn time(&mut self) -> Result<SystemTime, ChannelError> {
        Ok(UNIX_EPOCH + Duration::from_nanos(self.u64()?))
    }

    fn duration(&mut self) -> Result<Duration, ChannelError> {
        Ok(Duration::from_nanos(self.u64()?))
    }

    fn exit(&mut self) -> Result<WorkerExit, ChannelError> {
        let kind = self.u8()?;
        let value = self.u64()?;
        Ok(match kind {
            EXIT_PERIODS => WorkerExit::Periods(value.min(u64::from(u32::MAX)) as u32),
            EXIT_RSS => WorkerExit::Rss(value),
            EXIT_FINISHED => WorkerExit::Finished,
            other => return Err(ChannelError::UnknownTag(other)),
        })
    }

    fn bytes(&mut self) -> Result<&[u8], ChannelError> {
        let length = self.count(1)?;
        self.take(length)
    }

    fn optional_bytes(&mut self) -> Result<Option<Vec<u8>>, ChannelError> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.bytes()?.to_vec())),
            other => Err(ChannelError::UnknownTag(other)),
        }
    }

    fn figures(&mut self) -> Result<Overhead, ChannelError> {
        Ok(Overhead {
            duration: self.duration()?,
            samples: self.u64()?,
            heap: self.heap()?,
            lost: self.lost()?,
            throttles: self.u64()?,
            truncated: self.u64()?,
            stacks: StackFigures {
                frames: self.u64()?,
                depth_limited: self.u64()?,
                stack_exhausted: self.u64()?,
                walk_failed: self.u64()?,
            },
            profiler_cpu: self.duration()?,
            target_cpu: self.duration()?,
            rss_kib: self.u64()?,
            peak_rss_kib: self.u64()?,
            run: self.totals()?,
        })
    }

    fn lost(&mut self) -> Result<Lost, ChannelError> {
        Ok(Lost {
            ring_full: self.u64()?,
            malformed: self.u64()?,
            unsampled: self.u64()?,
            worker: self.u64()?,
            exiting: self.u64()?,
        })
    }

    fn heap(&mut self) -> Result<HeapSamples, ChannelError> {
        Ok(HeapSamples {
            allocations: self.u64()?,
            frees: self.u64()?,
        })
    }

    fn totals(&mut self) -> Result<RunTotals, ChannelError> {
        Ok(RunTotals {
            samples: self.u64()?,
            heap: self.heap()?,
            truncated: self.u64()?,
            weight_nanos: self.u64()?,
            lost: self.lost()?,
            throttles: self.u64()?,
            counted_nanos: match self.u8()? {
                0 => None,
                1 => Some(self.u64()?),
                other => return Err(ChannelError::UnknownTag(other)),
            },
            losing_loop: ThreadTimes {
                on_cpu: self.duration()?,
                waiting: self.duration()?,
            },
        })
    }

    fn service(&mut self) -> Result<ServiceProfile, ChannelError> {
        let text = |bytes: Vec<u8>| String::from_utf8(bytes).map_err(|_| ChannelError::NotUtf8);
        let service = text(self.bytes()?.to_vec())?;
        let mut tag = || self.optional_bytes()?.map(text).transpose();
        let (env, version, instance_id, container_id) = (tag()?, tag()?, tag()?, tag()?);
        Ok(ServiceProfile {
            identity: ServiceIdentity {
                service,
                env,
                version,
                instance_id,
                container_id,
            },
            pprof_gzip: self.optional_bytes()?,
            pprof_zstd: self.optional_bytes()?,
            code_provenance: self.optional_bytes()?,
        })
    }

    /// [`Writer::folded`]'s stacks and sources.
    fn folded(&mut self) -> Result<(FoldedPeriod, FrameSources), ChannelError> {
        let name_count = self.count(8)?;
        let mut names: Vec<Arc<str>> = Vec::with_capacity(name_count);
        for _ in 0..name_count {
            let name = std::str::from_utf8(self.bytes()?).map_err(|_| ChannelError::NotUtf8)?;
            names.push(Arc::from(name));
        }
        let stack_count = self.count(16)?;
        let mut stacks = Vec::with_capacity(stack_count);
        for _ in 0..stack_count {
            let count = self.u64()?;
            let depth = self.count(8)?;
            let mut frames = Vec::with_capacity(depth);
            for _ in 0..depth {
                let id = self.u64()?;
                let name = names
                    .get(id as usize)
                    .ok_or(ChannelError::Truncated)?
                    .clone();
                frames.push(name);
            }
            stacks.push((frames, count));
        }
        let known = self.count(9)?;
        let mut sources = FrameSources::with_capacity(known);
        for _ in 0..known {
            let name = names
                .get(self.u64()? as usize)
                .ok_or(ChannelError::Truncated)?;
            let code = self.u8()?;
            let source = source_of_code(code).ok_or(ChannelError::UnknownTag(code))?;
            sources.insert(name.clone(), source);
        }
        Ok((stacks, sources))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn period() -> ToParent {
        let name = |text: &str| Arc::<str>::from(text);
        ToParent::PeriodEnd {
            start: UNIX_EPOCH + Duration::from_secs(1_795_000_000),
            end: UNIX_EPOCH + Duration::from_secs(1_795_000_001),
            profile: Some(Box::new(EncodedPeriod {
                figures: Overhead {
                    duration: Duration::from_millis(1001),
                    samples: 990,
                    lost: Lost {
                        ring_full: 2,
                        malformed: 1,
                        unsampled: 4,
                        worker: 0,
                        exiting: 3,
                    },
                    heap: HeapSamples {
                        allocations: 70,
                        frees: 7,
                    },
                    throttles: 5,
                    truncated: 3,
                    stacks: StackFigures {
                        frames: 9000,
                        depth_limited: 1,
                        stack_exhausted: 2,
                        walk_failed: 3,
                    },
                    profiler_cpu: Duration::from_millis(12),
                    target_cpu: Duration::from_millis(990),
                    rss_kib: 20_000,
                    peak_rss_kib: 30_000,
                    run: RunTotals {
                        samples: 1990,
                        heap: HeapSamples {
                            allocations: 140,
                            frees: 14,
                        },
                        truncated: 6,
                        weight_nanos: 1_990_000_000,
                        lost: Lost {
                            ring_full: 3,
                            malformed: 1,
                            unsampled: 9,
                            worker: 8,
                            exiting: 5,
                        },
                        throttles: 5,
                        counted_nanos: Some(2_020_000_000),
                        losing_loop: ThreadTimes {
                            on_cpu: Duration::from_millis(4),
                            waiting: Duration::from_millis(2042),
                        },
                    },
                },
                worker_peak_rss_kib: 18_000,
                last_of_run: true,
                pprof_gzip: Some(vec![0x1f, 0x8b, 1, 2, 3]),
                pprof_zstd: None,
                folded: vec![
                    (vec![name("chain"), name("main"), name("a")], 7),
                    (vec![name("chain"), name("main")], 1),
                ],
                sources: [
                    (name("main"), Source::Application),
                    (name("a"), Source::System),
                ]
                .into_iter()
                .collect(),
                code_provenance: Some(br#"{"v1":[]}"#.to_vec()),
                services: vec![ServiceProfile {
                    identity: ServiceIdentity {
                        service: "checkout".into(),
                        env: Some("prod".into()),
                        version: None,
                        instance_id: Some("i-1".into()),
                        container_id: None,
                    },
                    pprof_gzip: None,
                    pprof_zstd: Some(vec![0x28, 0xb5, 0x2f, 0xfd]),
                    code_provenance: Some(b"{}".to_vec()),
                }],
            })),
        }
    }

    fn frames_of(messages: &[ToParent]) -> Vec<u8> {
        messages.iter().flat_map(ToParent::to_frame).collect()
    }

    #[test]
    fn messages_survive_the_round_trip_byte_by_byte() {
        let messages = vec![
            period(),
            ToParent::PeriodEnd {
                start: UNIX_EPOCH + Duration::from_secs(5),
                end: UNIX_EPOCH + Duration::from_secs(6),
                profile: None,
            },
            ToParent::Retiring(Retirement {
                exit: WorkerExit::Rss(300_000),
                next_period_start: UNIX_EPOCH + Duration::from_secs(6),
                profile_follows: true,
                reported_cpu: Duration::from_millis(35),
                totals: RunTotals::default(),
            }),
            ToParent::Exiting(WorkerExit::Periods(240)),
            ToParent::Exiting(WorkerExit::Rss(300_000)),
            ToParent::Exiting(WorkerExit::Finished),
        ];
        let bytes = frames_of(&messages);
        let mut reader = FrameReader::default();
        let mut received = Vec::new();
        // Arriving one byte at a time, as a stream may deliver them.
        for byte in bytes {
            reader.extend(&[byte]);
            while let Some(message) = reader.next_message().unwrap() {
                received.push(message);
            }
        }
        assert_eq!(received, messages);
        assert_eq!(reader.pending_bytes(), 0);
    }

    #[test]
    fn a_truncated_frame_waits_and_is_seen_at_end_of_file() {
        let bytes = period().to_frame();
        let mut reader = FrameReader::default();
        reader.extend(&bytes[..bytes.len() - 3]);
        assert_eq!(reader.next_message(), Ok(None));
        assert_eq!(reader.pending_bytes(), bytes.len() - 3);
    }

    #[test]
    fn garbage_is_an_error_never_a_panic() {
        // Too long a frame.
        let mut reader = FrameReader::default();
        reader.extend(&u32::MAX.to_le_bytes());
        assert!(matches!(
            reader.next_message(),
            Err(ChannelError::FrameTooLong(_))
        ));
        // An unknown tag.
        let mut reader = FrameReader::default();
        reader.extend(&[1, 0, 0, 0, 9]);
        assert_eq!(reader.next_message(), Err(ChannelError::UnknownTag(9)));
        // A payload whose inner lengths claim more than the frame holds.
        let mut frame = period().to_frame();
        let payload_length = frame.len() - 4 - 10;
        frame.truncate(frame.len() - 10);
        frame[..4].copy_from_slice(&(payload_length as u32).to_le_bytes());
        let mut reader = FrameReader::default();
        reader.extend(&frame);
        assert_eq!(reader.next_message(), Err(ChannelError::Truncated));
        // Bytes after a valid message.
        let mut frame = ToParent::Exiting(WorkerExit::Finished).to_frame();
        frame.push(0);
        let length = (frame.len() - 4) as u32;
        frame[..4].copy_from_slice(&length.to_le_bytes());
        let mut reader = FrameReader::default();
        reader.extend(&frame);
        assert_eq!(reader.next_message(), Err(ChannelError::TrailingBytes(1)));
        // Every prefix of every byte pattern parses or fails cleanly.
        let valid = period().to_frame();
        for cut in 0..valid.len() - 4 {
            let _ = ToParent::parse(&valid[4..4 + cut]);
            let mut flipped = valid[4..].to_vec();
            flipped[cut] ^= 0xff;
            let _ = ToParent::parse(&flipped);
        }
    }
}

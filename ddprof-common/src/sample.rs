//! The sample record both engines agree on, and the reasons a stack can end
//! before reaching its root.

/// ddprof's own limit on user frames per stack (both engines).
pub const MAX_USER_FRAMES: usize = 512;
/// Kernel frames kept per stack (the kernel's own `perf_event_max_stack` default).
pub const MAX_KERNEL_FRAMES: usize = 127;

/// Why a user stack stopped before its root frame. `Complete` means the walk
/// ended on a frame that the unwind rules mark as the outermost one (or a
/// zero return address / frame pointer where frame pointers are used).
#[repr(u32)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StackEnd {
    /// The root of the thread was reached.
    Complete = 0,
    /// The copied stack bytes ran out before the root (perf engine).
    StackExhausted = 1,
    /// A code range had no unwind row and frame pointers did not help.
    NoUnwindInfo = 2,
    /// A computed address was not readable (bad CFA, bad return address).
    BadAddress = 3,
    /// `MAX_USER_FRAMES` frames were collected.
    DepthLimit = 4,
    /// The unwind did not make progress (same SP twice, SP going down).
    NoProgress = 5,
    /// The sample carried no user registers (kernel thread, or a sample in
    /// the kernel with no user context).
    NoUserContext = 6,
}

impl StackEnd {
    /// Decodes the value stored in a raw record; unknown values are treated as
    /// a bad address so that a newer BPF object never panics an older reader.
    pub const fn from_raw(raw: u32) -> StackEnd {
        match raw {
            0 => StackEnd::Complete,
            1 => StackEnd::StackExhausted,
            2 => StackEnd::NoUnwindInfo,
            4 => StackEnd::DepthLimit,
            5 => StackEnd::NoProgress,
            6 => StackEnd::NoUserContext,
            _ => StackEnd::BadAddress,
        }
    }

    pub const fn is_complete(self) -> bool {
        matches!(self, StackEnd::Complete)
    }
}

/// Fixed-size header of a sample record written by the BPF program into its
/// ring buffer. It is followed by `kernel_frames` kernel PCs and then
/// `user_frames` user PCs, each a `u64`, innermost first (kernel frames come
/// first because the kernel stack is collected before the user walk, and
/// the record is emitted with only the frames used).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct RawSampleHeader {
    pub pid: u32,
    pub tid: u32,
    /// CLOCK_MONOTONIC nanoseconds, as `bpf_ktime_get_ns` and perf's
    /// `use_clockid` with CLOCK_MONOTONIC give.
    pub time_ns: u64,
    /// The sampling period in the event's unit (nanoseconds for cpu/task-clock).
    pub period: u64,
    pub cpu: u32,
    /// A `StackEnd` value.
    pub stack_end: u32,
    pub user_frames: u32,
    pub kernel_frames: u32,
    /// The cookie of the link the program ran from: the sampled event's
    /// index in the session's list plus one; 0 for an event attached
    /// without one (the CPU-time events).
    pub event_cookie: u32,
    /// [`RECORD_HAS_ARGUMENTS`] or 0.
    pub flags: u32,
    /// With [`RECORD_HAS_ARGUMENTS`]: the second and third integer
    /// arguments of the function a uprobe stopped at (the allocation
    /// marker's address and kind), whose first is in `period`. 0 otherwise.
    pub arguments: [u64; 2],
}

/// [`RawSampleHeader::flags`]: the record is of a uprobe on a function
/// (`sALLOC`'s marker) and carries its first three integer arguments
/// (`period`, then `arguments`).
pub const RECORD_HAS_ARGUMENTS: u32 = 1;

/// `stack_end` of a header-only record that is not a sample: the program
/// met a process whose entry does not describe its code (a process that
/// just started or exec'd), handed its sample to the perf engine, and wakes
/// the reader at once to describe the process (the header's `pid`), so that
/// the process's next samples are unwound in the kernel. Sent at most once
/// per [`HANDOFF_NOTICE_INTERVAL_NS`] per process (`HANDED_OFF` holds when
/// each was last named).
pub const HANDOFF_NOTICE: u32 = 0xFFFF_0001;

/// The least time between two notices naming the same process. The reader
/// describes a process within a poll of its notice; a process handed over
/// again soon after is one whose new mappings its records will bring to the
/// next poll anyway, or one the maps cannot describe (a table that does not
/// fit), which would otherwise wake the reader at every sample. A notice
/// lost with the ring buffer full is made good by the next hand-over after
/// this interval.
pub const HANDOFF_NOTICE_INTERVAL_NS: u64 = 100_000_000;

/// `stack_end` of a header-only `sWALL` record: the thread of the header's
/// `pid` and `tid`, whose switch-out stack the program emitted, ran again
/// at `time_ns`; `period` is the `time_ns` of that switch-out (the stack
/// record's), by which the reader pairs the two.
pub const WALL_RESUME: u32 = 0xFFFF_0002;

/// `sWALL`: the length of the window over which each CPU counts the
/// profiled threads' switch-outs; the next window's probability follows
/// from that count and the budget of walks.
pub const WALL_WINDOW_NS: u64 = 100_000_000;

/// A probability of 1 in the program's fixed point: a switch-out is sampled
/// when a 32-bit random number is below the probability.
pub const WALL_PROBABILITY_ONE: u64 = 1 << 32;

/// What the `sWALL` program keeps of a thread whose switch-out stack it
/// emitted, until the thread runs again (`PARKED`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct ParkedThread {
    pub pid: u32,
    pub tid: u32,
    /// The switch-out's time (its stack record's `time_ns`).
    pub switched_out: u64,
}

const _: () = assert!(core::mem::size_of::<ParkedThread>() == 16);

// SAFETY: `#[repr(C)]`, two u32 then a u64, 16 bytes (asserted above): no
// padding, so every byte aya copies to or from the kernel is initialised,
// and any bytes are a valid value.
#[cfg(feature = "user")]
unsafe impl aya::Pod for ParkedThread {}

/// `sWALL`: one CPU's count of the profiled threads' switch-outs in the
/// current window (`WALL_RATES`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct WallRate {
    pub window_start: u64,
    pub switch_outs: u64,
    /// In [`WALL_PROBABILITY_ONE`]ths, for the window's switch-outs.
    pub probability: u64,
}

/// The first word of a record that begins with a [`RawTraceContext`]
/// (then the header and frames follow it): no PID is this large
/// (`PID_MAX_LIMIT` is 2^22), so a header never begins with it.
pub const TRACE_CONTEXT_MARKER: u32 = 0xFFFF_FFC7;

/// [`RawTraceContext::kind`] of an OTEP 4947 thread context record: its
/// `attrs` are the record's own (`key index`, `length`, value bytes).
pub const TRACE_CONTEXT_OTEL: u8 = 1;
/// [`RawTraceContext::kind`] of a `custom-labels` label set (or of a Go
/// goroutine's pprof labels, copied the same way): its `attrs`
/// are [`MAX_CUSTOM_LABELS`] slots of [`CUSTOM_LABEL_SLOT`] bytes (key
/// length, value length, the key in [`MAX_CUSTOM_LABEL_KEY`] bytes, the
/// value in [`MAX_CUSTOM_LABEL_VALUE`]; a key length of 0: no label), the
/// ids zero. Fixed slots, not packed entries: a label's place does not
/// depend on the others', which keeps the verifier's paths few.
pub const TRACE_CONTEXT_LABELS: u8 = 2;

/// Attribute bytes a record carries; a published context's further bytes
/// are left out (and the flag says so).
pub const TRACE_CONTEXT_ATTR_BYTES: usize = 256;
/// `custom-labels`: labels read per sample, and the longest key and value
/// read of each (longer ones are cut, and flagged).
pub const MAX_CUSTOM_LABELS: u32 = 4;
pub const CUSTOM_LABEL_SLOT: u32 = 64;
pub const MAX_CUSTOM_LABEL_KEY: u32 = 22;
pub const MAX_CUSTOM_LABEL_VALUE: u32 = 40;
const _: () = assert!(
    2 + MAX_CUSTOM_LABEL_KEY + MAX_CUSTOM_LABEL_VALUE == CUSTOM_LABEL_SLOT
        && (MAX_CUSTOM_LABELS * CUSTOM_LABEL_SLOT) as usize == TRACE_CONTEXT_ATTR_BYTES
);
/// [`RawTraceContext::flags`]: the published attributes did not all fit.
pub const TRACE_CONTEXT_CUT: u8 = 1;

/// What the sampled thread published of the request it was serving,
/// copied by the program from the thread's context record.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct RawTraceContext {
    /// [`TRACE_CONTEXT_MARKER`].
    pub marker: u32,
    /// [`TRACE_CONTEXT_OTEL`] or [`TRACE_CONTEXT_LABELS`].
    pub kind: u8,
    /// [`TRACE_CONTEXT_CUT`] or 0.
    pub flags: u8,
    /// Bytes of `attrs` used.
    pub attrs_len: u16,
    /// From here to the end of `attrs`, the bytes are laid out as an OTEP
    /// 4947 record's first 284, so that the program copies them in one
    /// read. W3C byte order (big-endian); zero without a trace.
    pub trace_id: [u8; 16],
    pub span_id: [u8; 8],
    /// The record's `valid`, trace flags and `attrs_data_size` (LE u16).
    pub record_state: [u8; 4],
    pub attrs: [u8; TRACE_CONTEXT_ATTR_BYTES],
    /// Keeps the size a multiple of 8: the header that follows starts
    /// right after it.
    pub reserved: u32,
}

/// Bytes of [`RawTraceContext`] before a header that follows one.
pub const RAW_TRACE_CONTEXT_SIZE: usize = core::mem::size_of::<RawTraceContext>();
const _: () = assert!(
    RAW_TRACE_CONTEXT_SIZE == 40 + TRACE_CONTEXT_ATTR_BYTES
        && RAW_TRACE_CONTEXT_SIZE.is_multiple_of(8)
);
/// The bytes of an OTEP 4947 record copied: ids, state, attributes.
pub const OTEL_RECORD_READ: usize = 28 + TRACE_CONTEXT_ATTR_BYTES;

/// Bytes of [`RawSampleHeader`] in a record.
pub const RAW_SAMPLE_HEADER_SIZE: usize = core::mem::size_of::<RawSampleHeader>();
const _: () = assert!(RAW_SAMPLE_HEADER_SIZE == 64);

/// Frames a record can hold: kernel frames, then user frames.
pub const MAX_RECORD_FRAMES: usize = MAX_KERNEL_FRAMES + MAX_USER_FRAMES;

/// A whole record as the BPF program builds it in a per-CPU scratch map.
/// The record sent starts at `header`, or at `context` when the thread
/// published one (the two are adjacent: no padding between them).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RawSample {
    pub context: RawTraceContext,
    pub header: RawSampleHeader,
    /// `header.kernel_frames` kernel PCs, then `header.user_frames` user PCs.
    pub frames: [u64; MAX_RECORD_FRAMES],
}

// The record sent from `context` is the context then the header: adjacent.
const _: () = assert!(core::mem::offset_of!(RawSample, header) == RAW_TRACE_CONTEXT_SIZE);

/// Declares [`BpfCounter`] from one list, in slot order: its `ALL` (the
/// display order), `COUNT` (the counter map's size) and the slots (the
/// discriminants) all derive from it.
macro_rules! bpf_counters {
    ($($(#[$doc:meta])* $name:ident,)*) => {
        /// Why the BPF program dropped or cut a sample; index into its counter
        /// map. Every counter but `Seen`/`Emitted` counts samples (at most once
        /// each).
        #[repr(u32)]
        #[derive(Clone, Copy, Debug, PartialEq, Eq)]
        pub enum BpfCounter {
            $($(#[$doc])* $name,)*
        }

        impl BpfCounter {
            /// How many counters there are.
            pub const COUNT: usize = [$(stringify!($name)),*].len();
            /// Every counter, in slot order.
            pub const ALL: [BpfCounter; Self::COUNT] = [$(BpfCounter::$name),*];
        }
    };
}

bpf_counters! {
    /// Samples the program saw for a profiled process.
    Seen,
    /// Samples written to the ring buffer.
    Emitted,
    /// The ring buffer had no room: the sample is lost.
    BufferFull,
    /// Some frame of the sample had no unwind table (frame pointers were tried).
    NoTable,
    /// `bpf_probe_read_user` faulted and ended the walk.
    ReadFault,
    /// The walk hit `MAX_USER_FRAMES`.
    DepthLimit,
    /// The sample had no user registers (kernel thread).
    NoUserContext,
    /// The process had no entry in the process map, or its entry did not
    /// hold the sampled PC (it exec'd or mapped code since): the program let
    /// the kernel write the sample to the perf buffer for the perf engine.
    HandedToPerf,
    /// Of those, samples handed over because a frame was in a file whose
    /// table is not in the row map, or in no mapping the process map
    /// describes (a mapping made since the last sync, or beyond
    /// `MAX_PROCESS_MAPPINGS`), below the first frame.
    HandedOffMidStack,
    /// With `TREE_ONLY` (every task of a CPU sampled): samples of a process
    /// userspace found not profiled, dropped before anything else.
    NotProfiled,
    /// Samples of an event's copy that a new thread or process inherited
    /// (the kernel copies the program, not the link's cookie that names
    /// the event), handed to the perf engine.
    HandedOverInherited,
    /// `sWALL`: switch-outs of the profiled processes' threads (and of
    /// processes not described yet, which may not be profiled).
    WallSwitchOuts,
    /// Of those, switch-outs of a process the maps did not describe yet
    /// (walked with frame pointers only; the reader asked to describe it).
    WallUndescribed,
    /// Of those, the ones sampled: their stacks walked.
    WallSampled,
    /// Of those, stacks lost with the ring buffer full.
    WallBufferFull,
    /// Switch-ins of parked threads whose record was lost with the ring
    /// buffer full (the reader ends their wait at the thread's next CPU
    /// sample or its process's end, or drops the rest of it at the
    /// thread's next stack).
    WallResumeLost,
    /// Records (CPU samples and `sWALL` stacks) that carry the context
    /// their thread published (`TRACE_CONTEXTS`).
    WithTraceContext,
    /// `sALLOC`: allocation samples the uprobe program unwound and wrote
    /// to the ring buffer (they count in `Seen` and `Emitted` too).
    AllocationsUnwound,
    /// `sALLOC`: allocation samples handed to the perf engine because the
    /// CPU's allocation slot was in use (a task preempted in the program,
    /// on a kernel that preempts there).
    AllocationSlotBusy,
}

// Each counter's slot is its place in `ALL`.
const _: () = {
    let mut slot = 0;
    while slot < BpfCounter::COUNT {
        assert!(BpfCounter::ALL[slot] as usize == slot);
        slot += 1;
    }
};

/// Number of `BpfCounter` slots (the size of the program's counter map).
pub const BPF_COUNTER_SLOTS: u32 = BpfCounter::COUNT as u32;

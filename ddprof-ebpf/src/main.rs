//! The ddprof BPF program, attached to every sampling perf event.
//!
//! For each sample it reads the thread's user registers, walks the user stack
//! in the kernel — with the DWARF-derived unwind rows userspace loaded for
//! the file of each PC (`ddprof_common::unwind::step`, the very function the
//! perf engine's unwinder uses), else with frame pointers —, optionally
//! collects the kernel stack, and emits a record with only the frames used
//! into a BPF ring buffer. It returns 0, so that the kernel neither writes
//! the perf sample nor copies its user stack.
//!
//! Two variants share everything but the loop over frames (one is loaded,
//! chosen by probing the kernel for `bpf_loop`):
//! - `ddprof_sample`: one frame per `bpf_loop` iteration (kernel 5.17+), so
//!   the verifier checks the per-frame step once whatever the depth;
//! - `ddprof_sample_tail` + `ddprof_walk_tail` (kernels 5.10 to 5.16):
//!   `FRAMES_PER_TAIL_CALL_RUN` frames per program run, continued through
//!   tail calls, the walk state staying in the per-CPU `WALKS` map.
//!
//! `ddprof_switch` (wall time, `sWALL`, beside the `bpf_loop` variant) is a
//! `sched_switch` BTF tracepoint program: it walks a drawn switch-out's
//! stacks the same way, and reports when that thread runs again. It shares
//! the per-CPU `SCRATCH` and `WALKS` with the perf_event programs: those run
//! with preemption off, and it runs in the scheduler with interrupts off,
//! so neither can start on a CPU while the other runs there.
//!
//! `ddprof_allocation` (`sALLOC`, beside the `bpf_loop` variant) is a
//! uprobe program on the preloaded library's allocation marker: it walks
//! the stack from the registers at the marker the same way and writes the
//! marker's arguments into the record. It runs in the task's context with
//! only migration off, so it has a slot of its own in `SCRATCH` and
//! `WALKS`, and `ALLOCATION_OWNERS` keeps two of its runs apart on one CPU.
#![no_std]
#![no_main]

use core::ffi::c_void;

use aya_ebpf::bindings::{
    bpf_perf_event_data, bpf_pidns_info, BPF_F_NO_PREALLOC, BPF_RB_AVAIL_DATA,
    BPF_RB_FORCE_WAKEUP,
    BPF_RB_NO_WAKEUP, BPF_RB_RING_SIZE,
};
use aya_ebpf::helpers::bpf_get_current_pid_tgid;
use aya_ebpf::helpers::generated::{
    bpf_get_attach_cookie, bpf_get_current_task, bpf_get_current_task_btf, bpf_get_ns_current_pid_tgid, bpf_get_smp_processor_id, bpf_get_stack, bpf_ktime_get_ns, bpf_loop,
    bpf_get_prandom_u32, bpf_probe_read_kernel, bpf_probe_read_user, bpf_ringbuf_output,
    bpf_task_pt_regs,
};
use aya_ebpf::btf_maps::{Array as BtfArray, ArrayOfMaps};
use aya_ebpf::macros::{btf_map, map};
use aya_ebpf::maps::{HashMap, LruHashMap, PerCpuArray, ProgramArray, RingBuf};
use aya_ebpf::programs::PerfEventContext;
use aya_ebpf::EbpfContext;
use ddprof_common::bpf_maps::{
    go_labels_layout, tls_access, GoLabelsSlot, GO_BUCKET_KEYS, GO_BUCKET_VALUES, GO_HMAP_BUCKETS, GO_HMAP_COUNT,
    GO_HMAP_LOG2_BUCKETS, GO_MIN_TOP_HASH, ProcessMappings, RowChunk, TraceContextSlot, TraceContextSlots,
    MAX_TRACE_CONTEXT_PROCESSES, FRAMES_PER_TAIL_CALL_RUN, MAPPING_SEARCH_STEPS,
    MAX_NOT_PROFILED, MAX_PARKED, MAX_PROCESS_MAPPINGS, MAX_TABLES, ROWS_PER_CHUNK, TABLE_MAP_FLAGS,
    TABLE_NOT_LOADED,
};
use ddprof_common::sample::{
    RawSampleHeader, RawTraceContext, CUSTOM_LABEL_SLOT, OTEL_RECORD_READ, MAX_CUSTOM_LABELS, MAX_CUSTOM_LABEL_KEY, MAX_CUSTOM_LABEL_VALUE,
    RAW_TRACE_CONTEXT_SIZE, TRACE_CONTEXT_ATTR_BYTES, TRACE_CONTEXT_CUT, TRACE_CONTEXT_LABELS,
    TRACE_CONTEXT_MARKER, TRACE_CONTEXT_OTEL,
    BpfCounter, ParkedThread, RawSample, StackEnd, WallRate, BPF_COUNTER_SLOTS, HANDOFF_NOTICE,
    RECORD_HAS_ARGUMENTS,
    HANDOFF_NOTICE_INTERVAL_NS, WALL_PROBABILITY_ONE, WALL_RESUME, WALL_WINDOW_NS,
    MAX_KERNEL_FRAMES,
    MAX_RECORD_FRAMES, MAX_USER_FRAMES, RAW_SAMPLE_HEADER_SIZE,
};
use ddprof_common::unwind::{
    Advance, FrameRule, LastStep, Regs, RowKind, UnwindRow, Walker, MAX_LOOKUP_STEPS,
};

/// Why samples were kept or dropped, indexed by `BpfCounter`.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(BPF_COUNTER_SLOTS, 0);

/// Sample records for userspace. Its size is set by the loader.
#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Where a record is built before it is copied to the ring buffer (too big
/// for the 512-byte BPF stack): slot `SAMPLE_SLOT` for the perf_event
/// programs, `SWITCH_SLOT` for `ddprof_switch`, `ALLOCATION_SLOT` for
/// `ddprof_allocation`.
#[map]
static SCRATCH: PerCpuArray<RawSample> = PerCpuArray::with_max_entries(3, 0);

/// The per-CPU slot (of `SCRATCH` and `WALKS`) of the perf_event programs.
const SAMPLE_SLOT: u32 = 0;
/// The per-CPU slot of `ddprof_switch`: its own, because a perf_event
/// program of a hardware event runs from an NMI, which can come while
/// `ddprof_switch` runs (interrupts off do not hold NMIs back), and the
/// kernel's guard against nested programs (`bpf_prog_active`) is not set
/// by tracing programs. (The reverse cannot happen: perf_event programs run
/// with preemption off, so no switch comes while one runs.)
const SWITCH_SLOT: u32 = 1;
/// The per-CPU slot of `ddprof_allocation`: its own, because it runs in
/// the task's context with only migration off, so a perf_event program
/// (from the timer's interrupt or an NMI) or `ddprof_switch` (when the
/// kernel preempts it) can run on its CPU while it does. Two runs of it
/// on one CPU are kept apart by `ALLOCATION_OWNERS`.
const ALLOCATION_SLOT: u32 = 2;

/// `sALLOC`: the task whose run of `ddprof_allocation` holds this CPU's
/// `ALLOCATION_SLOT` (its `pid_tgid`; 0: none). A kernel that preempts
/// tasks in the kernel (`preempt=full`) can switch to another task that
/// allocates while a run walks; that run finds the slot held and hands its
/// sample to the perf engine rather than overwrite the walk.
#[map]
static ALLOCATION_OWNERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// `sALLOC`: set by the loader to the event's cookie (its index plus one),
/// written into the allocation program's records.
#[no_mangle]
static ALLOCATION_COOKIE: u32 = 0;

/// Executable mappings per process (tgid). Sized by the loader. Not
/// preallocated: a preallocated hash map recycles the element an update
/// replaces at once, so a sample walking it on another CPU could read a
/// value that a later update is rewriting; without preallocation, a
/// replaced element is freed only after an RCU grace period (every program
/// run that looked it up has ended), and a walk reads one whole value.
#[map]
static PROCESSES: HashMap<u32, ProcessMappings> =
    HashMap::with_max_entries(1024, BPF_F_NO_PREALLOC);

/// One file's unwind rows: the template of `TABLES`' inner maps (userspace
/// creates each with its table's size and these flags, and writes it
/// through an mmap).
type TableRows = BtfArray<RowChunk, 1, { TABLE_MAP_FLAGS as usize }>;

/// The loaded files' unwind tables, a slot each (`MappingEntry::table`).
#[btf_map]
static TABLES: ArrayOfMaps<TableRows, { MAX_TABLES as usize }> = ArrayOfMaps::new();

/// When (`bpf_ktime_get_ns`) the program last named each process in a
/// `HANDOFF_NOTICE` record, and its entry's version then (plus one; 0
/// without an entry); only the program reads and writes it.
#[map]
static HANDED_OFF: LruHashMap<u32, [u64; 2]> = LruHashMap::with_max_entries(1024, 0);

/// With `TREE_ONLY`: the processes userspace found not profiled (a sample
/// of theirs was handed over, and no record of the profiled processes
/// names them), whose samples are dropped at once. Userspace writes it
/// and removes a process that the records later name (a reused PID).
#[map]
static NOT_PROFILED: LruHashMap<u32, u32> = LruHashMap::with_max_entries(MAX_NOT_PROFILED, 0);

/// Set by the loader: the program is attached to per-CPU events, which
/// sample every task of their CPU, and keeps the profiled processes'
/// samples only (non-zero); else to events that follow the profiled tasks.
#[no_mangle]
static TREE_ONLY: u32 = 0;

/// Set by the loader when the profiler runs in a PID namespace other than
/// the initial one (a container): the device and inode of its namespace
/// (`/proc/self/ns/pid`). The process map and the records use the PIDs of
/// that namespace; the program then takes the sampled task's PIDs there
/// too, and a task outside it is none of the profiler's.
#[no_mangle]
static PID_NS_DEV: u64 = 0;
#[no_mangle]
static PID_NS_INO: u64 = 0;

/// Set by the loader: collect kernel stacks (non-zero) or not.
#[no_mangle]
static KERNEL_STACKS: u32 = 0;

/// Set by the loader where links carry cookies (Linux 5.15+) and the
/// `bpf_loop` variant runs (the tail-call variant never reads them): each
/// record says which event it is of (the cookie its link was given: the
/// event's index plus one). Left 0, the helper is never called.
/// `EVERY_LINK_HAS_A_COOKIE` (every CPU sampled: the CPU-time events are
/// attached with links too): a cookie of 0 is then an event's copy that a
/// thread or process created since inherited, which the kernel gives the
/// program but not the cookie; its samples are handed to the perf engine,
/// which knows their event.
#[no_mangle]
static EVENT_COOKIES: u32 = 0;

/// `EVENT_COOKIES`'s value when every link carries a cookie.
const EVERY_LINK_HAS_A_COOKIE: u32 = 2;

/// Set by the loader: a hand-off notice wakes the reader at once (non-zero)
/// or, for a process's first notice, waits for its next wake-up (low
/// sampling rates, where the wake-up costs more than the samples of a short
/// job it saves from the perf engine's path).
#[no_mangle]
static HANDOFF_WAKEUP: u32 = 1;

/// The state of the stack walk of this CPU. It lives in a map, not on the
/// program's stack: the verifier does not track values in map memory, so it
/// checks the `bpf_loop` callback once instead of once per possible frame
/// count (a precise counter on the stack would make it re-verify the body
/// for each of the 512 iterations).
#[map]
static WALKS: PerCpuArray<Walk> = PerCpuArray::with_max_entries(3, 0);

/// The tail-call variant's continuation: slot 0 holds `ddprof_walk_tail`
/// (set by the loader; empty with the `bpf_loop` variant).
#[map]
static WALK_PROGRAMS: ProgramArray = ProgramArray::with_max_entries(1, 0);

/// What a walk found, the part of its state the record needs.
#[repr(C)]
#[derive(Clone, Copy)]
struct WalkResult {
    pid: u32,
    kernel_frames: u32,
    user_frames: u32,
    /// A `StackEnd` value.
    end: u32,
    /// Flags for the counters: some frame had no table / a read faulted /
    /// the process was unknown.
    no_table: u32,
    read_fault: u32,
    /// Hand the sample to the perf engine: 1, the first PC is in none of
    /// the process's mappings; 2, a later frame is, or needs a table that
    /// is not loaded.
    handoff: u32,
}

#[repr(C)]
struct Walk {
    /// The walk's registers and what it knows of them (the state machine
    /// the perf engine's unwinder drives too).
    walker: Walker,
    /// What the record needs of the walk.
    result: WalkResult,
    /// The mapping of the previous frame (consecutive frames are often in the
    /// same file): `[start, end)`, its bias and its table's rows.
    mapping_start: u64,
    mapping_end: u64,
    mapping_bias: u64,
    mapping_table: u32,
    mapping_row_count: u32,
    /// The bounds of the binary search under way (see `search`).
    search_low: u32,
    search_high: u32,
}

/// The entry point of the `bpf_loop` variant (Linux 5.17+). Written out
/// rather than generated by aya's `#[perf_event]`, whose wrapper discards
/// the function's value and always returns 0: the hand-off to the perf
/// engine depends on that value.
/// 0: the kernel does not write the sample to the perf ring buffer;
/// 1: it does (with the user stack copy), for the perf engine to unwind.
#[no_mangle]
#[link_section = "perf_event"]
pub fn ddprof_sample(ctx: *mut c_void) -> u32 {
    let ctx = PerfEventContext::new(ctx.cast());
    let cookie = event_cookie(&ctx);
    // SAFETY: a read of a constant the loader may have set.
    if cookie == 0 && unsafe { core::ptr::read_volatile(&EVENT_COOKIES) } == EVERY_LINK_HAS_A_COOKIE
    {
        // An inherited copy of an event other than CPU time (`sCS`, `sPF`
        // of a thread started since): without its cookie its samples would
        // pass for CPU time.
        count(BpfCounter::HandedOverInherited);
        return 1;
    }
    match start_perf_sample(&ctx, |_| saved_user_regs_btf(), || cookie) {
        Start::Done(value) => value,
        Start::NoUserContext => finish_sample(SAMPLE_SLOT, true),
        Start::Walk => {
            walk_with_loop(SAMPLE_SLOT);
            finish_sample(SAMPLE_SLOT, true)
        }
    }
}

/// `sALLOC`: the program on the allocation marker's uprobe
/// (`ddprof_sampled_allocation(size, address, kind)` in the preloaded
/// library), attached beside the `bpf_loop` variant. A kprobe-type program:
/// its context is the task's user registers at the probe, the marker's
/// first instruction. It walks the user stack from there as
/// `ddprof_sample` walks a CPU sample's, and writes the marker's three
/// arguments into the record. 0: the kernel writes no perf sample (and
/// copies no stack); 1: it does, for the perf engine to unwind (a process
/// the maps do not describe yet, a frame whose table is not loaded, the
/// CPU's slot held by a preempted run).
#[no_mangle]
#[link_section = "uprobe/ddprof_allocation"]
pub fn ddprof_allocation(ctx: *mut c_void) -> u32 {
    let Some(owner) = ALLOCATION_OWNERS.get_ptr_mut(0) else {
        return 1;
    };
    let task = bpf_get_current_pid_tgid();
    // SAFETY: this CPU's slot of a per-CPU array, valid for the run. A run
    // preempted between this read and the write below lets a second one
    // in: its walk may then be overwritten (a wrong stack, never a fault).
    if unsafe { owner.read_volatile() } != 0 {
        count(BpfCounter::AllocationSlotBusy);
        count(BpfCounter::HandedToPerf);
        return 1;
    }
    // SAFETY: as above.
    unsafe { owner.write_volatile(task) };
    let value = allocation_sample(ctx);
    // SAFETY: as above; every path of `allocation_sample` returns here.
    unsafe { owner.write_volatile(0) };
    value
}

/// The body of `ddprof_allocation`, run while it holds `ALLOCATION_SLOT`.
#[inline(always)]
fn allocation_sample(ctx: *mut c_void) -> u32 {
    // SAFETY: a uprobe program's context is the task's `pt_regs` (on
    // arm64, starting with its `user_pt_regs`), read at constant offsets.
    let regs = unsafe { &*(ctx as *const arch::UserRegs) };
    // The marker's arguments: the size, the address the library follows
    // (0: not followed), 1 for a mapping.
    let [size, address, kind] = arch::arguments(regs);
    // SAFETY: a read of a constant the loader sets.
    let cookie = unsafe { core::ptr::read_volatile(&ALLOCATION_COOKIE) };
    // A uprobe's registers are user ones: no saved registers are needed,
    // and no kernel stack is worth taking (the breakpoint's handler).
    let start = start_sample(
        ctx,
        regs,
        size,
        ALLOCATION_SLOT,
        false,
        |_| SavedRegs::HandOff,
        || cookie,
    );
    match start {
        Start::Done(value) => value,
        Start::NoUserContext => 1,
        Start::Walk => {
            let Some(record) = SCRATCH.get_ptr_mut(ALLOCATION_SLOT) else {
                return 1;
            };
            // SAFETY: this CPU's record of the slot this run holds.
            unsafe {
                (*record).header.flags = RECORD_HAS_ARGUMENTS;
                (*record).header.arguments = [address, kind];
            }
            walk_with_loop(ALLOCATION_SLOT);
            let value = finish_sample(ALLOCATION_SLOT, true);
            if value == 0 {
                count(BpfCounter::AllocationsUnwound);
            }
            value
        }
    }
}

/// The entry point of the tail-call variant, for kernels without `bpf_loop`
/// (5.10 to 5.16): it walks `FRAMES_PER_TAIL_CALL_RUN` frames, then
/// `ddprof_walk_tail` continues through tail calls. It calls no helper newer
/// than 5.10 (`tests/bpf_engine.rs` checks the object) and no BPF-to-BPF
/// function (mixing those with tail calls needs the x86-64 JIT of 5.10+ and
/// caps the stack at 256 bytes). Its own section, so that the test finds
/// its instructions.
#[no_mangle]
#[link_section = "perf_event/ddprof_sample_tail"]
pub fn ddprof_sample_tail(ctx: *mut c_void) -> u32 {
    let ctx = PerfEventContext::new(ctx.cast());
    // No cookies: `bpf_get_attach_cookie` is newer than 5.10.
    match start_perf_sample(&ctx, |_| SavedRegs::HandOff, || 0) {
        Start::Done(value) => value,
        Start::NoUserContext => finish_sample(SAMPLE_SLOT, false),
        Start::Walk => continue_walk(&ctx),
    }
}

/// Attached to the per-task events when per-CPU events sample
/// (`TREE_ONLY`): their samples are dropped (they sample at the lowest
/// rate; the events stay for their counts and process records).
#[no_mangle]
#[link_section = "perf_event/ddprof_ignore"]
pub fn ddprof_ignore(_ctx: *mut c_void) -> u32 {
    0
}

/// The tail-called program of the tail-call variant: the next
/// `FRAMES_PER_TAIL_CALL_RUN` frames of the walk `WALKS` holds.
#[no_mangle]
#[link_section = "perf_event/ddprof_walk_tail"]
pub fn ddprof_walk_tail(ctx: *mut c_void) -> u32 {
    continue_walk(&PerfEventContext::new(ctx.cast()))
}

/// `sWALL`: set by the loader to the event's cookie (its index plus one),
/// written into the program's records.
#[no_mangle]
static WALL_COOKIE: u32 = 0;

/// `sWALL`: the highest probability with which a switch-out is sampled, in
/// `WALL_PROBABILITY_ONE`ths (the event's `probability=`).
#[no_mangle]
static WALL_MAX_PROBABILITY: u64 = WALL_PROBABILITY_ONE;

/// `sWALL`: the stacks a CPU walks per `WALL_WINDOW_NS` window, on
/// average: when the profiled threads switched out more often in a window,
/// the next window samples each switch-out with the probability that keeps
/// to this budget. Set by the loader (at least 1).
#[no_mangle]
static WALL_WALKS_PER_WINDOW: u64 = 25;

/// `sWALL`: set by the loader where a process the maps do not describe may
/// be profiled (every CPU sampled, `TREE_ONLY`, or every process,
/// `--global`): its switch-outs are drawn too and the reader is asked to
/// describe it (or mark it not profiled). 0: the maps hold every profiled
/// process (per-task events), and the others' switches are none of ours.
#[no_mangle]
static WALL_UNDESCRIBED: u32 = 0;

/// `sWALL`: the offset of `pid` (the thread's id, as the root PID
/// namespace numbers it) in `struct task_struct`, which the loader reads
/// from the kernel's BTF: the incoming thread's id is read from it.
#[no_mangle]
static TASK_PID_OFFSET: u32 = 0;

/// Set by the loader: the offset of the thread pointer (`thread.fsbase`)
/// in `struct task_struct`, from the kernel's BTF. 0: unknown, and no
/// thread context is read.
#[no_mangle]
static TASK_FSBASE_OFFSET: u32 = 0;

/// The processes that publish a thread context (OTEP 4947, or
/// `custom-labels`), where each thread keeps its pointer to it. Written by
/// userspace when it finds the publisher's TLS variable in a process's
/// files; a process without an entry costs its samples this one lookup.
#[map]
static TRACE_CONTEXTS: HashMap<u32, TraceContextSlots> =
    HashMap::with_max_entries(MAX_TRACE_CONTEXT_PROCESSES, 0);

/// `sWALL`: the threads whose switch-out stack was emitted, by their id in
/// the root PID namespace (keyed by thread, not by CPU: a thread may run
/// again on another CPU), until they run again; userspace adds the threads
/// already off a CPU when the program starts. An LRU, so that a switch
/// never fails for want of room (see `MAX_PARKED`).
#[map]
static PARKED: LruHashMap<u32, ParkedThread> = LruHashMap::with_max_entries(MAX_PARKED, 0);

/// `sWALL`: where the outgoing thread's saved user registers are copied
/// (in map memory: on the program's stack, with the walk's callback, they
/// overran its 512 bytes).
#[map]
static SAVED_REGS: PerCpuArray<arch::UserRegs> = PerCpuArray::with_max_entries(1, 0);

/// `sWALL`: each CPU's count of switch-outs in the current window.
#[map]
static WALL_RATES: PerCpuArray<WallRate> = PerCpuArray::with_max_entries(1, 0);

/// `sWALL`, attached to the `sched_switch` BTF tracepoint (every context
/// switch of the machine, run by the CPU that switches, interrupts off):
/// first the incoming thread's end of wait, if it was parked; then the
/// outgoing thread's stack (it is still `current`, its user memory
/// readable), if its process is profiled and the switch-out is drawn. The
/// blocked thread's stack does not change until it runs again, so it is
/// taken once, at switch-out; its weight (the time off the CPU over the
/// probability it was drawn with) is known at switch-in, where the reader
/// pairs the two records. The walk is the CPU samples' (`bpf_loop`: Linux
/// 5.17+; the tracepoint's `prev_state` argument: 5.18+).
#[no_mangle]
#[link_section = "tp_btf/sched_switch"]
pub fn ddprof_switch(ctx: *mut c_void) -> i32 {
    // SAFETY: reads of the tracepoint's arguments at constant offsets of
    // the context: (preempt, prev, next, prev_state), each a u64 (the
    // fourth since Linux 5.18: on 5.17 the verifier refuses the program).
    // The outgoing thread (`prev`) is `current`.
    let (next, prev_state) = unsafe {
        let args = ctx as *const u64;
        (*args.add(2), *args.add(3))
    };
    resume_parked(next);
    // A dead task's last switch: it never runs again, and its address
    // space is gone (its parked entry would stay until evicted).
    if prev_state & TASK_DEAD == 0 {
        switch_out(ctx);
    }
    0
}

/// `TASK_DEAD` of `task_struct.__state` (`include/linux/sched.h`), the
/// state of a task's last switch-out.
const TASK_DEAD: u64 = 0x80;

/// Reports the end of `task`'s wait if its switch-out stack was emitted
/// (or userspace found it off a CPU at the start).
#[inline(always)]
fn resume_parked(task: u64) {
    // SAFETY: a read of a constant the loader set.
    let offset = unsafe { core::ptr::read_volatile(&TASK_PID_OFFSET) };
    if offset == 0 {
        return;
    }
    // SAFETY: a checked kernel read of 4 bytes of the incoming task's
    // `task_struct` (the tracepoint's argument) into a local.
    let mut tid: u32 = 0;
    let read = unsafe {
        bpf_probe_read_kernel(
            &mut tid as *mut u32 as *mut c_void,
            4,
            (task + u64::from(offset)) as *const c_void,
        )
    };
    if read != 0 {
        return;
    }
    // SAFETY: the value is copied out at once.
    let Some(parked) = (unsafe { PARKED.get(&tid) }).copied() else {
        return;
    };
    let _ = PARKED.remove(&tid);
    let Some(record) = SCRATCH.get_ptr_mut(SWITCH_SLOT) else {
        return;
    };
    // SAFETY: this CPU's scratch record (see `start_sample`; the sched_switch
    // program runs with interrupts off and no perf_event program of this
    // CPU is running: they run with preemption off).
    let record = unsafe { &mut *record };
    record.header.pid = parked.pid;
    record.header.tid = parked.tid;
    record.header.period = parked.switched_out;
    record.header.stack_end = WALL_RESUME;
    record.header.user_frames = 0;
    record.header.kernel_frames = 0;
    // SAFETY: helpers without memory arguments; a read of a constant the
    // loader set.
    unsafe {
        record.header.time_ns = bpf_ktime_get_ns();
        record.header.cpu = bpf_get_smp_processor_id();
        record.header.event_cookie = core::ptr::read_volatile(&WALL_COOKIE);
    }
    if !emit(record, BPF_RB_NO_WAKEUP, false) {
        count(BpfCounter::WallResumeLost);
    }
}

/// Draws whether the outgoing thread's switch-out is sampled and, if it
/// is, emits its kernel and user stacks and parks it.
#[inline(always)]
fn switch_out(ctx: *mut c_void) {
    let Some(pid_tgid) = current_pid_tgid() else {
        return;
    };
    let pid = (pid_tgid >> 32) as u32;
    if pid == 0 {
        return;
    }
    let described = PROCESSES.get_ptr(pid).is_some();
    if !described {
        // SAFETY: a read of a constant the loader set.
        if unsafe { core::ptr::read_volatile(&WALL_UNDESCRIBED) } == 0 {
            return;
        }
        // Every CPU sampled: one more lookup for the processes userspace
        // found not profiled.
        // SAFETY: as above; the map's value is not used, only whether
        // there is one.
        if unsafe { core::ptr::read_volatile(&TREE_ONLY) } != 0
            && unsafe { NOT_PROFILED.get(&pid) }.is_some()
        {
            return;
        }
        // A process not described yet (it just started, or is not
        // profiled: userspace decides, and marks it one way or the other):
        // its stack is walked with frame pointers only, and the reader is
        // asked to describe it for its next switches.
        count(BpfCounter::WallUndescribed);
        notify_undescribed(pid, SWITCH_SLOT);
    }
    count(BpfCounter::WallSwitchOuts);
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(probability) = switch_out_probability(now) else {
        return;
    };
    // SAFETY: a helper without arguments.
    if u64::from(unsafe { bpf_get_prandom_u32() }) >= probability {
        return;
    }
    let Some(saved) = SAVED_REGS.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: bpf_get_current_task_btf never fails in a tracing program;
    // bpf_task_pt_regs returns the kernel address of the task's saved user
    // registers, copied with a checked kernel read into this CPU's slot.
    let read = unsafe {
        let task = bpf_get_current_task_btf();
        bpf_probe_read_kernel(
            saved as *mut c_void,
            core::mem::size_of::<arch::UserRegs>() as u32,
            bpf_task_pt_regs(task) as *const c_void,
        )
    };
    // SAFETY: this CPU's slot, written above.
    let saved = unsafe { &*saved };
    // A kernel thread of the process (io_uring's workers): no user stack.
    if read != 0 || !arch::has_user_frame(saved) {
        return;
    }
    count(BpfCounter::WallSampled);
    let Some(record) = SCRATCH.get_ptr_mut(SWITCH_SLOT) else {
        return;
    };
    // SAFETY: this CPU's scratch record (see `resume_parked`).
    let record = unsafe { &mut *record };
    record.header.pid = pid;
    record.header.tid = pid_tgid as u32;
    record.header.time_ns = now;
    record.header.period = probability;
    // SAFETY: a helper without memory arguments; a read of a constant the
    // loader set.
    unsafe {
        record.header.cpu = bpf_get_smp_processor_id();
        record.header.event_cookie = core::ptr::read_volatile(&WALL_COOKIE);
    }
    // The kernel stack says why the thread waits (futex, poll, a pipe, a
    // page fault's I/O), whatever `KERNEL_STACKS` says.
    // SAFETY: the buffer is the start of the record's frame array, which
    // holds more than MAX_KERNEL_FRAMES u64s.
    let bytes = unsafe {
        bpf_get_stack(
            ctx,
            record.frames.as_mut_ptr() as *mut c_void,
            (MAX_KERNEL_FRAMES * 8) as u32,
            0,
        )
    };
    let kernel_frames = if bytes > 0 {
        (bytes as u32 / 8).min(MAX_KERNEL_FRAMES as u32)
    } else {
        0
    };
    let Some(walk) = init_walk(SWITCH_SLOT, pid, kernel_frames) else {
        return;
    };
    walk.walker.regs = arch::regs_of(saved);
    walk.result.end = StackEnd::DepthLimit as u32;
    walk_with_loop(SWITCH_SLOT);
    let Some(walk_ptr) = WALKS.get_ptr_mut(SWITCH_SLOT) else {
        return;
    };
    let result = walk_result(walk_ptr);
    // A frame in a mapping the entry does not describe yet: there is no
    // perf sample to hand over, so the stack ends there (`BadAddress`) and
    // the reader is asked to describe the process for the next ones.
    fill_record(&result, record);
    let with_context = read_trace_context(pid, &mut record.context);
    if with_context {
        count(BpfCounter::WithTraceContext);
    }
    if emit(record, BPF_RB_NO_WAKEUP, with_context) {
        let parked = ParkedThread {
            pid,
            tid: pid_tgid as u32,
            switched_out: now,
        };
        // Keyed as `resume_parked` reads it: by the root namespace's id.
        let root_tid = bpf_get_current_pid_tgid() as u32;
        let _ = PARKED.insert(&root_tid, &parked, 0);
    } else {
        count(BpfCounter::WallBufferFull);
    }
    if result.handoff != 0 && described {
        notify_undescribed(pid, SWITCH_SLOT);
    }
}

/// The probability (in `WALL_PROBABILITY_ONE`ths) with which this CPU
/// samples a switch-out at `now`, counting it in the window: the budget of
/// walks over the previous window's switch-outs, at most the event's own;
/// lowered within the window when its switch-outs come faster than that
/// (at each power of two of them from the budget on: a first window, or a
/// burst, would otherwise walk every switch-out of a whole window).
/// Decided from past switches only, so that each sample's time off the CPU
/// over its probability stays an unbiased estimate.
#[inline(always)]
fn switch_out_probability(now: u64) -> Option<u64> {
    let rate = WALL_RATES.get_ptr_mut(0)?;
    // SAFETY: this CPU's slot (the program does not nest on a CPU).
    let rate = unsafe { &mut *rate };
    // SAFETY: reads of constants the loader set.
    let (max, budget) = unsafe {
        (
            core::ptr::read_volatile(&WALL_MAX_PROBABILITY),
            core::ptr::read_volatile(&WALL_WALKS_PER_WINDOW),
        )
    };
    let elapsed = now.wrapping_sub(rate.window_start);
    if elapsed >= WALL_WINDOW_NS {
        let switch_outs = rate.switch_outs;
        rate.probability = if switch_outs <= budget {
            max
        } else {
            let drawn = (budget << 32) / switch_outs;
            if drawn < max {
                drawn
            } else {
                max
            }
        };
        rate.window_start = now;
        rate.switch_outs = 0;
    }
    rate.switch_outs += 1;
    let switch_outs = rate.switch_outs;
    if switch_outs >= budget && switch_outs & (switch_outs - 1) == 0 && elapsed < WALL_WINDOW_NS {
        // At this pace the window would see `switch_outs * WINDOW /
        // elapsed` of them: the probability that walks `budget` of those.
        // ((budget << 32) / WINDOW first: the product stays within u64.)
        // (`checked_div`: a division the compiler cannot prove safe would
        // leave a panic path, which the verifier refuses.)
        let paced = ((budget << 32) / WALL_WINDOW_NS * (elapsed + 1))
            .checked_div(switch_outs)
            .unwrap_or(0);
        if paced < rate.probability {
            rate.probability = if paced > 0 { paced } else { 1 };
        }
    }
    Some(rate.probability)
}

/// Walks up to `FRAMES_PER_TAIL_CALL_RUN` frames, then tail-calls
/// `ddprof_walk_tail` (slot 0 of `WALK_PROGRAMS`) for the rest, or emits
/// the sample when the walk is over.
#[inline(always)]
fn continue_walk(ctx: &PerfEventContext) -> u32 {
    let Some(walk) = WALKS.get_ptr_mut(SAMPLE_SLOT) else {
        return 0;
    };
    // SAFETY: this CPU's walk state (see `WALKS`).
    let walk = unsafe { &mut *walk };
    let mut frames = 0;
    while frames < FRAMES_PER_TAIL_CALL_RUN {
        if walk_one(walk, SAMPLE_SLOT).is_none() {
            return finish_sample(SAMPLE_SLOT, false);
        }
        frames += 1;
    }
    // At the limit: end here rather than spend a tail call to learn it
    // (512 frames then take the entry and 31 of the 32 calls a chain may
    // make before Linux 5.17).
    if walk.result.user_frames >= MAX_USER_FRAMES as u32 {
        walk.result.end = StackEnd::DepthLimit as u32;
        return finish_sample(SAMPLE_SLOT, false);
    }
    // SAFETY: the context is this program's; on success the call does not
    // return.
    unsafe { WALK_PROGRAMS.tail_call(ctx, 0) };
    // The tail call failed (the slot is empty, or the chain used all its
    // calls, which `FRAMES_PER_TAIL_CALL_RUN` makes impossible before
    // `MAX_USER_FRAMES`): the stack ends here, at its depth limit.
    walk.result.end = StackEnd::DepthLimit as u32;
    finish_sample(SAMPLE_SLOT, false)
}

/// The cookie of the link this run came from (0 without cookies).
#[inline(always)]
fn event_cookie(ctx: &PerfEventContext) -> u32 {
    // SAFETY: a read of a constant the loader may have set.
    if unsafe { core::ptr::read_volatile(&EVENT_COOKIES) } == 0 {
        return 0;
    }
    // SAFETY: the helper reads the program's own context.
    unsafe { bpf_get_attach_cookie(ctx.as_ptr()) as u32 }
}

/// The current task's tgid (high half) and tid, as the profiler's PID
/// namespace numbers them (`PID_NS_INO`), or as the initial one does; `None`
/// for a task outside the profiler's namespace.
#[inline(always)]
fn current_pid_tgid() -> Option<u64> {
    // SAFETY: reads of constants the loader may have set.
    let (dev, ino) = unsafe {
        (
            core::ptr::read_volatile(&PID_NS_DEV),
            core::ptr::read_volatile(&PID_NS_INO),
        )
    };
    if ino == 0 {
        return Some(bpf_get_current_pid_tgid());
    }
    let mut ids = bpf_pidns_info { pid: 0, tgid: 0 };
    // SAFETY: the helper writes `size` bytes into `ids`, a local of that
    // size (Linux 5.7+; the tail-call variant is for 5.10+).
    let result = unsafe {
        bpf_get_ns_current_pid_tgid(
            dev,
            ino,
            &mut ids,
            core::mem::size_of::<bpf_pidns_info>() as u32,
        )
    };
    (result == 0).then_some(((ids.tgid as u64) << 32) | ids.pid as u64)
}

/// How a sample starts.
enum Start {
    /// Nothing to walk: the program returns this value.
    Done(u32),
    /// No user registers: emit the (kernel-only) record.
    NoUserContext,
    /// `WALKS` holds the registers of the first user frame.
    Walk,
}

/// The saved user registers of a sample taken in kernel mode.
enum SavedRegs {
    Regs(Regs),
    /// None: a kernel thread.
    None,
    /// This variant cannot read them: hand the sample to the perf engine.
    HandOff,
}

/// [`start_sample`] for a perf_event program: the interrupted registers
/// and the period from its context, kernel stacks as the loader asked, in
/// `SAMPLE_SLOT`.
#[inline(always)]
fn start_perf_sample(
    ctx: &PerfEventContext,
    saved_regs: impl FnOnce(&arch::UserRegs) -> SavedRegs,
    cookie: impl FnOnce() -> u32,
) -> Start {
    let data = ctx.as_ptr() as *const bpf_perf_event_data;
    // SAFETY: reads of the program context at constant offsets: the
    // interrupted registers, and the sample's period; and of a constant
    // the loader may have set.
    let (interrupted, period, kernel_stacks) = unsafe {
        (
            &(*data).regs,
            (*data).sample_period,
            core::ptr::read_volatile(&KERNEL_STACKS) != 0,
        )
    };
    start_sample(
        ctx.as_ptr(),
        interrupted,
        period,
        SAMPLE_SLOT,
        kernel_stacks,
        saved_regs,
        cookie,
    )
}

/// Counts the sample, fills the record's header (`period` its period) and
/// kernel stack (`kernel_stacks`) and the walk state in `slot`, or hands
/// the sample to the perf engine. `ctx` is the program's context,
/// `interrupted` the registers the sample was taken with; `saved_regs`
/// gives the user registers of a sample taken in kernel mode.
#[inline(always)]
fn start_sample(
    ctx: *mut c_void,
    interrupted: &arch::UserRegs,
    period: u64,
    slot: u32,
    kernel_stacks: bool,
    saved_regs: impl FnOnce(&arch::UserRegs) -> SavedRegs,
    cookie: impl FnOnce() -> u32,
) -> Start {
    let Some(pid_tgid) = current_pid_tgid() else {
        // A task outside the profiler's PID namespace (per-CPU events).
        count(BpfCounter::NotProfiled);
        return Start::Done(0);
    };
    let pid = (pid_tgid >> 32) as u32;
    // SAFETY: a read of a constant the loader may have set.
    if unsafe { core::ptr::read_volatile(&TREE_ONLY) } != 0 {
        // Another process's sample: the idle task, or one userspace found
        // not profiled. Any other unknown process is handed over below and
        // userspace decides.
        // SAFETY: the value is not used, only whether there is one.
        if pid == 0 || unsafe { NOT_PROFILED.get(&pid) }.is_some() {
            count(BpfCounter::NotProfiled);
            return Start::Done(0);
        }
    }
    count(BpfCounter::Seen);
    // A process userspace has not described yet (just forked or started,
    // or beyond the map's size): the perf engine unwinds this sample from
    // the stack copy the kernel then writes.
    if PROCESSES.get_ptr(pid).is_none() {
        hand_off_waking_reader(pid, slot);
        return Start::Done(1);
    }
    let regs = if arch::is_user_mode(interrupted) {
        Some(arch::regs_of(interrupted))
    } else {
        match saved_regs(interrupted) {
            SavedRegs::Regs(regs) => Some(regs),
            SavedRegs::None => None,
            // The kernel writes the sample with the user registers and
            // stack it saved at kernel entry, which the perf engine unwinds.
            SavedRegs::HandOff => {
                count(BpfCounter::HandedToPerf);
                return Start::Done(1);
            }
        }
    };
    let Some(record) = SCRATCH.get_ptr_mut(slot) else {
        return Start::Done(0);
    };
    // SAFETY: a per-CPU map slot, valid for the whole program run and used
    // by this CPU only (perf_event programs do not nest on one CPU; the
    // other programs have slots of their own).
    let record = unsafe { &mut *record };
    record.header.pid = pid;
    record.header.tid = pid_tgid as u32;
    // SAFETY: helpers without memory arguments.
    unsafe {
        record.header.time_ns = bpf_ktime_get_ns();
        record.header.cpu = bpf_get_smp_processor_id();
    }
    record.header.period = period;
    // Volatile stores: LLVM would turn these zeros (with a cookie of 0)
    // into a call of `memset`, a BPF-to-BPF call the tail-call variant must
    // not make (see `ddprof_sample_tail`).
    // SAFETY: fields of this CPU's scratch record, written through
    // pointers into it.
    unsafe {
        use core::ptr::addr_of_mut;
        addr_of_mut!(record.header.event_cookie).write_volatile(cookie());
        addr_of_mut!(record.header.flags).write_volatile(0);
        addr_of_mut!(record.header.arguments[0]).write_volatile(0);
        addr_of_mut!(record.header.arguments[1]).write_volatile(0);
    }

    let mut kernel_frames = 0u32;
    if kernel_stacks {
        // SAFETY: the buffer is the start of the record's frame array, which
        // holds more than MAX_KERNEL_FRAMES u64s.
        let bytes = unsafe {
            bpf_get_stack(
                ctx,
                record.frames.as_mut_ptr() as *mut c_void,
                (MAX_KERNEL_FRAMES * 8) as u32,
                0,
            )
        };
        if bytes > 0 {
            kernel_frames = (bytes as u32 / 8).min(MAX_KERNEL_FRAMES as u32);
        }
    }

    let Some(walk) = init_walk(slot, pid, kernel_frames) else {
        return Start::Done(0);
    };
    match regs {
        Some(regs) => {
            walk.walker.regs = regs;
            // Stays DepthLimit only if every frame step asked for more.
            walk.result.end = StackEnd::DepthLimit as u32;
            Start::Walk
        }
        None => {
            count(BpfCounter::NoUserContext);
            Start::NoUserContext
        }
    }
}

/// Resets this CPU's walk state in `slot` for a sample of `pid` whose
/// record holds `kernel_frames` kernel frames already.
#[inline(always)]
fn init_walk(slot: u32, pid: u32, kernel_frames: u32) -> Option<&'static mut Walk> {
    let walk_ptr = WALKS.get_ptr_mut(slot)?;
    // Field by field, with volatile stores: LLVM would turn a whole-struct
    // store into a call of `memset`, a BPF-to-BPF call the tail-call variant
    // must not make (see `ddprof_sample_tail`).
    // SAFETY: this CPU's slot, as for the record; every field is written
    // through a pointer into it.
    unsafe {
        use core::ptr::addr_of_mut;
        let walk = walk_ptr;
        addr_of_mut!((*walk).result.pid).write_volatile(pid);
        addr_of_mut!((*walk).result.kernel_frames).write_volatile(kernel_frames);
        addr_of_mut!((*walk).result.user_frames).write_volatile(0);
        addr_of_mut!((*walk).result.end).write_volatile(StackEnd::NoUserContext as u32);
        addr_of_mut!((*walk).walker.exact_pc).write_volatile(1);
        addr_of_mut!((*walk).result.no_table).write_volatile(0);
        addr_of_mut!((*walk).result.read_fault).write_volatile(0);
        addr_of_mut!((*walk).result.handoff).write_volatile(0);
        addr_of_mut!((*walk).walker.last_step).write_volatile(LastStep::Row);
        addr_of_mut!((*walk).walker.bp_restored).write_volatile(0);
        addr_of_mut!((*walk).mapping_start).write_volatile(0);
        addr_of_mut!((*walk).mapping_end).write_volatile(0);
        addr_of_mut!((*walk).mapping_bias).write_volatile(0);
        addr_of_mut!((*walk).mapping_table).write_volatile(0);
        addr_of_mut!((*walk).mapping_row_count).write_volatile(0);
        addr_of_mut!((*walk).search_low).write_volatile(0);
        addr_of_mut!((*walk).search_high).write_volatile(0);
    }
    // SAFETY: as above.
    Some(unsafe { &mut *walk_ptr })
}

/// Emits the record of the finished walk (or hands the sample to the perf
/// engine) and returns the program's value. `with_trace_context`: read the
/// thread's published context into the record (the `bpf_loop` variant;
/// the tail-call variant, which must not call BPF functions, does not).
#[inline(always)]
fn finish_sample(slot: u32, with_trace_context: bool) -> u32 {
    let Some(walk_ptr) = WALKS.get_ptr_mut(slot) else {
        return 0;
    };
    let Some(record) = SCRATCH.get_ptr_mut(slot) else {
        return 0;
    };
    // SAFETY: this CPU's scratch record (see `start_sample`).
    let record = unsafe { &mut *record };
    let result = walk_result(walk_ptr);
    let pid = result.pid;
    if result.handoff != 0 {
        // The process's entry does not describe its code (it exec'd or
        // mapped code since userspace last wrote it), or a frame needs a
        // table the row map does not hold.
        if result.handoff == 2 {
            count(BpfCounter::HandedOffMidStack);
        }
        hand_off_waking_reader(pid, slot);
        return 1;
    }

    fill_record(&result, record);
    let with_context = with_trace_context && read_trace_context(pid, &mut record.context);
    if with_context {
        count(BpfCounter::WithTraceContext);
    }
    count(if emit(record, BPF_RB_NO_WAKEUP, with_context) {
        BpfCounter::Emitted
    } else {
        BpfCounter::BufferFull
    });
    0
}

/// Reads the finished walk's result. The walk changed the state through
/// other pointers (the loop's callback, an earlier program of the
/// tail-call chain): read from memory, not from what the compiler assumes
/// it holds; and not the whole state, which would take ~200 bytes of the
/// program's 512-byte stack.
#[inline(always)]
fn walk_result(walk: *const Walk) -> WalkResult {
    // SAFETY: this CPU's slot of `WALKS`, valid for the program run.
    unsafe { core::ptr::read_volatile(core::ptr::addr_of!((*walk).result)) }
}

/// Puts what the walk found in the record's header, and counts why it
/// ended where that is worth knowing.
#[inline(always)]
fn fill_record(result: &WalkResult, record: &mut RawSample) {
    record.header.stack_end = result.end;
    record.header.user_frames = result.user_frames;
    record.header.kernel_frames = result.kernel_frames;
    if result.no_table != 0 {
        count(BpfCounter::NoTable);
    }
    if result.read_fault != 0 {
        count(BpfCounter::ReadFault);
    }
    if result.end == StackEnd::DepthLimit as u32 {
        count(BpfCounter::DepthLimit);
    }
}

/// Copies the record, with only the frames it holds, to the ring buffer
/// (from its trace context `with_context`, else from its header); false
/// when the buffer had no room. `wakeup` is `BPF_RB_NO_WAKEUP` unless the
/// record must wake the reader anyway.
#[inline(always)]
fn emit(record: &mut RawSample, wakeup: u32, with_context: bool) -> bool {
    let mut frames = (record.header.kernel_frames + record.header.user_frames) as u64;
    if frames > MAX_RECORD_FRAMES as u64 {
        frames = MAX_RECORD_FRAMES as u64;
    }
    let size = RAW_SAMPLE_HEADER_SIZE as u64 + frames * 8;
    // Waking the reader for every sample costs an irq_work and a context
    // switch each; it polls with a timeout anyway, so wake it only once a
    // quarter of the buffer is waiting.
    let pending = SAMPLES.query(BPF_RB_AVAIL_DATA as u64);
    let ring_size = SAMPLES.query(BPF_RB_RING_SIZE as u64);
    let wakeup = if pending >= ring_size / 4 {
        BPF_RB_FORCE_WAKEUP
    } else {
        wakeup
    };
    // Two calls, not one with a computed start: each keeps its start and
    // size together for the verifier.
    // SAFETY: `record` is a map value of size_of::<RawSample>() bytes; from
    // `context` (its start) the record spans at most all of it, from
    // `header` (RAW_TRACE_CONTEXT_SIZE bytes in) at most the rest; the map
    // pointer is the ring buffer map itself.
    let written = unsafe {
        if with_context {
            bpf_ringbuf_output(
                &SAMPLES as *const RingBuf as *mut c_void,
                &mut record.context as *mut RawTraceContext as *mut c_void,
                RAW_TRACE_CONTEXT_SIZE as u64 + size,
                wakeup as u64,
            )
        } else {
            bpf_ringbuf_output(
                &SAMPLES as *const RingBuf as *mut c_void,
                &mut record.header as *mut RawSampleHeader as *mut c_void,
                size,
                wakeup as u64,
            )
        }
    };
    written == 0
}

/// Copies the context the sampled thread published, if its process
/// publishes one (`TRACE_CONTEXTS`), into `context`; whether it did. A
/// thread of such a process with no context costs two reads (its thread
/// pointer, its null context pointer); a process without one, the lookup.
#[inline(always)]
fn read_trace_context(pid: u32, context: &mut RawTraceContext) -> bool {
    // SAFETY: a read of a constant the loader set.
    let fsbase_offset = unsafe { core::ptr::read_volatile(&TASK_FSBASE_OFFSET) };
    if fsbase_offset == 0 {
        return false;
    }
    // SAFETY: the value is copied at once.
    let Some(slots) = (unsafe { TRACE_CONTEXTS.get(&pid) }).copied() else {
        return false;
    };
    let mut thread_pointer = 0u64;
    // SAFETY: the current task's address, and a checked kernel read of 8
    // bytes at the BTF's offset of its thread pointer into a local.
    let read = unsafe {
        let task = bpf_get_current_task();
        bpf_probe_read_kernel(
            &mut thread_pointer as *mut u64 as *mut c_void,
            8,
            (task + u64::from(fsbase_offset)) as *const c_void,
        )
    };
    if read != 0 || thread_pointer == 0 {
        return false;
    }
    if let Some(record) = context_pointer(thread_pointer, &slots.otel) {
        return read_otel_context(record, context);
    }
    if let Some(labels) = context_pointer(thread_pointer, &slots.labels) {
        return read_custom_labels(labels, context);
    }
    if slots.go.g_offset != 0 {
        return read_go_labels(thread_pointer, &slots.go, context);
    }
    false
}

/// The thread's context pointer (the TLS variable's value) as `slot`
/// finds it from the thread pointer; `None` when null or unreadable.
#[inline(always)]
fn context_pointer(thread_pointer: u64, slot: &TraceContextSlot) -> Option<u64> {
    let variable = match slot.access {
        tls_access::STATIC => thread_pointer.wrapping_add(slot.offset as u64),
        tls_access::DTV => {
            let dtv = read_user_u64(thread_pointer.wrapping_add(8))?;
            // glibc keeps the DTV's length in the entry before it: a thread
            // whose DTV was not grown for the module yet has no block there.
            let length = read_user_u64(dtv.wrapping_sub(16))?;
            if slot.module > length {
                return None;
            }
            let block = read_user_u64(dtv.wrapping_add(slot.module.wrapping_mul(16)))?;
            // Not allocated yet for this thread (glibc's TLS_DTV_UNALLOCATED).
            if block == 0 || block == u64::MAX {
                return None;
            }
            block.wrapping_add(slot.offset as u64)
        }
        tls_access::DTV_MUSL => {
            let dtv = read_user_u64(thread_pointer.wrapping_add(8))?;
            // musl's first entry is the count of the others; each is the
            // block's address (musl allocates a dlopen'ed module's block
            // for every thread at once).
            let count = read_user_u64(dtv)?;
            if slot.module > count {
                return None;
            }
            let block = read_user_u64(dtv.wrapping_add(slot.module.wrapping_mul(8)))?;
            if block == 0 {
                return None;
            }
            block.wrapping_add(slot.offset as u64)
        }
        _ => return None,
    };
    read_user_u64(variable).filter(|&pointer| pointer != 0)
}

/// Copies an OTEP 4947 record: trace id, span id, (`valid`, flags,
/// `attrs_data_size`), then the attributes, in one read of
/// `OTEL_RECORD_READ` bytes (the OTEP's records are 640 bytes; one that
/// ends sooner, before an unmapped page, is read in two: the fixed part,
/// then its attributes). A record being rewritten (`valid` 0) gives none.
#[inline(always)]
fn read_otel_context(record: u64, context: &mut RawTraceContext) -> bool {
    // SAFETY: checked user reads into the context, from `trace_id` on: its
    // ids, state and attributes are adjacent (repr(C), asserted in
    // ddprof_common), OTEL_RECORD_READ bytes in all.
    let whole = unsafe {
        bpf_probe_read_user(
            context.trace_id.as_mut_ptr() as *mut c_void,
            OTEL_RECORD_READ as u32,
            record as *const c_void,
        )
    };
    if whole != 0 {
        // SAFETY: as above, the fixed 28 bytes only.
        let fixed = unsafe {
            bpf_probe_read_user(
                context.trace_id.as_mut_ptr() as *mut c_void,
                28,
                record as *const c_void,
            )
        };
        if fixed != 0 {
            return false;
        }
    }
    let state = context.record_state;
    if state[0] != 1 {
        return false;
    }
    let published = u16::from_le_bytes([state[2], state[3]]) as u32;
    let mut size = published;
    if size > TRACE_CONTEXT_ATTR_BYTES as u32 {
        size = TRACE_CONTEXT_ATTR_BYTES as u32;
    }
    context.flags = if published > size { TRACE_CONTEXT_CUT } else { 0 };
    if whole != 0 && size > 0 {
        // SAFETY: at most TRACE_CONTEXT_ATTR_BYTES bytes into the context's
        // attribute array of that size.
        let read = unsafe {
            bpf_probe_read_user(
                context.attrs.as_mut_ptr() as *mut c_void,
                size,
                (record + 28) as *const c_void,
            )
        };
        if read != 0 {
            size = 0;
        }
    }
    context.attrs_len = size as u16;
    context.kind = TRACE_CONTEXT_OTEL;
    context.marker = TRACE_CONTEXT_MARKER;
    true
}

/// Copies a `custom-labels` (ABI v1) label set: `{storage, count,
/// capacity}`, each label two `{len, buf}` strings; the first
/// `MAX_CUSTOM_LABELS` labels, each in its slot of `attrs`, its key and
/// value cut to their bounds.
#[inline(always)]
fn read_custom_labels(set: u64, context: &mut RawTraceContext) -> bool {
    let Some(storage) = read_user_u64(set) else {
        return false;
    };
    let Some(count) = read_user_u64(set.wrapping_add(8)) else {
        return false;
    };
    if count == 0 {
        return false;
    }
    read_label_array(storage, count, true, context);
    true
}

/// Copies the first `MAX_CUSTOM_LABELS` of `count` labels at `array`, 32
/// bytes each: two strings of two words, the length first
/// (`custom-labels`' `{len, buf}`) or the pointer first (Go's strings);
/// then ends the context, cut if there were more.
#[inline(always)]
fn read_label_array(array: u64, count: u64, length_first: bool, context: &mut RawTraceContext) {
    let mut index = 0u32;
    while index < MAX_CUSTOM_LABELS {
        clear_label(context, index);
        if u64::from(index) < count {
            let mut label = [0u64; 4];
            // SAFETY: a checked user read of 32 bytes into a local of that size.
            let read = unsafe {
                bpf_probe_read_user(
                    label.as_mut_ptr() as *mut c_void,
                    32,
                    array.wrapping_add(u64::from(index) * 32) as *const c_void,
                )
            };
            let [key_len, key, value_len, value] = if length_first {
                label
            } else {
                [label[1], label[0], label[3], label[2]]
            };
            if read == 0 {
                copy_label(context, index, key, key_len, value, value_len);
            }
        }
        index += 1;
    }
    finish_labels(context, count > u64::from(MAX_CUSTOM_LABELS));
}

/// Copies the pprof labels of the goroutine a Go program's thread runs
/// (`g.m.curg.labels`), each in its slot of `attrs`: from Go 1.24 on, the
/// first `MAX_CUSTOM_LABELS` of its sorted slice; before, the labels of
/// its `map[string]string`'s first bucket's first `MAX_CUSTOM_LABELS`
/// entries (a map that dd-trace-go, or `pprof.Do`, builds for a few labels
/// is one bucket, filled in order). More labels or buckets than that are
/// flagged as cut.
#[inline(always)]
fn read_go_labels(thread_pointer: u64, go: &GoLabelsSlot, context: &mut RawTraceContext) -> bool {
    let Some(g) = read_user_u64(thread_pointer.wrapping_add(go.g_offset as u64)) else {
        return false;
    };
    let Some(m) = read_user_u64(g.wrapping_add(u64::from(go.m))).filter(|&m| m != 0) else {
        return false;
    };
    // No user goroutine on the thread (its scheduler runs): no labels.
    let Some(curg) = read_user_u64(m.wrapping_add(u64::from(go.curg))).filter(|&g| g != 0) else {
        return false;
    };
    let Some(labels) = read_user_u64(curg.wrapping_add(u64::from(go.labels))).filter(|&l| l != 0)
    else {
        return false;
    };
    if go.layout == go_labels_layout::SLICE {
        return read_go_label_slice(labels, context);
    }
    let Some(map) = read_user_u64(labels).filter(|&map| map != 0) else {
        return false;
    };
    let Some(count) = read_user_u64(map.wrapping_add(GO_HMAP_COUNT)).filter(|&count| count != 0)
    else {
        return false;
    };
    let Some(buckets) = read_user_u64(map.wrapping_add(GO_HMAP_BUCKETS)).filter(|&b| b != 0)
    else {
        return false;
    };
    let Some(top_hashes) = read_user_u64(buckets) else {
        return false;
    };
    let mut log2_buckets = 0u8;
    // SAFETY: a checked user read of 1 byte into a local of that size.
    unsafe {
        bpf_probe_read_user(
            &mut log2_buckets as *mut u8 as *mut c_void,
            1,
            map.wrapping_add(GO_HMAP_LOG2_BUCKETS) as *const c_void,
        )
    };
    let mut index = 0u32;
    while index < MAX_CUSTOM_LABELS {
        clear_label(context, index);
        let top_hash = (top_hashes >> (8 * index)) as u8;
        if top_hash >= GO_MIN_TOP_HASH {
            let entry = u64::from(index) * 16;
            let mut key = [0u64; 2];
            let mut value = [0u64; 2];
            // SAFETY: checked user reads of 16 bytes each into locals of
            // that size.
            let read = unsafe {
                bpf_probe_read_user(
                    key.as_mut_ptr() as *mut c_void,
                    16,
                    buckets.wrapping_add(GO_BUCKET_KEYS + entry) as *const c_void,
                ) | bpf_probe_read_user(
                    value.as_mut_ptr() as *mut c_void,
                    16,
                    buckets.wrapping_add(GO_BUCKET_VALUES + entry) as *const c_void,
                )
            };
            if read == 0 {
                copy_label(context, index, key[0], key[1], value[0], value[1]);
            }
        }
        index += 1;
    }
    let cut = count > u64::from(MAX_CUSTOM_LABELS) || log2_buckets != 0;
    finish_labels(context, cut);
    true
}

/// Copies Go 1.24's labels: `labels` points to a slice header (array,
/// length, capacity) of `{key, value}` strings, each string two words
/// (pointer, length).
#[inline(always)]
fn read_go_label_slice(labels: u64, context: &mut RawTraceContext) -> bool {
    let Some(array) = read_user_u64(labels).filter(|&array| array != 0) else {
        return false;
    };
    let Some(count) = read_user_u64(labels.wrapping_add(8)).filter(|&count| count != 0) else {
        return false;
    };
    read_label_array(array, count, false, context);
    true
}

/// Marks label slot `index` of `attrs` empty.
#[inline(always)]
fn clear_label(context: &mut RawTraceContext, index: u32) {
    let slot = (index * CUSTOM_LABEL_SLOT) as usize;
    // SAFETY: `index` is below MAX_CUSTOM_LABELS, so `slot` is below
    // TRACE_CONTEXT_ATTR_BYTES (asserted in ddprof_common: the slots fill
    // the array).
    unsafe { *context.attrs.as_mut_ptr().add(slot) = 0 };
}

/// Copies a label's key and value (user addresses and lengths) into slot
/// `index` of `attrs`, each cut to its bound; the slot stays empty when a
/// read fails.
#[inline(always)]
fn copy_label(
    context: &mut RawTraceContext,
    index: u32,
    key: u64,
    key_len: u64,
    value: u64,
    value_len: u64,
) {
    if key == 0 || value == 0 || key_len == 0 {
        return;
    }
    let slot = (index * CUSTOM_LABEL_SLOT) as usize;
    let key_bytes = if key_len > u64::from(MAX_CUSTOM_LABEL_KEY) {
        MAX_CUSTOM_LABEL_KEY
    } else {
        key_len as u32
    };
    let value_bytes = if value_len > u64::from(MAX_CUSTOM_LABEL_VALUE) {
        MAX_CUSTOM_LABEL_VALUE
    } else {
        value_len as u32
    };
    // SAFETY: the key (at most MAX_CUSTOM_LABEL_KEY bytes) and value (at
    // most MAX_CUSTOM_LABEL_VALUE) go to their places in this label's
    // slot, inside `attrs` (`index` is below MAX_CUSTOM_LABELS).
    let read = unsafe {
        let at = context.attrs.as_mut_ptr().add(slot);
        bpf_probe_read_user(at.add(2) as *mut c_void, key_bytes, key as *const c_void)
            | bpf_probe_read_user(
                at.add(2 + MAX_CUSTOM_LABEL_KEY as usize) as *mut c_void,
                value_bytes,
                value as *const c_void,
            )
    };
    if read == 0 {
        // SAFETY: the slot's two length bytes, inside `attrs`.
        unsafe {
            let at = context.attrs.as_mut_ptr().add(slot);
            *at = key_bytes as u8;
            *at.add(1) = value_bytes as u8;
        }
    }
}

/// Ends a label set's context: no ids, every slot's bytes, the cut flag.
#[inline(always)]
fn finish_labels(context: &mut RawTraceContext, cut: bool) {
    context.trace_id = [0; 16];
    context.span_id = [0; 8];
    context.attrs_len = TRACE_CONTEXT_ATTR_BYTES as u16;
    context.flags = if cut { TRACE_CONTEXT_CUT } else { 0 };
    context.kind = TRACE_CONTEXT_LABELS;
    context.marker = TRACE_CONTEXT_MARKER;
}

/// The user registers the task saved on kernel entry, found with
/// `bpf_get_current_task_btf` (5.11) and `bpf_task_pt_regs` (5.15): the
/// `bpf_loop` variant only.
#[inline(always)]
fn saved_user_regs_btf() -> SavedRegs {
    // SAFETY: bpf_get_current_task_btf never fails in a perf_event program;
    // bpf_task_pt_regs returns the kernel address of the task's saved user
    // registers, copied out with a checked kernel read.
    match unsafe { arch::read_saved_regs(bpf_task_pt_regs(bpf_get_current_task_btf()) as *const c_void) } {
        Some(regs) => SavedRegs::Regs(regs),
        None => SavedRegs::None,
    }
}

/// The architecture's user registers: what a sample's `pt_regs` holds, and
/// how the unwinder and the allocation marker see them.
#[cfg(bpf_target_arch = "x86_64")]
mod arch {
    use ddprof_common::unwind::Regs;

    /// `bpf_user_pt_regs_t`: the whole `pt_regs` on x86-64.
    pub type UserRegs = aya_ebpf::bindings::pt_regs;

    /// The registers were saved in user mode: CS in ring 3.
    #[inline(always)]
    pub fn is_user_mode(regs: &UserRegs) -> bool {
        regs.cs & 3 == 3
    }

    /// User registers with a PC: a kernel thread of the process (io_uring's
    /// workers) has none.
    #[inline(always)]
    pub fn has_user_frame(regs: &UserRegs) -> bool {
        is_user_mode(regs) && regs.rip != 0
    }

    /// A probed function's first three integer arguments (System V ABI).
    #[inline(always)]
    pub fn arguments(regs: &UserRegs) -> [u64; 3] {
        [regs.rdi, regs.rsi, regs.rdx]
    }

    /// The user registers a task saved at `saved` (`bpf_task_pt_regs`) on
    /// kernel entry, if they are a user frame's (kernel threads have none).
    ///
    /// # Safety
    /// `saved` is a kernel address; it is only read by a checked read.
    #[inline(always)]
    pub unsafe fn read_saved_regs(saved: *const core::ffi::c_void) -> Option<Regs> {
        let mut regs: UserRegs = core::mem::zeroed();
        // SAFETY: a checked kernel read into this stack variable.
        let result = aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            &mut regs as *mut UserRegs as *mut core::ffi::c_void,
            core::mem::size_of::<UserRegs>() as u32,
            saved,
        );
        (result == 0 && has_user_frame(&regs)).then(|| regs_of(&regs))
    }

    /// The registers the unwinder tracks, the others by DWARF number.
    /// (Entries 6 and 7, RBP and RSP, are not read — `bp` and `sp` are —,
    /// but hold them rather than zeros: two constant zeros become a call of
    /// `memset`, a BPF-to-BPF call the tail-call variant must not make;
    /// `lr`, arm64's, holds the PC for the same reason.)
    #[inline(always)]
    pub fn regs_of(regs: &UserRegs) -> Regs {
        Regs {
            ip: regs.rip,
            sp: regs.rsp,
            bp: regs.rbp,
            others: [
                regs.rax, regs.rdx, regs.rcx, regs.rbx, regs.rsi, regs.rdi, regs.rbp, regs.rsp,
                regs.r8, regs.r9, regs.r10, regs.r11, regs.r12, regs.r13, regs.r14, regs.r15,
            ],
            known: Regs::ALL_KNOWN,
            lr: regs.rip,
        }
    }
}

#[cfg(bpf_target_arch = "aarch64")]
mod arch {
    use ddprof_common::unwind::Regs;

    /// `bpf_user_pt_regs_t`: `user_pt_regs`, the start of arm64's
    /// `pt_regs` (X0-X30, SP, PC, PSTATE).
    pub type UserRegs = aya_ebpf::bindings::user_pt_regs;

    /// PSTATE's mode bits (`PSR_MODE_MASK` and the AArch32 bit): 0 is
    /// EL0t, user mode of a 64-bit task.
    const MODE_BITS: u64 = 0x1f;

    /// The registers were saved in 64-bit user mode (EL0).
    #[inline(always)]
    pub fn is_user_mode(regs: &UserRegs) -> bool {
        regs.pstate & MODE_BITS == 0
    }

    /// User registers with a PC: a kernel thread of the process has none.
    #[inline(always)]
    pub fn has_user_frame(regs: &UserRegs) -> bool {
        is_user_mode(regs) && regs.pc != 0
    }

    /// A probed function's first three integer arguments (AAPCS64: X0-X2).
    #[inline(always)]
    pub fn arguments(regs: &UserRegs) -> [u64; 3] {
        [regs.regs[0], regs.regs[1], regs.regs[2]]
    }

    /// The end of `user_pt_regs`: X29, X30, SP, PC, PSTATE.
    #[repr(C)]
    struct FrameRegs {
        fp: u64,
        lr: u64,
        sp: u64,
        pc: u64,
        pstate: u64,
    }

    /// The user registers a task saved at `saved` (`bpf_task_pt_regs`) on
    /// kernel entry, if they are a user frame's (kernel threads have none):
    /// the frame registers only (the whole `user_pt_regs` would not fit the
    /// program's 512-byte stack beside the walk; no arm64 row is based on
    /// the other registers).
    ///
    /// # Safety
    /// `saved` is a kernel address; it is only read by a checked read.
    #[inline(always)]
    pub unsafe fn read_saved_regs(saved: *const core::ffi::c_void) -> Option<Regs> {
        let mut frame = FrameRegs {
            fp: 0,
            lr: 0,
            sp: 0,
            pc: 0,
            pstate: 0,
        };
        // SAFETY: a checked kernel read into this stack variable, from the
        // offset of X29 in `user_pt_regs`.
        let result = aya_ebpf::helpers::generated::bpf_probe_read_kernel(
            &mut frame as *mut FrameRegs as *mut core::ffi::c_void,
            core::mem::size_of::<FrameRegs>() as u32,
            (saved as *const u64).wrapping_add(29) as *const core::ffi::c_void,
        );
        if result != 0 || frame.pstate & MODE_BITS != 0 || frame.pc == 0 {
            return None;
        }
        let mut regs = Regs::new(frame.pc, frame.sp, frame.fp);
        regs.lr = frame.lr;
        Some(regs)
    }

    /// The registers the unwinder tracks: PC, SP, the frame pointer X29,
    /// the link register X30, and X0-X15 by DWARF number.
    #[inline(always)]
    pub fn regs_of(regs: &UserRegs) -> Regs {
        let r = &regs.regs;
        Regs {
            ip: regs.pc,
            sp: regs.sp,
            bp: r[29],
            others: [
                r[0], r[1], r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9], r[10], r[11], r[12],
                r[13], r[14], r[15],
            ],
            known: Regs::ALL_KNOWN,
            lr: r[30],
        }
    }
}

/// One `bpf_loop` iteration: records the current PC and steps to the caller.
/// Returns 0 to continue and 1 to stop.
#[inline(never)]
extern "C" fn walk_frame(_index: u64, context: *mut c_void) -> i64 {
    // SAFETY: the context is the caller's `slot`, a u32 on its stack
    // (`walk_with_loop`).
    let slot = unsafe { *(context as *const u32) };
    let Some(walk) = WALKS.get_ptr_mut(slot) else {
        return 1;
    };
    // SAFETY: this CPU's walk state (see `WALKS`).
    let walk = unsafe { &mut *walk };
    match walk_one(walk, slot) {
        Some(()) => 0,
        None => 1,
    }
}

/// Walks the user stack of the walk in `slot` of `WALKS` (into the same
/// slot of `SCRATCH`), one frame per `bpf_loop` iteration.
#[inline(always)]
fn walk_with_loop(slot: u32) {
    let slot = slot;
    // SAFETY: `walk_frame` has the callback signature bpf_loop expects; its
    // context is `slot`, on this stack for the whole call.
    unsafe {
        bpf_loop(
            MAX_USER_FRAMES as u32,
            walk_frame as *mut c_void,
            &slot as *const u32 as *mut c_void,
            0,
        )
    };
}

/// `None` ends the walk (with `walk.result.end` set). `slot`: the walk's
/// slot of `WALKS`, whose record is in the same slot of `SCRATCH`.
#[inline(always)]
fn walk_one(walk: &mut Walk, slot: u32) -> Option<()> {
    if walk.result.user_frames >= MAX_USER_FRAMES as u32 {
        walk.result.end = StackEnd::DepthLimit as u32;
        return None;
    }
    let record = SCRATCH.get_ptr_mut(slot)?;
    let index = (walk.result.kernel_frames + walk.result.user_frames) as usize;
    // SAFETY: this CPU's scratch record (see `sample`).
    let Some(frame) = (unsafe { (*record).frames.get_mut(index) }) else {
        walk.result.end = StackEnd::DepthLimit as u32;
        return None;
    };
    *frame = walk.walker.regs.ip;
    walk.result.user_frames += 1;

    let rule = match rule_for(walk, walk.walker.lookup_pc()) {
        Rule::Row(row) => FrameRule::Row(row),
        Rule::FramePointer => FrameRule::FramePointer,
        // The PC is in no mapping the entry describes (the process exec'd
        // or mapped code since userspace wrote it, or has more mappings
        // than an entry holds), or in a file whose table is not loaded:
        // the perf engine, which knows every mapping and table, unwinds it.
        // (A PC reached through frame pointers may be garbage: the perf
        // engine would follow the same frame pointers, so that stack ends
        // here.)
        Rule::NotLoaded => {
            walk.result.handoff = if walk.result.user_frames == 1 { 1 } else { 2 };
            walk.result.end = StackEnd::BadAddress as u32;
            return None;
        }
        Rule::Unmapped => {
            walk.result.handoff = if walk.result.user_frames == 1 {
                1
            } else if walk.walker.last_step == LastStep::Row {
                2
            } else {
                0
            };
            walk.result.end = StackEnd::BadAddress as u32;
            return None;
        }
    };
    let end = match walk.walker.advance(rule, read_user_u64) {
        Advance::Next => return Some(()),
        Advance::End(end) => end,
        Advance::ReadFault { frame_pointer } => {
            walk.result.read_fault = 1;
            // A frame-pointer chain into unreadable memory: RBP was no
            // frame pointer there.
            if frame_pointer {
                StackEnd::NoUnwindInfo
            } else {
                StackEnd::BadAddress
            }
        }
    };
    walk.result.end = end as u32;
    None
}

enum Rule {
    Row(UnwindRow),
    FramePointer,
    Unmapped,
    NotLoaded,
}

/// How to step the frame whose (lookup) PC is `pc`.
#[inline(always)]
fn rule_for(walk: &mut Walk, pc: u64) -> Rule {
    if pc < walk.mapping_start || pc >= walk.mapping_end {
        // (Only missing if userspace removed it since the sample began.)
        let Some(mappings) = PROCESSES.get_ptr(walk.result.pid) else {
            return Rule::FramePointer;
        };
        // SAFETY: a map value, valid for the program run: the map is not
        // preallocated, so an update replaces the element and the one read
        // here stays whole until every program run that found it has ended
        // (an RCU grace period).
        let mappings = unsafe { &*mappings };
        let count = mappings.count.min(MAX_PROCESS_MAPPINGS as u32);
        let Some(index) = search(walk, count, MAPPING_SEARCH_STEPS, pc, |i| {
            mappings
                .entries
                .get(i as usize & (MAX_PROCESS_MAPPINGS - 1))
                .map(|entry| entry.start)
        }) else {
            return Rule::Unmapped;
        };
        let Some(entry) = mappings
            .entries
            .get(index as usize & (MAX_PROCESS_MAPPINGS - 1))
        else {
            return Rule::Unmapped;
        };
        if pc >= entry.end {
            return Rule::Unmapped;
        }
        walk.mapping_start = entry.start;
        walk.mapping_end = entry.end;
        walk.mapping_bias = entry.bias;
        walk.mapping_table = entry.table;
        walk.mapping_row_count = entry.row_count;
    }
    if walk.mapping_row_count == 0 {
        if walk.mapping_table == TABLE_NOT_LOADED {
            return Rule::NotLoaded;
        }
        walk.result.no_table = 1;
        return Rule::FramePointer;
    }
    let vaddr = pc.wrapping_sub(walk.mapping_bias);
    if vaddr > u32::MAX as u64 {
        return Rule::FramePointer;
    }
    let row_count = walk.mapping_row_count;
    // (Only missing if userspace freed the table since the entry was read:
    // the next sample finds the entry rewritten.)
    let Some(table) = TABLES.get(walk.mapping_table) else {
        return Rule::NotLoaded;
    };
    let Some(index) = search(walk, row_count, MAX_LOOKUP_STEPS, vaddr, |i| {
        row_at(table, i).map(|row| row.start as u64)
    }) else {
        return Rule::FramePointer;
    };
    match row_at(table, index) {
        Some(row) => rule_of(row),
        None => Rule::FramePointer,
    }
}

#[inline(always)]
fn rule_of(row: UnwindRow) -> Rule {
    if row.row_kind() == RowKind::NoInfo {
        Rule::FramePointer
    } else {
        Rule::Row(row)
    }
}

/// Index of the last of `len` sorted entries whose start (read by
/// `start_of`) is `<= key`, in at most `max_steps` steps: the binary search
/// of `ddprof_common::unwind::find_row_index`, with its bounds kept in map
/// memory (`walk`) between steps. On the BPF stack they would be tracked
/// precisely and every path through the search would be a new verifier
/// state (2^steps of them); read back from a map they are unknown scalars,
/// and the verifier prunes the paths of each step into one.
#[inline(always)]
fn search<F: FnMut(u32) -> Option<u64>>(
    walk: &mut Walk,
    len: u32,
    max_steps: u32,
    key: u64,
    mut start_of: F,
) -> Option<u32> {
    let low_cell = core::ptr::addr_of_mut!(walk.search_low);
    let high_cell = core::ptr::addr_of_mut!(walk.search_high);
    // SAFETY: the cells are fields of this CPU's walk state.
    unsafe {
        low_cell.write_volatile(0);
        high_cell.write_volatile(len);
    }
    let mut steps = 0;
    while steps < max_steps {
        // SAFETY: as above.
        let (low, high) = unsafe { (low_cell.read_volatile(), high_cell.read_volatile()) };
        if low >= high {
            break;
        }
        let mid = low + (high - low) / 2;
        // SAFETY: as above.
        unsafe {
            if start_of(mid)? <= key {
                low_cell.write_volatile(mid + 1);
            } else {
                high_cell.write_volatile(mid);
            }
        }
        steps += 1;
    }
    // SAFETY: as above.
    unsafe { low_cell.read_volatile() }.checked_sub(1)
}

#[inline(always)]
fn row_at(table: &TableRows, index: u32) -> Option<UnwindRow> {
    let chunk = table.get(index / ROWS_PER_CHUNK)?;
    chunk.rows.get((index % ROWS_PER_CHUNK) as usize).copied()
}

#[inline(always)]
fn read_user_u64(addr: u64) -> Option<u64> {
    let mut value = 0u64;
    // SAFETY: the helper checks the user address and writes 8 bytes into
    // `value` (zeroes on a fault).
    let result = unsafe {
        bpf_probe_read_user(
            &mut value as *mut u64 as *mut c_void,
            8,
            addr as *const c_void,
        )
    };
    (result == 0).then_some(value)
}

/// Counts a sample handed to the perf engine and, unless it named the
/// process less than `HANDOFF_NOTICE_INTERVAL_NS` ago, writes a
/// `HANDOFF_NOTICE` record naming it that wakes the reader at once: a
/// process that just started or exec'd (a compiler job, a shell command)
/// would otherwise be gone before the reader's next timed poll describes
/// it, and all its samples would take the perf engine's path. At low
/// rates (`HANDOFF_WAKEUP` zero) a process's first notice waits for the
/// reader's next wake-up, and only one named before (at least the interval
/// ago, so a process that outlived the short jobs the setting spares a
/// wake-up for) wakes it. The reader never touches `HANDED_OFF` (each
/// bpf(2) call of its own cost more than the rest of a new process's sync
/// on a VM).
///
/// A process whose entry was written (or rewritten) since its last notice
/// is named again at once, not after the interval: userspace described it
/// since, and it hands over again, so its code changed again (rustup's
/// proxy exec'ing rustc ~40 ms in, then rustc's libraries mapped; a shell
/// exec'ing its command). Before, its tables reached the maps ~100 ms
/// after the exec, and a `rustc -O` handed ~90 samples to the perf engine.
#[inline(always)]
fn hand_off_waking_reader(pid: u32, slot: u32) {
    count(BpfCounter::HandedToPerf);
    notify_undescribed(pid, slot);
}

/// Writes the `HANDOFF_NOTICE` record naming `pid`, a process whose entry
/// does not describe the code a walk met (see `hand_off_waking_reader`),
/// unless it was named less than `HANDOFF_NOTICE_INTERVAL_NS` ago.
#[inline(always)]
fn notify_undescribed(pid: u32, slot: u32) {
    // SAFETY: a helper without arguments.
    let now = unsafe { bpf_ktime_get_ns() };
    // 0 without an entry, else its version plus one.
    let version = match PROCESSES.get_ptr(pid) {
        // SAFETY: a map value, read at once (see `rule_for`).
        Some(mappings) => u64::from(unsafe { (*mappings).version }) + 1,
        None => 0,
    };
    // SAFETY: the value is read at once, not kept.
    let named_before = match unsafe { HANDED_OFF.get(&pid) } {
        Some(&[named, seen])
            if now.wrapping_sub(named) < HANDOFF_NOTICE_INTERVAL_NS && seen == version =>
        {
            return
        }
        Some(_) => true,
        None => false,
    };
    let _ = HANDED_OFF.insert(&pid, &[now, version], 0);
    let Some(record) = SCRATCH.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: this CPU's scratch record (see `start_sample`); the sample it
    // held, if any, is handed off and not emitted.
    let record = unsafe { &mut *record };
    record.header.pid = pid;
    record.header.stack_end = HANDOFF_NOTICE;
    record.header.user_frames = 0;
    record.header.kernel_frames = 0;
    // SAFETY: a global the loader sets, read once.
    let wakeup = if named_before || unsafe { core::ptr::read_volatile(&HANDOFF_WAKEUP) } != 0 {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    };
    // SAFETY: `record.header` is RAW_SAMPLE_HEADER_SIZE bytes of a map
    // value; the map pointer is the ring buffer map itself.
    unsafe {
        bpf_ringbuf_output(
            &SAMPLES as *const RingBuf as *mut c_void,
            &mut record.header as *mut RawSampleHeader as *mut c_void,
            RAW_SAMPLE_HEADER_SIZE as u64,
            wakeup as u64,
        )
    };
}

#[inline(always)]
fn count(counter: BpfCounter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: a per-CPU array slot owned by this CPU.
        unsafe { *slot += 1 }
    }
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

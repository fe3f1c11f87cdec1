//! The `TABLES` array of maps seen from userspace: one array map per loaded
//! file's unwind table, created for exactly its rows when the file is
//! first needed (`BPF_MAP_CREATE`), written through a short-lived mmap,
//! put in a free slot of `TABLES`, and freed (slot cleared, descriptor
//! closed) when no process maps the file any more. The kernel memory they
//! take is counted against a budget (`--bpf-table-mib`).
//!
//! Each change of a slot made from userspace waits in the kernel for an
//! RCU grace period (`synchronize_rcu`, so that no program still uses what
//! it replaced): ~12-16 ms here. The kernel swaps the slot at the start of
//! the call, though, and the program sees the new table from then on. So
//! [`TableMaps::store`] and [`TableMaps::release`] only note the change,
//! and [`TableMaps::flush`] hands each pending change to a thread of its
//! own and returns as soon as every stored table is seen in its slot (a
//! lookup of the slot), not when the grace periods end: the process entry
//! that uses the tables is written ~0.1 ms after they were stored instead
//! of one grace period later, and a release never holds the sampler's
//! loop. A cleared slot is reused only once its thread has returned (its
//! grace period over: no walk that found the old table is still running).
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::time::{Duration, Instant};

use ddprof_common::bpf_maps::{RowChunk, MAX_TABLES, ROWS_PER_CHUNK, TABLE_MAP_FLAGS};
use ddprof_common::unwind::{rows_as_bytes, rows_from_bytes, UnwindRow, ROW_SIZE};

/// The loaded tables' maps and the budget they share.
pub struct TableMaps {
    outer: OwnedFd,
    slots: Vec<Slot>,
    budget_bytes: u64,
    used_bytes: u64,
    /// Where the threads of [`TableMaps::flush`] say that a slot's change
    /// returned (grace period over), and with what result.
    changed_tx: Sender<(u32, io::Result<()>)>,
    changed_rx: Receiver<(u32, io::Result<()>)>,
    /// Changes handed to a thread whose result has not been taken yet.
    in_flight: usize,
    /// Those threads, until seen finished (joined before a fork).
    threads: Vec<std::thread::JoinHandle<()>>,
    /// The BTF the table maps are typed with (see [`super::table_btf`]);
    /// `None` where the kernel refused it (maps are then created untyped).
    btf: Option<OwnedFd>,
}

/// A slot of `TABLES` as userspace left it.
enum Slot {
    Free,
    /// In the kernel's slot.
    Set(TableMap),
    /// Written, not yet in the kernel's slot ([`TableMaps::flush`]).
    Pending(TableMap),
    /// Being put in the kernel's slot by a thread (in the slot once a
    /// lookup finds it there; the thread returns after the grace period).
    Storing(TableMap),
    /// Released, not yet cleared in the kernel's slot: not reused before.
    Clearing,
    /// Being cleared by a thread: not reused before it returns.
    BeingCleared,
}

/// One table's map.
struct TableMap {
    fd: OwnedFd,
    rows: u32,
    /// What the kernel allocated for it (page-rounded values).
    bytes: u64,
}

impl Slot {
    fn map(&self) -> Option<&TableMap> {
        match self {
            Slot::Set(map) | Slot::Pending(map) | Slot::Storing(map) => Some(map),
            Slot::Free | Slot::Clearing | Slot::BeingCleared => None,
        }
    }
}

/// At most this many slot changes run at once (a thread each).
const FLUSH_THREADS: usize = 32;

/// How long a wait for a slot change gives up after: a grace period takes
/// ~12-16 ms here; one that takes this long means a stuck kernel, and the
/// caller goes on (a warning says so).
const CHANGE_WAIT_LIMIT: Duration = Duration::from_secs(10);

/// How often [`TableMaps::flush`] looks whether its stores are in their
/// slots yet.
const VISIBLE_POLL: Duration = Duration::from_micros(50);

/// The stack of a slot-changing thread (it makes one system call).
const CHANGE_THREAD_STACK: usize = 64 << 10;

/// Why a table was not stored.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{needed} bytes of table do not fit the {free} bytes left of the budget")]
    OverBudget { needed: u64, free: u64 },
    #[error("every one of the {MAX_TABLES} table slots is in use")]
    NoSlot,
    #[error("a table of {0} rows is beyond what a map can hold")]
    TooBig(usize),
    #[error("{call} failed: {source}")]
    Kernel {
        call: &'static str,
        #[source]
        source: io::Error,
    },
}

/// The most of a table mapped at once while writing it, so that a large
/// table does not make the whole map resident in the profiler.
const WINDOW_BYTES: usize = 1 << 20;

impl TableMaps {
    /// The table store of the program's `TABLES` map `outer`, spending at
    /// most `budget_bytes` of kernel memory on tables.
    pub fn new(outer: BorrowedFd<'_>, budget_bytes: u64) -> io::Result<Self> {
        let (changed_tx, changed_rx) = mpsc::channel();
        let btf = load_table_btf()
            .inspect_err(|error| {
                log::debug!("BPF engine: table maps created without BTF ({error})")
            })
            .ok();
        Ok(TableMaps {
            outer: outer.try_clone_to_owned()?,
            slots: Vec::new(),
            budget_bytes,
            used_bytes: 0,
            changed_tx,
            changed_rx,
            in_flight: 0,
            threads: Vec::new(),
            btf,
        })
    }

    pub fn budget_bytes(&self) -> u64 {
        self.budget_bytes
    }

    /// Kernel memory of the loaded tables.
    pub fn used_bytes(&self) -> u64 {
        self.used_bytes
    }

    /// Rows of the loaded tables.
    pub fn used_rows(&self) -> u64 {
        self.slots
            .iter()
            .filter_map(Slot::map)
            .map(|map| u64::from(map.rows))
            .sum()
    }

    /// The kernel memory a table of `rows` rows takes.
    pub fn bytes_for(rows: usize) -> u64 {
        let page = super::load::page_size() as u64;
        let chunks = (rows as u64).div_ceil(u64::from(ROWS_PER_CHUNK)).max(1);
        // The values, page-rounded for the mmap, and the map's own page.
        (chunks * std::mem::size_of::<RowChunk>() as u64).div_ceil(page) * page + page
    }

    /// Stores `rows` in a map of their own and returns its slot; the
    /// program finds it there once [`TableMaps::flush`] has run.
    pub fn store(&mut self, rows: &[UnwindRow], name: &str) -> Result<u32, StoreError> {
        let needed = Self::bytes_for(rows.len());
        self.take_finished_changes();
        let free = self.budget_bytes.saturating_sub(self.used_bytes);
        if needed > free {
            return Err(StoreError::OverBudget { needed, free });
        }
        let chunks = u32::try_from(rows.len().div_ceil(ROWS_PER_CHUNK as usize).max(1))
            .ok()
            .filter(|&chunks| {
                u64::from(chunks) * (std::mem::size_of::<RowChunk>() as u64) < u64::from(u32::MAX)
            })
            .ok_or(StoreError::TooBig(rows.len()))?;
        let slot = match self
            .slots
            .iter()
            .position(|slot| matches!(slot, Slot::Free))
        {
            Some(slot) => slot,
            None if self.slots.len() < MAX_TABLES as usize => {
                self.slots.push(Slot::Free);
                self.slots.len() - 1
            }
            None => return Err(StoreError::NoSlot),
        };
        let btf = self.btf.as_ref().map(AsFd::as_fd);
        let fd = create_table_map(chunks, name, btf).map_err(|source| StoreError::Kernel {
            call: "bpf(BPF_MAP_CREATE)",
            source,
        })?;
        let bytes = rows_as_bytes(rows);
        let capacity = chunks as usize * std::mem::size_of::<RowChunk>();
        let mut written = 0;
        while written < bytes.len() {
            let part = &bytes[written..(written + WINDOW_BYTES).min(bytes.len())];
            with_window(fd.as_fd(), capacity, written, part.len(), |window| {
                window.copy_from_slice(part)
            })
            .map_err(|source| StoreError::Kernel {
                call: "mmap of a table map",
                source,
            })?;
            written += part.len();
        }
        self.used_bytes += needed;
        self.slots[slot] = Slot::Pending(TableMap {
            fd,
            rows: rows.len() as u32,
            bytes: needed,
        });
        Ok(slot as u32)
    }

    /// Frees the table in `slot` (the slot is cleared in the kernel by the
    /// next [`TableMaps::flush`]; a walk that already looked the table up
    /// keeps it until it ends: the kernel frees an inner map after an RCU
    /// grace period).
    pub fn release(&mut self, slot: u32) {
        if matches!(self.slots.get(slot as usize), Some(Slot::Storing(_))) {
            // Its thread's result decides whether there is anything to clear.
            self.wait_for_change(|slots| !matches!(slots[slot as usize], Slot::Storing(_)));
        }
        let Some(entry) = self.slots.get_mut(slot as usize) else {
            return;
        };
        let released = std::mem::replace(entry, Slot::Clearing);
        match released {
            Slot::Set(map) | Slot::Storing(map) => self.used_bytes -= map.bytes,
            // Never in the kernel: nothing to clear.
            Slot::Pending(map) => {
                self.used_bytes -= map.bytes;
                *entry = Slot::Free;
            }
            other => *entry = other,
        }
    }

    /// Makes the kernel's slots what [`TableMaps::store`] and
    /// [`TableMaps::release`] said: each change goes to a thread of its own
    /// (their grace periods overlap, and none is waited for here), and this
    /// returns once every stored table is in its slot, where the program
    /// finds it. A slot that cannot be set is freed: its table's samples
    /// are then handed to the perf engine.
    pub fn flush(&mut self) {
        self.take_finished_changes();
        let mut stored = Vec::new();
        for slot in 0..self.slots.len() {
            let inner = match &self.slots[slot] {
                Slot::Pending(map) => Some(map.fd.as_fd().try_clone_to_owned()),
                Slot::Clearing => None,
                _ => continue,
            };
            while self.in_flight >= FLUSH_THREADS {
                if !self.wait_for_change(|_| true) {
                    break;
                }
            }
            let state = std::mem::replace(&mut self.slots[slot], Slot::Free);
            self.slots[slot] = match state {
                Slot::Pending(map) => {
                    stored.push(slot as u32);
                    Slot::Storing(map)
                }
                _ => Slot::BeingCleared,
            };
            self.start_change(slot as u32, inner);
        }
        // The stores are in the kernel once a lookup finds them (or their
        // thread has answered, an error included).
        let started = Instant::now();
        loop {
            self.take_finished_changes();
            let outer = self.outer.as_fd();
            let slots = &self.slots;
            stored.retain(|&slot| {
                matches!(slots[slot as usize], Slot::Storing(_)) && !slot_is_set(outer, slot)
            });
            if stored.is_empty() {
                return;
            }
            if started.elapsed() > CHANGE_WAIT_LIMIT {
                log::warn!(
                    "BPF engine: {} unwind table(s) not in their slots after {} s; their \
                     samples are handed to the perf engine until they are",
                    stored.len(),
                    CHANGE_WAIT_LIMIT.as_secs()
                );
                return;
            }
            std::thread::sleep(VISIBLE_POLL);
        }
    }

    /// Hands the change of `slot` (to the map `inner`, or cleared with
    /// `None`) to a thread; made here, waiting, if no thread can be had.
    fn start_change(&mut self, slot: u32, inner: Option<io::Result<OwnedFd>>) {
        let changed = self.changed_tx.clone();
        let spawned = self
            .outer
            .as_fd()
            .try_clone_to_owned()
            .and_then(|outer| Ok((outer, inner.transpose()?)))
            .and_then(|(outer, inner)| {
                std::thread::Builder::new()
                    .name("ddprof-slot".into())
                    .stack_size(CHANGE_THREAD_STACK)
                    .spawn(move || {
                        let inner = inner.as_ref().map(AsRawFd::as_raw_fd);
                        let _ = changed.send((slot, update_slot(outer.as_fd(), slot, inner)));
                    })
            });
        match spawned {
            Ok(thread) => {
                self.in_flight += 1;
                self.threads.push(thread);
            }
            Err(error) => {
                log::debug!("BPF engine: slot {slot} changed without a thread: {error}");
                let inner = match &self.slots[slot as usize] {
                    Slot::Storing(map) => Some(map.fd.as_raw_fd()),
                    _ => None,
                };
                let result = update_slot(self.outer.as_fd(), slot, inner);
                self.in_flight += 1;
                self.finish_change(slot, result);
            }
        }
    }

    /// Takes the results of the changes whose threads have returned.
    fn take_finished_changes(&mut self) {
        while let Ok((slot, result)) = self.changed_rx.try_recv() {
            self.finish_change(slot, result);
        }
        self.threads.retain(|thread| !thread.is_finished());
    }

    /// Waits for changes to return until `done` holds of the slots; false
    /// if it gave up (a warning says so).
    fn wait_for_change(&mut self, done: impl Fn(&[Slot]) -> bool) -> bool {
        let deadline = Instant::now() + CHANGE_WAIT_LIMIT;
        loop {
            self.take_finished_changes();
            if self.in_flight == 0 {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.changed_rx.recv_timeout(left) {
                Ok((slot, result)) => {
                    self.finish_change(slot, result);
                    if done(&self.slots) {
                        return true;
                    }
                }
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {
                    log::warn!(
                        "BPF engine: {} change(s) of unwind table slots still waiting in the \
                         kernel after {} s",
                        self.in_flight,
                        CHANGE_WAIT_LIMIT.as_secs()
                    );
                    return false;
                }
            }
        }
    }

    /// What a returned change of `slot` leaves in it (one of the
    /// `in_flight` changes).
    fn finish_change(&mut self, slot: u32, result: io::Result<()>) {
        self.in_flight -= 1;
        let entry = &mut self.slots[slot as usize];
        let state = std::mem::replace(entry, Slot::Free);
        *entry = match (state, result) {
            (Slot::Storing(map), Ok(())) => Slot::Set(map),
            (Slot::Storing(map), Err(error)) => {
                log::warn!("BPF engine: cannot put an unwind table in slot {slot}: {error}");
                self.used_bytes -= map.bytes;
                Slot::Free
            }
            (Slot::BeingCleared, Ok(())) => Slot::Free,
            (Slot::BeingCleared, Err(error)) => {
                log::debug!("BPF engine: cannot clear table slot {slot}: {error}");
                Slot::Free
            }
            // Not a slot a thread was changing: left as it was.
            (other, _) => other,
        };
    }

    /// Empties every slot of `TABLES`, the ones this copy does not know
    /// too: a worker that replaces another starts from the parent's copy,
    /// while the earlier workers filled and freed slots since (the maps
    /// they left in slots would stay alive, uncounted).
    pub fn clear_all(&mut self) {
        let outer = self.outer.as_fd();
        self.slots = (0..MAX_TABLES)
            .map(|slot| {
                if slot_is_set(outer, slot) {
                    Slot::Clearing
                } else {
                    Slot::Free
                }
            })
            .collect();
        self.used_bytes = 0;
        self.flush();
        // Every clear returned before a slot is counted free again.
        self.settle();
        self.slots.clear();
    }

    /// Waits until every change handed to a thread has returned (bounded):
    /// before a fork, whose child would otherwise wait for threads it does
    /// not have, and before slots are counted free again.
    pub fn settle(&mut self) {
        if self.wait_for_change(|_| false) {
            // Each has sent its result: what is left of it is its exit.
            for thread in self.threads.drain(..) {
                let _ = thread.join();
            }
        }
    }

    /// Closes this copy's table maps without touching the kernel's slots
    /// (the parent's copy, after a fork: the worker owns the slots, and a
    /// later worker empties them with [`TableMaps::clear_all`]).
    pub fn close_descriptors(&mut self) {
        self.slots.clear();
        self.used_bytes = 0;
    }

    /// A copy of the rows of the table in `slot` (for tests and checks).
    pub fn rows(&self, slot: u32) -> Option<Vec<UnwindRow>> {
        let map = self.slots.get(slot as usize)?.map()?;
        let capacity = (map.rows as usize).div_ceil(ROWS_PER_CHUNK as usize).max(1)
            * std::mem::size_of::<RowChunk>();
        // The window starts on a page: aligned for rows.
        with_window(
            map.fd.as_fd(),
            capacity,
            0,
            map.rows as usize * ROW_SIZE,
            |window| rows_from_bytes(window).map(<[UnwindRow]>::to_vec),
        )
        .ok()?
    }
}

const BPF_MAP_CREATE: libc::c_long = 0;
const BPF_MAP_LOOKUP_ELEM: libc::c_long = 1;
const BPF_MAP_UPDATE_ELEM: libc::c_long = 2;
const BPF_MAP_DELETE_ELEM: libc::c_long = 3;
const BPF_BTF_LOAD: libc::c_long = 18;
const BPF_MAP_TYPE_ARRAY: u32 = 2;
#[cfg(test)]
const BPF_MAP_TYPE_ARRAY_OF_MAPS: u32 = 12;

/// The leading fields of `union bpf_attr` for `BPF_MAP_CREATE` (the kernel
/// takes the fields after them as zero).
#[repr(C)]
#[derive(Default)]
struct MapCreateAttr {
    map_type: u32,
    key_size: u32,
    value_size: u32,
    max_entries: u32,
    map_flags: u32,
    inner_map_fd: u32,
    numa_node: u32,
    map_name: [u8; 16],
    map_ifindex: u32,
    btf_fd: u32,
    btf_key_type_id: u32,
    btf_value_type_id: u32,
}

/// `union bpf_attr` for `BPF_BTF_LOAD`. Every one of its 32 bytes is a
/// field, so that all are written: the 4 bytes after `btf_log_level` would
/// otherwise be padding, which Rust leaves as whatever the stack held, and a
/// kernel before 6.4 (which has no `btf_log_true_size` there) refuses a
/// load whose bytes past its last field are not zero (EINVAL). The table
/// maps were then made without BTF, and a kernel before 6.2 refused every
/// one of them (the arm64 guest's 6.1: "cannot put an unwind table in slot
/// N: Invalid argument", in 2-3 of 5 runs).
#[repr(C)]
#[derive(Default)]
struct BtfLoadAttr {
    btf: u64,
    btf_log_buf: u64,
    btf_size: u32,
    btf_log_size: u32,
    btf_log_level: u32,
    /// Linux 6.4's `btf_log_true_size` (written by the kernel), zero here.
    btf_log_true_size: u32,
}

// No tail padding: the last field ends where the struct does (see above).
const _: () = assert!(
    std::mem::offset_of!(BtfLoadAttr, btf_log_true_size) + 4 == std::mem::size_of::<BtfLoadAttr>()
);

/// `union bpf_attr` for the element commands.
#[repr(C)]
#[derive(Default)]
struct MapElemAttr {
    map_fd: u32,
    _pad: u32,
    key: u64,
    value: u64,
    flags: u64,
}

/// The attribute structs this module hands to bpf(2): plain `#[repr(C)]`
/// heads of `union bpf_attr` whose pointer fields, if any, point at
/// memory that outlives the call.
trait BpfAttr {}
impl BpfAttr for MapCreateAttr {}
impl BpfAttr for MapElemAttr {}
impl BpfAttr for BtfLoadAttr {}

/// Loads [`super::table_btf::blob`] into the kernel.
fn load_table_btf() -> io::Result<OwnedFd> {
    let blob = super::table_btf::blob(std::mem::size_of::<RowChunk>() as u32)
        .ok_or_else(|| io::Error::other("a row chunk is not a whole number of ints"))?;
    let mut attr = BtfLoadAttr {
        btf: blob.as_ptr() as u64,
        btf_size: blob.len() as u32,
        ..BtfLoadAttr::default()
    };
    let fd = bpf_command(BPF_BTF_LOAD, &mut attr)?;
    // SAFETY: BPF_BTF_LOAD returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// bpf(2) with `attr`: the call's non-negative result, or its error.
fn bpf_command<A: BpfAttr>(command: libc::c_long, attr: &mut A) -> io::Result<i64> {
    // SAFETY: bpf(2) reads (and for lookups writes through) at most
    // `size_of::<A>()` bytes of a live, initialised `#[repr(C)]` head of
    // `union bpf_attr`; the buffers its pointer fields name are borrowed by
    // the caller for the whole call (the `BpfAttr` contract).
    let result = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            command,
            attr as *mut A,
            std::mem::size_of::<A>(),
        )
    };
    if result < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(result)
}

/// A new array map of `chunks` `RowChunk`s with the flags of `TABLES`'
/// template, typed by `btf` (see [`super::table_btf`]), named after the
/// file (up to 15 bytes, for `bpftool`).
fn create_table_map(chunks: u32, name: &str, btf: Option<BorrowedFd<'_>>) -> io::Result<OwnedFd> {
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: std::mem::size_of::<RowChunk>() as u32,
        max_entries: chunks,
        map_flags: TABLE_MAP_FLAGS,
        ..MapCreateAttr::default()
    };
    if let Some(btf) = btf {
        attr.btf_fd = btf.as_raw_fd() as u32;
        attr.btf_key_type_id = super::table_btf::KEY_TYPE_ID;
        attr.btf_value_type_id = super::table_btf::VALUE_TYPE_ID;
    }
    // Map names allow [A-Za-z0-9_.] only.
    for (to, from) in attr.map_name[..15].iter_mut().zip(
        name.bytes()
            .filter(|byte| byte.is_ascii_alphanumeric() || *byte == b'_' || *byte == b'.'),
    ) {
        *to = from;
    }
    let fd = bpf_command(BPF_MAP_CREATE, &mut attr)?;
    // SAFETY: BPF_MAP_CREATE returned a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Whether `outer`'s slot `slot` holds a map (a lookup answers its ID,
/// or `ENOENT`).
fn slot_is_set(outer: BorrowedFd<'_>, slot: u32) -> bool {
    let key = slot;
    let mut id: u32 = 0;
    let mut attr = MapElemAttr {
        map_fd: outer.as_raw_fd() as u32,
        key: &key as *const u32 as u64,
        value: &mut id as *mut u32 as u64,
        ..MapElemAttr::default()
    };
    bpf_command(BPF_MAP_LOOKUP_ELEM, &mut attr).is_ok()
}

/// Puts the map `inner` (a descriptor) in `outer`'s slot `slot`, or
/// clears the slot.
fn update_slot(outer: BorrowedFd<'_>, slot: u32, inner: Option<i32>) -> io::Result<()> {
    let key = slot;
    let value: u32 = inner.map_or(0, |fd| fd as u32);
    let mut attr = MapElemAttr {
        map_fd: outer.as_raw_fd() as u32,
        key: &key as *const u32 as u64,
        ..MapElemAttr::default()
    };
    // A delete takes the key alone: the kernel refuses one whose later
    // fields are not zero (EINVAL; before, every clear failed so, and a
    // released table stayed in its slot until a store replaced it).
    let command = if inner.is_some() {
        attr.value = &value as *const u32 as u64;
        BPF_MAP_UPDATE_ELEM
    } else {
        BPF_MAP_DELETE_ELEM
    };
    bpf_command(command, &mut attr).map(drop)
}

/// Maps the pages of the map `fd` (of `capacity` value bytes) that hold
/// `len` bytes at byte `offset`, lends those bytes to `access`, and unmaps
/// them: mapped only while used, so the map's memory is not resident in
/// the profiler's address space between writes.
fn with_window<R>(
    fd: BorrowedFd<'_>,
    capacity: usize,
    offset: usize,
    len: usize,
    access: impl FnOnce(&mut [u8]) -> R,
) -> io::Result<R> {
    if offset.checked_add(len).is_none_or(|end| end > capacity) {
        return Err(io::Error::other("window beyond the table map"));
    }
    let page = super::load::page_size();
    let map_start = offset / page * page;
    let map_len = (offset + len).div_ceil(page) * page - map_start;
    // SAFETY: a shared mapping of a BPF array map created mmapable, at a
    // page-aligned offset; the kernel refuses a window beyond its
    // (page-rounded) value area.
    let address = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            map_start as libc::off_t,
        )
    };
    if address == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `offset - map_start + len <= map_len`, all mapped just above;
    // this is the only reference into the mapping, and it does not outlive
    // the call.
    let window = unsafe {
        std::slice::from_raw_parts_mut(address.cast::<u8>().add(offset - map_start), len)
    };
    let result = access(window);
    // SAFETY: unmaps exactly the mapping made above.
    unsafe { libc::munmap(address, map_len) };
    Ok(result)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_costs_its_pages_and_one_more() {
        let page = super::super::load::page_size() as u64;
        assert_eq!(TableMaps::bytes_for(0), 2 * page);
        assert_eq!(TableMaps::bytes_for(16), 2 * page);
        // 1 M rows: 65,536 chunks of 192 bytes = 12 MiB.
        assert_eq!(TableMaps::bytes_for(1 << 20), (12 << 20) + page);
    }

    /// An array of maps like `TABLES`, of `slots` slots, whose inner maps
    /// are table maps (root only: creating BPF maps needs `CAP_BPF`).
    fn outer_map(slots: u32) -> OwnedFd {
        let template = create_table_map(1, "template", None).expect("root may create BPF maps");
        let mut attr = MapCreateAttr {
            map_type: BPF_MAP_TYPE_ARRAY_OF_MAPS,
            key_size: 4,
            value_size: 4,
            max_entries: slots,
            inner_map_fd: template.as_raw_fd() as u32,
            ..MapCreateAttr::default()
        };
        let fd = bpf_command(BPF_MAP_CREATE, &mut attr).expect("an array of maps");
        // SAFETY: BPF_MAP_CREATE returned a new descriptor that nothing else owns.
        unsafe { OwnedFd::from_raw_fd(fd as i32) }
    }

    fn rows(count: u32) -> Vec<UnwindRow> {
        (0..count)
            .map(|i| UnwindRow {
                start: i * 16,
                cfa_offset: 8,
                ..UnwindRow::default()
            })
            .collect()
    }

    /// `flush` returns once the kernel's slots hold the stored tables (the
    /// program may use them from then on) and does not wait for the grace
    /// periods; a released slot is cleared by a thread, not handed out
    /// again before that thread has returned, and `settle` waits for every
    /// thread. As root, as the suite runs (creating BPF maps needs
    /// `CAP_BPF`).
    #[test]
    fn a_flush_puts_tables_in_their_slots_and_a_cleared_slot_waits_for_its_thread() {
        let outer = outer_map(8);
        let mut maps = TableMaps::new(outer.as_fd(), 1 << 30).unwrap();
        let first = maps.store(&rows(100), "first").unwrap();
        let second = maps.store(&rows(20), "second").unwrap();
        assert!(
            !slot_is_set(outer.as_fd(), first),
            "stored, not flushed yet"
        );
        maps.flush();
        for slot in [first, second] {
            assert!(
                slot_is_set(outer.as_fd(), slot),
                "slot {slot} after the flush"
            );
        }
        assert_eq!(maps.rows(first), Some(rows(100)));

        maps.release(first);
        maps.flush();
        let third = maps.store(&rows(10), "third").unwrap();
        if matches!(maps.slots[first as usize], Slot::BeingCleared) {
            assert_ne!(third, first, "a slot still being cleared was handed out");
        }
        maps.flush();
        assert!(slot_is_set(outer.as_fd(), third));

        maps.settle();
        assert_eq!(maps.in_flight, 0);
        assert!(maps.threads.is_empty());
        if third != first {
            assert!(
                !slot_is_set(outer.as_fd(), first),
                "the released slot is cleared"
            );
            assert!(matches!(maps.slots[first as usize], Slot::Free));
        }
        assert!(matches!(maps.slots[second as usize], Slot::Set(_)));
        assert_eq!(maps.used_rows(), 30);

        maps.clear_all();
        for slot in 0..8 {
            assert!(
                !slot_is_set(outer.as_fd(), slot),
                "slot {slot} after clear_all"
            );
        }
        assert_eq!(maps.in_flight, 0);
    }
}

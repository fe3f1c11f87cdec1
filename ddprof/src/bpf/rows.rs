//! The `TABLES` array of maps seen from userspace: one array map per loaded
//! file's unwind table, created for exactly its rows when the file is
//! first needed (`BPF_MAP_CREATE`), written through a short-lived mmap,
//! put in a free slot of `TABLES`, and freed (slot cleared, descriptor
//! closed) when no process maps the file any more. The kernel memory they
//! take is counted against a budget (`--bpf-table-mib`).
//!
//! Each change of a slot waits in the kernel for an RCU grace period
//! (`synchronize_rcu`, so that no program still uses what it replaced):
//! ~16 ms here. Set one at a time, the 20 libraries of a new clang process
//! took 320 ms to reach the kernel, and their samples went to the perf
//! engine meanwhile. So [`TableMaps::store`] and [`TableMaps::release`]
//! only note the change, and [`TableMaps::flush`] makes all that are
//! pending at once, one thread each: their grace periods overlap.
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

use ddprof_common::bpf_maps::{RowChunk, MAX_TABLES, ROWS_PER_CHUNK, TABLE_MAP_FLAGS};
use ddprof_common::unwind::{rows_as_bytes, rows_from_bytes, UnwindRow, ROW_SIZE};

/// The loaded tables' maps and the budget they share.
pub struct TableMaps {
    outer: OwnedFd,
    slots: Vec<Slot>,
    budget_bytes: u64,
    used_bytes: u64,
}

/// A slot of `TABLES` as userspace left it.
enum Slot {
    Free,
    /// In the kernel's slot.
    Set(TableMap),
    /// Written, not yet in the kernel's slot ([`TableMaps::flush`]).
    Pending(TableMap),
    /// Released, not yet cleared in the kernel's slot: not reused before.
    Clearing,
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
            Slot::Set(map) | Slot::Pending(map) => Some(map),
            Slot::Free | Slot::Clearing => None,
        }
    }
}

/// At most this many slot changes run at once (a thread each).
const FLUSH_THREADS: usize = 32;

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
        Ok(TableMaps {
            outer: outer.try_clone_to_owned()?,
            slots: Vec::new(),
            budget_bytes,
            used_bytes: 0,
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
        let fd = create_table_map(chunks, name).map_err(|source| StoreError::Kernel {
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
        let Some(entry) = self.slots.get_mut(slot as usize) else {
            return;
        };
        let released = std::mem::replace(entry, Slot::Clearing);
        match released {
            Slot::Set(map) => self.used_bytes -= map.bytes,
            // Never in the kernel: nothing to clear.
            Slot::Pending(map) => {
                self.used_bytes -= map.bytes;
                *entry = Slot::Free;
            }
            other => *entry = other,
        }
    }

    /// Makes the kernel's slots what [`TableMaps::store`] and
    /// [`TableMaps::release`] said, all at once (a thread per change, so
    /// that their grace periods overlap). A slot that cannot be set is
    /// freed: its table's samples are then handed to the perf engine.
    pub fn flush(&mut self) {
        let changes: Vec<(u32, Option<i32>)> = self
            .slots
            .iter()
            .enumerate()
            .filter_map(|(slot, state)| match state {
                Slot::Pending(map) => Some((slot as u32, Some(map.fd.as_raw_fd()))),
                Slot::Clearing => Some((slot as u32, None)),
                Slot::Free | Slot::Set(_) => None,
            })
            .collect();
        if changes.is_empty() {
            return;
        }
        let outer = self.outer.as_fd();
        let results: Vec<io::Result<()>> = if changes.len() == 1 {
            vec![update_slot(outer, changes[0].0, changes[0].1)]
        } else {
            changes
                .chunks(FLUSH_THREADS)
                .flat_map(|batch| {
                    std::thread::scope(|scope| {
                        let running: Vec<_> = batch
                            .iter()
                            .map(|&(slot, fd)| scope.spawn(move || update_slot(outer, slot, fd)))
                            .collect();
                        running
                            .into_iter()
                            .map(|thread| {
                                thread
                                    .join()
                                    .unwrap_or_else(|_| Err(io::Error::other("thread panicked")))
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect()
        };
        for ((slot, _), result) in changes.into_iter().zip(results) {
            let entry = &mut self.slots[slot as usize];
            let state = std::mem::replace(entry, Slot::Free);
            *entry = match (state, result) {
                (Slot::Pending(map), Ok(())) => Slot::Set(map),
                (Slot::Pending(map), Err(error)) => {
                    log::warn!("BPF engine: cannot put an unwind table in slot {slot}: {error}");
                    self.used_bytes -= map.bytes;
                    Slot::Free
                }
                (_, Ok(())) => Slot::Free,
                (_, Err(error)) => {
                    log::debug!("BPF engine: cannot clear table slot {slot}: {error}");
                    Slot::Free
                }
            };
        }
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
        self.slots.clear();
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
const BPF_MAP_TYPE_ARRAY: u32 = 2;

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
}

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
/// template, named after the file (up to 15 bytes, for `bpftool`).
fn create_table_map(chunks: u32, name: &str) -> io::Result<OwnedFd> {
    let mut attr = MapCreateAttr {
        map_type: BPF_MAP_TYPE_ARRAY,
        key_size: 4,
        value_size: std::mem::size_of::<RowChunk>() as u32,
        max_entries: chunks,
        map_flags: TABLE_MAP_FLAGS,
        ..MapCreateAttr::default()
    };
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
        value: &value as *const u32 as u64,
        ..MapElemAttr::default()
    };
    let command = if inner.is_some() {
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
}

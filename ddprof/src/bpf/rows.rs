//! The `ROWS` BPF array seen from userspace: written through short-lived
//! mmaps of the map (created with `BPF_F_MMAPABLE`), and a first-fit
//! allocator of row ranges in it, one range per loaded file.
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use ddprof_common::bpf_maps::ROWS_PER_CHUNK;
use ddprof_common::unwind::{UnwindRow, ROW_SIZE};

/// The rows of the `ROWS` map.
pub struct RowStore {
    map: OwnedFd,
    /// Rows the map holds (a multiple of `ROWS_PER_CHUNK`).
    capacity: u32,
    free: RangeAllocator,
}

/// The most of the map mapped at once while writing, so that a large table
/// does not make the whole of it resident in the profiler.
const WINDOW_BYTES: usize = 1 << 20;

/// First-fit allocation of row ranges; freed ranges merge with their
/// neighbours.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RangeAllocator {
    /// Free ranges `(first, len)`, sorted by first, coalesced.
    free: Vec<(u32, u32)>,
}

impl RangeAllocator {
    pub fn new(capacity: u32) -> Self {
        RangeAllocator {
            free: if capacity > 0 {
                vec![(0, capacity)]
            } else {
                Vec::new()
            },
        }
    }

    pub fn free_len(&self) -> u32 {
        self.free.iter().map(|&(_, len)| len).sum()
    }

    /// The first of `len` consecutive free rows, now taken.
    pub fn allocate(&mut self, len: u32) -> Option<u32> {
        if len == 0 {
            return None;
        }
        let slot = self.free.iter().position(|&(_, free)| free >= len)?;
        let (first, free) = self.free[slot];
        if free == len {
            self.free.remove(slot);
        } else {
            self.free[slot] = (first + len, free - len);
        }
        Some(first)
    }

    /// Returns a range taken by `allocate`.
    pub fn release(&mut self, first: u32, len: u32) {
        if len == 0 {
            return;
        }
        let at = self.free.partition_point(|&(start, _)| start < first);
        self.free.insert(at, (first, len));
        if at + 1 < self.free.len() && self.free[at].0 + self.free[at].1 == self.free[at + 1].0 {
            self.free[at].1 += self.free[at + 1].1;
            self.free.remove(at + 1);
        }
        if at > 0 && self.free[at - 1].0 + self.free[at - 1].1 == self.free[at].0 {
            self.free[at - 1].1 += self.free[at].1;
            self.free.remove(at);
        }
    }
}

impl RowStore {
    /// The row store of the `ROWS` map `map_fd`, of `chunks` elements.
    /// Checks once that the map can be mapped (it is created mmapable).
    pub fn map(map_fd: BorrowedFd<'_>, chunks: u32) -> io::Result<Self> {
        let store = RowStore {
            map: map_fd.try_clone_to_owned()?,
            capacity: chunks * ROWS_PER_CHUNK,
            free: RangeAllocator::new(chunks * ROWS_PER_CHUNK),
        };
        store.with_window(0, ROW_SIZE.min(store.capacity_bytes()), |_| ())?;
        Ok(store)
    }

    pub fn capacity_rows(&self) -> u32 {
        self.capacity
    }

    pub fn capacity_bytes(&self) -> usize {
        self.capacity as usize * ROW_SIZE
    }

    /// Rows not allocated to any table.
    pub fn free_rows(&self) -> u32 {
        self.free.free_len()
    }

    /// Copies `rows` into a free range and returns its first row, or `None`
    /// when no free range is large enough (or the map cannot be mapped).
    pub fn store(&mut self, rows: &[UnwindRow]) -> Option<u32> {
        let len = u32::try_from(rows.len()).ok()?;
        let first = self.free.allocate(len)?;
        // SAFETY: `UnwindRow` is `repr(C)` plain data without padding (its
        // size is ROW_SIZE, the sum of its fields), so its bytes are
        // initialised.
        let bytes = unsafe {
            std::slice::from_raw_parts(rows.as_ptr().cast::<u8>(), rows.len() * ROW_SIZE)
        };
        let mut written = 0;
        while written < bytes.len() {
            let part = &bytes[written..(written + WINDOW_BYTES).min(bytes.len())];
            let at = first as usize * ROW_SIZE + written;
            if let Err(error) =
                self.with_window(at, part.len(), |window| window.copy_from_slice(part))
            {
                log::warn!("BPF engine: cannot map the unwind-row map to write it: {error}");
                self.free.release(first, len);
                return None;
            }
            written += part.len();
        }
        Some(first)
    }

    /// Returns a range to the free list.
    pub fn release(&mut self, first: u32, len: u32) {
        self.free.release(first, len);
    }

    /// A copy of the rows stored at `first..first + len` (for tests and
    /// checks).
    pub fn rows(&self, first: u32, len: u32) -> Option<Vec<UnwindRow>> {
        let end = first.checked_add(len)?;
        if end > self.capacity {
            return None;
        }
        let mut rows = vec![UnwindRow::default(); len as usize];
        // SAFETY: as in `store`: plain data, every byte pattern the map
        // holds was written from an `UnwindRow`, or is zero.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(rows.as_mut_ptr().cast::<u8>(), rows.len() * ROW_SIZE)
        };
        self.with_window(first as usize * ROW_SIZE, bytes.len(), |window| {
            bytes.copy_from_slice(window)
        })
        .ok()?;
        Some(rows)
    }

    /// Maps the pages of the map's values that hold `len` bytes at byte
    /// `offset`, lends those bytes to `access`, and unmaps them.
    ///
    /// Mapped only while written, so the map's memory (kernel memory, sized
    /// with headroom for what the target loads later) is not resident in
    /// the profiler's address space between writes.
    fn with_window<R>(
        &self,
        offset: usize,
        len: usize,
        access: impl FnOnce(&mut [u8]) -> R,
    ) -> io::Result<R> {
        if offset
            .checked_add(len)
            .is_none_or(|end| end > self.capacity_bytes())
        {
            return Err(io::Error::other("row window beyond the map"));
        }
        let page = super::load::page_size();
        let map_start = offset / page * page;
        let map_len = (offset + len).div_ceil(page) * page - map_start;
        // SAFETY: a shared mapping of a BPF array map created mmapable, at
        // a page-aligned offset; the kernel refuses a window beyond its
        // (page-rounded) value area.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                self.map.as_raw_fd(),
                map_start as libc::off_t,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `offset - map_start + len <= map_len`, all mapped just
        // above; this is the only reference into the mapping, and it does
        // not outlive the call.
        let window = unsafe {
            std::slice::from_raw_parts_mut(address.cast::<u8>().add(offset - map_start), len)
        };
        let result = access(window);
        // SAFETY: unmaps exactly the mapping made above.
        unsafe { libc::munmap(address, map_len) };
        Ok(result)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocates_first_fit_and_coalesces_on_release() {
        let mut ranges = RangeAllocator::new(100);
        assert_eq!(ranges.allocate(0), None);
        assert_eq!(ranges.allocate(30), Some(0));
        assert_eq!(ranges.allocate(30), Some(30));
        assert_eq!(ranges.allocate(30), Some(60));
        assert_eq!(ranges.allocate(30), None);
        assert_eq!(ranges.free_len(), 10);
        ranges.release(0, 30);
        ranges.release(60, 30);
        // Two holes (0..30, 60..100) cannot hold 50 rows...
        assert_eq!(ranges.allocate(50), None);
        // ...until the middle one is freed and everything merges.
        ranges.release(30, 30);
        assert_eq!(ranges, RangeAllocator::new(100));
        assert_eq!(ranges.allocate(100), Some(0));
        assert_eq!(RangeAllocator::new(0).allocate(1), None);
    }
}

//! The `ROWS` BPF array seen from userspace: an mmap of the map (created
//! with `BPF_F_MMAPABLE`) written directly, and a first-fit allocator of row
//! ranges in it, one range per loaded file.
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;

use ddprof_common::bpf_maps::{RowChunk, ROWS_PER_CHUNK};
use ddprof_common::unwind::{UnwindRow, ROW_SIZE};

/// The mapped rows of the `ROWS` map.
pub struct RowStore {
    base: NonNull<UnwindRow>,
    /// Rows the map holds (a multiple of `ROWS_PER_CHUNK`).
    capacity: u32,
    mapped_bytes: usize,
    free: RangeAllocator,
}

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

// SAFETY: the mapping is owned by this value and only written through `&mut self`.
unsafe impl Send for RowStore {}

impl RowStore {
    /// Maps the whole array of `chunks` elements.
    pub fn map(map_fd: BorrowedFd<'_>, chunks: u32) -> io::Result<Self> {
        let bytes = chunks as usize * std::mem::size_of::<RowChunk>();
        // SAFETY: page_size has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
        let mapped_bytes = bytes.div_ceil(page).max(1) * page;
        // SAFETY: a shared mapping of a BPF array map created mmapable;
        // the kernel bounds it to the map's (page-rounded) value area.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                map_fd.as_raw_fd(),
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let capacity = chunks * ROWS_PER_CHUNK;
        Ok(RowStore {
            base: NonNull::new(address.cast()).ok_or_else(|| io::Error::other("mmap gave null"))?,
            capacity,
            mapped_bytes,
            free: RangeAllocator::new(capacity),
        })
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
    /// when no free range is large enough.
    pub fn store(&mut self, rows: &[UnwindRow]) -> Option<u32> {
        let len = u32::try_from(rows.len()).ok()?;
        let first = self.free.allocate(len)?;
        // SAFETY: `first..first + len` lies within the mapped capacity (the
        // allocator only hands out ranges below it) and no other Rust
        // reference points into the mapping.
        let target = unsafe {
            std::slice::from_raw_parts_mut(self.base.as_ptr().add(first as usize), len as usize)
        };
        target.copy_from_slice(rows);
        Some(first)
    }

    /// Returns a range to the free list.
    pub fn release(&mut self, first: u32, len: u32) {
        self.free.release(first, len);
    }

    /// The rows of a stored range (for tests and checks).
    pub fn rows(&self, first: u32, len: u32) -> Option<&[UnwindRow]> {
        let end = first.checked_add(len)?;
        if end > self.capacity {
            return None;
        }
        // SAFETY: within the mapped capacity; writes need `&mut self`.
        Some(unsafe {
            std::slice::from_raw_parts(self.base.as_ptr().add(first as usize), len as usize)
        })
    }
}

impl Drop for RowStore {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping made in `map`.
        unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped_bytes) };
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

//! The mmap'd ring buffer of one perf event: a control page followed by
//! 2^n data pages that the kernel fills and this reader drains.
//!
//! Protocol (see `perf_event_mmap_page` in `linux/perf_event.h`): the kernel
//! publishes `data_head` after writing records, the reader loads it with
//! acquire ordering, reads the records in `[data_tail, data_head)`, then
//! stores the new `data_tail` with release ordering so that the kernel only
//! reuses that space once the reader is done with it.
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};

use perf_event_open_sys::bindings::perf_event_mmap_page;

use super::record::HEADER_SIZE;

pub fn page_size() -> usize {
    // SAFETY: sysconf has no memory effects; _SC_PAGESIZE is always valid.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

pub struct RingBuffer {
    /// Start of the mapping (the control page).
    base: NonNull<u8>,
    mapped_len: usize,
    data_offset: usize,
    /// A power of two.
    data_size: usize,
    /// Where the next unread record starts (free-running, like data_head).
    tail: u64,
}

// SAFETY: the mapping is owned by this value and only accessed through
// `&mut self`; the kernel side synchronises through data_head/data_tail.
unsafe impl Send for RingBuffer {}

/// What one drain of the buffer found besides the records.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct DrainOutcome {
    pub records: u64,
    /// Records that straddled the end of the buffer (reassembled in scratch).
    pub wrapped: u64,
    /// The buffer held bytes that were not a valid record; they were skipped.
    pub corrupted: bool,
    /// How many bytes were skipped then: records have no marker to find
    /// the next one by, so everything unread up to the head goes.
    pub skipped_bytes: u64,
}

impl RingBuffer {
    /// Maps `data_pages` (a power of two) data pages of `fd`'s ring buffer.
    pub fn map(fd: BorrowedFd<'_>, data_pages: usize) -> io::Result<Self> {
        if !data_pages.is_power_of_two() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the number of ring buffer data pages must be a power of two",
            ));
        }
        let page = page_size();
        let mapped_len = (data_pages + 1) * page;
        // SAFETY: a fresh shared mapping of a perf event fd of the size the
        // kernel expects (1 + 2^n pages); the result is checked below and
        // owned (unmapped in Drop) by the returned value.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let base = NonNull::new(address.cast::<u8>()).ok_or_else(io::Error::last_os_error)?;
        let mut ring = Self {
            base,
            mapped_len,
            data_offset: page,
            data_size: data_pages * page,
            tail: 0,
        };
        // Kernels since 4.1 say where the data is; older ones use page 1 on.
        // SAFETY: the control page is mapped and these fields are plain u64s
        // that the kernel sets once at mmap time.
        let (offset, size) = unsafe {
            let control = ring.base.as_ptr().cast::<perf_event_mmap_page>();
            (
                std::ptr::addr_of!((*control).data_offset).read_volatile(),
                std::ptr::addr_of!((*control).data_size).read_volatile(),
            )
        };
        if size != 0
            && (size as usize).is_power_of_two()
            && (offset as usize).saturating_add(size as usize) <= mapped_len
        {
            ring.data_offset = offset as usize;
            ring.data_size = size as usize;
        }
        ring.tail = ring.data_tail().load(Ordering::Relaxed);
        Ok(ring)
    }

    /// Makes this copy of the reader, in a process forked from the one that
    /// mapped the buffer (a profiler worker), usable: the kernel does not
    /// copy perf buffer mappings into a child (`VM_DONTCOPY`), so the buffer
    /// is mapped again at the same address (free in the child for that very
    /// reason), which the parent's mapping keeps alive. Reading resumes at
    /// the shared `data_tail`, where the previous reader left it.
    pub fn remap_after_fork(&mut self, fd: BorrowedFd<'_>) -> io::Result<()> {
        // SAFETY: maps the same perf buffer, of the size mapped before, at
        // the address this value owns; MAP_FIXED_NOREPLACE fails rather than
        // replace anything mapped there. The result is checked below.
        let address = unsafe {
            libc::mmap(
                self.base.as_ptr().cast(),
                self.mapped_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                fd.as_raw_fd(),
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        if address != self.base.as_ptr().cast() {
            // A kernel without MAP_FIXED_NOREPLACE treats it as a hint.
            // SAFETY: unmaps the mapping just made, which nothing uses.
            unsafe { libc::munmap(address, self.mapped_len) };
            return Err(io::Error::from_raw_os_error(libc::EEXIST));
        }
        self.tail = self.data_tail().load(Ordering::Acquire);
        Ok(())
    }

    pub fn data_size(&self) -> usize {
        self.data_size
    }

    fn data_head(&self) -> &AtomicU64 {
        // SAFETY: data_head is an 8-byte aligned u64 in the mapped control
        // page, which lives as long as `self`; the kernel writes it
        // concurrently, hence the atomic view.
        unsafe {
            let control = self.base.as_ptr().cast::<perf_event_mmap_page>();
            AtomicU64::from_ptr(std::ptr::addr_of_mut!((*control).data_head))
        }
    }

    fn data_tail(&self) -> &AtomicU64 {
        // SAFETY: as for data_head; data_tail is written by this reader and
        // read by the kernel.
        unsafe {
            let control = self.base.as_ptr().cast::<perf_event_mmap_page>();
            AtomicU64::from_ptr(std::ptr::addr_of_mut!((*control).data_tail))
        }
    }

    fn data(&self) -> &[u8] {
        // SAFETY: the data area is inside the mapping. The kernel writes only
        // outside [tail, head) until data_tail moves, and this reader only
        // looks inside that range after loading data_head with acquire.
        unsafe {
            std::slice::from_raw_parts(
                self.base.as_ptr().add(self.data_offset).cast_const(),
                self.data_size,
            )
        }
    }

    /// Hands every complete record now in the buffer to `on_record`, then
    /// frees their space. Records that wrap around the end of the buffer are
    /// reassembled in `scratch`.
    pub fn drain(
        &mut self,
        scratch: &mut Vec<u8>,
        on_record: &mut dyn FnMut(&[u8]),
    ) -> DrainOutcome {
        let head = self.head();
        let outcome = self.scan(head, scratch, &|_| true, on_record);
        self.release(head);
        outcome
    }

    /// Where the kernel has written up to (free-running): the end for
    /// [`RingBuffer::scan`] and [`RingBuffer::release`].
    pub fn head(&self) -> u64 {
        self.data_head().load(Ordering::Acquire)
    }

    /// Hands every complete record before `head` whose header `wanted`
    /// accepts to `on_record`, without freeing their space: the records stay
    /// where they are, in place, for another scan, until
    /// [`RingBuffer::release`]. Records that wrap around the end of the
    /// buffer are reassembled in `scratch` (only the wanted ones: a sample
    /// is up to 32 KB).
    pub fn scan(
        &self,
        head: u64,
        scratch: &mut Vec<u8>,
        wanted: &dyn Fn(&[u8; HEADER_SIZE]) -> bool,
        on_record: &mut dyn FnMut(&[u8]),
    ) -> DrainOutcome {
        let mut tail = self.tail;
        let mut outcome = DrainOutcome::default();
        let size = self.data_size as u64;
        if head.wrapping_sub(tail) > size {
            // The kernel never overwrites unread data in a writable mapping;
            // a head this far ahead means the control page is not what we think.
            outcome.corrupted = true;
            outcome.skipped_bytes = size;
            return outcome;
        }
        let data = self.data();
        while tail < head {
            let available = (head - tail) as usize;
            let start = (tail % size) as usize;
            let mut header = [0u8; HEADER_SIZE];
            copy_wrapping(data, start, &mut header);
            let record_size = u16::from_ne_bytes([header[6], header[7]]) as usize;
            if record_size < HEADER_SIZE || record_size > available {
                outcome.corrupted = true;
                outcome.skipped_bytes = available as u64;
                break;
            }
            if !wanted(&header) {
                // Skipped, not read.
            } else if start + record_size <= data.len() {
                on_record(&data[start..start + record_size]);
            } else {
                scratch.clear();
                scratch.resize(record_size, 0);
                copy_wrapping(data, start, scratch);
                on_record(scratch);
                outcome.wrapped += 1;
            }
            outcome.records += 1;
            tail += record_size as u64;
        }
        outcome
    }

    /// How full the buffer is up to `head`, in percent of its data area: at
    /// 100 the kernel drops what it samples next (and counts it lost).
    pub fn percent_full(&self, head: u64) -> u32 {
        let unread = head.wrapping_sub(self.tail).min(self.data_size as u64);
        (unread * 100 / (self.data_size as u64).max(1)) as u32
    }

    /// Whether every record before `head` has been released already.
    pub fn is_read_up_to(&self, head: u64) -> bool {
        self.tail == head
    }

    /// Frees the space of every record before `head` (what a scan up to
    /// `head` saw, and whatever a corrupt record kept it from seeing).
    pub fn release(&mut self, head: u64) {
        self.tail = head;
        self.data_tail().store(head, Ordering::Release);
    }
}

/// Copies `out.len()` bytes starting at `start` of the circular `data`.
fn copy_wrapping(data: &[u8], start: usize, out: &mut [u8]) {
    let first = out.len().min(data.len() - start);
    out[..first].copy_from_slice(&data[start..start + first]);
    let rest = out.len() - first;
    out[first..].copy_from_slice(&data[..rest]);
}

impl Drop for RingBuffer {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `map`, which nothing
        // references any more.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.mapped_len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_across_the_end_of_the_buffer() {
        let data: Vec<u8> = (0..16).collect();
        let mut out = [0u8; 6];
        copy_wrapping(&data, 13, &mut out);
        assert_eq!(out, [13, 14, 15, 0, 1, 2]);
        copy_wrapping(&data, 2, &mut out);
        assert_eq!(out, [2, 3, 4, 5, 6, 7]);
    }
}

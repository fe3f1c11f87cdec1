//! The sizes of the perf engine's ring buffers: one per event and CPU (or
//! per event and thread for `-p`), sized by the rate and the stack copies
//! of the event that writes it.
use super::ring;
use super::MAX_USER_FRAMES;

/// Default ring buffer data size per event: room for about 32 samples with
/// 32 KB stacks; the kernel wakes the reader when half of it is written
/// (see `events`).
pub const DEFAULT_RING_BUFFER_BYTES: usize = 1 << 20;
/// The least time half a ring buffer holds at the sampling rate: the reader
/// wakes at most about once per this much time per busy CPU.
const MIN_HALF_BUFFER_MILLIS: u64 = 30;
/// The ring buffer for samples of `stack_sample_size` bytes taken at
/// `samples_per_cpu_second` (the most one event, on one CPU, can write):
/// room for 32 samples (1 MiB for the default 32 KB), and more at high
/// rates, so that half of it holds [`MIN_HALF_BUFFER_MILLIS`] of samples;
/// a power of two within 256 KiB..=4 MiB.
///
/// Each wake-up costs the reader ~16 µs of CPU in the context switch alone
/// on a VM, and one came every 16 samples at 999 Hz: with 2 MiB rather than
/// 1 MiB there, the perf engine's CPU per sample on the `threads` workload
/// fell from 2.1–2.3 to 1.3 µs (5 rounds of 99 against 999 Hz). The pages
/// are the kernel's, not the profiler's resident memory; at 99 Hz the
/// buffer stays at 1 MiB, which a reader already drains every ~160 ms.
pub fn default_ring_buffer_bytes(stack_sample_size: u32, samples_per_cpu_second: u64) -> usize {
    // Each sample also carries ~100 bytes of header, ids, registers and sizes.
    let record_bytes = stack_sample_size as u64 + 256;
    let half_buffer_samples = samples_per_cpu_second.saturating_mul(MIN_HALF_BUFFER_MILLIS) / 1000;
    let samples = half_buffer_samples.saturating_mul(2).max(32);
    usize::try_from(record_bytes.saturating_mul(samples))
        .ok()
        .and_then(usize::checked_next_power_of_two)
        .unwrap_or(usize::MAX)
        .clamp(256 * 1024, 4 << 20)
}

/// The engine gives up shrinking a buffer that cannot be mapped below this.
pub(super) const MIN_RING_BUFFER_PAGES: usize = 2;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerfEngineOptions {
    /// Bytes of data area per event fd; rounded up to a power of two pages.
    /// When the locked-memory limit refuses it, the engine halves it (down
    /// to two pages) and logs a warning.
    pub ring_buffer_bytes: usize,
    /// The buffers of `sALLOC`'s probes, sized by their own rate rather
    /// than the CPU events' (allocations with their stack copies, frees
    /// without): `None` when `--ring-buffer-kib` sizes every buffer.
    pub allocation_ring_buffer_bytes: Option<AllocationBuffers>,
    /// Most user frames kept per sample.
    pub max_frames: usize,
}

/// Bytes of data area of the allocation probes' buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AllocationBuffers {
    pub allocations: usize,
    pub frees: usize,
}

impl Default for PerfEngineOptions {
    fn default() -> Self {
        Self {
            ring_buffer_bytes: DEFAULT_RING_BUFFER_BYTES,
            allocation_ring_buffer_bytes: None,
            max_frames: MAX_USER_FRAMES,
        }
    }
}

impl PerfEngineOptions {
    /// Data pages per buffer: a power of two, at least 1.
    pub(super) fn data_pages(&self) -> usize {
        Self::pages(self.ring_buffer_bytes)
    }

    /// Data pages of the buffer of an event of `kind`.
    pub(super) fn data_pages_for(&self, kind: &crate::events::EventKind) -> usize {
        use crate::events::EventKind;
        match (kind, self.allocation_ring_buffer_bytes) {
            (EventKind::Allocation { .. }, Some(sizes)) => Self::pages(sizes.allocations),
            (EventKind::AllocationFreed, Some(sizes)) => Self::pages(sizes.frees),
            _ => self.data_pages(),
        }
    }

    fn pages(bytes: usize) -> usize {
        bytes.div_ceil(ring::page_size()).max(1).next_power_of_two()
    }
}

//! The ddprof BPF program, attached to every sampling perf event.
//!
//! Today it counts the samples of each profiled process; it returns 0 so that
//! the kernel does not also write (and copy the user stack of) the sample into
//! the perf ring buffer.
#![no_std]
#![no_main]

use aya_ebpf::macros::{map, perf_event};
use aya_ebpf::maps::{PerCpuArray, PerCpuHashMap};
use aya_ebpf::programs::PerfEventContext;
use aya_ebpf::EbpfContext;
use ddprof_common::sample::{BpfCounter, BPF_COUNTER_SLOTS};

/// Samples seen per process (tgid), per CPU so that increments need no atomics.
#[map]
static SAMPLES_PER_PROCESS: PerCpuHashMap<u32, u64> = PerCpuHashMap::with_max_entries(16384, 0);

/// Why samples were kept or dropped, indexed by `BpfCounter`.
#[map]
static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(BPF_COUNTER_SLOTS, 0);

#[perf_event]
pub fn ddprof_sample(ctx: PerfEventContext) -> u32 {
    let pid = ctx.tgid();
    count(BpfCounter::Seen);
    match SAMPLES_PER_PROCESS.get_ptr_mut(&pid) {
        // SAFETY: the pointer comes from a map lookup of this CPU's slot and
        // is valid for the duration of the program; per-CPU maps have no
        // concurrent writers on this CPU.
        Some(slot) => unsafe { *slot += 1 },
        None => {
            let _ = SAMPLES_PER_PROCESS.insert(&pid, &1, 0);
        }
    }
    0
}

#[inline(always)]
fn count(counter: BpfCounter) {
    if let Some(slot) = COUNTERS.get_ptr_mut(counter as u32) {
        // SAFETY: as above, a per-CPU array slot owned by this CPU.
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

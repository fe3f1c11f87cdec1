//! What the parent says at exit about the samples lost: one line per
//! cause, with what to do about it.
use std::time::Duration;

use crate::overhead::ThreadTimes;

/// What the loss of `ring_full` samples in full buffers calls for: a
/// saturated machine that kept the sampling loop off a CPU (it waited
/// longer than it ran, and at least 100 ms, in the periods that lost them)
/// needs the profiler to get more of a CPU, not larger buffers alone.
fn ring_full_warning(ring_full: u64, losing_loop: ThreadTimes) -> String {
    let kept_off_a_cpu = losing_loop.waiting >= Duration::from_millis(100)
        && losing_loop.waiting > losing_loop.on_cpu;
    if kept_off_a_cpu {
        format!(
            "{ring_full} samples were lost with the ring buffers full while the profiler waited \
             {:.1} s for a CPU (it ran {:.1} s): the machine's CPUs were saturated; give the \
             profiler a larger share with --nice (e.g. --nice -10), raise --ring-buffer-kib \
             or lower the frequency",
            losing_loop.waiting.as_secs_f64(),
            losing_loop.on_cpu.as_secs_f64()
        )
    } else {
        format!(
            "{ring_full} samples were lost with the ring buffers full: raise --ring-buffer-kib \
             or lower the frequency"
        )
    }
}

/// Says at exit, in one line per cause, what samples were lost and what to
/// do about it.
pub(super) fn warn_of_losses(
    lost: &crate::overhead::Lost,
    losing_loop: ThreadTimes,
    throttles: u64,
    samples: u64,
) {
    if lost.ring_full > 0 {
        log::warn!("{}", ring_full_warning(lost.ring_full, losing_loop));
    }
    if lost.malformed > 0 {
        log::warn!(
            "{} records could not be read and were skipped (counted as lost samples)",
            lost.malformed
        );
    }
    // Sampling every CPU, where a sample falls is chance: the count is
    // within a few samples of what the kernel counted, either way, and
    // that is not worth a warning (the summary has the figure).
    let beyond_chance = lost.unsampled > 2 && lost.unsampled * 100 > samples;
    if beyond_chance || (lost.unsampled > 0 && throttles > 0) {
        let throttled = if throttles > 0 {
            format!(
                "; the kernel throttled sampling {throttles} times (lower the frequency, or raise \
                 kernel.perf_event_max_sample_rate)"
            )
        } else {
            String::new()
        };
        log::warn!(
            "{} samples' worth of the profiled tasks' CPU time (as the kernel counted it) has no \
             sample: time threads and processes ran after their last sample and before they \
             ended (where each task is sampled on its own count, a short-lived one may never \
             reach a sample){throttled}",
            lost.unsampled
        );
    }
    if lost.worker > 0 {
        log::warn!(
            "{} samples were lost with a profiler worker that died or hung (read and not sent, \
             or dropped by the kernel while nothing read the buffers)",
            lost.worker
        );
    }
    // Not a fault: what a process costs on its way out (~75 µs each on a
    // VM), where no stack is left to show. Said, not warned.
    if lost.exiting > 0 {
        log::info!(
            "{} samples were taken of profiled processes already exiting (after their exit \
             record: no address space left to unwind) and not kept",
            lost.exiting
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CI's run of 1,000 threads started at once on 2 CPUs: the loop ran
    /// 4 ms and waited 2,042 ms for a CPU while 84 samples were lost.
    #[test]
    fn losses_while_the_loop_was_kept_off_a_cpu_say_so() {
        let times = |on_cpu, waiting| ThreadTimes {
            on_cpu: Duration::from_millis(on_cpu),
            waiting: Duration::from_millis(waiting),
        };
        let starved = ring_full_warning(84, times(4, 2042));
        assert!(
            starved.contains("waited 2.0 s for a CPU (it ran 0.0 s)") && starved.contains("--nice"),
            "{starved}"
        );
        // Busy, or a short wait: the buffers were too small for the rate.
        for (on_cpu, waiting) in [(900, 300), (10, 50)] {
            let busy = ring_full_warning(84, times(on_cpu, waiting));
            assert!(
                busy.starts_with("84 samples were lost with the ring buffers full: raise"),
                "{busy}"
            );
        }
    }
}

//! Calls into the filesystem that may not come back: an open on a FUSE or
//! NFS mount whose server hangs, an automount that never completes. The
//! profiler runs beside production and must not hang with it, so every
//! open of a file that a profiled process names runs here, on a helper
//! thread, and the caller waits at most a bound. A call that overruns it
//! leaves its thread behind (a thread blocked in the kernel cannot be
//! stopped) and the next call gets a fresh helper; after [`MAX_STUCK`]
//! such threads no call is made any more (each answers at once that it
//! timed out), so that a hung mount costs a few threads, not one per file.
//!
//! Each calling thread has a helper of its own: with one for the process,
//! the worker's loop would wait behind the publisher's open of a debug
//! file (its bound counting from when it asked, not when its open began),
//! and a call queued behind a hung one would time out on a healthy device.
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

/// Helper threads that may be stuck in the kernel at once.
pub const MAX_STUCK: usize = 4;

/// Why a bounded call has no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unanswered {
    #[error("it did not return within {} ms", .0.as_millis())]
    TimedOut(Duration),
    #[error("{MAX_STUCK} earlier calls are still blocked in the kernel")]
    TooManyStuck,
    #[error("it panicked")]
    Panicked,
}

type Job = Box<dyn FnOnce() + Send>;

/// How many helpers of this process (the `pid` tells: after a fork the
/// child has none) are stuck in the kernel.
struct Stuck {
    pid: u32,
    count: Arc<Mutex<usize>>,
}

static STUCK: Mutex<Option<Stuck>> = Mutex::new(None);

thread_local! {
    /// This thread's helper, and the process it was started in.
    static OWN_HELPER: std::cell::RefCell<Option<(u32, mpsc::Sender<Job>)>> =
        const { std::cell::RefCell::new(None) };
}

enum Slot<T> {
    Waiting,
    Done(std::thread::Result<T>),
    Abandoned,
}

/// Runs `job` on the helper thread and returns its result, or
/// [`Unanswered`] when it does not return within `timeout`.
pub fn run<T: Send + 'static>(
    timeout: Duration,
    job: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Unanswered> {
    let (sender, stuck) = helper()?;
    let slot = Arc::new((Mutex::new(Slot::Waiting), Condvar::new()));
    let job_slot = slot.clone();
    let job_stuck = stuck.clone();
    let wrapped: Job = Box::new(move || {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
        let (lock, ready) = &*job_slot;
        let mut state = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        match *state {
            // The caller gave up on it: this thread is free again.
            Slot::Abandoned => {
                let mut stuck = job_stuck.lock().unwrap_or_else(|p| p.into_inner());
                *stuck = stuck.saturating_sub(1);
            }
            _ => {
                *state = Slot::Done(result);
                ready.notify_one();
            }
        }
    });
    if sender.send(wrapped).is_err() {
        // The helper is gone (it cannot be: it only ends when its sender
        // does); start another next time.
        forget_helper();
        return Err(Unanswered::Panicked);
    }
    let (lock, ready) = &*slot;
    let state = lock.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let (mut state, _) = ready
        .wait_timeout_while(state, timeout, |state| matches!(state, Slot::Waiting))
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    match std::mem::replace(&mut *state, Slot::Abandoned) {
        Slot::Done(Ok(value)) => Ok(value),
        Slot::Done(Err(_)) => Err(Unanswered::Panicked),
        Slot::Waiting | Slot::Abandoned => {
            // Still running: its thread is lost to us until the kernel lets
            // it go, and later calls go to a new one.
            *stuck.lock().unwrap_or_else(|p| p.into_inner()) += 1;
            drop(state);
            forget_helper();
            Err(Unanswered::TimedOut(timeout))
        }
    }
}

/// The calling thread's helper, started if needed, and the process's
/// count of stuck helpers.
fn helper() -> Result<(mpsc::Sender<Job>, Arc<Mutex<usize>>), Unanswered> {
    let pid = std::process::id();
    let stuck = {
        let mut stuck = STUCK
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if stuck.as_ref().is_none_or(|s| s.pid != pid) {
            // A forked child inherits the parent's state, not its threads.
            *stuck = Some(Stuck {
                pid,
                count: Arc::new(Mutex::new(0)),
            });
        }
        stuck.as_ref().expect("set above").count.clone()
    };
    if *stuck.lock().unwrap_or_else(|p| p.into_inner()) >= MAX_STUCK {
        return Err(Unanswered::TooManyStuck);
    }
    OWN_HELPER.with(|own| {
        let mut own = own.borrow_mut();
        if let Some((started_in, jobs)) = own.as_ref() {
            if *started_in == pid {
                return Ok((jobs.clone(), stuck.clone()));
            }
        }
        let (sender, receiver) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("ddprof-open".into())
            .spawn(move || {
                for job in receiver {
                    job();
                }
            })
            .map_err(|_| Unanswered::Panicked)?;
        *own = Some((pid, sender.clone()));
        Ok((sender, stuck.clone()))
    })
}

/// The calling thread's next call gets a new helper.
fn forget_helper() {
    OWN_HELPER.with(|own| own.borrow_mut().take());
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn answers_and_gives_up_within_the_bound() {
        assert_eq!(run(Duration::from_secs(5), || 41 + 1), Ok(42));
        let started = Instant::now();
        let slow = run(Duration::from_millis(50), || {
            std::thread::sleep(Duration::from_millis(400));
            1
        });
        assert_eq!(slow, Err(Unanswered::TimedOut(Duration::from_millis(50))));
        assert!(started.elapsed() < Duration::from_millis(300));
        // The next call does not wait behind the stuck one.
        let started = Instant::now();
        assert_eq!(run(Duration::from_secs(5), || 7), Ok(7));
        assert!(started.elapsed() < Duration::from_millis(300));
        assert_eq!(
            run(Duration::from_secs(5), || -> u8 { panic!("x") }),
            Err(Unanswered::Panicked)
        );
        // Once the slow call returns, its thread counts as free again.
        std::thread::sleep(Duration::from_millis(500));
        let stuck = STUCK.lock().unwrap();
        assert_eq!(*stuck.as_ref().unwrap().count.lock().unwrap(), 0);
    }

    #[test]
    fn a_thread_never_waits_behind_another_threads_call() {
        let slow = std::thread::spawn(|| {
            run(Duration::from_secs(5), || {
                std::thread::sleep(Duration::from_millis(600));
                1
            })
        });
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        assert_eq!(run(Duration::from_secs(5), || 2), Ok(2));
        assert!(
            started.elapsed() < Duration::from_millis(300),
            "waited {:?} behind the other thread's call",
            started.elapsed()
        );
        assert_eq!(slow.join().unwrap(), Ok(1));
    }
}

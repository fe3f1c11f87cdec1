//! Waiting for the buffers: an epoll set, edge-triggered, of the perf
//! events and (with the BPF engine) the BPF ring buffer.
//!
//! Why not poll(2): a wake-up of any descriptor makes poll look at all of
//! them again, and the BPF ring buffer reads as ready whenever it holds a
//! record, which at any sampling rate is nearly always. Every exiting task
//! of a profiled process wakes the perf event it inherited (the kernel
//! kicks the parent event's pollers so that they can see a hang-up), so a
//! program that starts short-lived processes cost the loop a turn per
//! process exit on top of the turn of its hand-off notice. Edge-triggered
//! epoll only returns for a descriptor whose own wake-up says it has
//! something: the ring buffer's (the program's wake-ups, a quarter full or
//! a hand-off), a perf buffer's watermark, a hang-up.
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// The key of the other descriptor (the BPF ring buffer) in the set; the
/// perf events are keyed by their index.
const OTHER: u64 = u64::MAX;

/// What one [`Waiter::wait`] saw.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Woken {
    /// Indices of the events that hung up (or failed): they are out of the
    /// set from now on.
    pub(super) hung_up: Vec<usize>,
}

pub(super) struct Waiter {
    epoll: OwnedFd,
    /// The other descriptor the set was built with.
    other: Option<RawFd>,
}

impl Waiter {
    /// An epoll set of `events` (those not hung up, by index) and `other`.
    pub(super) fn new(
        events: impl Iterator<Item = (usize, RawFd)>,
        other: Option<RawFd>,
    ) -> io::Result<Self> {
        // SAFETY: epoll_create1 takes no pointers; the descriptor it returns
        // is owned by nothing else.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let waiter = Self {
            epoll: unsafe { OwnedFd::from_raw_fd(fd) },
            other,
        };
        for (index, event) in events {
            waiter.add(event, index as u64)?;
        }
        if let Some(other) = other {
            waiter.add(other, OTHER)?;
        }
        Ok(waiter)
    }

    /// The descriptor other than the events the set watches.
    pub(super) fn other(&self) -> Option<RawFd> {
        self.other
    }

    fn add(&self, fd: RawFd, key: u64) -> io::Result<()> {
        let mut event = libc::epoll_event {
            events: (libc::EPOLLIN | libc::EPOLLET) as u32,
            u64: key,
        };
        // SAFETY: `event` is a valid epoll_event that outlives the call;
        // `fd` is open (the caller owns it for as long as the set lives).
        let result =
            unsafe { libc::epoll_ctl(self.epoll.as_raw_fd(), libc::EPOLL_CTL_ADD, fd, &mut event) };
        if result < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits up to `timeout` for a wake-up; an interrupted wait returns
    /// as a wake-up with nothing in it. `event_fd` gives an event's
    /// descriptor by index, to take the hung-up ones out of the set (an
    /// edge-triggered hang-up is reported once, but it costs nothing to be
    /// sure).
    pub(super) fn wait(
        &self,
        timeout: Duration,
        event_fd: impl Fn(usize) -> Option<RawFd>,
    ) -> io::Result<Woken> {
        const CAPACITY: usize = 16;
        let mut ready = [libc::epoll_event { events: 0, u64: 0 }; CAPACITY];
        let timeout_ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
        // SAFETY: `ready` has room for CAPACITY events and outlives the call.
        let count = unsafe {
            libc::epoll_wait(
                self.epoll.as_raw_fd(),
                ready.as_mut_ptr(),
                CAPACITY as i32,
                timeout_ms,
            )
        };
        if count < 0 {
            let error = io::Error::last_os_error();
            if error.kind() == io::ErrorKind::Interrupted {
                return Ok(Woken::default());
            }
            return Err(error);
        }
        let mut woken = Woken::default();
        for event in &ready[..count as usize] {
            let key = event.u64;
            if key == OTHER || event.events & (libc::EPOLLHUP | libc::EPOLLERR) as u32 == 0 {
                continue;
            }
            let index = key as usize;
            woken.hung_up.push(index);
            if let Some(fd) = event_fd(index) {
                // SAFETY: EPOLL_CTL_DEL ignores the event pointer (null is
                // allowed since Linux 2.6.9).
                unsafe {
                    libc::epoll_ctl(
                        self.epoll.as_raw_fd(),
                        libc::EPOLL_CTL_DEL,
                        fd,
                        std::ptr::null_mut(),
                    )
                };
            }
        }
        Ok(woken)
    }
}

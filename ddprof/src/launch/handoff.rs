//! Passing the perf event descriptors from the launcher to the profiler
//! daemon over a Unix `SOCK_SEQPACKET` socket pair (`SCM_RIGHTS`).
//!
//! Protocol, launcher → daemon:
//! 1. a header: `DDPROF-EVENTS` then the number of descriptors (u32, native endian);
//! 2. batches of at most [`FDS_PER_MESSAGE`] descriptors, each message's data
//!    being, per descriptor, its event's index (u32, [`crate::events::spec_of_index`]) and its CPU (i32).
//!
//! The daemon answers one byte ([`ACK`]) once it holds every descriptor, and
//! a second ([`READY`]) once its engine is set up (the BPF program attached
//! to the events), or closes the socket if it cannot set one up. If the
//! launcher could not open its events it closes the socket without sending
//! anything, and the daemon, seeing end-of-file, exits quietly. Last, just
//! before it execs the command, the launcher says how much CPU time it
//! (and the intermediate process of the double fork, which it reaped) spent
//! ([`send_launcher_cpu`]): the profiler reports it as its own.
use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType, UnixAddr,
};

use crate::events::EventFd;
use crate::events::EventSpec;

const HEADER_MAGIC: &[u8] = b"DDPROF-EVENTS";
/// Well below the kernel's `SCM_MAX_FD` (253) per message.
pub const FDS_PER_MESSAGE: usize = 64;
const RECORD_SIZE: usize = 8;
/// The daemon's answer once it holds every descriptor.
pub const ACK: u8 = b'K';
/// The daemon's word once its engine is set up.
pub const READY: u8 = b'R';
/// The launcher's last message: its CPU time (nanoseconds, u64 native).
const LAUNCHER_CPU: u8 = b'C';

#[derive(Debug, thiserror::Error)]
pub enum HandoffError {
    #[error("cannot create the socket to the profiler: {0}")]
    Socket(nix::Error),
    #[error("cannot send the perf events to the profiler: {0}")]
    Send(nix::Error),
    #[error("cannot receive the perf events from the launcher: {0}")]
    Receive(nix::Error),
    #[error("the launcher closed the socket before sending its events")]
    NoEvents,
    #[error("malformed hand-off message from the launcher ({0})")]
    Malformed(&'static str),
    #[error("the profiler did not take the events within {0:?}")]
    Timeout(Duration),
    #[error("the profiler exited before taking the events")]
    ProfilerGone,
}

/// A connected pair: one end for the launcher, one for the daemon. Both are
/// close-on-exec, so the command never inherits either.
pub fn channel() -> Result<(OwnedFd, OwnedFd), HandoffError> {
    socketpair(
        AddressFamily::Unix,
        SockType::SeqPacket,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(HandoffError::Socket)
}

/// Sends every event descriptor (the launcher keeps its own copies). A
/// profiler that stopped reading cannot block the launcher: each message
/// waits at most `timeout` for room in the socket's queue.
pub fn send_events(
    socket: &OwnedFd,
    events: &[EventFd],
    timeout: Duration,
) -> Result<(), HandoffError> {
    // In microseconds: time_t and suseconds_t differ between libcs.
    let timeout_value = <nix::sys::time::TimeVal as nix::sys::time::TimeValLike>::microseconds(
        i64::try_from(timeout.as_micros()).unwrap_or(i64::MAX),
    );
    nix::sys::socket::setsockopt(
        socket,
        nix::sys::socket::sockopt::SendTimeout,
        &timeout_value,
    )
    .map_err(HandoffError::Socket)?;
    let mut header = HEADER_MAGIC.to_vec();
    header.extend_from_slice(&(events.len() as u32).to_ne_bytes());
    sendmsg::<UnixAddr>(
        socket.as_raw_fd(),
        &[IoSlice::new(&header)],
        &[],
        MsgFlags::MSG_NOSIGNAL,
        None,
    )
    .map_err(send_error(timeout))?;
    for batch in events.chunks(FDS_PER_MESSAGE) {
        let mut records = Vec::with_capacity(batch.len() * RECORD_SIZE);
        let mut fds: Vec<RawFd> = Vec::with_capacity(batch.len());
        for event in batch {
            let spec_index = u32::from(event.spec.index());
            records.extend_from_slice(&spec_index.to_ne_bytes());
            records.extend_from_slice(&event.cpu.to_ne_bytes());
            fds.push(event.fd.as_raw_fd());
        }
        sendmsg::<UnixAddr>(
            socket.as_raw_fd(),
            &[IoSlice::new(&records)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_NOSIGNAL,
            None,
        )
        .map_err(send_error(timeout))?;
    }
    Ok(())
}

fn send_error(timeout: Duration) -> impl Fn(nix::Error) -> HandoffError {
    move |error| match error {
        nix::errno::Errno::EAGAIN => HandoffError::Timeout(timeout),
        other => HandoffError::Send(other),
    }
}

/// Waits (at most `timeout`) for the daemon's acknowledgement.
pub fn wait_for_ack(socket: &OwnedFd, timeout: Duration) -> Result<(), HandoffError> {
    wait_for_byte(socket, ACK, timeout)
}

/// Waits (at most `timeout`) for the daemon to say that its engine is set
/// up ([`report_ready`]).
pub fn wait_for_ready(socket: &OwnedFd, timeout: Duration) -> Result<(), HandoffError> {
    wait_for_byte(socket, READY, timeout)
}

/// Waits (at most `timeout`) for the one-byte message `expected`.
fn wait_for_byte(socket: &OwnedFd, expected: u8, timeout: Duration) -> Result<(), HandoffError> {
    let deadline = Instant::now() + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(HandoffError::Timeout(timeout));
        }
        let mut poll_fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
        let millis = u16::try_from(left.as_millis().max(1)).unwrap_or(u16::MAX);
        match poll(&mut poll_fds, PollTimeout::from(millis)) {
            Ok(0) => continue,
            Ok(_) => break,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(error) => return Err(HandoffError::Receive(error)),
        }
    }
    let mut answer = [0u8; 1];
    match nix::sys::socket::recv(socket.as_raw_fd(), &mut answer, MsgFlags::empty()) {
        Ok(1) if answer[0] == expected => Ok(()),
        Ok(_) => Err(HandoffError::ProfilerGone),
        Err(error) => Err(HandoffError::Receive(error)),
    }
}

/// Receives every event descriptor; `specs` are the parsed `-e` specs the
/// launcher indexes into.
pub fn receive_events(socket: &OwnedFd, specs: &[EventSpec]) -> Result<Vec<EventFd>, HandoffError> {
    let mut header = [0u8; 64];
    let length = receive(socket, &mut header, &mut Vec::new())?;
    if length == 0 {
        return Err(HandoffError::NoEvents);
    }
    let count = header[..length]
        .strip_prefix(HEADER_MAGIC)
        .and_then(|rest| rest.try_into().ok())
        .map(u32::from_ne_bytes)
        .ok_or(HandoffError::Malformed("bad header"))? as usize;
    let mut events = Vec::with_capacity(count);
    while events.len() < count {
        let mut records = [0u8; FDS_PER_MESSAGE * RECORD_SIZE];
        let mut fds = Vec::new();
        let length = receive(socket, &mut records, &mut fds)?;
        if length == 0 {
            return Err(HandoffError::Malformed("end of stream before every event"));
        }
        if length != fds.len() * RECORD_SIZE {
            return Err(HandoffError::Malformed(
                "descriptor count does not match the records",
            ));
        }
        for (record, fd) in records[..length].chunks_exact(RECORD_SIZE).zip(fds) {
            let spec_index = u32::from_ne_bytes(record[..4].try_into().unwrap_or_default());
            let cpu = i32::from_ne_bytes(record[4..].try_into().unwrap_or_default());
            let spec = u16::try_from(spec_index)
                .ok()
                .and_then(|index| crate::events::spec_of_index(specs, index))
                .ok_or(HandoffError::Malformed("unknown event spec"))?;
            // Opened by the launcher: enabled by its exec, but for the
            // allocation probe, which watches every CPU.
            let scope = crate::events::scope_of(&spec, crate::events::Scope::SelfOnExec);
            events.push(EventFd {
                fd,
                cpu,
                spec,
                enable_when_mapped: scope == crate::events::Scope::Global,
                scope,
            });
        }
    }
    Ok(events)
}

/// Tells the launcher that every descriptor arrived.
pub fn acknowledge(socket: &OwnedFd) -> Result<(), HandoffError> {
    send_byte(socket, ACK)
}

/// Tells the launcher that the engine is set up: the command may start.
pub fn report_ready(socket: &OwnedFd) -> Result<(), HandoffError> {
    send_byte(socket, READY)
}

/// Tells the daemon what the launcher spent (never waits: the command is
/// about to start).
pub fn send_launcher_cpu(socket: &OwnedFd, cpu: Duration) {
    let mut message = [0u8; 9];
    message[0] = LAUNCHER_CPU;
    message[1..].copy_from_slice(&(cpu.as_nanos() as u64).to_ne_bytes());
    let _ = nix::sys::socket::send(
        socket.as_raw_fd(),
        &message,
        MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
    );
}

/// The launcher's CPU time ([`send_launcher_cpu`]), waiting at most
/// `timeout` for it (it comes right after the launcher heard [`READY`]).
pub fn receive_launcher_cpu(socket: &OwnedFd, timeout: Duration) -> Option<Duration> {
    let mut poll_fds = [PollFd::new(socket.as_fd(), PollFlags::POLLIN)];
    let millis = u16::try_from(timeout.as_millis().max(1)).unwrap_or(u16::MAX);
    if !matches!(poll(&mut poll_fds, PollTimeout::from(millis)), Ok(1)) {
        return None;
    }
    let mut message = [0u8; 9];
    match nix::sys::socket::recv(socket.as_raw_fd(), &mut message, MsgFlags::MSG_DONTWAIT) {
        Ok(9) if message[0] == LAUNCHER_CPU => Some(Duration::from_nanos(u64::from_ne_bytes(
            message[1..].try_into().ok()?,
        ))),
        _ => None,
    }
}

fn send_byte(socket: &OwnedFd, byte: u8) -> Result<(), HandoffError> {
    nix::sys::socket::send(socket.as_raw_fd(), &[byte], MsgFlags::MSG_NOSIGNAL)
        .map(|_| ())
        .map_err(HandoffError::Send)
}

/// One message: its data into `buffer`, its descriptors (close-on-exec)
/// appended to `fds`. Returns the data length (0 at end of stream).
fn receive(
    socket: &OwnedFd,
    buffer: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> Result<usize, HandoffError> {
    let mut control = nix::cmsg_space!([RawFd; FDS_PER_MESSAGE]);
    let mut iov = [IoSliceMut::new(buffer)];
    let message = loop {
        match recvmsg::<()>(
            socket.as_raw_fd(),
            &mut iov,
            Some(&mut control),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Err(nix::errno::Errno::EINTR) => continue,
            other => break other.map_err(HandoffError::Receive)?,
        }
    };
    for cmsg in message.cmsgs().map_err(HandoffError::Receive)? {
        if let ControlMessageOwned::ScmRights(received) = cmsg {
            for raw in received {
                // SAFETY: SCM_RIGHTS installed these descriptors in this
                // process for us; nothing else owns them.
                fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
            }
        }
    }
    if message.flags.contains(MsgFlags::MSG_CTRUNC) {
        return Err(HandoffError::Malformed("descriptors were truncated"));
    }
    Ok(message.bytes)
}

impl From<HandoffError> for io::Error {
    fn from(error: HandoffError) -> io::Error {
        io::Error::other(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::events::{open, EventOptions, Scope};

    #[test]
    fn hands_over_event_descriptors() {
        let specs = crate::events::parse_events("sCPU; sCS p=100").unwrap();
        let options = EventOptions {
            stack_sample_size: 8192,
            include_kernel: false,
            kernel_stacks: false,
        };
        let pid = std::process::id() as i32;
        // More than one batch, with both specs.
        let events: Vec<EventFd> = (0..FDS_PER_MESSAGE + 3)
            .map(|i| open(&specs[i % 2], Scope::Process(pid), -1, &options).unwrap())
            .collect();
        let (launcher, daemon) = channel().unwrap();
        send_events(&launcher, &events, Duration::from_secs(1)).unwrap();
        let received = receive_events(&daemon, &specs).unwrap();
        assert_eq!(received.len(), events.len());
        for (sent, got) in events.iter().zip(&received) {
            assert_eq!(sent.spec, got.spec);
            assert_eq!(sent.cpu, got.cpu);
            assert_ne!(sent.fd.as_raw_fd(), got.fd.as_raw_fd());
        }
        acknowledge(&daemon).unwrap();
        wait_for_ack(&launcher, Duration::from_secs(1)).unwrap();
        // The engine's word is a different byte: an acknowledgement is not
        // taken for it, nor the reverse.
        report_ready(&daemon).unwrap();
        wait_for_ready(&launcher, Duration::from_secs(1)).unwrap();
        acknowledge(&daemon).unwrap();
        assert!(matches!(
            wait_for_ready(&launcher, Duration::from_secs(1)),
            Err(HandoffError::ProfilerGone)
        ));
    }

    #[test]
    fn a_profiler_that_stopped_reading_cannot_block_the_launcher() {
        let specs = crate::events::parse_events("sCPU").unwrap();
        let options = EventOptions {
            stack_sample_size: 8192,
            include_kernel: false,
            kernel_stacks: false,
        };
        let pid = std::process::id() as i32;
        let event = open(&specs[0], Scope::Process(pid), -1, &options).unwrap();
        // More messages than the socket queue holds (net.unix.max_dgram_qlen
        // is 10 by default; the smallest send buffer holds fewer), never read.
        let events: Vec<EventFd> = (0..FDS_PER_MESSAGE * 15)
            .map(|_| EventFd {
                fd: event.fd.try_clone().unwrap(),
                cpu: -1,
                spec: specs[0].clone(),
                enable_when_mapped: false,
                scope: crate::events::Scope::SelfOnExec,
            })
            .collect();
        let (launcher, _daemon) = channel().unwrap();
        nix::sys::socket::setsockopt(&launcher, nix::sys::socket::sockopt::SndBuf, &0).unwrap();
        let result = send_events(&launcher, &events, Duration::from_millis(50));
        assert!(
            matches!(result, Err(HandoffError::Timeout(_))),
            "{result:?}"
        );
    }

    #[test]
    fn a_silent_profiler_times_out_and_a_closed_one_is_gone() {
        let (launcher, daemon) = channel().unwrap();
        assert!(matches!(
            wait_for_ack(&launcher, Duration::from_millis(20)),
            Err(HandoffError::Timeout(_))
        ));
        drop(daemon);
        assert!(matches!(
            wait_for_ack(&launcher, Duration::from_secs(1)),
            Err(HandoffError::ProfilerGone)
        ));
        let (launcher, daemon) = channel().unwrap();
        drop(launcher);
        assert!(matches!(
            receive_events(&daemon, &[]),
            Err(HandoffError::NoEvents)
        ));
    }
}

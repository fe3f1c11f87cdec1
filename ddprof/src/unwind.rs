//! Unwind tables compiled from .eh_frame / .debug_frame, and the user-side unwinder.
use crate::process::ProcessTable;
use crate::sample::StackEnd;

/// The user registers a sample carries (x86_64).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct UserRegs {
    pub ip: u64,
    pub sp: u64,
    pub bp: u64,
}

/// Walks user stacks copied by the kernel, with tables built once per file
/// and shared by every process that maps the file.
#[derive(Default)]
pub struct Unwinder {}

impl Unwinder {
    pub fn new() -> Self {
        Self::default()
    }

    /// Unwinds one sample of process `pid`. `stack` holds the bytes the kernel
    /// copied starting at `regs.sp`. Pushes the PCs, innermost first, into
    /// `frames` (at most `max_frames`) and says how the walk ended.
    pub fn unwind(
        &mut self,
        _processes: &ProcessTable,
        _pid: u32,
        regs: &UserRegs,
        _stack: &[u8],
        max_frames: usize,
        frames: &mut Vec<u64>,
    ) -> StackEnd {
        if max_frames == 0 {
            return StackEnd::DepthLimit;
        }
        frames.push(regs.ip);
        StackEnd::NoUnwindInfo
    }
}

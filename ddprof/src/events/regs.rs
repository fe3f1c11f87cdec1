//! The user registers each sample carries (`perf_event_attr.sample_regs_user`),
//! by perf's numbers for this build's architecture (x86-64's `enum
//! perf_event_x86_regs`, arm64's `enum perf_event_arm64_regs`), and where
//! the unwinder keeps them.

/// Where a sampled register goes: the unwinders track IP, SP and the frame
/// pointer (RBP, X29) through every frame, arm64's link register in the
/// first one, and the other general-purpose registers (by DWARF number) as
/// long as no frame changed them: hand-written assembly (OpenSSL) bases its
/// CFA on any of them, and `sALLOC`'s marker passes its arguments in them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Slot {
    Ip,
    Sp,
    Bp,
    /// arm64's X30.
    Lr,
    Other(u8),
}

/// The registers the unwinders need, in the order the kernel writes them
/// (ascending bit number): `(bit, slot)`.
#[cfg(target_arch = "x86_64")]
pub const SAMPLED: [(u64, Slot); 17] = [
    (0, Slot::Other(0)), // AX
    (1, Slot::Other(3)), // BX
    (2, Slot::Other(2)), // CX
    (3, Slot::Other(1)), // DX
    (4, Slot::Other(4)), // SI
    (5, Slot::Other(5)), // DI
    (6, Slot::Bp),
    (7, Slot::Sp),
    (8, Slot::Ip),
    (16, Slot::Other(8)), // R8 ..
    (17, Slot::Other(9)),
    (18, Slot::Other(10)),
    (19, Slot::Other(11)),
    (20, Slot::Other(12)),
    (21, Slot::Other(13)),
    (22, Slot::Other(14)),
    (23, Slot::Other(15)), // .. R15
];

/// X0-X15 (perf's and DWARF's numbers are the same), X29, X30, SP, PC.
#[cfg(target_arch = "aarch64")]
pub const SAMPLED: [(u64, Slot); 20] = [
    (0, Slot::Other(0)),
    (1, Slot::Other(1)),
    (2, Slot::Other(2)),
    (3, Slot::Other(3)),
    (4, Slot::Other(4)),
    (5, Slot::Other(5)),
    (6, Slot::Other(6)),
    (7, Slot::Other(7)),
    (8, Slot::Other(8)),
    (9, Slot::Other(9)),
    (10, Slot::Other(10)),
    (11, Slot::Other(11)),
    (12, Slot::Other(12)),
    (13, Slot::Other(13)),
    (14, Slot::Other(14)),
    (15, Slot::Other(15)),
    (29, Slot::Bp),
    (30, Slot::Lr),
    (31, Slot::Sp),
    (32, Slot::Ip),
];

/// perf's numbers of a function's first six integer arguments (System V:
/// RDI, RSI, RDX, RCX, R8, R9).
#[cfg(target_arch = "x86_64")]
const ARGUMENTS: [u8; 6] = [5, 4, 3, 2, 16, 17];
/// AAPCS64: X0-X5.
#[cfg(target_arch = "aarch64")]
const ARGUMENTS: [u8; 6] = [0, 1, 2, 3, 4, 5];

/// What `r=` accepts: its error message.
#[cfg(target_arch = "x86_64")]
pub const REGISTER_EXPECTED: &str =
    "expected a general-purpose register's perf number (0-8 for AX..IP, 16-23 for R8..R15)";
#[cfg(target_arch = "aarch64")]
pub const REGISTER_EXPECTED: &str =
    "expected a general-purpose register's perf number (0-15 for X0..X15, 29-32 for X29, LR, SP, PC)";

pub const MASK: u64 = {
    let mut mask = 0;
    let mut i = 0;
    while i < SAMPLED.len() {
        mask |= 1 << SAMPLED[i].0;
        i += 1;
    }
    mask
};
pub const COUNT: usize = SAMPLED.len();

/// Whether perf register `register` is among the sampled ones.
pub fn is_sampled(register: u8) -> bool {
    SAMPLED.iter().any(|(bit, _)| *bit == u64::from(register))
}

/// perf's number of argument `n` (1-6) of a function.
pub fn argument(n: u64) -> Option<u8> {
    let index = usize::try_from(n).ok()?.checked_sub(1)?;
    ARGUMENTS.get(index).copied()
}

/// Where [`SAMPLED`] puts perf register `register` in the unwinder's
/// registers.
fn slot(register: u8) -> Option<Slot> {
    SAMPLED
        .iter()
        .find(|(bit, _)| *bit == u64::from(register))
        .map(|(_, slot)| *slot)
}

/// Stores a sampled register's `value` where [`SAMPLED`] says; `None`
/// for a DWARF number out of the unwinder's range.
pub fn store(regs: &mut crate::unwind::UserRegs, slot: Slot, value: u64) -> Option<()> {
    match slot {
        Slot::Ip => regs.ip = value,
        Slot::Sp => regs.sp = value,
        Slot::Bp => regs.bp = value,
        Slot::Lr => regs.lr = value,
        Slot::Other(dwarf) => *regs.others.get_mut(usize::from(dwarf))? = value,
    }
    Some(())
}

/// The registers of a record that carries a probed function's first three
/// integer arguments (the BPF engine's allocation samples) where a perf
/// sample would have them, so that [`super::Weighing`] reads both engines'
/// samples alike.
pub fn with_arguments(arguments: [u64; 3]) -> crate::unwind::UserRegs {
    let mut regs = crate::unwind::UserRegs::default();
    for (n, value) in (1..).zip(arguments) {
        if let Some(Slot::Other(dwarf)) = argument(n).and_then(slot) {
            regs.others[usize::from(dwarf)] = value;
            regs.known |= 1 << dwarf;
        }
    }
    regs
}

/// The value of perf register `register` in `regs` (as the sample
/// recorded it), if sampled.
pub fn value(regs: &crate::unwind::UserRegs, register: u8) -> Option<u64> {
    Some(match slot(register)? {
        Slot::Ip => regs.ip,
        Slot::Sp => regs.sp,
        Slot::Bp => regs.bp,
        Slot::Lr => regs.lr,
        Slot::Other(dwarf) => *regs.others.get(usize::from(dwarf))?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn arguments_land_where_a_sample_has_them() {
        let regs = with_arguments([10, 20, 30]);
        assert_eq!(value(&regs, argument(1).unwrap()), Some(10));
        assert_eq!(value(&regs, argument(2).unwrap()), Some(20));
        assert_eq!(value(&regs, argument(3).unwrap()), Some(30));
        assert_eq!(argument(0), None);
        assert_eq!(argument(7), None);
        assert!((1..=6).all(|n| argument(n).is_some_and(is_sampled)));
    }
}

//! Unwind-table rows and the step function that applies one row to a
//! register set. Compiled for the BPF program and for userspace.

//! Types and logic shared by the ddprof BPF program (kernel side) and the
//! ddprof userspace binary.
//!
//! Everything here is `no_std`, allocation-free and `#[repr(C)]` where it
//! crosses the kernel/user boundary, because the very same definitions are
//! compiled for `bpfel-unknown-none` and for the host.
#![no_std]

pub mod bpf_maps;
pub mod sample;
pub mod unwind;

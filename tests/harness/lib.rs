//! Test harness: builds workloads, runs ddprof, reads its outputs.
pub mod symbols;
pub mod workloads;

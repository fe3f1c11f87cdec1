//! Test harness: builds workloads, runs ddprof, reads its outputs.

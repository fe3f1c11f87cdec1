//! The perf sampling engine: ring-buffer records, user-side DWARF unwinding.

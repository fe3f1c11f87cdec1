//! The profiler's heap: one arena, and freed memory given back after the
//! set-up.

/// Returns the heap's free memory to the system. The engine's set-up
/// frees much more than the profiler keeps (aya parses the kernel's whole
/// BTF, ~5 MB, into small allocations, to load a program that needs none of
/// it), and glibc keeps freed memory below the top of the heap.
pub fn release_free_memory() {
    // SAFETY: malloc_trim only gives free pages of glibc's heap back to the
    // kernel; it takes the allocator's lock like any allocation.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Keeps the profiler's allocations in one malloc arena: its helper threads
/// (the BPF program's load, table syncs) would each get an arena of their
/// own, whose pages stay resident after the thread is gone (10-15 MiB more
/// peak RSS in `cargo xtask bench`).
pub fn one_malloc_arena() {
    // SAFETY: mallopt only tunes glibc's allocator; it is called before
    // the profiler starts any thread.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

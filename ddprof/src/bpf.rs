//! The eBPF sampling engine: user stacks unwound in the kernel.

/// The BPF object built by `cargo xtask build-ebpf`, when this binary has one.
#[cfg(ddprof_bpf)]
pub const BPF_OBJECT: Option<&[u8]> = Some(include_bytes!(env!("DDPROF_EBPF_OBJECT_PATH")));
#[cfg(not(ddprof_bpf))]
pub const BPF_OBJECT: Option<&[u8]> = None;

/// Why the BPF engine cannot run when the binary was built without it.
pub const NOT_BUILT: &str =
    "BPF engine not built into this binary (build with `cargo xtask build-ebpf`)";

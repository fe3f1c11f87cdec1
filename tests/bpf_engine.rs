//! The eBPF engine on this kernel: real program, real processes.
use ddprof::bpf::{BpfProgram, MapSizes};

#[test]
fn program_passes_the_verifier() {
    let program = BpfProgram::load(MapSizes::minimal(), true).expect("verifier accepts");
    let stats = program.stats();
    eprintln!("verifier: {stats:?}");
    assert!(stats.instructions.unwrap_or(0) > 0);
}

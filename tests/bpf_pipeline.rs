//! The BPF build pipeline end to end: the object embedded in ddprof loads
//! into this kernel, attaches to a cpu-clock perf event of a real process
//! and counts that process's samples (the sample records themselves are
//! tested with the engine in bpf_engine.rs).
use std::process::{Command, Stdio};
use std::time::Duration;

use ddprof::bpf::{BpfProgram, MapSizes};
use ddprof::events::{self, parse_events, EventOptions, Scope};
use ddprof_common::sample::BpfCounter;
use ddprof_tests::guards::KillOnDrop;

#[test]
fn embedded_program_counts_samples_of_a_busy_process() {
    assert!(
        ddprof::bpf::BPF_OBJECT.is_some(),
        "this ddprof was built without its BPF object: run `cargo xtask test`"
    );
    // A busy shell loop: all user-space CPU, ~1 s at least.
    let mut busy = KillOnDrop(
        Command::new("sh")
            .args(["-c", "i=0; while [ $i -lt 3000000 ]; do i=$((i+1)); done"])
            .stdout(Stdio::null())
            .spawn()
            .expect("sh runs"),
    );
    let pid = busy.id();
    let specs = parse_events("sCPU freq=999").unwrap();
    let options = EventOptions {
        stack_sample_size: 8,
        include_kernel: false,
        kernel_stacks: false,
    };
    let fds = events::open_all(&specs, Scope::Process(pid as i32), &options)
        .expect("root can open task-clock events on its child");
    let program = BpfProgram::load(MapSizes::minimal(), true)
        .expect("the BPF program loads and passes the verifier");
    for fd in &fds {
        program
            .attach(fd)
            .expect("PERF_EVENT_IOC_SET_BPF attaches to the event");
        // Opened disabled, for an engine to enable once set up.
        fd.enable().expect("PERF_EVENT_IOC_ENABLE");
    }
    std::thread::sleep(Duration::from_millis(800));
    let seen = program.counter(BpfCounter::Seen).unwrap();
    busy.stop();
    // 0.8 s of a busy process at 999 Hz is ~800 samples; demand a clear signal.
    assert!(seen >= 200, "BPF saw {seen} samples of pid {pid}");
}

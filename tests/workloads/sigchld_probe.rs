//! Counts the SIGCHLD signals it receives. It creates no child unless told
//! to, so any SIGCHLD it reports otherwise came from somewhere else (e.g. a
//! profiler that wrongly stayed its child).
//!
//! Protocol on stdin/stdout: prints `ready pid=PID`, then for each line read:
//! `spawn` runs `/bin/true` and waits for it (a SIGCHLD the probe caused
//! itself, to prove the counting works); `report` prints `sigchld=N` and exits 0.
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicUsize, Ordering};

static SIGCHLD_COUNT: AtomicUsize = AtomicUsize::new(0);

extern "C" fn count_sigchld(_: libc::c_int) {
    SIGCHLD_COUNT.fetch_add(1, Ordering::SeqCst);
}

fn main() {
    // SAFETY: the handler only increments an atomic; `action` is fully
    // initialised before sigaction reads it.
    unsafe {
        let mut action: libc::sigaction = std::mem::zeroed();
        action.sa_sigaction = count_sigchld as *const () as libc::sighandler_t;
        action.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut action.sa_mask);
        assert_eq!(
            libc::sigaction(libc::SIGCHLD, &action, std::ptr::null_mut()),
            0
        );
    }
    let mut stdout = std::io::stdout();
    writeln!(stdout, "ready pid={}", std::process::id()).unwrap();
    stdout.flush().unwrap();
    for line in std::io::stdin().lock().lines() {
        match line.unwrap().trim() {
            "spawn" => {
                std::process::Command::new("/bin/true").status().unwrap();
            }
            "report" => break,
            _ => {}
        }
    }
    writeln!(stdout, "sigchld={}", SIGCHLD_COUNT.load(Ordering::SeqCst)).unwrap();
}

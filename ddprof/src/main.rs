//! `main` is the C entry point (`#![no_main]`): the Rust runtime's start-up
//! would set SIGPIPE to "ignored", and an ignored signal stays ignored across
//! exec, so the command would not get the caller's SIGPIPE disposition.
//! (Under `cargo test` the test harness brings its own `main`.)
#![cfg_attr(not(test), no_main)]
#![cfg_attr(test, allow(dead_code))]

use ddprof::config::{self, Config, Origin};
use ddprof::logging::print_error;
use ddprof::profiler::Target;
use ddprof::{launch, logging};

/// The static (musl) build's allocator: musl's malloc is markedly slower
/// for the profiler's many small, short-lived allocations (docs/Benchmarks.md,
/// "Allocator of the static binary"); glibc's is kept where it is the libc.
#[cfg(target_env = "musl")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Exit status of a usage error (as clap uses).
const EXIT_USAGE: u8 = 2;
/// Exit status when the command is not run because how it must run (user,
/// capabilities) cannot be honoured.
const EXIT_NOT_RUN: u8 = 1;

#[cfg(not(test))]
#[unsafe(no_mangle)]
pub extern "C" fn main(argc: libc::c_int, argv: *const *const libc::c_char) -> libc::c_int {
    // process::exit flushes stdout as a normal return from Rust's main would.
    std::process::exit(run(command_line(argc, argv)).into())
}

/// The arguments, from `main`'s own: std finds them by itself only where
/// glibc hands them to its initialisers, and with `no_main` on musl (the
/// static build) `std::env::args` is empty.
#[cfg(not(test))]
fn command_line(argc: libc::c_int, argv: *const *const libc::c_char) -> Vec<std::ffi::OsString> {
    use std::os::unix::ffi::OsStrExt;
    (0..usize::try_from(argc).unwrap_or(0))
        .map(|index| {
            // SAFETY: the C runtime passes argc valid, NUL-terminated
            // strings in argv, which live as long as the process.
            let argument = unsafe { std::ffi::CStr::from_ptr(*argv.add(index)) };
            std::ffi::OsStr::from_bytes(argument.to_bytes()).to_os_string()
        })
        .collect()
}

fn run(arguments: Vec<std::ffi::OsString>) -> u8 {
    let config = match Config::load_from(arguments, |variable| std::env::var_os(variable)) {
        Ok(config) => config,
        // A bad command line: clap prints its message and exits 2 (and
        // prints `--help`/`--version` and exits 0).
        Err(error) => error.exit(),
    };
    let cli = &config.cli;
    logging::init(cli.log_level, &cli.log_mode);
    for warning in &config.warnings {
        log::warn!("{warning}");
    }
    let nothing_to_profile = cli.command.is_empty() && cli.pid.is_none() && !cli.global;
    if cli.print_config || (cli.show_config && nothing_to_profile) {
        print!("{}", config.to_toml());
        return match config.problems_line() {
            Some(problems) => {
                print_error(format_args!("error: {problems}"));
                EXIT_USAGE
            }
            None => 0,
        };
    }
    if cli.show_config {
        // Then profile as asked: stdout is the command's.
        eprint!("{}", config.to_toml());
    }
    if cli.check {
        let report = ddprof::check::run();
        for line in &report.lines {
            println!("{line}");
        }
        return if report.can_profile { 0 } else { 1 };
    }
    let launch_problem = config.launch_problem().filter(|_| !cli.command.is_empty());
    if let Some(problem) = launch_problem {
        print_error(format_args!(
            "error: {problem}: the command does not run (it must not run with more privileges than asked)"
        ));
        return EXIT_NOT_RUN;
    }
    // What the settings mean for each stage (every value was checked when
    // it was read: this cannot fail but for a bug). Unusable export
    // settings are a problem like a bad variable: the command still runs,
    // unprofiled.
    let (options, export_problem, events_problem) = match config::resolve(cli) {
        Ok(resolved) => {
            if !resolved.unavailable_events.is_empty() && resolved.events_problem.is_none() {
                log::warn!(
                    "not sampled by this ddprof yet, left out: {}; the other events are sampled",
                    resolved.unavailable_events.join(", ")
                );
            }
            for line in &resolved.left_out {
                log::warn!("{line}");
            }
            (
                resolved.options,
                resolved.export_problem,
                resolved.events_problem,
            )
        }
        Err(error) => {
            print_error(format_args!("error: {error}"));
            return EXIT_USAGE;
        }
    };
    let attach_target = match (cli.pid, cli.global) {
        (Some(pid), _) => Some(Target::Pid(pid as u32)),
        (None, true) => Some(Target::Global),
        (None, false) => None,
    };
    let export_problem = export_problem.map(|problem| problem.to_string());
    let events_problem = events_problem.map(|problem| format!("--event: {problem}"));
    let problems: Vec<String> = [config.problems_line(), export_problem, events_problem]
        .into_iter()
        .flatten()
        .collect();
    let problems = (!problems.is_empty()).then(|| problems.join("; "));
    match attach_target {
        Some(_) if !cli.command.is_empty() => {
            let typed =
                [config.origin("pid"), config.origin("global")].contains(&&Origin::CommandLine);
            if typed {
                print_error(format_args!(
                    "error: give either a COMMAND or -p/--global, not both"
                ));
                return EXIT_USAGE;
            }
            // -p/--global came from the file or the environment: the
            // command typed here still runs.
            let setting = if cli.pid.is_some() { "pid" } else { "global" };
            let reason = format!(
                "`{setting}` ({}) asks to profile another target, but a COMMAND was given",
                config.origin(setting).describe(setting)
            );
            launch::run_command(&options, Some(reason))
        }
        // Nothing else to run: the problems are errors.
        Some(_) if problems.is_some() => {
            print_error(format_args!(
                "error: {}",
                problems.as_deref().unwrap_or_default()
            ));
            EXIT_USAGE
        }
        Some(_) if !cli.enabled => {
            print_error(format_args!(
                "profiling is disabled (--enable false): nothing to do"
            ));
            0
        }
        Some(target) => match launch::attach(&options, target) {
            Ok(()) => 0,
            Err(error) => {
                print_error(format_args!("error: {error}"));
                1
            }
        },
        None if cli.command.is_empty() => {
            if let Some(problems) = problems {
                print_error(format_args!("error: {problems}"));
            }
            print_error(format_args!(
                "error: nothing to profile: give a COMMAND, -p PID or --global (see --help)"
            ));
            EXIT_USAGE
        }
        None => launch::run_command(&options, problems),
    }
}

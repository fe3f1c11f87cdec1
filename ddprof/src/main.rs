//! `main` is the C entry point (`#![no_main]`): the Rust runtime's start-up
//! would set SIGPIPE to "ignored", and an ignored signal stays ignored across
//! exec, so the command would not get the caller's SIGPIPE disposition.
//! (Under `cargo test` the test harness brings its own `main`.)
#![cfg_attr(not(test), no_main)]
#![cfg_attr(test, allow(dead_code))]

use ddprof::config::{Cli, ConfigError};
use ddprof::logging::print_error;
use ddprof::profiler::Target;
use ddprof::{launch, logging};

/// Exit status of a usage error (as clap uses).
const EXIT_USAGE: u8 = 2;

#[cfg(not(test))]
#[unsafe(no_mangle)]
pub extern "C" fn main(_argc: libc::c_int, _argv: *const *const libc::c_char) -> libc::c_int {
    // std reads the arguments itself (glibc hands them to its initialisers);
    // process::exit flushes stdout as a normal return from Rust's main would.
    std::process::exit(run().into())
}

fn run() -> u8 {
    let cli = match Cli::load() {
        Ok(cli) => cli,
        // clap prints its own message (and `--help`/`--version`) and exits.
        Err(ConfigError::Args(error)) => error.exit(),
        Err(error) => {
            print_error(format_args!("error: {error}"));
            return EXIT_USAGE;
        }
    };
    logging::init(cli.log_level, cli.log_mode);
    if cli.show_config {
        println!("{cli:#?}");
        return 0;
    }
    let attach_target = match (cli.pid, cli.global) {
        (Some(pid), _) => Some(Target::Pid(pid as u32)),
        (None, true) => Some(Target::Global),
        (None, false) => None,
    };
    match attach_target {
        Some(_) if !cli.command.is_empty() => {
            print_error(format_args!(
                "error: give either a COMMAND or -p/--global, not both"
            ));
            EXIT_USAGE
        }
        Some(_) if !cli.enabled => {
            print_error(format_args!(
                "profiling is disabled (--enable false): nothing to do"
            ));
            0
        }
        Some(target) => match launch::attach(&cli, target) {
            Ok(()) => 0,
            Err(error) => {
                print_error(format_args!("error: {error}"));
                1
            }
        },
        None if cli.command.is_empty() => {
            print_error(format_args!(
                "error: nothing to profile: give a COMMAND, -p PID or --global (see --help)"
            ));
            EXIT_USAGE
        }
        None => launch::run_command(&cli),
    }
}

use std::process::ExitCode;

use ddprof::config::{Cli, ConfigError};
use ddprof::profiler::Target;
use ddprof::{launch, logging};

/// Exit status of a usage error (as clap uses).
const EXIT_USAGE: u8 = 2;

fn main() -> ExitCode {
    let cli = match Cli::load() {
        Ok(cli) => cli,
        // clap prints its own message (and `--help`/`--version`) and exits.
        Err(ConfigError::Args(error)) => error.exit(),
        Err(error) => {
            eprintln!("ddprof: error: {error}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    logging::init(cli.log_level, cli.log_mode);
    if cli.show_config {
        println!("{cli:#?}");
        return ExitCode::SUCCESS;
    }
    let attach_target = match (cli.pid, cli.global) {
        (Some(pid), _) => Some(Target::Pid(pid as u32)),
        (None, true) => Some(Target::Global),
        (None, false) => None,
    };
    match attach_target {
        Some(_) if !cli.command.is_empty() => {
            eprintln!("ddprof: error: give either a COMMAND or -p/--global, not both");
            ExitCode::from(EXIT_USAGE)
        }
        Some(_) if !cli.enabled => {
            eprintln!("ddprof: profiling is disabled (--enable false): nothing to do");
            ExitCode::SUCCESS
        }
        Some(target) => match launch::attach(&cli, target) {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                eprintln!("ddprof: error: {error}");
                ExitCode::FAILURE
            }
        },
        None if cli.command.is_empty() => {
            eprintln!(
                "ddprof: error: nothing to profile: give a COMMAND, -p PID or --global (see --help)"
            );
            ExitCode::from(EXIT_USAGE)
        }
        None => launch::run_command(&cli),
    }
}

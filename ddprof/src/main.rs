use std::process::ExitCode;

use clap::Parser;
use ddprof::config::Cli;

fn main() -> ExitCode {
    let cli = Cli::parse();
    if cli.show_config {
        println!("{cli:#?}");
        return ExitCode::SUCCESS;
    }
    eprintln!("ddprof: not implemented yet");
    ExitCode::FAILURE
}

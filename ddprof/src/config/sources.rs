//! Where each setting comes from: the flag, else the config file, else the
//! environment variable, else the default.
//!
//! clap reads only the command line (its environment lookups are switched
//! off); every value from the file or the environment is then checked on its
//! own with the option's value parser, so that a bad one is named exactly
//! (`DD_PROFILING_UPLOAD_PERIOD`, or the file's key as written there) and does
//! not hide the others. The checked values are handed to clap as
//! `--name=value` flags in front of the command line, so the resulting
//! [`Cli`] is built by clap in one place.
//!
//! A bad command line is a usage error (the caller typed it and is there to
//! read the message). A bad file or environment value is a
//! [`ConfigProblem`]: the caller says it in one line and runs the command
//! unprofiled, because a profiler setting must not take a service down in a
//! container's entrypoint. The exception is a problem that hides how the
//! command must run ([`LAUNCH_SETTINGS`]): guessing there could run the
//! command with more privileges than asked.
use std::collections::HashMap;
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};

use clap::builder::{BoolishValueParser, TypedValueParser};
use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::parser::ValueSource;
use clap::{Arg, ArgAction, Command, CommandFactory, FromArgMatches};

use super::cpp::{parser_id, CPP_IGNORED, CPP_REFUSED, CPP_VARIABLES};
use super::Cli;

/// Options given only on the command line, never by a file or variable
/// (`config` has its own variable, read first).
const COMMAND_LINE_ONLY: &[&str] = &[
    "config",
    "help",
    "version",
    "command",
    "show_config",
    "print_config",
    "check",
];

/// The command line as parsed: [`Cli`] with the C++ ddprof's spellings as
/// hidden aliases, so that its command lines run unchanged: every long
/// option with `-` also with `_` (`--worker_period`, `--switch_user`), and
/// `-v` for `--version`.
pub fn command() -> Command {
    let mut command = Cli::command()
        // The C++ ddprof's way to turn the timeline off.
        .arg(
            Arg::new("no_timeline")
                .long("no-timeline")
                .hide(true)
                .action(ArgAction::SetTrue)
                .help("Same as --timeline false (the C++ ddprof's spelling)"),
        );
    // Accepted by the C++ ddprof, refused here with why (not as unknown).
    for (long, why) in CPP_REFUSED {
        command = command.arg(
            Arg::new(parser_id(long))
                .long(*long)
                .hide(true)
                .num_args(0..=1)
                .action(ArgAction::Set)
                .help(*why),
        );
    }
    for option in CPP_IGNORED {
        let arg = Arg::new(parser_id(option.long))
            .long(option.long)
            .hide(true)
            .help(option.why);
        command = command.arg(if option.takes_value {
            arg.num_args(1).action(ArgAction::Set)
        } else {
            arg.action(ArgAction::SetTrue)
        });
    }
    command.mut_args(|arg| {
        let underscored = arg
            .get_long()
            .filter(|long| long.contains('-'))
            .map(|long| long.replace('-', "_"));
        let arg = match underscored {
            Some(alias) => arg.alias(alias),
            None => arg,
        };
        if arg.get_id() == "version" {
            arg.short_alias('v')
        } else {
            arg
        }
    })
}

/// Settings that decide how the command runs. When one of them cannot be
/// known, the command does not run: running it as the caller when another
/// user was asked for, or with capabilities that were to be dropped, would
/// give it more privileges than asked.
pub const LAUNCH_SETTINGS: &[&str] = &["switch_user", "drop_capabilities"];

/// Settings still applied when file and environment values conflict: how the
/// command runs, and where ddprof's own messages go.
const ALWAYS_APPLIED: &[&str] = &["switch_user", "drop_capabilities", "log_level", "log_mode"];

/// Where a setting's value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    CommandLine,
    /// The config file, under `key` as written there.
    File {
        path: PathBuf,
        key: String,
    },
    Environment {
        variable: String,
    },
    Default,
}

impl Origin {
    /// `from --service`, `from /etc/ddprof.toml (service)`, `from DD_SERVICE`, `default`.
    pub fn describe(&self, long: &str) -> String {
        match self {
            Origin::CommandLine => format!("from --{long}"),
            Origin::File { path, key } => format!("from {} ({key})", path.display()),
            Origin::Environment { variable } => format!("from {variable}"),
            Origin::Default => "default".to_string(),
        }
    }
}

/// A setting from the config file or the environment that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigProblem {
    #[error("{variable}: invalid value `{value}`: {expected}")]
    Environment {
        setting: String,
        variable: String,
        value: String,
        expected: String,
    },
    #[error("config file {path}: `{key}`: invalid value `{value}`: {expected}")]
    FileValue {
        setting: String,
        path: PathBuf,
        key: String,
        value: String,
        expected: String,
    },
    #[error("config file {path}: unknown key `{key}` (keys are the long option names, e.g. `upload_period`)")]
    UnknownKey { path: PathBuf, key: String },
    #[error("config file {path}: `{key}` can only be given on the command line")]
    CommandLineOnly { path: PathBuf, key: String },
    #[error("cannot read the config file {path}: {reason}")]
    Unreadable { path: PathBuf, reason: String },
    #[error(
        "config file {path} is not valid TOML: {reason}{}",
        if *.names_launch_setting { " (and it names switch_user or drop_capabilities)" } else { "" }
    )]
    NotToml {
        path: PathBuf,
        reason: String,
        /// Whether its text names a [`LAUNCH_SETTINGS`] key: the file may
        /// set it, but what to cannot be known.
        names_launch_setting: bool,
    },
    #[error("settings from the config file or the environment conflict: {0}")]
    Conflict(String),
}

impl ConfigProblem {
    /// Whether this problem hides how the command must run (a
    /// [`LAUNCH_SETTINGS`] value that is invalid, or that a file which
    /// cannot be parsed may set).
    pub fn hides_launch_setting(&self) -> bool {
        match self {
            ConfigProblem::Environment { setting, .. }
            | ConfigProblem::FileValue { setting, .. } => {
                LAUNCH_SETTINGS.contains(&setting.as_str())
            }
            ConfigProblem::NotToml {
                names_launch_setting,
                ..
            } => *names_launch_setting,
            _ => false,
        }
    }
}

/// The resolved settings, where each came from, and what could not be used.
#[derive(Debug, Clone)]
pub struct Config {
    pub cli: Cli,
    /// By option id (the `Cli` field name).
    origins: HashMap<String, Origin>,
    pub problems: Vec<ConfigProblem>,
    /// Said once logging is set up; nothing the command's run depends on
    /// (a `./ddprof.toml` that is not safe to read, left out).
    pub warnings: Vec<String>,
}

impl Config {
    /// Reads this process's command line, config file and environment.
    pub fn load() -> Result<Config, clap::Error> {
        Self::load_from(std::env::args_os(), |variable| std::env::var_os(variable))
    }

    /// [`Config::load`] with explicit arguments (the first is the program
    /// name) and environment. `Err` is a command-line usage error, or
    /// `--help`/`--version` (clap prints and exits).
    pub fn load_from<I, T>(
        args: I,
        environment: impl Fn(&str) -> Option<OsString>,
    ) -> Result<Config, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString>,
    {
        let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
        let documented = command();
        let parser = documented.clone().mut_args(|arg| arg.env(None));
        let command_line = match parser.clone().try_get_matches_from(&args) {
            Ok(matches) => matches,
            Err(error)
                if matches!(
                    error.kind(),
                    ErrorKind::DisplayHelp | ErrorKind::DisplayVersion
                ) =>
            {
                // Rendered again with the `[env: …]` lines of the help.
                return Err(documented
                    .try_get_matches_from(&args)
                    .err()
                    .unwrap_or(error));
            }
            Err(error) => return Err(error),
        };
        // Empty variables count as unset (`DD_SERVICE=` in a container spec).
        let variable_value =
            |variable: &str| environment(variable).filter(|value| !value.is_empty());
        // The setting's variable, else the C++ ddprof's, whichever is set
        // first, with its value.
        let variable_of = |id: &str| {
            let ours = documented
                .get_arguments()
                .find(|arg| arg.get_id().as_str() == id)
                .and_then(Arg::get_env)
                .and_then(OsStr::to_str)
                .map(str::to_string);
            let theirs = CPP_VARIABLES
                .iter()
                .filter(|(setting, _)| *setting == id)
                .map(|(_, variable)| variable.to_string());
            ours.into_iter().chain(theirs).find_map(|variable| {
                let value = variable_value(&variable)?;
                Some((variable, value))
            })
        };

        let mut origins = HashMap::new();
        let mut problems = Vec::new();
        let config_path = match command_line.get_one::<PathBuf>("config") {
            Some(path) => {
                origins.insert("config".to_string(), Origin::CommandLine);
                Some(path.clone())
            }
            None => variable_of("config").map(|(variable, path)| {
                origins.insert("config".to_string(), Origin::Environment { variable });
                PathBuf::from(path)
            }),
        };
        // No file named: the C++ ddprof's default, `./ddprof.toml`, when
        // there is one that its owner and mode make safe to read.
        let mut warnings = Vec::new();
        let mut default_file_read = false;
        let mut file_values = HashMap::new();
        match &config_path {
            Some(path) => match open_config_file(path, false) {
                Ok(Some(text)) => {
                    file_values = read_config_text(&parser, path, &text, &mut problems)
                }
                missing_or_unreadable => problems.push(ConfigProblem::Unreadable {
                    path: path.to_path_buf(),
                    reason: missing_or_unreadable
                        .err()
                        .unwrap_or_else(|| "no such file".to_string()),
                }),
            },
            None => match open_config_file(Path::new(DEFAULT_CONFIG_FILE), true) {
                Ok(Some(text)) => {
                    default_file_read = true;
                    file_values = read_config_text(
                        &parser,
                        Path::new(DEFAULT_CONFIG_FILE),
                        &text,
                        &mut problems,
                    );
                }
                Ok(None) => {}
                Err(reason) => warnings.push(format!(
                    "{DEFAULT_CONFIG_FILE} left out: {reason}; name it with --config to read \
                     it anyway"
                )),
            },
        }

        for (long, why) in CPP_REFUSED {
            let id = parser_id(long);
            if command_line.value_source(&id) == Some(ValueSource::CommandLine)
                || file_values.contains_key(&id)
            {
                return Err(documented.clone().error(
                    ErrorKind::UnknownArgument,
                    format!("--{long}, an option of the C++ ddprof: {why}"),
                ));
            }
        }
        // (option id, flag) for clap, file and environment values alike.
        let mut injected: Vec<(String, OsString)> = Vec::new();
        for arg in parser.get_arguments() {
            let id = arg.get_id().as_str();
            if COMMAND_LINE_ONLY.contains(&id) || arg.get_long().is_none() {
                continue;
            }
            if command_line.value_source(id) == Some(ValueSource::CommandLine) {
                origins.insert(id.to_string(), Origin::CommandLine);
                continue;
            }
            let origin = if let Some((path, key, value)) = file_values.remove(id) {
                let checked = file_value_text(&value).and_then(|text| check(&parser, arg, &text));
                match checked {
                    Ok(flag) => {
                        injected.extend(flag.map(|flag| (id.to_string(), flag)));
                        Origin::File { path, key }
                    }
                    Err(expected) => {
                        problems.push(ConfigProblem::FileValue {
                            setting: id.to_string(),
                            path,
                            key,
                            value: match &value {
                                toml::Value::String(text) => text.clone(),
                                other => other.to_string(),
                            },
                            expected,
                        });
                        Origin::Default
                    }
                }
            } else if let Some((variable, value)) = variable_of(id) {
                match check(&parser, arg, &value) {
                    Ok(flag) => {
                        injected.extend(flag.map(|flag| (id.to_string(), flag)));
                        Origin::Environment { variable }
                    }
                    Err(expected) => {
                        problems.push(ConfigProblem::Environment {
                            setting: id.to_string(),
                            variable,
                            value: value.to_string_lossy().into_owned(),
                            expected,
                        });
                        Origin::Default
                    }
                }
            } else {
                Origin::Default
            };
            origins.insert(id.to_string(), origin);
        }
        // `--preset` gives the events when `--event` is not set: one typed
        // on the command line outranks events from the file or the
        // environment, as any flag outranks them.
        if command_line.value_source("preset") == Some(ValueSource::CommandLine)
            && command_line.value_source("events") != Some(ValueSource::CommandLine)
            && injected.iter().any(|(id, _)| id == "events")
        {
            injected.retain(|(id, _)| id != "events");
            origins.insert("events".to_string(), Origin::Default);
        }

        let with = |flags: &mut dyn Iterator<Item = &OsString>| {
            let mut merged: Vec<OsString> = args.first().cloned().into_iter().collect();
            merged.extend(flags.cloned());
            merged.extend(args.iter().skip(1).cloned());
            parser.clone().try_get_matches_from(merged)
        };
        let matches = match with(&mut injected.iter().map(|(_, flag)| flag)) {
            Ok(matches) => matches,
            // Each value is valid on its own: some go badly together (e.g.
            // `DD_PROFILING_PID` with `global = true`).
            Err(error) => {
                problems.push(ConfigProblem::Conflict(clap_message(&error)));
                let kept = injected
                    .iter()
                    .filter(|(id, _)| ALWAYS_APPLIED.contains(&id.as_str()))
                    .map(|(_, flag)| flag);
                with(&mut kept.into_iter()).unwrap_or(command_line)
            }
        };
        for option in CPP_IGNORED {
            let id = parser_id(option.long);
            if matches
                .value_source(&id)
                .is_some_and(|source| source != ValueSource::DefaultValue)
            {
                let value = match option.takes_value {
                    true => matches
                        .get_one::<String>(&id)
                        .map(|value| format!(" {value}"))
                        .unwrap_or_default(),
                    false => String::new(),
                };
                warnings.push(format!(
                    "ignored: --{}{value}, an option of the C++ ddprof ({})",
                    option.long, option.why
                ));
            }
        }
        let mut cli = Cli::from_arg_matches(&matches)?;
        if matches.get_flag("no_timeline") {
            cli.timeline = false;
            origins.insert("timeline".to_string(), Origin::CommandLine);
        }
        if default_file_read {
            cli.config = Some(PathBuf::from(DEFAULT_CONFIG_FILE));
        }
        Ok(Config {
            cli,
            origins,
            problems,
            warnings,
        })
    }

    /// Where the setting `id` (a `Cli` field name) came from.
    pub fn origin(&self, id: &str) -> &Origin {
        self.origins.get(id).unwrap_or(&Origin::Default)
    }

    /// A problem that hides how the command must run: the command must not
    /// run at all.
    pub fn launch_problem(&self) -> Option<&ConfigProblem> {
        self.problems
            .iter()
            .find(|problem| problem.hides_launch_setting())
    }

    /// Every problem, in one line.
    pub fn problems_line(&self) -> Option<String> {
        if self.problems.is_empty() {
            return None;
        }
        let described: Vec<String> = self.problems.iter().map(ToString::to_string).collect();
        Some(described.join("; "))
    }

    /// The resolved settings as TOML (usable as a config file), each with
    /// where it came from as a trailing comment.
    pub fn to_toml(&self) -> String {
        let values = toml::Table::try_from(&self.cli).unwrap_or_default();
        let mut text = String::from(
            "# ddprof settings and where each came from \
             (precedence: flag > config file > environment > default)\n",
        );
        match (&self.cli.config, self.origin("config")) {
            (Some(path), origin) => text.push_str(&format!(
                "# config file: {} ({})\n",
                path.display(),
                origin.describe("config")
            )),
            (None, _) => text.push_str("# config file: none\n"),
        }
        for arg in command().get_arguments() {
            let id = arg.get_id().as_str();
            let Some(long) = arg.get_long() else { continue };
            if COMMAND_LINE_ONLY.contains(&id) {
                continue;
            }
            let key = long.replace('-', "_");
            let origin = self.origin(id);
            match values.get(id) {
                Some(value) => {
                    text.push_str(&format!("{key} = {value}  # {}\n", origin.describe(long)))
                }
                // Hidden options are shown only when set.
                None if arg.is_hide_set() => {}
                None => text.push_str(&format!("# {key} is not set\n")),
            }
        }
        if !self.cli.command.is_empty() {
            text.push_str(&format!("# command: {}\n", self.cli.command.join(" ")));
        }
        for problem in &self.problems {
            text.push_str(&format!("# not used: {problem}\n"));
        }
        text
    }
}

/// The C++ ddprof's config file when none is named: read if present.
pub const DEFAULT_CONFIG_FILE: &str = "./ddprof.toml";
/// Config files longer than this are refused: settings take a few hundred
/// bytes, and whatever sits at the path is read whole.
const MAX_CONFIG_BYTES: u64 = 1 << 20;

/// The text of the config file at `path`; `Ok(None)` when there is none.
/// Never waits (a FIFO or a device is refused, not read) and reads at most
/// [`MAX_CONFIG_BYTES`]. The `implicit` default file, which nobody named,
/// is taken only if it is no link and belongs to root or to this user with
/// nobody else allowed to write it: `./ddprof.toml` in a shared directory
/// (`/tmp`) could otherwise be anyone's settings for a profiler that runs as
/// root (`switch_user`, `--output` paths, upload endpoints).
fn open_config_file(path: &Path, implicit: bool) -> Result<Option<String>, String> {
    use std::io::Read;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let mut flags = libc::O_NONBLOCK | libc::O_CLOEXEC;
    if implicit {
        flags |= libc::O_NOFOLLOW;
    }
    let file = match std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags)
        .open(path)
    {
        Ok(file) => file,
        Err(error) if implicit && error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) if implicit && error.raw_os_error() == Some(libc::ELOOP) => {
            return Err("it is a symbolic link".to_string())
        }
        Err(error) => return Err(error.to_string()),
    };
    let metadata = file.metadata().map_err(|error| error.to_string())?;
    if !metadata.is_file() {
        return Err("not a regular file".to_string());
    }
    if metadata.len() > MAX_CONFIG_BYTES {
        return Err(format!(
            "{} bytes, more than the {} KiB a config file may have",
            metadata.len(),
            MAX_CONFIG_BYTES >> 10
        ));
    }
    if implicit {
        let me = nix::unistd::geteuid().as_raw();
        if metadata.uid() != 0 && metadata.uid() != me {
            return Err(format!(
                "it belongs to uid {}, neither root nor this user (uid {me})",
                metadata.uid()
            ));
        }
        if metadata.mode() & 0o022 != 0 {
            return Err(format!(
                "others may write it (mode {:o}; chmod go-w)",
                metadata.mode() & 0o7777
            ));
        }
    }
    let mut text = String::new();
    file.take(MAX_CONFIG_BYTES)
        .read_to_string(&mut text)
        .map_err(|error| error.to_string())?;
    Ok(Some(text))
}

/// The config file's settings by option id: `(path, key as written, value)`.
/// Unknown keys and text that is not TOML are problems.
fn read_config_text(
    parser: &Command,
    path: &Path,
    text: &str,
    problems: &mut Vec<ConfigProblem>,
) -> HashMap<String, (PathBuf, String, toml::Value)> {
    let mut settings = HashMap::new();
    let table: toml::Table = match text.parse() {
        Ok(table) => table,
        Err(error) => {
            let error: toml::de::Error = error;
            // The file's other settings are unknown; whether it tries to set
            // a launch setting can still be told from its text.
            let names_launch_setting = LAUNCH_SETTINGS
                .iter()
                .any(|id| text.contains(id) || text.contains(&id.replace('_', "-")));
            problems.push(ConfigProblem::NotToml {
                path: path.to_path_buf(),
                reason: toml_error_line(&error, text),
                names_launch_setting,
            });
            return settings;
        }
    };
    for (key, value) in table {
        let long = key.replace('_', "-");
        let arg = parser
            .get_arguments()
            .find(|arg| arg.get_long() == Some(long.as_str()));
        match arg.map(|arg| arg.get_id().as_str()) {
            None => problems.push(ConfigProblem::UnknownKey {
                path: path.to_path_buf(),
                key,
            }),
            Some(id) if COMMAND_LINE_ONLY.contains(&id) => {
                problems.push(ConfigProblem::CommandLineOnly {
                    path: path.to_path_buf(),
                    key,
                })
            }
            Some(id) => {
                settings.insert(id.to_string(), (path.to_path_buf(), key, value));
            }
        }
    }
    settings
}

/// A file value as the text a flag would carry.
fn file_value_text(value: &toml::Value) -> Result<OsString, String> {
    match value {
        toml::Value::String(text) => Ok(text.into()),
        toml::Value::Integer(number) => Ok(number.to_string().into()),
        toml::Value::Float(number) => Ok(number.to_string().into()),
        toml::Value::Boolean(flag) => Ok(flag.to_string().into()),
        other => Err(format!(
            "expected a string, a number or a boolean, not a TOML {}",
            other.type_str()
        )),
    }
}

/// Checks one value with the option's own parser; returns the flag that
/// sets it (None when it changes nothing), or what was expected.
fn check(parser: &Command, arg: &Arg, value: &OsStr) -> Result<Option<OsString>, String> {
    let long = arg.get_long().unwrap_or_default();
    if matches!(arg.get_action(), ArgAction::SetTrue) {
        let on = BoolishValueParser::new()
            .parse_ref(parser, Some(arg), value)
            .map_err(|error| expected(&error))?;
        return Ok(on.then(|| format!("--{long}").into()));
    }
    let mut flag = OsString::from(format!("--{long}="));
    flag.push(value);
    parser
        .clone()
        .try_get_matches_from([OsString::from("ddprof"), flag.clone()])
        .map_err(|error| expected(&error))?;
    // The default changes nothing, and must not make clap see e.g.
    // `global = false` as conflicting with `-p`.
    let is_default = arg
        .get_default_values()
        .iter()
        .any(|default| default.as_os_str() == value);
    Ok((!is_default).then_some(flag))
}

/// What a value parser expected, from its error.
fn expected(error: &clap::Error) -> String {
    if let Some(source) = std::error::Error::source(error) {
        return source.to_string();
    }
    if let Some(ContextValue::Strings(values)) = error.get(ContextKind::ValidValue) {
        return match values.split_last() {
            Some((last, [])) => format!("expected {last}"),
            Some((last, rest)) => format!("expected {} or {last}", rest.join(", ")),
            None => clap_message(error),
        };
    }
    clap_message(error)
}

/// clap's message on one line, without its `error: ` prefix.
fn clap_message(error: &clap::Error) -> String {
    let rendered = error.render().to_string();
    let first_line = rendered.lines().next().unwrap_or_default();
    first_line
        .strip_prefix("error: ")
        .unwrap_or(first_line)
        .to_string()
}

/// A TOML error on one line: `line L, column C: message`.
fn toml_error_line(error: &toml::de::Error, text: &str) -> String {
    let message = error.message().trim();
    match error.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let column = before.chars().rev().take_while(|c| *c != '\n').count() + 1;
            format!("line {line}, column {column}: {message}")
        }
        None => message.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::logging::LogLevel;

    /// Loads with `environment` as the only variables.
    fn load(args: &[&str], environment: &[(&str, &str)]) -> Result<Config, clap::Error> {
        let environment: HashMap<String, OsString> = environment
            .iter()
            .map(|(name, value)| (name.to_string(), OsString::from(value)))
            .collect();
        Config::load_from(
            std::iter::once("ddprof").chain(args.iter().copied()),
            |name| environment.get(name).cloned(),
        )
    }

    fn write_config(name: &str, text: &str) -> PathBuf {
        let path =
            std::env::temp_dir().join(format!("ddprof-config-{}-{name}.toml", std::process::id()));
        std::fs::write(&path, text).unwrap();
        path
    }

    /// Every C++-only option, in both spellings, before a command: parsed
    /// (never a panic, never the command taken as its value), one warning
    /// each; the refused ones are usage errors saying what to do.
    #[test]
    fn the_cpp_ddprofs_options_without_a_meaning_here_are_ignored_each_in_one_line() {
        for option in CPP_IGNORED {
            for long in [option.long.to_string(), option.long.replace('-', "_")] {
                let flag = format!("--{long}");
                let mut args = vec![flag.as_str()];
                if option.takes_value {
                    args.push("1");
                }
                args.extend(["sh", "-c", "true"]);
                let config = load(&args, &[]).unwrap_or_else(|error| panic!("{args:?}: {error}"));
                assert_eq!(config.cli.command, ["sh", "-c", "true"], "{args:?}");
                assert_eq!(config.warnings.len(), 1, "{args:?}: {:?}", config.warnings);
                assert!(
                    config.warnings[0].starts_with(&format!("ignored: --{}", option.long)),
                    "{:?}",
                    config.warnings
                );
            }
        }
        for (long, why) in CPP_REFUSED {
            let flag = format!("--{}", long.replace('-', "_"));
            let error = load(&[&flag, "x", "true"], &[]).expect_err("refused");
            assert_eq!(error.kind(), ErrorKind::UnknownArgument);
            assert!(error.to_string().contains(why), "{error}");
        }
        let config = load(&["--no-timeline", "true"], &[]).unwrap();
        assert!(!config.cli.timeline);
        assert_eq!(config.cli.command, ["true"]);
    }

    /// `./ddprof.toml`, which nobody named, is read only when it is safe
    /// to: a regular file, no link, root's or this user's, that nobody else
    /// may write; a file named with `--config` may be a link (a Kubernetes
    /// config map is one). Neither waits on a FIFO.
    #[test]
    fn the_implicit_config_file_is_read_only_when_nobody_else_controls_it() {
        use std::os::unix::fs::PermissionsExt;
        let dir =
            std::env::temp_dir().join(format!("ddprof-config-{}-implicit", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("ddprof.toml");
        std::fs::write(&file, "service = \"mine\"\n").unwrap();
        let mode = |mode: u32| {
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(mode)).unwrap()
        };
        mode(0o644);
        assert_eq!(
            open_config_file(&file, true),
            Ok(Some("service = \"mine\"\n".to_string()))
        );
        for writable in [0o664, 0o646] {
            mode(writable);
            let refused = open_config_file(&file, true).unwrap_err();
            assert!(refused.contains("others may write it"), "{refused}");
            // Named, it is the user's choice.
            assert!(open_config_file(&file, false).unwrap().is_some());
        }
        mode(0o644);
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&file, Some(65534), None).unwrap();
            let refused = open_config_file(&file, true).unwrap_err();
            assert!(
                refused.contains("belongs to uid 65534, neither root nor this user"),
                "{refused}"
            );
            std::os::unix::fs::chown(&file, Some(0), None).unwrap();
        }
        let link = dir.join("link.toml");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        assert_eq!(
            open_config_file(&link, true),
            Err("it is a symbolic link".to_string())
        );
        assert!(open_config_file(&link, false).unwrap().is_some());
        let fifo = dir.join("fifo.toml");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        for implicit in [true, false] {
            assert_eq!(
                open_config_file(&fifo, implicit),
                Err("not a regular file".to_string())
            );
        }
        let big = dir.join("big.toml");
        std::fs::write(&big, vec![b'#'; (MAX_CONFIG_BYTES + 1) as usize]).unwrap();
        assert!(open_config_file(&big, false)
            .unwrap_err()
            .contains("more than the 1024 KiB"));
        let missing = dir.join("missing.toml");
        assert_eq!(open_config_file(&missing, true), Ok(None));
        assert!(open_config_file(&missing, false).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn flags_override_the_file_which_overrides_the_environment() {
        let path = write_config(
            "precedence",
            "service = \"from-file\"\nenvironment = \"file-env\"\nupload_period = 10\nshow-samples = true\n",
        );
        let config = load(
            &[
                "--config",
                path.to_str().unwrap(),
                "-E",
                "flag-env",
                "--",
                "true",
            ],
            &[
                ("DD_SERVICE", "from-variable"),
                ("DD_VERSION", "1.2"),
                ("DD_PROFILING_UPLOAD_PERIOD", "20"),
            ],
        )
        .unwrap();
        assert!(config.problems.is_empty(), "{:?}", config.problems);
        let cli = &config.cli;
        assert_eq!(cli.environment.as_deref(), Some("flag-env"));
        assert_eq!(cli.service.as_deref(), Some("from-file"));
        assert_eq!(cli.upload_period, 10);
        assert!(cli.show_samples);
        assert_eq!(cli.service_version.as_deref(), Some("1.2"));
        assert_eq!(
            cli.stack_sample_size,
            crate::config::DEFAULT_STACK_SAMPLE_SIZE
        );
        assert_eq!(cli.command, ["true"]);
        assert_eq!(config.origin("environment"), &Origin::CommandLine);
        assert_eq!(
            config.origin("service"),
            &Origin::File {
                path: path.clone(),
                key: "service".into()
            }
        );
        assert_eq!(
            config.origin("service_version"),
            &Origin::Environment {
                variable: "DD_VERSION".into()
            }
        );
        assert_eq!(config.origin("stack_sample_size"), &Origin::Default);
        // The file may also come from DD_PROFILING_CONFIG.
        let config = load(
            &["true"],
            &[
                ("DD_PROFILING_CONFIG", path.to_str().unwrap()),
                ("DD_SERVICE", "x"),
            ],
        )
        .unwrap();
        assert_eq!(config.cli.service.as_deref(), Some("from-file"));
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn the_cpp_ddprofs_spellings_are_accepted() {
        // Its README's and docs' command lines: underscores, `informational`.
        let config = load(
            &[
                "--worker_period",
                "15",
                "--stack_sample_size=16384",
                "--upload_period",
                "30",
                "-l",
                "informational",
                "--switch_user",
                "nobody",
                "./app",
            ],
            &[],
        )
        .unwrap();
        assert_eq!(config.cli.worker_period, 15);
        assert_eq!(config.cli.stack_sample_size, 16384);
        assert_eq!(config.cli.upload_period, 30);
        assert_eq!(config.cli.log_level, LogLevel::Info);
        assert_eq!(config.cli.switch_user.as_deref(), Some("nobody"));
        assert_eq!(config.origin("worker_period"), &Origin::CommandLine);
        assert_eq!(config.cli.command, vec!["./app".to_string()]);
        // After the command, `_` options are the command's own.
        let config = load(&["./app", "--worker_period", "1"], &[]).unwrap();
        assert_eq!(config.cli.command, ["./app", "--worker_period", "1"]);
        assert_eq!(config.cli.worker_period, 240);
        // `-v` is `--version`.
        let error = load(&["-v"], &[]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::DisplayVersion);
    }

    #[test]
    fn a_preset_flag_outranks_events_from_the_environment() {
        let environment = [("DD_PROFILING_NATIVE_EVENTS", "sCPU freq=499")];
        let config = load(&["--preset", "cpu_only", "true"], &environment).unwrap();
        assert_eq!(config.cli.events, None);
        assert_eq!(config.origin("events"), &Origin::Default);
        // An `--event` flag still wins over a preset, and a preset from the
        // environment does not outrank the environment's events.
        let config = load(
            &["--preset", "cpu_only", "-e", "sCPU freq=199", "true"],
            &environment,
        )
        .unwrap();
        assert_eq!(config.cli.events.as_deref(), Some("sCPU freq=199"));
        let config = load(
            &["true"],
            &[
                ("DD_PROFILING_NATIVE_EVENTS", "sCPU freq=499"),
                ("DD_PROFILING_NATIVE_PRESET", "cpu_only"),
            ],
        )
        .unwrap();
        assert_eq!(config.cli.events.as_deref(), Some("sCPU freq=499"));
    }

    #[test]
    fn the_cpp_ddprofs_variables_are_read_when_ours_are_not_set() {
        let config = load(
            &["true"],
            &[
                ("DD_PROFILING_NATIVE_LOG_LEVEL", "debug"),
                ("DD_PROFILING_NATIVE_LOG_MODE", "/var/log/ddprof.log"),
            ],
        )
        .unwrap();
        assert_eq!(config.cli.log_level, LogLevel::Debug);
        assert_eq!(
            config.cli.log_mode,
            crate::logging::LogMode::File("/var/log/ddprof.log".into())
        );
        assert_eq!(
            config.origin("log_level"),
            &Origin::Environment {
                variable: "DD_PROFILING_NATIVE_LOG_LEVEL".into()
            }
        );
        // Ours first when both are set; an empty one is unset.
        let config = load(
            &["true"],
            &[
                ("DD_PROFILING_LOG_LEVEL", "error"),
                ("DD_PROFILING_NATIVE_LOG_LEVEL", "debug"),
                ("DD_PROFILING_LOG_MODE", ""),
                ("DD_PROFILING_NATIVE_LOG_MODE", "stdout"),
            ],
        )
        .unwrap();
        assert_eq!(config.cli.log_level, LogLevel::Error);
        assert_eq!(config.cli.log_mode, crate::logging::LogMode::Stdout);
        // A bad value names the variable it came from.
        let config = load(&["true"], &[("DD_PROFILING_NATIVE_LOG_LEVEL", "loud")]).unwrap();
        let line = config.problems_line().unwrap();
        assert!(
            line.starts_with("DD_PROFILING_NATIVE_LOG_LEVEL: invalid value `loud`"),
            "{line}"
        );
        // Variables whose C++ values differ from ours are not read.
        let config = load(&["true"], &[("DD_PROFILING_TIMELINE_ENABLE", "yes")]).unwrap();
        assert!(config.problems.is_empty());
        assert!(config.cli.timeline);
    }

    #[test]
    fn unknown_options_before_the_command_are_usage_errors() {
        let error = load(&["--foo", "--", "true"], &[]).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::UnknownArgument);
        assert!(error.to_string().contains("--foo"), "{error}");
        // After the command (or `--`), options are the command's own.
        let config = load(&["ls", "-l", "--foo", "-p", "1"], &[]).unwrap();
        assert_eq!(config.cli.command, ["ls", "-l", "--foo", "-p", "1"]);
        assert_eq!(config.cli.pid, None);
        let config = load(&["-u", "5", "--", "--foo"], &[]).unwrap();
        assert_eq!(config.cli.command, ["--foo"]);
        assert_eq!(config.cli.upload_period, 5);
    }

    #[test]
    fn flag_errors_say_what_was_expected() {
        let error = load(&["--nice", "40", "true"], &[])
            .unwrap_err()
            .to_string();
        assert!(error.contains("--nice"), "{error}");
        assert!(
            error.contains("expected a niceness from -20 to 19"),
            "{error}"
        );
        let error = load(&["-e", "sFOO", "true"], &[]).unwrap_err().to_string();
        assert!(error.contains("--event"), "{error}");
        let error = load(&["-T", "notakeyvalue", "true"], &[])
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("`notakeyvalue` is not a key:value tag"),
            "{error}"
        );
    }

    #[test]
    fn bad_environment_values_are_problems_naming_the_variable() {
        let config = load(
            &["sh", "-c", "exit 3"],
            &[
                ("DD_PROFILING_UPLOAD_PERIOD", "soon"),
                ("DD_TAGS", "notakeyvalue"),
                ("DD_SERVICE", "kept"),
                ("DD_ENV", ""),
            ],
        )
        .unwrap();
        let problems: Vec<String> = config.problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            problems,
            [
                "DD_TAGS: invalid value `notakeyvalue`: `notakeyvalue` is not a key:value tag \
                 (expected key:value pairs separated by commas, e.g. team:core,region:eu)",
                "DD_PROFILING_UPLOAD_PERIOD: invalid value `soon`: expected a number of seconds from 1 to 3600",
            ]
        );
        assert!(config.launch_problem().is_none());
        // The others still apply; the command is intact.
        assert_eq!(config.cli.service.as_deref(), Some("kept"));
        assert_eq!(config.cli.environment, None, "empty counts as unset");
        assert_eq!(config.cli.upload_period, 59);
        assert_eq!(config.cli.command, ["sh", "-c", "exit 3"]);
        let line = config.problems_line().unwrap();
        assert!(!line.contains('\n'), "{line}");
    }

    #[test]
    fn bad_config_files_are_problems_naming_the_key() {
        let path = write_config(
            "bad-values",
            "upload_period = 0\nno_such_option = 1\ntags = [1, 2]\nshow_config = true\nlog-level = \"loud\"\n",
        );
        let config = load(&["--config", path.to_str().unwrap(), "true"], &[]).unwrap();
        let file = path.display();
        let problems: Vec<String> = config.problems.iter().map(ToString::to_string).collect();
        assert!(problems.contains(&format!(
            "config file {file}: `upload_period`: invalid value `0`: expected a number of seconds from 1 to 3600"
        )), "{problems:?}");
        assert!(problems.contains(&format!(
            "config file {file}: unknown key `no_such_option` (keys are the long option names, e.g. `upload_period`)"
        )), "{problems:?}");
        assert!(problems.contains(&format!(
            "config file {file}: `tags`: invalid value `[1, 2]`: expected a string, a number or a boolean, not a TOML array"
        )), "{problems:?}");
        assert!(
            problems.contains(&format!(
                "config file {file}: `show_config` can only be given on the command line"
            )),
            "{problems:?}"
        );
        assert!(problems.contains(&format!(
            "config file {file}: `log-level`: invalid value `loud`: expected error, warn, notice, info or debug"
        )), "{problems:?}");
        assert_eq!(problems.len(), 5, "{problems:?}");
        assert!(!config.cli.show_config);
        assert!(config.launch_problem().is_none());

        std::fs::write(&path, "service = \"a\"\nenvironment = \n").unwrap();
        let config = load(&["--config", path.to_str().unwrap(), "true"], &[]).unwrap();
        let problem = config.problems_line().unwrap();
        assert!(
            problem.starts_with(&format!(
                "config file {file} is not valid TOML: line 2, column "
            )),
            "{problem}"
        );
        assert!(config.launch_problem().is_none());

        // A file that cannot be parsed and names a launch setting may ask
        // for another user: what it asks cannot be known.
        std::fs::write(&path, "switch_user = nobody\n").unwrap();
        let config = load(&["--config", path.to_str().unwrap(), "true"], &[]).unwrap();
        assert!(config.launch_problem().is_some(), "{:?}", config.problems);

        let missing = path.with_extension("missing");
        let config = load(&["--config", missing.to_str().unwrap(), "true"], &[]).unwrap();
        assert!(
            config
                .problems_line()
                .unwrap()
                .starts_with("cannot read the config file"),
            "{:?}",
            config.problems
        );
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn launch_settings_that_cannot_be_known_stop_the_launch() {
        let config = load(&["true"], &[("DD_PROFILING_DROP_CAPABILITIES", "maybe")]).unwrap();
        assert_eq!(
            config.launch_problem().map(ToString::to_string).as_deref(),
            Some("DD_PROFILING_DROP_CAPABILITIES: invalid value `maybe`: expected true or false")
        );
        let config = load(
            &["true"],
            &[("DD_PROFILING_SWITCH_USER", "no-such-user-ddprof")],
        )
        .unwrap();
        assert_eq!(
            config.launch_problem().map(ToString::to_string).as_deref(),
            Some("DD_PROFILING_SWITCH_USER: invalid value `no-such-user-ddprof`: no user `no-such-user-ddprof` on this machine")
        );
        // Typed on the command line, it is a usage error.
        let error = load(&["--switch-user", "no-such-user-ddprof", "true"], &[]).unwrap_err();
        assert!(
            error.to_string().contains("no user `no-such-user-ddprof`"),
            "{error}"
        );
        let config = load(&["true"], &[("DD_PROFILING_SWITCH_USER", "nobody")]).unwrap();
        assert_eq!(config.cli.switch_user.as_deref(), Some("nobody"));
    }

    #[test]
    fn conflicting_values_are_a_problem_and_launch_settings_still_apply() {
        let path = write_config("conflict", "global = true\nlog_level = \"debug\"\n");
        let config = load(
            &["--config", path.to_str().unwrap()],
            &[
                ("DD_PROFILING_PID", "1"),
                ("DD_PROFILING_SWITCH_USER", "nobody"),
            ],
        )
        .unwrap();
        assert!(
            matches!(config.problems.as_slice(), [ConfigProblem::Conflict(message)] if message.contains("--pid")),
            "{:?}",
            config.problems
        );
        assert_eq!((config.cli.pid, config.cli.global), (None, false));
        assert_eq!(config.cli.switch_user.as_deref(), Some("nobody"));
        assert_eq!(config.cli.log_level, LogLevel::Debug);
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn shown_settings_are_toml_with_their_origin() {
        let path = write_config("shown", "upload_period = 10\nevent = \"sCPU freq=999\"\n");
        let config = load(
            &[
                "--config",
                path.to_str().unwrap(),
                "-I",
                "--nice",
                "-5",
                "--",
                "make",
                "-j2",
            ],
            &[
                ("DD_SERVICE", "checkout"),
                ("DD_PROFILING_UPLOAD_PERIOD", "30"),
            ],
        )
        .unwrap();
        let text = config.to_toml();
        let table: toml::Table = text
            .parse()
            .unwrap_or_else(|error| panic!("{error}\n{text}"));
        assert_eq!(table["service"].as_str(), Some("checkout"));
        assert_eq!(table["upload_period"].as_integer(), Some(10));
        assert_eq!(table["event"].as_str(), Some("sCPU freq=999"));
        assert_eq!(table["inlined_functions"].as_bool(), Some(true));
        assert_eq!(table["nice"].as_integer(), Some(-5));
        assert_eq!(table["engine"].as_str(), Some("auto"));
        assert!(!table.contains_key("url"), "unset settings are comments");
        let line = |key: &str| {
            text.lines()
                .find(|line| line.starts_with(&format!("{key} = ")))
                .unwrap_or_else(|| panic!("no {key} in\n{text}"))
                .to_string()
        };
        assert!(line("service").ends_with("# from DD_SERVICE"), "{text}");
        assert!(
            line("upload_period").ends_with(&format!("# from {} (upload_period)", path.display())),
            "{text}"
        );
        assert!(
            line("inlined_functions").ends_with("# from --inlined-functions"),
            "{text}"
        );
        assert!(line("engine").ends_with("# default"), "{text}");
        assert!(text.contains("# command: make -j2"), "{text}");

        // It is a config file that gives the same settings.
        let shown = write_config("shown-again", &text);
        let again = load(&["--config", shown.to_str().unwrap(), "true"], &[]).unwrap();
        assert!(again.problems.is_empty(), "{:?}", again.problems);
        assert_eq!(again.cli.service.as_deref(), Some("checkout"));
        assert_eq!(again.cli.upload_period, 10);
        assert_eq!(again.cli.nice, Some(-5));
        assert!(again.cli.inlined_functions);
        std::fs::remove_file(path).unwrap();
        std::fs::remove_file(shown).unwrap();
    }
}

//! What Datadog's C++ ddprof accepts and this ddprof reads differently: its
//! variables read for ours, its options without a meaning here (accepted
//! and ignored, said once), and those refused with what to do instead.
//! [`super::sources::command`] adds them to the parser; docs/Commands.md
//! lists every C++ option with its status.

/// Variables of Datadog's C++ ddprof read for the same setting when ours is
/// not set: `(setting id, variable)`. Only those whose every C++ value
/// means the same here: a value refused here would turn a variable ignored
/// today into a command run unprofiled. Not `DD_PROFILING_TIMELINE_ENABLE`
/// (CLI11 flags take `1`, `yes`, `on`; ours `true`/`false`), nor
/// `DD_PROFILING_NATIVE_CONFIG` (CLI11's config files carry keys this
/// ddprof does not have).
pub const CPP_VARIABLES: &[(&str, &str)] = &[
    ("log_level", "DD_PROFILING_NATIVE_LOG_LEVEL"),
    ("log_mode", "DD_PROFILING_NATIVE_LOG_MODE"),
];

/// Options of the C++ ddprof refused here, each with what to do instead.
pub const CPP_REFUSED: &[(&str, &str)] = &[
    (
        "api-key",
        "give the key in DD_API_KEY: on the command line it is readable by every local user \
         in /proc/PID/cmdline for as long as the profiler runs",
    ),
    ("runtime-id", "give it in DD_PROFILING_RUNTIME_ID"),
    (
        "do-export",
        "not supported yet: profiles are uploaded only to an agent named by --url, --host, \
         --port or --agentless, and written with --output DIR",
    ),
    (
        "capture-config",
        "not supported yet: `ddprof --print-config OPTIONS > FILE` writes a file --config reads",
    ),
];

/// An option of Datadog's C++ ddprof that means nothing here: accepted
/// (hidden, with its `_` spelling, on the command line and in a config
/// file) so that its command lines still start the command, and said once
/// to be ignored, with why.
pub struct CppIgnored {
    pub long: &'static str,
    pub takes_value: bool,
    pub why: &'static str,
}

/// The parser's id of the C++ option `long` (ignored or refused): never a
/// `Cli` field.
pub(super) fn parser_id(long: &str) -> String {
    format!("cpp_{}", long.replace('-', "_"))
}

/// The C++ ddprof's options without a meaning here (docs/Commands.md lists
/// every C++ option with its status). Not here: those whose effect a user
/// relies on and this ddprof lacks (`--do_export`, `--capture_config`),
/// which stay usage errors rather than being silently dropped.
pub const CPP_IGNORED: &[CppIgnored] = &[
    CppIgnored {
        long: "fault-info",
        takes_value: true,
        why: "the C++ ddprof's crash report; a fault here is one log line and the command runs on",
    },
    CppIgnored {
        long: "cpu-affinity",
        takes_value: true,
        why: "the profiler pins itself to one CPU",
    },
    CppIgnored {
        long: "maximum-pids",
        takes_value: true,
        why: "processes are bounded by the caches' budgets (--worker-max-rss)",
    },
    CppIgnored {
        long: "reorder-events",
        takes_value: false,
        why: "records are always merged in time order",
    },
    CppIgnored {
        long: "no-reorder-events",
        takes_value: false,
        why: "records are always merged in time order",
    },
    CppIgnored {
        long: "remote-symbolization",
        takes_value: false,
        why: "profiles are symbolized on the host",
    },
    CppIgnored {
        long: "disable-symbolization",
        takes_value: false,
        why: "profiles are symbolized on the host",
    },
    CppIgnored {
        long: "socket",
        takes_value: true,
        why: "the C++ allocation library's channel; ddprof's allocation sampler reports through a uprobe and needs none",
    },
    CppIgnored {
        long: "pipefd",
        takes_value: true,
        why: "the C++ allocation library's channel; ddprof's allocation sampler reports through a uprobe and needs none",
    },
    CppIgnored {
        long: "initial-loaded-libs-check-delay",
        takes_value: true,
        why: "the C++ allocation library's; ddprof's allocation sampler forwards to whatever allocator the loader finds, libraries loaded later included, and needs no check",
    },
    CppIgnored {
        long: "loaded-libs-check-interval",
        takes_value: true,
        why: "the C++ allocation library's; ddprof's allocation sampler forwards to whatever allocator the loader finds, libraries loaded later included, and needs no check",
    },
    CppIgnored {
        long: "debug-pprof-prefix",
        takes_value: true,
        why: "pprof files are written with --output DIR",
    },
];

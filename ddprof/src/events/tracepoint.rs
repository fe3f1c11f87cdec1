//! A tracepoint's id, from tracefs (mounted when it is not and ddprof may).
use std::io::Read;
use std::path::{Path, PathBuf};

use super::spec::Tracepoint;

/// Where tracefs is mounted, in the order looked at.
const TRACEFS_DIRS: [&str; 2] = ["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

#[derive(Debug, thiserror::Error)]
pub enum TracepointError {
    #[error(
        "tracefs is not mounted, and mounting it failed ({0}): mount it with \
         `mount -t tracefs nodev /sys/kernel/tracing`"
    )]
    NoTracefs(std::io::Error),
    #[error(
        "no tracepoint {group}:{name} in this kernel (no {path}); list them with `ls {dir}/events`"
    )]
    Unknown {
        group: String,
        name: String,
        path: String,
        dir: String,
    },
    #[error("cannot read the id of {0}: {1}")]
    Unreadable(String, std::io::Error),
}

/// The perf `config` of `tracepoint`: its id.
pub fn id(tracepoint: &Tracepoint) -> Result<u64, TracepointError> {
    let (group, name) = match tracepoint {
        Tracepoint::Id(id) => return Ok(*id),
        Tracepoint::Named { group, name } => (group, name),
    };
    let dir = tracefs()?;
    // `group` and `name` are letters, digits and `_` (the parser's check):
    // the path stays under tracefs.
    let path = dir.join("events").join(&**group).join(&**name).join("id");
    let mut text = String::new();
    match std::fs::File::open(&path) {
        Ok(file) => file
            .take(32)
            .read_to_string(&mut text)
            .map_err(|error| TracepointError::Unreadable(path.display().to_string(), error))?,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            return Err(TracepointError::Unknown {
                group: group.to_string(),
                name: name.to_string(),
                path: path.display().to_string(),
                dir: dir.display().to_string(),
            })
        }
        Err(error) => {
            return Err(TracepointError::Unreadable(
                path.display().to_string(),
                error,
            ))
        }
    };
    text.trim().parse().map_err(|_| {
        TracepointError::Unreadable(
            path.display().to_string(),
            std::io::Error::new(std::io::ErrorKind::InvalidData, "not a number"),
        )
    })
}

/// A tracefs file's text, at most 1 MiB (tracefs files are small; the
/// bound keeps a listing of many probes from growing without one).
pub(super) fn read_small(path: &Path) -> std::io::Result<String> {
    let mut text = String::new();
    std::fs::File::open(path)?
        .take(1 << 20)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// Where tracefs is: mounted already, or mounted now at its usual place.
pub(super) fn tracefs() -> Result<PathBuf, TracepointError> {
    if let Some(dir) = TRACEFS_DIRS
        .iter()
        .map(Path::new)
        .find(|dir| dir.join("events").is_dir())
    {
        return Ok(dir.to_path_buf());
    }
    let dir = Path::new(TRACEFS_DIRS[0]);
    nix::mount::mount(
        Some("nodev"),
        dir,
        Some("tracefs"),
        nix::mount::MsFlags::MS_NOSUID
            | nix::mount::MsFlags::MS_NODEV
            | nix::mount::MsFlags::MS_NOEXEC,
        None::<&str>,
    )
    .map_err(|errno| TracepointError::NoTracefs(errno.into()))?;
    log::info!("mounted tracefs at {} to open tracepoints", dir.display());
    Ok(dir.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_id_of_a_tracepoint_and_names_a_missing_one() {
        let switch = Tracepoint::Named {
            group: "sched".into(),
            name: "sched_switch".into(),
        };
        // Root here (the suite's machine); tracefs mounted if it was not.
        let id = id(&switch).expect("sched:sched_switch has an id");
        assert!(id > 0);
        assert_eq!(super::id(&Tracepoint::Id(id)).unwrap(), id);
        let missing = Tracepoint::Named {
            group: "sched".into(),
            name: "no_such_tracepoint".into(),
        };
        let error = super::id(&missing).unwrap_err().to_string();
        assert!(
            error.contains("no tracepoint sched:no_such_tracepoint") && error.contains("/events"),
            "{error}"
        );
    }
}

//! Which package installed a file, and its version: read from the package
//! database under the root of the process that mapped it (ddprof's own, or
//! a container's): dpkg's ([`super::dpkg`]) or RPM's ([`super::rpm`]).
//!
//! A file is said to be a package's only when the path the package lists
//! leads, under that root, to the very file a process mapped (same device
//! and inode): a container's `/usr/lib/x86_64-linux-gnu/libc.so.6` is
//! another file than the host's, and is named after the container's
//! package, never the host's. A container's database is whatever its
//! image or its processes wrote, and the host's is read the same way:
//! every path resolved under the root as if it were `/` (a link cannot
//! lead out of it), regular files only, opened without blocking, each read
//! bounded in size, and the whole lookup under a time bound (a hung disk
//! costs [`LOOKUP_TIMEOUT`], not the worker). What it can say is a package
//! name and version per file, in the upload's `code-provenance.json`.
use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::files::{bounded, TargetRoot};

/// The longest one lookup in the database may take.
pub const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);

/// A file to name: where it was mapped from and which file it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Wanted {
    pub path: String,
    pub dev: u64,
    pub inode: u64,
}

/// A package that installed a file.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Package {
    pub name: String,
    /// "" when the status file does not say.
    pub version: String,
}

/// The package database under a root directory.
#[derive(Debug, Clone)]
pub struct Database {
    /// `None` when the root could not be opened: nothing is named then.
    root: Option<TargetRoot>,
}

impl Database {
    /// The database of ddprof's own root.
    pub fn host() -> Self {
        Self {
            root: TargetRoot::own().ok(),
        }
    }

    /// The database under the directory `root` (tests build one).
    pub fn at(root: &Path) -> Self {
        Self {
            root: TargetRoot::of_directory(root).ok(),
        }
    }

    /// The database under a process's root (a container's).
    pub fn of_root(root: TargetRoot) -> Self {
        Self { root: Some(root) }
    }

    /// Whether this is the database under `root`.
    pub fn is_under(&self, root: &TargetRoot) -> bool {
        self.root.as_ref().is_some_and(|own| own.same_as(root))
    }

    /// The package of each of `wanted` that one installed; `None` for the
    /// others, and for all of them when there is no database or it could
    /// not be read within [`LOOKUP_TIMEOUT`] (logged).
    pub fn owners(&self, wanted: &[Wanted]) -> HashMap<Wanted, Package> {
        let Some(root) = self.root.clone() else {
            return HashMap::new();
        };
        if wanted.is_empty() {
            return HashMap::new();
        }
        let wanted = wanted.to_vec();
        let deadline = Instant::now() + LOOKUP_TIMEOUT;
        let look_up = move || {
            super::dpkg::look_up(&root, &wanted, deadline)
                .or_else(|| super::rpm::look_up(&root, &wanted, deadline))
                .unwrap_or_default()
        };
        match bounded::run(LOOKUP_TIMEOUT, look_up) {
            Ok(found) => found,
            Err(unanswered) => {
                log::warn!(
                    "code provenance: the package database was not read ({unanswered}); files \
                     are classed by their directories only"
                );
                HashMap::new()
            }
        }
    }
}

/// Files looked up at most in one call (the others are classed by their
/// directories).
pub const MAX_WANTED: usize = 512;

/// The last part of a path.
pub(super) fn file_name_bytes(path: &[u8]) -> &[u8] {
    path.rsplit(|&byte| byte == b'/').next().unwrap_or(path)
}

/// The wanted files by their file names (at most [`MAX_WANTED`]).
pub(super) fn by_file_name(wanted: &[Wanted]) -> HashMap<&[u8], Vec<&Wanted>> {
    let mut by_name: HashMap<&[u8], Vec<&Wanted>> = HashMap::new();
    for file in wanted.iter().take(MAX_WANTED) {
        by_name
            .entry(file_name_bytes(file.path.as_bytes()))
            .or_default()
            .push(file);
    }
    by_name
}

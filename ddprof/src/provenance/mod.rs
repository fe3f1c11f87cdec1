//! Code provenance: where the code of each frame comes from. A frame's file
//! is the application's own code (its executable), a library shipped with
//! it (any other file outside the system's), or the system's (a file a
//! package installed, or one in the distribution's directories, and the
//! kernel), with the package's name and version when the package database
//! (dpkg's or RPM's) says.
//!
//! Each upload carries this as `code-provenance.json`, in the format
//! Datadog's tracers send (`{"v1": [{"kind", "name", "version", "paths"}]}`,
//! `kind` `""` for the service's own code, `library`, `standard library`),
//! its paths the mapped files' paths as the profile's mappings name them;
//! the local flame graph is coloured by the same classes.
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;

use crate::aggregate::{FileId, Frame};
use crate::files::ObjectFile;
use crate::symbolize::SymbolizedProfile;

mod bdb;
pub mod dpkg;
pub mod packages;
pub mod rpm;
mod sqlite;

/// Where a file's code comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Source {
    /// The program's own executable.
    Application,
    /// A library shipped with the program (not the system's).
    Library,
    /// A file of the system: a package's, or in the distribution's
    /// directories.
    System,
    /// The kernel.
    Kernel,
}

impl Source {
    /// Datadog's `kind` for it: `""` is the service's own code.
    pub fn kind(self) -> &'static str {
        match self {
            Source::Application => "",
            Source::Library => "library",
            Source::System | Source::Kernel => "standard library",
        }
    }

    /// The colour of its frames in the flame graph (warm for the
    /// program's, cool for the system's, as samply and Firefox's profiler
    /// set the program apart).
    pub fn flame_color(self) -> inferno::flamegraph::color::Color {
        let (r, g, b) = match self {
            Source::Application => (230, 90, 60),
            Source::Library => (235, 180, 60),
            Source::System => (90, 150, 220),
            Source::Kernel => (150, 150, 150),
        };
        inferno::flamegraph::color::Color { r, g, b }
    }
}

/// Where one file's code comes from, and under which name and version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Origin {
    pub source: Source,
    pub name: String,
    /// "" when not known.
    pub version: String,
}

/// The directories a distribution installs its programs and libraries in
/// (not `/usr/local`, not `/opt`: the machine's own).
const SYSTEM_DIRECTORIES: &[&str] = &[
    "/usr/lib/",
    "/usr/lib64/",
    "/usr/lib32/",
    "/usr/libexec/",
    "/usr/bin/",
    "/usr/sbin/",
    "/lib/",
    "/lib64/",
    "/lib32/",
    "/bin/",
    "/sbin/",
];

/// Whether `path` is in one of the distribution's directories.
pub fn in_system_directory(path: &str) -> bool {
    SYSTEM_DIRECTORIES
        .iter()
        .any(|directory| path.starts_with(directory))
        && !path.starts_with("/usr/local/")
}

/// Whether a package may have installed the file at `path`: in the
/// distribution's directories or in `/opt` (a read of the package database,
/// ~17 ms, is not spent on a program's own files elsewhere).
fn may_be_packaged(path: &str) -> bool {
    in_system_directory(path) || path.starts_with("/opt/")
}

/// What a run knows of its files' provenance (each file classed once).
#[derive(Debug)]
pub struct Provenance {
    packages: packages::Database,
    /// Each file's origin, and the period that last used it.
    origins: HashMap<FileKey, (Origin, u64)>,
    periods: u64,
    kernel_release: String,
}

/// A file as the run's classes are kept: its path and identity.
type FileKey = (String, u64, u64);

fn file_key(file: &ObjectFile) -> FileKey {
    (file.path.clone(), file.dev, file.inode)
}

/// A file not met in this many periods is forgotten (classed again if it
/// comes back): the files of programs that come and go do not pile up.
pub const FORGOTTEN_AFTER_PERIODS: u64 = 64;

impl Default for Provenance {
    fn default() -> Self {
        Self::new(packages::Database::host())
    }
}

/// One period's provenance: the origin of each file its frames are in.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PeriodProvenance {
    pub files: HashMap<FileId, Origin>,
    /// The kernel's release (said when a profile has kernel frames).
    pub kernel_release: String,
}

impl Provenance {
    pub fn new(packages: packages::Database) -> Self {
        Self {
            packages,
            origins: HashMap::new(),
            periods: 0,
            kernel_release: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|release| release.trim().to_string())
                .unwrap_or_default(),
        }
    }

    /// The origins of the files the period's frames are in (the files seen
    /// for the first time classed now: one read of the package database for all
    /// of them).
    /// Called once a period (files not met in [`FORGOTTEN_AFTER_PERIODS`]
    /// are forgotten); the parts a period is split into take their
    /// origins from its answer.
    pub fn of_period(&mut self, profile: &SymbolizedProfile) -> PeriodProvenance {
        self.periods += 1;
        let period = &profile.period;
        let (used, _) = files_used(profile);
        let new: Vec<&ObjectFile> = used
            .iter()
            .map(|&id| &**period.file(id))
            .filter(|file| !self.origins.contains_key(&file_key(file)))
            .collect();
        if !new.is_empty() {
            let classing = std::time::Instant::now();
            let (owners, deferred) = self.owners(&new);
            for file in &new {
                if deferred.contains(&file_key(file)) {
                    continue;
                }
                let package = wanted(file).and_then(|lookup| owners.get(&lookup));
                self.origins
                    .insert(file_key(file), (classify(file, package), self.periods));
            }
            log::debug!(
                "code provenance: {} new files classed in {:.1} ms ({} of them a package's, \
                 {} left for the next period)",
                new.len() - deferred.len(),
                classing.elapsed().as_secs_f64() * 1e3,
                owners.len(),
                deferred.len()
            );
        }
        let periods = self.periods;
        let files = used
            .into_iter()
            .map(|id| {
                let file = period.file(id);
                let origin = match self.origins.get_mut(&file_key(file)) {
                    Some((origin, last_used)) => {
                        *last_used = periods;
                        origin.clone()
                    }
                    // Left for the next period: by its directory for now.
                    None => classify(file, None),
                };
                (id, origin)
            })
            .collect();
        self.origins
            .retain(|_, (_, last_used)| periods - *last_used < FORGOTTEN_AFTER_PERIODS);
        PeriodProvenance {
            files,
            kernel_release: self.kernel_release.clone(),
        }
    }
}

/// Container roots whose databases are read at most in one period (each
/// read is bounded by `packages::LOOKUP_TIMEOUT`): the files of the others are
/// classed by their directories in that period and looked up in the next.
pub const MAX_ROOTS_PER_PERIOD: usize = 8;

impl Provenance {
    /// The packages that installed `new` files, each looked up in the
    /// database under the root of the process it was opened for (the
    /// host's, or a container's own); and the files left for the next
    /// period (beyond [`MAX_ROOTS_PER_PERIOD`] roots).
    fn owners(
        &self,
        new: &[&ObjectFile],
    ) -> (
        HashMap<packages::Wanted, packages::Package>,
        HashSet<FileKey>,
    ) {
        let mut databases: Vec<(packages::Database, Vec<packages::Wanted>)> =
            vec![(self.packages.clone(), Vec::new())];
        let mut deferred = HashSet::new();
        for file in new.iter().filter(|file| may_be_packaged(&file.path)) {
            let Some(lookup) = wanted(file) else {
                continue;
            };
            let index = match file.root() {
                Some(root) if !self.packages.is_under(root) => {
                    match databases
                        .iter()
                        .position(|(database, _)| database.is_under(root))
                    {
                        Some(index) => index,
                        None if databases.len() <= MAX_ROOTS_PER_PERIOD => {
                            databases.push((packages::Database::of_root(root.clone()), Vec::new()));
                            databases.len() - 1
                        }
                        None => {
                            deferred.insert(file_key(file));
                            continue;
                        }
                    }
                }
                _ => 0,
            };
            databases[index].1.push(lookup);
        }
        let mut owners = HashMap::new();
        for (database, lookups) in databases {
            owners.extend(database.owners(&lookups));
        }
        (owners, deferred)
    }
}

/// The files a profile's frames are in, each once, and whether it has
/// kernel frames.
fn files_used(profile: &SymbolizedProfile) -> (Vec<FileId>, bool) {
    let mut used: Vec<FileId> = Vec::new();
    let mut kernel = false;
    for frame in &profile.period.frames {
        match frame {
            Frame::File { file, .. } => used.push(*file),
            Frame::Kernel { .. } => kernel = true,
            _ => {}
        }
    }
    used.sort_unstable_by_key(|file| file.0);
    used.dedup();
    (used, kernel)
}

/// A file as the package lookup takes it: the identity of the file held open
/// (the very file mapped), not the mapping's device number, which the
/// kernel encodes otherwise.
fn wanted(file: &ObjectFile) -> Option<packages::Wanted> {
    use std::os::unix::fs::MetadataExt;
    let metadata = file.held()?.metadata().ok()?;
    Some(packages::Wanted {
        path: file.path.clone(),
        dev: metadata.dev(),
        inode: metadata.ino(),
    })
}

/// Where `file`'s code comes from, `package` the one that installed it.
fn classify(file: &ObjectFile, package: Option<&packages::Package>) -> Origin {
    if let Some(package) = package {
        return Origin {
            source: Source::System,
            name: package.name.clone(),
            version: package.version.clone(),
        };
    }
    let name = file.file_name();
    if in_system_directory(&file.path) {
        return Origin {
            source: Source::System,
            name: name.to_string(),
            version: String::new(),
        };
    }
    if file.held().is_some_and(is_executable) {
        return Origin {
            source: Source::Application,
            name: name.to_string(),
            version: String::new(),
        };
    }
    // `libfoo.so.1.2` is `libfoo`, version `1.2`; `libfoo.so` is `libfoo`.
    let (library, version) = match (name.find(".so."), name.strip_suffix(".so")) {
        (Some(at), _) => (&name[..at], &name[at + 4..]),
        (None, Some(stem)) => (stem, ""),
        (None, None) => (name, ""),
    };
    Origin {
        source: Source::Library,
        name: library.to_string(),
        version: version.to_string(),
    }
}

/// Whether a file held open is a program (32- or 64-bit ELF) rather than a
/// shared library.
fn is_executable(file: &std::fs::File) -> bool {
    crate::files::elf_headers::is_program(&object::ReadCache::new(file))
}

impl PeriodProvenance {
    /// `code-provenance.json` of `profile` (the period, or a part of it):
    /// one entry per (class, name, version) of the files its frames are in,
    /// its paths the files' paths.
    pub fn json(&self, profile: &SymbolizedProfile) -> String {
        let (used, kernel) = files_used(profile);
        // One origin per path (two files mapped from one path, a library
        // upgraded during the run or a container's and the host's, take the
        // one a package names, else the first).
        let mut by_path: BTreeMap<&str, &Origin> = BTreeMap::new();
        for (id, origin) in used.iter().filter_map(|id| Some((id, self.files.get(id)?))) {
            let path = profile.period.file(*id).path.as_str();
            let kept = by_path.entry(path).or_insert(origin);
            if kept.version.is_empty() && !origin.version.is_empty() {
                *kept = origin;
            }
        }
        let mut entries: BTreeMap<&Origin, Vec<&str>> = BTreeMap::new();
        for (path, origin) in by_path {
            entries.entry(origin).or_default().push(path);
        }
        let mut libraries: Vec<serde_json::Value> = entries
            .into_iter()
            .map(|(origin, mut paths)| {
                paths.sort_unstable();
                paths.dedup();
                serde_json::json!({
                    "kind": origin.source.kind(),
                    "name": origin.name,
                    "version": origin.version,
                    "paths": paths,
                })
            })
            .collect();
        if kernel {
            libraries.push(serde_json::json!({
                "kind": Source::Kernel.kind(),
                "name": "linux",
                "version": self.kernel_release,
                "paths": [crate::profile::KERNEL_MAPPING_NAME],
            }));
        }
        serde_json::json!({ "v1": libraries }).to_string()
    }

    /// The source of each function name of the period's frames (the first
    /// one seen when two files define the same name), for the flame graph,
    /// which knows frames by name only.
    pub fn function_sources(&self, profile: &SymbolizedProfile) -> Vec<(Arc<str>, Source)> {
        let mut sources: HashMap<&Arc<str>, Source> = HashMap::new();
        for (frame, symbols) in profile.period.frames.iter().zip(&profile.frames) {
            let source = match frame {
                Frame::File { file, .. } => match self.files.get(file) {
                    Some(origin) => origin.source,
                    None => continue,
                },
                Frame::Kernel { .. } => Source::Kernel,
                _ => continue,
            };
            for symbol in symbols.iter() {
                sources.entry(&symbol.function).or_insert(source);
            }
        }
        sources
            .into_iter()
            .map(|(name, source)| (name.clone(), source))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(path: &str) -> ObjectFile {
        ObjectFile::by_path(path, 0, 0)
    }

    #[test]
    fn files_are_classed_by_package_directory_and_type() {
        let libc = packages::Package {
            name: "libc6".into(),
            version: "2.36-9".into(),
        };
        let origin = |file: &ObjectFile, package| classify(file, package);
        assert_eq!(
            origin(&object("/usr/lib/x86_64-linux-gnu/libc.so.6"), Some(&libc)),
            Origin {
                source: Source::System,
                name: "libc6".into(),
                version: "2.36-9".into()
            }
        );
        // In a system directory, no package: the system's, by file name.
        assert_eq!(
            origin(&object("/usr/lib64/libfoo.so.1"), None).source,
            Source::System
        );
        assert_ne!(
            origin(&object("/usr/local/lib/libfoo.so.1"), None).source,
            Source::System
        );
        // Not held: not known to be a program, so a library, named by its
        // soname.
        assert_eq!(
            origin(&object("/opt/app/lib/libfoo.so.1.2"), None),
            Origin {
                source: Source::Library,
                name: "libfoo".into(),
                version: "1.2".into()
            }
        );
        let library = origin(&object("/opt/app/lib/libfoo.socket.so"), None);
        assert_eq!(
            (library.name.as_str(), library.version.as_str()),
            ("libfoo.socket", "")
        );
    }
}

//! dpkg's database (`/var/lib/dpkg/status` and the file lists in
//! `/var/lib/dpkg/info/*.list`), read under a root as
//! [`super::packages`] says.
use std::collections::{HashMap, HashSet};
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::time::Instant;

use super::packages::{by_file_name, file_name_bytes, Package, Wanted};
use crate::files::TargetRoot;

/// The status file is read up to this size (Debian's is a few MB).
const MAX_STATUS_BYTES: u64 = 64 << 20;
/// Each file list is read up to this size, and all of them up to the total.
const MAX_LIST_BYTES: u64 = 16 << 20;
const MAX_ALL_LISTS_BYTES: u64 = 512 << 20;
/// File lists read at most.
const MAX_LISTS: usize = 100_000;

/// File names searched for in the lists' bytes (each a pass over them,
/// 8 MB on a Debian host); past this many, each list line is looked up by
/// its file name instead (one pass whatever the count).
const MAX_SEARCHED_NAMES: usize = 16;
/// The packages of `wanted` that dpkg's database under `root` names;
/// `None` when there is none (or not one of regular files).
pub(super) fn look_up(
    root: &TargetRoot,
    wanted: &[Wanted],
    deadline: Instant,
) -> Option<HashMap<Wanted, Package>> {
    let status = read_bounded(root, Path::new("var/lib/dpkg/status"), MAX_STATUS_BYTES)?;
    let versions = installed_versions(&String::from_utf8_lossy(&status));
    let by_name = by_file_name(wanted);
    // Each name as a list's line ends with it: `/NAME\n`.
    let finders: Vec<memchr::memmem::Finder> = if by_name.len() <= MAX_SEARCHED_NAMES {
        by_name
            .keys()
            .map(|name| {
                let needle = [b"/", *name, b"\n"].concat();
                memchr::memmem::Finder::new(&needle).into_owned()
            })
            .collect()
    } else {
        Vec::new()
    };
    let mut found = HashMap::new();
    let info = Path::new("var/lib/dpkg/info");
    let Ok(lists) = root.entry_names(info, MAX_LISTS) else {
        return Some(found);
    };
    let mut read_bytes = 0u64;
    let mut checked: HashSet<Vec<u8>> = HashSet::new();
    for name in lists {
        // The caller stopped waiting: so does the lookup.
        if read_bytes >= MAX_ALL_LISTS_BYTES || Instant::now() > deadline {
            break;
        }
        let Some(package) = name.to_str().and_then(|name| name.strip_suffix(".list")) else {
            continue;
        };
        let Some(mut list) = read_bounded(root, &info.join(&name), MAX_LIST_BYTES) else {
            continue;
        };
        read_bytes += list.len() as u64;
        list.push(b'\n');
        let mut lines: Vec<&[u8]> = Vec::new();
        if finders.is_empty() {
            lines.extend(
                list.split(|&byte| byte == b'\n')
                    .filter(|line| by_name.contains_key(file_name_bytes(line))),
            );
        } else {
            for finder in &finders {
                for end in finder.find_iter(&list) {
                    let start = list[..end]
                        .iter()
                        .rposition(|&b| b == b'\n')
                        .map_or(0, |i| i + 1);
                    lines.push(&list[start..end + finder.needle().len() - 1]);
                }
            }
        }
        for listed in lines {
            // Each listed path is looked at once (a path two packages list
            // names the first one's file; dpkg refuses such conflicts).
            if !checked.insert(listed.to_vec()) {
                continue;
            }
            let Some(candidates) = by_name.get(file_name_bytes(listed)) else {
                continue;
            };
            let listed = Path::new(std::ffi::OsStr::from_bytes(listed));
            let Ok(identity) = root.identity_of(listed) else {
                continue;
            };
            for &file in candidates {
                if (identity.dev, identity.inode) == (file.dev, file.inode) {
                    found.entry(file.clone()).or_insert_with(|| Package {
                        name: package_name(package).to_string(),
                        version: versions
                            .get(package)
                            .or_else(|| versions.get(package_name(package)))
                            .cloned()
                            .unwrap_or_default(),
                    });
                }
            }
        }
    }
    Some(found)
}

/// The package of a list's name: `libc6:amd64` is `libc6`.
fn package_name(list_name: &str) -> &str {
    list_name.split(':').next().unwrap_or(list_name)
}

/// The versions of the installed packages in a status file, by name and
/// by `name:architecture` (the names of multi-arch packages' file lists).
fn installed_versions(status: &str) -> HashMap<String, String> {
    let mut versions = HashMap::new();
    for stanza in status.split("\n\n") {
        let field = |key: &str| {
            stanza
                .lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
                .map(str::trim)
        };
        let (Some(name), Some(version)) = (field("Package"), field("Version")) else {
            continue;
        };
        if !field("Status").is_some_and(|status| status.ends_with(" installed")) {
            continue;
        }
        if let Some(arch) = field("Architecture") {
            versions.insert(format!("{name}:{arch}"), version.to_string());
        }
        versions.insert(name.to_string(), version.to_string());
    }
    versions
}

/// The bytes of the regular file at `path` under `root`, if it is at most
/// `max_bytes`: no device or FIFO is opened, no link leads out of the
/// root, nothing waits.
pub(super) fn read_bounded(root: &TargetRoot, path: &Path, max_bytes: u64) -> Option<Vec<u8>> {
    let opened = root.open(path).ok()?;
    if opened.size > max_bytes {
        return None;
    }
    let mut bytes = Vec::with_capacity(opened.size as usize);
    opened.file.take(max_bytes).read_to_end(&mut bytes).ok()?;
    Some(bytes)
}

#[cfg(test)]
mod tests {
    use super::super::packages::Database;
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// The file at `path` under `root` (a scratch root), as a lookup
    /// wants it: by its path there and its identity.
    fn wanted_under(root: &Path, path: &str) -> Wanted {
        let metadata = std::fs::metadata(root.join(path)).unwrap();
        Wanted {
            path: format!("/{path}"),
            dev: metadata.dev(),
            inode: metadata.ino(),
        }
    }

    /// A database of two packages in a scratch root: each file is named
    /// after the package whose list leads to it, through a link too (a
    /// merged `/usr`), and never after a list that names a path that
    /// leads to another file of the same name.
    #[test]
    fn a_file_is_named_after_the_package_that_installed_that_very_file() {
        let root = std::env::temp_dir().join(format!("ddprof-dpkg-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let info = root.join("var/lib/dpkg/info");
        std::fs::create_dir_all(&info).unwrap();
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::fs::create_dir_all(root.join("opt/app")).unwrap();
        std::os::unix::fs::symlink("usr/lib", root.join("lib")).unwrap();
        std::fs::write(root.join("usr/lib/libc.so.6"), b"libc").unwrap();
        std::fs::write(root.join("usr/lib/libz.so.1"), b"zlib").unwrap();
        std::fs::write(root.join("opt/app/libz.so.1"), b"bundled").unwrap();
        std::fs::write(
            root.join("var/lib/dpkg/status"),
            "Package: libc6\nStatus: install ok installed\nArchitecture: amd64\n\
             Version: 2.36-9\n\nPackage: zlib1g\nStatus: install ok installed\n\
             Architecture: amd64\nVersion: 1:1.2.13\n\nPackage: gone\n\
             Status: deinstall ok config-files\nVersion: 1\n",
        )
        .unwrap();
        // libc6's list names libc through the /lib link, as Debian's do.
        std::fs::write(info.join("libc6:amd64.list"), "/.\n/lib\n/lib/libc.so.6\n").unwrap();
        std::fs::write(info.join("zlib1g:amd64.list"), "/usr/lib/libz.so.1\n").unwrap();
        std::fs::write(info.join("gone.list"), "/opt/app/libz.so.1\n").unwrap();
        let wanted = |path: &str| wanted_under(&root, path);
        let libc = wanted("usr/lib/libc.so.6");
        let zlib = wanted("usr/lib/libz.so.1");
        let bundled = wanted("opt/app/libz.so.1");
        let mut unknown = wanted("usr/lib/libz.so.1");
        unknown.inode = u64::MAX;
        let few = [libc.clone(), zlib.clone(), bundled.clone(), unknown.clone()];
        let owners = Database::at(&root).owners(&few);
        // More names than are searched for one by one: each line looked up
        // by its file name, the same answers.
        let mut many = few.to_vec();
        many.extend((0..MAX_SEARCHED_NAMES).map(|n| Wanted {
            path: format!("/usr/lib/other{n}.so"),
            dev: 0,
            inode: 0,
        }));
        assert_eq!(Database::at(&root).owners(&many), owners);
        std::fs::remove_dir_all(&root).unwrap();
        let package = |name: &str, version: &str| Package {
            name: name.into(),
            version: version.into(),
        };
        assert_eq!(owners.get(&libc), Some(&package("libc6", "2.36-9")));
        assert_eq!(owners.get(&zlib), Some(&package("zlib1g", "1:1.2.13")));
        // Listed by a package that is no longer installed: its name, no
        // version.
        assert_eq!(owners.get(&bundled), Some(&package("gone", "")));
        assert_eq!(owners.get(&unknown), None);
    }

    /// A database is read under its root as if that were `/`: a list that
    /// is a link to an absolute path names the file at that path under the
    /// root (here none), never one outside it, such as the host's.
    #[test]
    fn a_link_in_a_database_does_not_lead_out_of_its_root() {
        let scratch =
            std::env::temp_dir().join(format!("ddprof-dpkg-links-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&scratch);
        let root = scratch.join("root");
        let outside = scratch.join("outside");
        let info = root.join("var/lib/dpkg/info");
        std::fs::create_dir_all(&info).unwrap();
        std::fs::create_dir_all(root.join("usr/lib")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(root.join("usr/lib/libz.so.1"), b"zlib").unwrap();
        std::fs::write(root.join("usr/lib/libplanted.so.1"), b"planted").unwrap();
        std::fs::write(
            outside.join("status"),
            "Package: planted\nStatus: install ok installed\nVersion: 6.6.6\n",
        )
        .unwrap();
        std::fs::write(outside.join("planted.list"), "/usr/lib/libplanted.so.1\n").unwrap();
        std::fs::write(
            root.join("var/lib/dpkg/status"),
            "Package: zlib1g\nStatus: install ok installed\nVersion: 1:1.2.13\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(outside.join("planted.list"), info.join("planted.list"))
            .unwrap();
        std::fs::write(info.join("zlib1g.list"), "/usr/lib/libz.so.1\n").unwrap();
        let wanted = |path: &str| wanted_under(&root, path);
        let zlib = wanted("usr/lib/libz.so.1");
        let planted_file = wanted("usr/lib/libplanted.so.1");
        let owners = Database::at(&root).owners(&[zlib.clone(), planted_file.clone()]);
        // Control: followed as ddprof's own root would, the planted list
        // names the file.
        let planted = std::fs::read_to_string(info.join("planted.list")).unwrap();
        // The status itself a link out of the root: no database at all.
        std::fs::remove_file(root.join("var/lib/dpkg/status")).unwrap();
        std::os::unix::fs::symlink(outside.join("status"), root.join("var/lib/dpkg/status"))
            .unwrap();
        let without_status = Database::at(&root).owners(std::slice::from_ref(&zlib));
        std::fs::remove_dir_all(&scratch).unwrap();
        assert_eq!(planted, "/usr/lib/libplanted.so.1\n");
        assert_eq!(
            owners.get(&zlib).map(|package| package.name.as_str()),
            Some("zlib1g"),
            "{owners:?}"
        );
        assert_eq!(owners.get(&planted_file), None, "{owners:?}");
        assert!(without_status.is_empty(), "{without_status:?}");
    }

    #[test]
    fn no_database_names_nothing() {
        let root = std::env::temp_dir().join(format!("ddprof-no-dpkg-{}", std::process::id()));
        std::fs::create_dir_all(&root).unwrap();
        let owners = Database::at(&root).owners(&[Wanted {
            path: "/usr/lib/libc.so.6".into(),
            dev: 1,
            inode: 2,
        }]);
        std::fs::remove_dir_all(&root).unwrap();
        assert!(owners.is_empty());
    }
}

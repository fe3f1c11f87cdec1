//! RPM's database, read under a root as [`super::packages`] says: the
//! SQLite one (`rpmdb.sqlite`, RPM 4.16 and later: Fedora 33 on, RHEL and
//! Rocky 9, Amazon Linux 2023, openSUSE), in `/usr/lib/sysimage/rpm` or
//! `/var/lib/rpm`, read by [`super::sqlite`]; else the Berkeley DB one
//! (`/var/lib/rpm/Packages`, before RPM 4.16: RHEL and CentOS 7 and 8,
//! Amazon Linux 2, UBI 8), read by [`super::bdb`]. Each row (value) is a
//! package's header, RPM's tagged binary format: its name, epoch, version
//! and release, and its files as directory names, base names and each
//! base name's directory.
//!
//! SUSE's ndb format (`Packages.db`, before 2021) is not read: its files
//! are classed by their directories, and the log says so once.
use std::collections::{HashMap, HashSet};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::bdb;
use super::packages::{by_file_name, file_name_bytes, Package, Wanted};
use super::sqlite::{self, Value};
use crate::files::TargetRoot;

/// Where RPM keeps its SQLite database (the first is Fedora's and
/// openSUSE's since 2021; `/var/lib/rpm` is often a link to it).
const SQLITE_PATHS: [&str; 2] = [
    "usr/lib/sysimage/rpm/rpmdb.sqlite",
    "var/lib/rpm/rpmdb.sqlite",
];
/// Where RPM kept its Berkeley DB database.
const BERKELEY_DB_PATH: &str = "var/lib/rpm/Packages";
/// The databases of the formats not read, and their names.
const OTHER_FORMATS: [(&str, &str); 2] = [
    ("var/lib/rpm/Packages.db", "ndb"),
    ("usr/lib/sysimage/rpm/Packages.db", "ndb"),
];
/// The largest database read (a Fedora workstation's is ~100 MB).
const MAX_DATABASE_BYTES: u64 = 1 << 30;
/// The largest package header read (RPM's own bound on a header's data is
/// 256 MB; a package with tens of thousands of files has a few MB).
const MAX_HEADER_BYTES: u64 = 32 << 20;
/// Packages read at most.
const MAX_PACKAGES: usize = 100_000;
/// Listed paths kept at most (each a wanted file's name, to be confirmed
/// by its identity): a header that repeats a wanted name costs no more.
const MAX_LISTED: usize = 4 * super::packages::MAX_WANTED;
/// A package's name and version are cut to this many bytes.
const MAX_NAME_BYTES: usize = 256;

/// The header tags read (RPM's `rpmtag.h`).
const TAG_NAME: u32 = 1000;
const TAG_VERSION: u32 = 1001;
const TAG_RELEASE: u32 = 1002;
const TAG_EPOCH: u32 = 1003;
const TAG_OLDFILENAMES: u32 = 1027;
const TAG_DIRINDEXES: u32 = 1116;
const TAG_BASENAMES: u32 = 1117;
const TAG_DIRNAMES: u32 = 1118;
/// The header's value types read.
const TYPE_INT32: u32 = 4;
const TYPE_STRING: u32 = 6;
const TYPE_STRING_ARRAY: u32 = 8;
const TYPE_I18NSTRING: u32 = 9;

/// Whether the line on a format not read was written.
static OTHER_FORMAT_SAID: AtomicBool = AtomicBool::new(false);
/// Whether a database that could not be read was said.
static UNREADABLE_SAID: AtomicBool = AtomicBool::new(false);

/// The packages of `wanted` that RPM's database under `root` names;
/// `None` when there is none that can be read.
pub(super) fn look_up(
    root: &TargetRoot,
    wanted: &[Wanted],
    deadline: Instant,
) -> Option<HashMap<Wanted, Package>> {
    let sqlite = SQLITE_PATHS
        .iter()
        .find_map(|path| Some((*path, root.open(Path::new(path)).ok()?)));
    let (path, opened) = match sqlite {
        Some(found) => found,
        None => match root.open(Path::new(BERKELEY_DB_PATH)) {
            Ok(opened) => (BERKELEY_DB_PATH, opened),
            Err(_) => {
                say_other_format(root);
                return None;
            }
        },
    };
    let by_name = by_file_name(wanted);
    // The listed paths whose file names are wanted, and their packages.
    let mut listed = Listed::default();
    let mut packages = 0usize;
    let mut each_header = |blob: Option<&[u8]>| {
        packages += 1;
        if packages > MAX_PACKAGES || Instant::now() > deadline {
            return false;
        }
        if let Some(header) = blob.and_then(Header::parse) {
            header.wanted_paths(&by_name, &mut listed);
        }
        true
    };
    let read = if opened.size > MAX_DATABASE_BYTES {
        Err(format!("over {MAX_DATABASE_BYTES} bytes"))
    } else if path == BERKELEY_DB_PATH {
        bdb::HashDatabase::open(&opened.file, opened.size)
            .and_then(|database| {
                database.values(MAX_HEADER_BYTES, deadline, &mut |blob| {
                    each_header(Some(blob))
                })
            })
            .map_err(|error| error.to_string())
    } else {
        sqlite::Database::open(&opened.file, opened.size)
            .and_then(|database| {
                let table = database.table_root("Packages", deadline)?;
                database.scan(table, MAX_HEADER_BYTES, deadline, &mut |_, record| {
                    // hnum (the row id), blob.
                    match sqlite::columns(record, 2).as_slice() {
                        [_, Value::Blob(blob)] => each_header(Some(blob)),
                        _ => each_header(None),
                    }
                })
            })
            .map_err(|error| error.to_string())
    };
    if let Err(error) = read {
        if !UNREADABLE_SAID.swap(true, Ordering::Relaxed) {
            log::warn!(
                "code provenance: RPM's database /{path} could not be read whole ({error}); \
                 the files of the packages not read are classed by their directories"
            );
        }
    }
    Some(confirmed(listed, &by_name, root, deadline))
}

/// The listed paths whose file names are wanted (at most [`MAX_LISTED`]),
/// each with the index of its package.
#[derive(Default)]
struct Listed {
    paths: Vec<(Vec<u8>, usize)>,
    packages: Vec<Package>,
}

/// Says once that a database of a format not read is there.
fn say_other_format(root: &TargetRoot) {
    if let Some((path, format)) = OTHER_FORMATS
        .iter()
        .find(|(path, _)| root.identity_of(Path::new(path)).is_ok())
    {
        if !OTHER_FORMAT_SAID.swap(true, Ordering::Relaxed) {
            log::info!(
                "code provenance: RPM's database /{path} is in the {format} format, which ddprof \
                 does not read: its packages' files are classed by their directories, without a \
                 package name"
            );
        }
    }
}

/// The wanted files that the listed paths lead to, under `root`, looked
/// at until `deadline`.
fn confirmed(
    listed: Listed,
    by_name: &HashMap<&[u8], Vec<&Wanted>>,
    root: &TargetRoot,
    deadline: Instant,
) -> HashMap<Wanted, Package> {
    let mut found = HashMap::new();
    for (path, package) in listed.paths {
        if Instant::now() > deadline {
            break;
        }
        let package = &listed.packages[package];
        let Some(candidates) = by_name.get(file_name_bytes(&path)) else {
            continue;
        };
        let Ok(identity) = root.identity_of(Path::new(std::ffi::OsStr::from_bytes(&path))) else {
            continue;
        };
        for &file in candidates {
            if (identity.dev, identity.inode) == (file.dev, file.inode) {
                found.entry(file.clone()).or_insert_with(|| package.clone());
            }
        }
    }
    found
}

/// A package's header as RPM's database stores it: the count of index
/// entries and the data's length (big-endian), the entries (tag, type,
/// offset into the data, count), the data.
struct Header<'a> {
    entries: &'a [u8],
    data: &'a [u8],
}

impl<'a> Header<'a> {
    fn parse(blob: &'a [u8]) -> Option<Self> {
        let word = |at: usize| Some(u32::from_be_bytes(blob.get(at..at + 4)?.try_into().ok()?));
        let entries = (word(0)? as usize).checked_mul(16)?;
        let data = word(4)? as usize;
        let entries_end = entries.checked_add(8)?;
        Some(Self {
            entries: blob.get(8..entries_end)?,
            data: blob.get(entries_end..entries_end.checked_add(data)?)?,
        })
    }

    /// The type, data offset and count of the entry of `tag`.
    fn entry(&self, tag: u32) -> Option<(u32, usize, usize)> {
        self.entries.chunks_exact(16).find_map(|entry| {
            let word = |at: usize| u32::from_be_bytes(entry[at..at + 4].try_into().unwrap());
            (word(0) == tag).then(|| (word(4), word(8) as usize, word(12) as usize))
        })
    }

    /// A string array's strings (each NUL-terminated, one after the
    /// other); a string's alone.
    fn strings(&self, tag: u32) -> Option<Vec<&'a [u8]>> {
        let (kind, offset, count) = self.entry(tag)?;
        let count = match kind {
            TYPE_STRING => 1,
            TYPE_STRING_ARRAY | TYPE_I18NSTRING => count,
            _ => return None,
        };
        let mut rest = self.data.get(offset..)?;
        // No more strings than bytes: a forged count is not allocated.
        let mut strings = Vec::with_capacity(count.min(rest.len()));
        for _ in 0..count {
            let end = rest.iter().position(|&byte| byte == 0)?;
            strings.push(&rest[..end]);
            rest = &rest[end + 1..];
        }
        Some(strings)
    }

    fn string(&self, tag: u32) -> Option<&'a [u8]> {
        self.strings(tag)?.first().copied()
    }

    fn int32s(&self, tag: u32) -> Option<Vec<u32>> {
        let (kind, offset, count) = self.entry(tag)?;
        if kind != TYPE_INT32 {
            return None;
        }
        let bytes = self
            .data
            .get(offset..offset.checked_add(count.checked_mul(4)?)?)?;
        Some(
            bytes
                .chunks_exact(4)
                .map(|word| u32::from_be_bytes(word.try_into().unwrap()))
                .collect(),
        )
    }

    /// `[epoch:]version-release`, as RPM prints it (each cut to
    /// [`MAX_NAME_BYTES`]).
    fn package(&self) -> Option<Package> {
        let text = |bytes: &[u8]| {
            String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_NAME_BYTES)]).into_owned()
        };
        let name = text(self.string(TAG_NAME)?);
        let mut version = text(self.string(TAG_VERSION).unwrap_or_default());
        if let Some(release) = self.string(TAG_RELEASE) {
            version = format!("{version}-{}", text(release));
        }
        if let Some(epoch) = self
            .int32s(TAG_EPOCH)
            .and_then(|epochs| epochs.first().copied())
        {
            version = format!("{epoch}:{version}");
        }
        Some(Package { name, version })
    }

    /// Adds to `listed` the package's files whose names are wanted (each
    /// path once, until [`MAX_LISTED`]), with the package.
    fn wanted_paths(&self, by_name: &HashMap<&[u8], Vec<&Wanted>>, listed: &mut Listed) {
        let room = MAX_LISTED.saturating_sub(listed.paths.len());
        if room == 0 {
            return;
        }
        let mut paths: Vec<Vec<u8>> = Vec::new();
        let mut seen: HashSet<Vec<u8>> = HashSet::new();
        if let Some(base_names) = self.strings(TAG_BASENAMES) {
            let (Some(directories), Some(indexes)) =
                (self.strings(TAG_DIRNAMES), self.int32s(TAG_DIRINDEXES))
            else {
                return;
            };
            for (base_name, index) in base_names.iter().zip(indexes) {
                if !by_name.contains_key(base_name) {
                    continue;
                }
                if let Some(directory) = directories.get(index as usize) {
                    let path = [*directory, *base_name].concat();
                    if seen.insert(path.clone()) {
                        paths.push(path);
                    }
                    if paths.len() >= room {
                        break;
                    }
                }
            }
        } else if let Some(files) = self.strings(TAG_OLDFILENAMES) {
            for path in files {
                if by_name.contains_key(file_name_bytes(path)) && seen.insert(path.to_vec()) {
                    paths.push(path.to_vec());
                    if paths.len() >= room {
                        break;
                    }
                }
            }
        }
        if paths.is_empty() {
            return;
        }
        let Some(package) = self.package() else {
            return;
        };
        listed.packages.push(package);
        let index = listed.packages.len() - 1;
        listed
            .paths
            .extend(paths.into_iter().map(|path| (path, index)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A header as RPM lays one out, of the given entries.
    fn header(entries: &[(u32, u32, Vec<u8>, u32)]) -> Vec<u8> {
        let mut index = Vec::new();
        let mut data = Vec::new();
        for (tag, kind, bytes, count) in entries {
            while *kind == TYPE_INT32 && data.len() % 4 != 0 {
                data.push(0);
            }
            for word in [*tag, *kind, data.len() as u32, *count] {
                index.extend_from_slice(&word.to_be_bytes());
            }
            data.extend_from_slice(bytes);
        }
        let mut blob = Vec::new();
        blob.extend_from_slice(&(entries.len() as u32).to_be_bytes());
        blob.extend_from_slice(&(data.len() as u32).to_be_bytes());
        blob.extend(index);
        blob.extend(data);
        blob
    }

    fn strings(values: &[&str]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|value| [value.as_bytes(), b"\0"].concat())
            .collect()
    }

    #[test]
    fn a_headers_files_and_version_are_read_and_forged_counts_are_not_trusted() {
        let blob = header(&[
            (TAG_NAME, TYPE_STRING, strings(&["glibc"]), 1),
            (TAG_VERSION, TYPE_STRING, strings(&["2.39"]), 1),
            (TAG_RELEASE, TYPE_STRING, strings(&["17.fc40"]), 1),
            (TAG_EPOCH, TYPE_INT32, 2u32.to_be_bytes().to_vec(), 1),
            (
                TAG_BASENAMES,
                TYPE_STRING_ARRAY,
                strings(&["libc.so.6", "ldd", "libm.so.6"]),
                3,
            ),
            (
                TAG_DIRNAMES,
                TYPE_STRING_ARRAY,
                strings(&["/usr/lib64/", "/usr/bin/"]),
                2,
            ),
            (
                TAG_DIRINDEXES,
                TYPE_INT32,
                [0u32, 1, 0].iter().flat_map(|i| i.to_be_bytes()).collect(),
                3,
            ),
        ]);
        let wanted = [
            Wanted {
                path: "/usr/lib64/libc.so.6".into(),
                dev: 1,
                inode: 1,
            },
            Wanted {
                path: "/usr/bin/ldd".into(),
                dev: 1,
                inode: 2,
            },
        ];
        let by_name = by_file_name(&wanted);
        let header = Header::parse(&blob).unwrap();
        let mut listed = Listed::default();
        header.wanted_paths(&by_name, &mut listed);
        let listed: Vec<(Vec<u8>, Package)> = listed
            .paths
            .into_iter()
            .map(|(path, index)| (path, listed.packages[index].clone()))
            .collect();
        let glibc = Package {
            name: "glibc".into(),
            version: "2:2.39-17.fc40".into(),
        };
        assert_eq!(
            listed,
            vec![
                (b"/usr/lib64/libc.so.6".to_vec(), glibc.clone()),
                (b"/usr/bin/ldd".to_vec(), glibc)
            ]
        );
        // Counts past the data, offsets past it, a truncated blob: no
        // strings, no panic.
        let forged = header_with_count(&blob, u32::MAX);
        let forged = Header::parse(&forged).unwrap();
        assert_eq!(forged.strings(TAG_NAME).map(|s| s.len()), Some(1));
        assert_eq!(forged.strings(TAG_BASENAMES), None);
        for cut in 0..blob.len() {
            if let Some(header) = Header::parse(&blob[..cut]) {
                header.wanted_paths(&by_name, &mut Listed::default());
            }
        }
        let mut huge = blob.clone();
        huge[..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(Header::parse(&huge).is_none());
    }

    /// A header that lists a wanted name again and again (in one
    /// directory, then in thousands) adds each path once, and no more
    /// paths than [`MAX_LISTED`].
    #[test]
    fn a_header_repeating_a_wanted_name_costs_a_bounded_list() {
        let wanted = [Wanted {
            path: "/usr/lib64/libc.so.6".into(),
            dev: 1,
            inode: 1,
        }];
        let by_name = by_file_name(&wanted);
        let names = vec!["libc.so.6"; 100_000];
        let directories: Vec<String> = (0..5_000).map(|n| format!("/d{n}/")).collect();
        let directories: Vec<&str> = directories.iter().map(String::as_str).collect();
        for (spread, expected) in [(1u32, 1usize), (5_000, MAX_LISTED)] {
            let indexes: Vec<u8> = (0..names.len() as u32)
                .flat_map(|i| (i % spread).to_be_bytes())
                .collect();
            let blob = header(&[
                (
                    TAG_NAME,
                    TYPE_STRING,
                    strings(&["x".repeat(10_000).as_str()]),
                    1,
                ),
                (
                    TAG_BASENAMES,
                    TYPE_STRING_ARRAY,
                    strings(&names),
                    names.len() as u32,
                ),
                (
                    TAG_DIRNAMES,
                    TYPE_STRING_ARRAY,
                    strings(&directories),
                    directories.len() as u32,
                ),
                (TAG_DIRINDEXES, TYPE_INT32, indexes, names.len() as u32),
            ]);
            let mut listed = Listed::default();
            Header::parse(&blob)
                .unwrap()
                .wanted_paths(&by_name, &mut listed);
            assert_eq!(listed.paths.len(), expected);
            assert_eq!(listed.packages.len(), 1);
            assert_eq!(listed.packages[0].name.len(), MAX_NAME_BYTES);
        }
    }

    /// The blob with the base names' count replaced.
    fn header_with_count(blob: &[u8], count: u32) -> Vec<u8> {
        let mut forged = blob.to_vec();
        let entries = u32::from_be_bytes(blob[..4].try_into().unwrap()) as usize;
        for index in 0..entries {
            let at = 8 + index * 16;
            if u32::from_be_bytes(blob[at..at + 4].try_into().unwrap()) == TAG_BASENAMES {
                forged[at + 12..at + 16].copy_from_slice(&count.to_be_bytes());
            }
        }
        forged
    }
}

//! Code provenance end to end: each upload's `code-provenance.json` says
//! which files are the program's own, a library shipped with it, or the
//! system's (with the package dpkg says installed it), and the local flame
//! graph is coloured by the same classes. Judged against `dpkg -S` and
//! `dpkg-query` on a real program nobody wrote for us (python3) and on a
//! workload of ours whose files' classes are known.
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use ddprof_tests::e2e::Scratch;
use ddprof_tests::intake::{Behaviour, Intake, Received};
use ddprof_tests::workloads::build_workload;

/// The flame graph's colours, as `ddprof::provenance::Source` sets them.
const APPLICATION: &str = "rgb(230,90,60)";
const LIBRARY: &str = "rgb(235,180,60)";
const SYSTEM: &str = "rgb(90,150,220)";
const KERNEL: &str = "rgb(150,150,150)";

/// Profiles `command` to a stand-in intake and a local directory, kernel
/// frames included; the run's last request and the output directory.
fn profile(scratch: &Scratch, command: &mut Command) -> (Received, PathBuf, String) {
    let intake = Intake::http(Behaviour::Accept);
    let local = scratch.0.join("out");
    let program = command.get_program().to_owned();
    let args: Vec<_> = command.get_args().map(ToOwned::to_owned).collect();
    let output = ddprof_tests::ddprof_command()
        .current_dir(&scratch.0)
        .args(["-l", "notice", "-U", &intake.url, "-e", "sCPU freq=999"])
        .args(["--include-kernel", "--output"])
        .arg(&local)
        .arg("--")
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("ddprof runs");
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(output.status.success(), "{stderr}");
    assert_eq!(intake.violations(), Vec::<String>::new(), "{stderr}");
    let received = intake.received().pop().expect("a profile was uploaded");
    (received, local, stderr)
}

/// The code-provenance entries by path: (kind, name, version).
fn entries_by_path(received: &Received) -> BTreeMap<String, (String, String, String)> {
    let provenance = received
        .code_provenance
        .as_ref()
        .expect("the upload has code-provenance.json");
    let mut by_path = BTreeMap::new();
    for entry in provenance["v1"].as_array().unwrap() {
        let field = |key: &str| entry[key].as_str().unwrap().to_string();
        for path in entry["paths"].as_array().unwrap() {
            let previous = by_path.insert(
                path.as_str().unwrap().to_string(),
                (field("kind"), field("name"), field("version")),
            );
            assert!(previous.is_none(), "{path} in two entries: {provenance}");
        }
    }
    by_path
}

/// Every file of the profile's mappings is in exactly one entry.
fn assert_every_mapping_is_classed(
    received: &Received,
    by_path: &BTreeMap<String, (String, String, String)>,
) {
    let profile = received.profile();
    for mapping in &profile.mapping {
        let file = profile.string(mapping.filename);
        assert!(
            by_path.contains_key(file),
            "{file} is in no entry of {:?}",
            received.code_provenance
        );
    }
}

/// Each frame name of the flame graph and its fill colour.
fn flame_colors(dir: &Path) -> HashMap<String, String> {
    let svg = std::fs::read_to_string(dir.join("flamegraph.svg")).expect("flamegraph.svg");
    let mut colors = HashMap::new();
    for frame in svg.split("<g><title>").skip(1) {
        let Some((title, rest)) = frame.split_once("</title>") else {
            continue;
        };
        let name = title.rsplit_once(" (").map_or(title, |(name, _)| name);
        let Some(fill) = rest
            .split_once("fill=\"")
            .and_then(|(_, fill)| fill.split_once('"'))
        else {
            continue;
        };
        colors.insert(name.to_string(), fill.0.to_string());
    }
    colors
}

/// What dpkg says of a path: the package that installed it (as `dpkg -S`
/// finds it: by the path, or by the path without the merged `/usr`, which
/// Debian's file lists use) and its version.
fn dpkg_owner(path: &str) -> Option<(String, String)> {
    let candidates = [Some(path), path.strip_prefix("/usr")];
    let package = candidates.into_iter().flatten().find_map(|candidate| {
        let output = Command::new("dpkg").args(["-S", candidate]).output().ok()?;
        let text = String::from_utf8_lossy(&output.stdout);
        let line = text
            .lines()
            .find(|line| line.ends_with(&format!(": {candidate}")))?;
        Some(line.split(':').next()?.to_string())
    })?;
    let version = Command::new("dpkg-query")
        .args(["-W", "-f", "${Version}", &package])
        .output()
        .ok()?;
    Some((
        package,
        String::from_utf8_lossy(&version.stdout).trim().to_string(),
    ))
}

#[test]
fn frames_are_classed_by_where_their_code_comes_from() {
    let scratch = Scratch::new("provenance-classes");
    let program = build_workload("provenance.c");
    let library = build_workload("shipped_plugin.c");
    let (received, local, stderr) =
        profile(&scratch, Command::new(&program).arg("2").arg(&library));
    let by_path = entries_by_path(&received);
    println!("{by_path:#?}");
    assert_every_mapping_is_classed(&received, &by_path);
    let entry = |path: &Path| by_path.get(path.to_str().unwrap()).cloned();
    assert_eq!(
        entry(&program),
        Some(("".into(), "provenance".into(), "".into())),
        "the program's own code: {stderr}"
    );
    assert_eq!(
        entry(&library),
        Some(("library".into(), "libshipped_plugin".into(), "".into())),
        "a library shipped with it"
    );
    let (libc_path, libc) = by_path
        .iter()
        .find(|(path, _)| path.ends_with("/libc.so.6"))
        .expect("glibc's frames");
    let (package, version) = dpkg_owner(libc_path).expect("dpkg knows glibc");
    assert_eq!(libc, &("standard library".into(), package, version));
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(
        by_path.get("[kernel.kallsyms]"),
        Some(&(
            "standard library".into(),
            "linux".into(),
            release.trim().into()
        ))
    );

    let colors = flame_colors(&local);
    let color = |name: &str| colors.get(name).map(String::as_str);
    assert_eq!(color("app_work"), Some(APPLICATION), "{colors:?}");
    assert_eq!(color("shipped_work"), Some(LIBRARY), "{colors:?}");
    assert_eq!(color("read_zero"), Some(KERNEL), "{colors:?}");
    let memcpy: Vec<_> = colors
        .iter()
        .filter(|(name, _)| name.starts_with("__memcpy") || name.starts_with("__memmove"))
        .collect();
    assert!(!memcpy.is_empty(), "{colors:?}");
    assert!(memcpy.iter().all(|(_, fill)| *fill == SYSTEM), "{memcpy:?}");
}

#[test]
fn a_real_programs_system_files_are_named_after_the_packages_dpkg_says() {
    let scratch = Scratch::new("provenance-python");
    let script = scratch.0.join("work.py");
    std::fs::write(
        &script,
        "import json, time, zlib\n\
         end = time.time() + 2\n\
         while time.time() < end:\n\
         \x20   doc = json.dumps({str(i): [i, str(i) * 3] for i in range(2000)})\n\
         \x20   zlib.compress(doc.encode())\n\
         \x20   json.loads(doc)\n",
    )
    .unwrap();
    // Debian's interpreter (a `python3` first in PATH may be a pyenv one).
    let (received, _, stderr) = profile(&scratch, Command::new("/usr/bin/python3").arg(&script));
    let by_path = entries_by_path(&received);
    println!("{by_path:#?}");
    assert_every_mapping_is_classed(&received, &by_path);
    let mut packaged = 0;
    for (path, (kind, name, version)) in &by_path {
        if path == "[kernel.kallsyms]" {
            continue;
        }
        match dpkg_owner(path) {
            Some((package, package_version)) => {
                packaged += 1;
                assert_eq!(
                    (kind.as_str(), name, version),
                    ("standard library", &package, &package_version),
                    "{path}"
                );
            }
            // A file of the system's directories that no package owns is
            // the system's too; one elsewhere is not.
            None if ddprof::provenance::in_system_directory(path) => {}
            None => assert_ne!(kind, "standard library", "{path}: no package owns it"),
        }
    }
    // The interpreter, libc, libz, the `_json` extension at least.
    assert!(packaged >= 3, "{by_path:#?}\n{stderr}");
}

/// A container's root made of copies of Debian's `xz-utils`, `liblzma5`
/// and `libc6` files (other inodes than the host's), laid out as an image
/// from before the merged `/usr` (its libraries in a real `/lib`: paths the
/// host's processes do not map, whose code provenance would otherwise take
/// one origin for both), with 3 MB of text for xz to compress; the paths
/// of its files, `/usr/bin/xz` first.
fn container_root(root: &Path) -> [PathBuf; 4] {
    for dir in ["usr/bin", "lib/x86_64-linux-gnu", "lib64"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    // The files at the paths Debian's lists give them.
    let lib = Path::new("/lib/x86_64-linux-gnu");
    let liblzma_name = std::fs::canonicalize(lib.join("liblzma.so.5")).unwrap();
    let liblzma = lib.join(liblzma_name.file_name().unwrap());
    let libc = lib.join("libc.so.6");
    let loader = lib.join("ld-linux-x86-64.so.2");
    let files = [PathBuf::from("/usr/bin/xz"), liblzma, libc, loader];
    for file in &files {
        let inside = root.join(file.strip_prefix("/").unwrap());
        std::fs::copy(file, &inside).unwrap_or_else(|e| panic!("copy {}: {e}", file.display()));
    }
    for (link, target) in [
        ("lib/x86_64-linux-gnu/liblzma.so.5", &files[1]),
        ("lib64/ld-linux-x86-64.so.2", &files[3]),
    ] {
        std::os::unix::fs::symlink(target, root.join(link)).unwrap();
    }
    // ~3 MB of text for xz -9: a second or two.
    let mut text = String::new();
    let mut x = 1u64;
    while text.len() < 3 << 20 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        text.push_str(&format!(
            "{} {:x} word{}\n",
            x >> 40,
            x >> 20,
            (x >> 33) % 977
        ));
    }
    std::fs::write(root.join("data"), text).unwrap();
    files
}

/// Every (kind, name, version) the upload's code provenance gives a path.
type ClassesByPath = BTreeMap<String, Vec<(String, String, String)>>;

/// Runs xz in `root` as a container's process (entered by `pivot_root` in
/// a mount namespace of its own, so that it maps `/usr/bin/xz` and
/// `/lib/x86_64-linux-gnu/liblzma.so.5…`), profiled; every (kind, name,
/// version) the upload's code provenance gives each path, and ddprof's
/// stderr.
fn profile_in_container(scratch: &Scratch, root: &Path) -> (ClassesByPath, String) {
    let script = "mount --bind \"$0\" \"$0\" && cd \"$0\" && mkdir -p .old \
                  && pivot_root . .old && exec /usr/bin/xz -9 -T1 -k -f /data";
    let (received, _, stderr) = profile(
        scratch,
        Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c", script])
            .arg(root),
    );
    assert!(
        root.join("data.xz").exists(),
        "xz ran in the container: {stderr}"
    );
    let mut classes = ClassesByPath::new();
    let provenance = received
        .code_provenance
        .as_ref()
        .expect("code-provenance.json");
    for entry in provenance["v1"].as_array().unwrap() {
        let field = |key: &str| entry[key].as_str().unwrap().to_string();
        for path in entry["paths"].as_array().unwrap() {
            classes
                .entry(path.as_str().unwrap().to_string())
                .or_default()
                .push((field("kind"), field("name"), field("version")));
        }
    }
    println!("{classes:#?}");
    (classes, stderr)
}

/// A container's own packages: the root of [`container_root`] with a dpkg
/// database of its own (the host's lists of those packages, their versions
/// marked `+container1`). Each of its files is named after the container's
/// package, at the container's version, which only the container's
/// database holds (the host's lists lead to the host's files, other
/// inodes: before, these files were classed by their directories, without
/// a package).
#[test]
fn a_containers_files_are_named_after_its_own_packages() {
    let scratch = Scratch::new("provenance-container");
    let root = scratch.0.join("root");
    let [xz, liblzma, libc, _] = container_root(&root);
    std::fs::create_dir_all(root.join("var/lib/dpkg/info")).unwrap();
    let packages = ["xz-utils", "liblzma5:amd64", "libc6:amd64"];
    let host_status = std::fs::read_to_string("/var/lib/dpkg/status").unwrap();
    let mut status = String::new();
    let mut versions = BTreeMap::new();
    for stanza in host_status.split("\n\n") {
        let field = |key: &str| {
            stanza
                .lines()
                .find_map(|line| line.strip_prefix(key)?.strip_prefix(": "))
        };
        let (Some(name), Some(version)) = (field("Package"), field("Version")) else {
            continue;
        };
        if !packages
            .iter()
            .any(|package| package.split(':').next() == Some(name))
        {
            continue;
        }
        let marked = format!("{version}+container1");
        status.push_str(&stanza.replace(
            &format!("Version: {version}\n"),
            &format!("Version: {marked}\n"),
        ));
        status.push_str("\n\n");
        versions.insert(name.to_string(), marked);
    }
    assert_eq!(
        versions.len(),
        3,
        "the host's dpkg knows {packages:?}: {versions:?}"
    );
    std::fs::write(root.join("var/lib/dpkg/status"), status).unwrap();
    for package in packages {
        let list = format!("var/lib/dpkg/info/{package}.list");
        std::fs::copy(Path::new("/").join(&list), root.join(&list)).unwrap();
    }
    let (classes, stderr) = profile_in_container(&scratch, &root);
    for (path, package) in [(&xz, "xz-utils"), (&liblzma, "liblzma5"), (&libc, "libc6")] {
        let expected = (
            "standard library".to_string(),
            package.to_string(),
            versions[package].clone(),
        );
        let path = path.to_str().unwrap();
        assert!(
            classes.get(path).is_some_and(|got| got.contains(&expected)),
            "{path}: the container's {package} ({}): {classes:#?}\n{stderr}",
            versions[package]
        );
    }
}

/// An RPM-based container (Fedora, RHEL 9, Amazon Linux 2023): the root of
/// [`container_root`] with no dpkg database but RPM's, made by the real
/// `rpm` (Debian's package): three packages built by `rpmbuild` from those
/// files, at versions no Debian database holds, entered in the root's
/// database with `rpm --root --justdb`. Each file is named after its RPM
/// package, `[epoch:]version-release` as RPM prints it.
#[test]
fn an_rpm_containers_files_are_named_after_its_rpm_packages() {
    rpm_container("provenance-rpm", false);
}

/// The same with RPM's database before RPM 4.16 (RHEL and CentOS 7 and 8,
/// Amazon Linux 2): a Berkeley DB hash file, `/var/lib/rpm/Packages`,
/// written by Berkeley DB itself (`db5.3_load`, Debian's db5.3-util) from
/// the headers `rpm` wrote (Debian's rpm no longer writes that format).
#[test]
fn an_rpm_containers_berkeley_db_names_its_files() {
    rpm_container("provenance-rpm-bdb", true);
}

/// Makes and profiles the RPM container of
/// [`an_rpm_containers_files_are_named_after_its_rpm_packages`], its
/// database in Berkeley DB's format if `berkeley_db`.
fn rpm_container(name: &str, berkeley_db: bool) {
    let scratch = Scratch::new(name);
    let root = scratch.0.join("root");
    let [xz, liblzma, libc, loader] = container_root(&root);
    let top = scratch.0.join("rpmbuild");
    let packages: [(&str, &str, &str, &str, Vec<&PathBuf>); 3] = [
        ("xz", "", "5.4.6", "1.fc40", vec![&xz]),
        ("xz-libs", "1", "5.4.6", "1.fc40", vec![&liblzma]),
        ("glibc", "", "2.39", "17.fc40", vec![&libc, &loader]),
    ];
    let rpm = |args: &[&str]| {
        let output = Command::new("rpm")
            .arg("--root")
            .arg(&root)
            // Where RPM distributions keep it (Debian's rpm keeps its own
            // in ~/.rpmdb).
            .args(["--dbpath", "/var/lib/rpm"])
            .args(args)
            .output()
            .expect("rpm runs (apt-get install rpm)");
        assert!(
            output.status.success(),
            "rpm {args:?}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    };
    rpm(&["--initdb"]);
    for (name, epoch, version, release, files) in &packages {
        let install: String = files
            .iter()
            .map(|file| {
                let dir = file.parent().unwrap().display();
                format!(
                    "mkdir -p %{{buildroot}}{dir}\ncp {source} %{{buildroot}}{file}\n",
                    source = root.join(file.strip_prefix("/").unwrap()).display(),
                    file = file.display()
                )
            })
            .collect();
        let listed: String = files
            .iter()
            .map(|file| format!("{}\n", file.display()))
            .collect();
        let epoch = if epoch.is_empty() {
            String::new()
        } else {
            format!("Epoch: {epoch}\n")
        };
        let spec = scratch.0.join(format!("{name}.spec"));
        std::fs::write(
            &spec,
            format!(
                "Name: {name}\n{epoch}Version: {version}\nRelease: {release}\n\
                 Summary: {name}\nLicense: none\nAutoReqProv: no\n\
                 %description\n{name}\n%install\n{install}%files\n{listed}"
            ),
        )
        .unwrap();
        let built = Command::new("rpmbuild")
            .arg("-bb")
            .arg("--define")
            .arg(format!("_topdir {}", top.display()))
            .args(["--define", "debug_package %{nil}"])
            .args(["--define", "__os_install_post %{nil}"])
            .args(["--define", "_build_id_links none"])
            .arg(&spec)
            .output()
            .expect("rpmbuild runs (apt-get install rpm)");
        assert!(
            built.status.success(),
            "rpmbuild {name}: {}",
            String::from_utf8_lossy(&built.stderr)
        );
    }
    let mut built: Vec<String> = std::fs::read_dir(top.join("RPMS"))
        .unwrap()
        .flat_map(|arch| std::fs::read_dir(arch.unwrap().path()).unwrap())
        .map(|package| package.unwrap().path().display().to_string())
        .collect();
    built.sort();
    assert_eq!(built.len(), 3, "{built:?}");
    let mut install = vec!["-i", "--justdb", "--nodeps", "--noscripts", "--nosignature"];
    install.extend(built.iter().map(String::as_str));
    rpm(&install);
    let database: Vec<_> = ["var/lib/rpm", "usr/lib/sysimage/rpm"]
        .iter()
        .map(|dir| root.join(dir).join("rpmdb.sqlite"))
        .filter(|path| path.exists())
        .collect();
    assert_eq!(
        database.len(),
        1,
        "rpm wrote an SQLite database: {database:?}"
    );
    assert!(!root.join("var/lib/dpkg").exists());
    if berkeley_db {
        to_berkeley_db(&database[0], &root.join("var/lib/rpm/Packages"), &scratch);
        for suffix in ["", "-shm", "-wal"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", database[0].display()));
        }
    }

    let (classes, stderr) = profile_in_container(&scratch, &root);
    for (name, epoch, version, release, files) in &packages {
        let version = if epoch.is_empty() {
            format!("{version}-{release}")
        } else {
            format!("{epoch}:{version}-{release}")
        };
        let expected = ("standard library".to_string(), name.to_string(), version);
        // The loader maps no code that runs long enough to be sampled.
        for file in files.iter().filter(|file| **file != &loader) {
            let path = file.to_str().unwrap();
            assert!(
                classes.get(path).is_some_and(|got| got.contains(&expected)),
                "{path}: {expected:?}: {classes:#?}\n{stderr}"
            );
        }
    }
}

/// Writes the package headers of RPM's SQLite database `sqlite` (as the
/// `sqlite3` program reads them) into a Berkeley DB hash database at
/// `packages`, keyed by their numbers as RPM keyed them there (a 32-bit
/// integer in the machine's byte order).
fn to_berkeley_db(sqlite: &Path, packages: &Path, scratch: &Scratch) {
    let rows = Command::new("sqlite3")
        .arg(sqlite)
        .arg("SELECT hnum, hex(blob) FROM Packages")
        .output()
        .expect("sqlite3 runs");
    assert!(rows.status.success());
    let mut input = String::from("VERSION=3\nformat=bytevalue\ntype=hash\nHEADER=END\n");
    let mut count = 0;
    for row in String::from_utf8_lossy(&rows.stdout).lines() {
        let (number, blob) = row.split_once('|').expect("hnum|blob");
        let key: String = number
            .parse::<u32>()
            .unwrap()
            .to_ne_bytes()
            .iter()
            .map(|byte| format!("{byte:02x}"))
            .collect();
        input.push_str(&format!(" {key}\n {}\n", blob.to_lowercase()));
        count += 1;
    }
    assert_eq!(count, 3, "three packages' headers");
    input.push_str("DATA=END\n");
    let text = scratch.0.join("packages.txt");
    std::fs::write(&text, input).unwrap();
    let status = Command::new("db5.3_load")
        .arg("-f")
        .arg(&text)
        .arg(packages)
        .status()
        .expect("db5.3_load runs (apt-get install db5.3-util)");
    assert!(status.success());
}

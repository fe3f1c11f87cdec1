//! The profiler's view of processes: names, threads and executable mappings,
//! kept exact from `/proc` snapshots and the kernel's mmap/comm/task records.
use std::collections::HashMap;

/// Maps looked up for every frame of every sample (`find_mapping`) and every
/// sample (`thread_name`): a faster hash than the default SipHash.
type FastMap<K, V> = HashMap<K, V, ahash::RandomState>;
use std::sync::Arc;

use crate::files::MappedFile;

/// A mapping as reported by the kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingRecord {
    pub pid: u32,
    pub start: u64,
    pub len: u64,
    /// Offset in the file of `start`.
    pub file_offset: u64,
    /// Device and inode of the file (0 when unknown).
    pub dev: u64,
    pub inode: u64,
    /// `PROT_*` bits.
    pub prot: u32,
    pub path: String,
}

/// Process life-cycle and mapping changes, in the order the kernel reported
/// them; the stages that need a process view (unwinding, normalization)
/// apply these before the samples that follow them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProcessEvent {
    /// A new executable mapping (perf `PERF_RECORD_MMAP2`).
    Map(MappingRecord),
    /// A thread's name changed; `exec` is set when the process exec'd, which
    /// replaces every mapping it had.
    Comm {
        pid: u32,
        tid: u32,
        name: String,
        exec: bool,
    },
    /// A thread or process was created.
    Fork {
        pid: u32,
        ppid: u32,
        tid: u32,
        ptid: u32,
    },
    /// A thread or process exited.
    Exit { pid: u32, tid: u32 },
}

#[derive(Debug, Clone)]
pub struct Mapping {
    pub start: u64,
    pub end: u64,
    pub file_offset: u64,
    pub file: Arc<MappedFile>,
}

impl Mapping {
    /// Offset in the file of the address `addr` (which must be in the mapping).
    pub fn file_offset_of(&self, addr: u64) -> u64 {
        addr - self.start + self.file_offset
    }
}

#[derive(Debug, Default, Clone)]
pub struct Process {
    pub name: String,
    pub threads: FastMap<u32, String>,
    /// Executable mappings, sorted by start and not overlapping.
    pub mappings: Vec<Mapping>,
    /// Renewed whenever `mappings` change (see [`ProcessTable::code_generation`]).
    code_generation: u64,
    /// Renewed whenever `name` or `threads` change.
    names_generation: u64,
    /// Execs the records said it made since the table learned of it (a
    /// new image: its heap is new too).
    execs: u32,
    /// The container it runs in: read from its cgroup when the table
    /// learns of it from `/proc` and at each exec (a runtime moves a
    /// container's first process into its cgroup before the exec), its
    /// parent's after a fork.
    pub container: Option<Arc<str>>,
}

impl Process {
    /// A process first met in a record other than its fork (or whose
    /// parent the table did not know): its container read now.
    fn met(pid: u32) -> Self {
        Self {
            container: crate::container::container_of(pid),
            ..Self::default()
        }
    }

    pub fn find_mapping(&self, addr: u64) -> Option<&Mapping> {
        let index = self.mappings.partition_point(|m| m.start <= addr);
        let mapping = self.mappings.get(index.checked_sub(1)?)?;
        (addr < mapping.end).then_some(mapping)
    }

    fn code_changed(&mut self) {
        self.code_generation = Generation::next().0;
    }

    fn names_changed(&mut self) {
        self.names_generation = Generation::next().0;
    }

    fn insert_mapping(&mut self, mapping: Mapping) {
        self.code_changed();
        // A new mapping replaces whatever it overlaps (mmap semantics).
        let (start, end) = (mapping.start, mapping.end);
        let mut kept = Vec::with_capacity(self.mappings.len() + 1);
        for old in self.mappings.drain(..) {
            if old.end <= start || old.start >= end {
                kept.push(old);
                continue;
            }
            if old.start < start {
                kept.push(Mapping {
                    end: start,
                    ..old.clone()
                });
            }
            if old.end > end {
                let shift = end - old.start;
                kept.push(Mapping {
                    start: end,
                    file_offset: old.file_offset + shift,
                    ..old
                });
            }
        }
        kept.push(mapping);
        kept.sort_by_key(|m| m.start);
        self.mappings = kept;
    }
}

/// The most exits [`ProcessTable::exited`] remembers.
pub const MAX_EXITED: usize = 4096;

/// Every process the profiler has seen and not yet seen exit.
#[derive(Debug, Default)]
pub struct ProcessTable {
    processes: FastMap<u32, Process>,
    /// Processes whose exit was applied and whose pid has not come back
    /// since, each with the number of its exit; the oldest forgotten
    /// first (see [`ProcessTable::exited`]).
    exited: FastMap<u32, u64>,
    /// The exits in the order they were applied (some of them stale: the
    /// pid came back since), for forgetting the oldest.
    exit_order: std::collections::VecDeque<(u32, u64)>,
    /// Exits applied so far.
    exits: u64,
    /// The last processes that exited, as they were then (at most
    /// `keep_ended`, 0 unless asked): the live heap names what they held
    /// at their exit with their mappings.
    ended: std::collections::VecDeque<(u32, Process)>,
    keep_ended: usize,
    files: FastMap<MappedFile, Arc<MappedFile>>,
    /// Renewed by every change, so that consumers that mirror the table
    /// (the BPF maps) can tell cheaply that nothing changed.
    generation: Generation,
}

/// A value no other table state ever had: drawn from one process-wide
/// counter, so that two tables never share one either.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Generation(u64);

impl Generation {
    fn next() -> Generation {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        Generation(NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed))
    }
}

impl Default for Generation {
    fn default() -> Self {
        Generation::next()
    }
}

impl ProcessTable {
    pub fn new() -> Self {
        Self::default()
    }

    /// Changes whenever a process, thread or mapping is added, renamed or
    /// removed.
    pub fn generation(&self) -> u64 {
        self.generation.0
    }

    /// Changes whenever process `pid`'s executable mappings change, and
    /// only then (0 for a process the table does not know): what an
    /// address of that process means stays true while it is the same. A
    /// table-wide [`ProcessTable::generation`] would make one process's
    /// `mmap` forget what every other process's addresses meant: with
    /// processes starting all the time (a build, `--global`), nearly every
    /// sample.
    pub fn code_generation(&self, pid: u32) -> u64 {
        self.processes.get(&pid).map_or(0, |p| p.code_generation)
    }

    /// Changes whenever process `pid`'s name or threads (their names
    /// included) change; 0 for a process the table does not know.
    pub fn names_generation(&self, pid: u32) -> u64 {
        self.processes.get(&pid).map_or(0, |p| p.names_generation)
    }

    /// Execs of process `pid` since the table learned of it (0 for a
    /// process it does not know).
    pub fn execs(&self, pid: u32) -> u32 {
        self.processes.get(&pid).map_or(0, |p| p.execs)
    }

    pub fn get(&self, pid: u32) -> Option<&Process> {
        self.processes.get(&pid)
    }

    /// Whether the records said that process `pid` exited (and no process
    /// has had its pid since). `false` says nothing of a process among more
    /// than [`MAX_EXITED`] exits ago: the table forgets the oldest, so that a
    /// long `--global` run does not keep every pid it ever saw. (It forgot
    /// them all at once before, and a sample of a process that had just
    /// exited, delivered after its exit, then read as another process's.)
    pub fn exited(&self, pid: u32) -> bool {
        self.exited.contains_key(&pid)
    }

    pub fn pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.processes.keys().copied()
    }

    /// Every process, with its pid.
    pub fn iter(&self) -> impl Iterator<Item = (u32, &Process)> + '_ {
        self.processes.iter().map(|(&pid, process)| (pid, process))
    }

    pub fn find_mapping(&self, pid: u32, addr: u64) -> Option<&Mapping> {
        self.processes.get(&pid)?.find_mapping(addr)
    }

    /// The container `pid` runs in, if any.
    pub fn container(&self, pid: u32) -> Option<&str> {
        self.get(pid)?.container.as_deref()
    }

    pub fn process_name(&self, pid: u32) -> Option<&str> {
        self.processes.get(&pid).map(|p| p.name.as_str())
    }

    pub fn thread_name(&self, pid: u32, tid: u32) -> Option<&str> {
        self.processes
            .get(&pid)?
            .threads
            .get(&tid)
            .map(String::as_str)
    }

    /// Copies process `pid` of `other` into this table, if `other` has it.
    pub fn copy_process(&mut self, other: &ProcessTable, pid: u32) {
        if let Some(process) = other.get(pid) {
            self.generation = Generation::next();
            self.came_back(pid);
            self.processes.insert(pid, process.clone());
        }
    }

    /// Process `pid` is (again) one the records describe: its earlier
    /// exit no longer stands, and a process that had its pid is no longer
    /// the one [`ProcessTable::as_it_ended`] would give.
    fn came_back(&mut self, pid: u32) {
        self.exited.remove(&pid);
        if !self.ended.is_empty() {
            self.ended.retain(|(ended, _)| *ended != pid);
        }
    }

    /// Forgets the processes kept as they ended (the live heap has named
    /// what they held, once, at the end of the period they ended in).
    pub fn forget_ended(&mut self) {
        self.ended.clear();
    }

    /// Keeps the last `count` processes that exit as they were then
    /// ([`ProcessTable::as_it_ended`]).
    pub fn keep_ended(&mut self, count: usize) {
        self.keep_ended = count;
        while self.ended.len() > count {
            self.ended.pop_front();
        }
    }

    /// A table of process `pid` alone, as it was when it exited, if it is
    /// one of the last kept ([`ProcessTable::keep_ended`]).
    pub fn as_it_ended(&self, pid: u32) -> Option<ProcessTable> {
        let (_, process) = self.ended.iter().rev().find(|(ended, _)| *ended == pid)?;
        let mut table = ProcessTable::new();
        table.processes.insert(pid, process.clone());
        Some(table)
    }

    /// Drops process `pid` without saying that it exited.
    pub fn forget(&mut self, pid: u32) {
        if self.processes.remove(&pid).is_some() {
            self.generation = Generation::next();
        }
    }

    /// Keeps only the processes for which `keep` holds.
    pub fn retain(&mut self, mut keep: impl FnMut(u32) -> bool) {
        self.generation = Generation::next();
        self.processes.retain(|pid, _| keep(*pid));
    }

    fn intern_file(&mut self, path: &str, dev: u64, inode: u64) -> Arc<MappedFile> {
        let key = MappedFile {
            path: path.to_string(),
            dev,
            inode,
        };
        self.files
            .entry(key)
            .or_insert_with_key(|key| Arc::new(key.clone()))
            .clone()
    }

    /// Applies a mapping record. Only executable mappings are kept.
    pub fn add_mapping(&mut self, record: &MappingRecord) {
        self.generation = Generation::next();
        if record.prot & (libc::PROT_EXEC as u32) == 0 || record.len == 0 {
            return;
        }
        let file = self.intern_file(&record.path, record.dev, record.inode);
        let mapping = Mapping {
            start: record.start,
            end: record.start.saturating_add(record.len),
            file_offset: record.file_offset,
            file,
        };
        self.came_back(record.pid);
        self.processes
            .entry(record.pid)
            .or_insert_with(|| Process::met(record.pid))
            .insert_mapping(mapping);
    }

    /// A thread was renamed; on exec the process's mappings are dropped,
    /// since the new image's mappings follow as fresh records.
    pub fn set_comm(&mut self, pid: u32, tid: u32, name: &str, exec: bool) {
        self.generation = Generation::next();
        self.came_back(pid);
        let process = self
            .processes
            .entry(pid)
            .or_insert_with(|| Process::met(pid));
        process.names_changed();
        if exec {
            process.execs = process.execs.wrapping_add(1);
            process.code_changed();
            process.mappings.clear();
            process.threads.clear();
            // Its root, while it runs: a short-lived process's files are
            // then found after it exited, under the root of the program
            // that exec'd (a container's, after `chroot`), by their device
            // and inode (see `files::target::open_mapped`).
            crate::files::target::note_process_root(pid);
            process.container = crate::container::container_of(pid);
        }
        if pid == tid {
            process.name = name.to_string();
        }
        process.threads.insert(tid, name.to_string());
    }

    /// A fork copies the parent's view; a new thread joins its process.
    pub fn fork(&mut self, pid: u32, ppid: u32, tid: u32) {
        self.generation = Generation::next();
        if pid == ppid {
            let process = self
                .processes
                .entry(pid)
                .or_insert_with(|| Process::met(pid));
            process.names_changed();
            let name = process.name.clone();
            process.threads.insert(tid, name);
            return;
        }
        self.came_back(pid);
        // The parent's name and mappings, not its threads: the child has
        // only the forking thread (cloning the parent's thread map to drop
        // it cost a table allocation and a copy per fork).
        let mut child = match self.processes.get(&ppid) {
            Some(parent) => Process {
                name: parent.name.clone(),
                mappings: parent.mappings.clone(),
                container: parent.container.clone(),
                ..Process::default()
            },
            None => Process::met(pid),
        };
        child.threads.insert(tid, child.name.clone());
        child.code_changed();
        child.names_changed();
        self.processes.insert(pid, child);
    }

    /// A thread exited; when it is the main thread the process is gone.
    pub fn exit(&mut self, pid: u32, tid: u32) {
        self.generation = Generation::next();
        if pid == tid {
            if let Some(process) = self.processes.remove(&pid) {
                if self.keep_ended > 0 {
                    if self.ended.len() >= self.keep_ended {
                        self.ended.pop_front();
                    }
                    self.ended.push_back((pid, process));
                }
            }
            self.exits += 1;
            self.exited.insert(pid, self.exits);
            self.exit_order.push_back((pid, self.exits));
            while self.exited.len() > MAX_EXITED || self.exit_order.len() > 2 * MAX_EXITED {
                let Some((oldest, number)) = self.exit_order.pop_front() else {
                    break;
                };
                if self.exited.get(&oldest) == Some(&number) {
                    self.exited.remove(&oldest);
                }
            }
        } else if let Some(process) = self.processes.get_mut(&pid) {
            process.names_changed();
            process.threads.remove(&tid);
        }
    }

    pub fn apply(&mut self, event: &ProcessEvent) {
        match event {
            ProcessEvent::Map(record) => self.add_mapping(record),
            ProcessEvent::Comm {
                pid,
                tid,
                name,
                exec,
            } => self.set_comm(*pid, *tid, name, *exec),
            ProcessEvent::Fork { pid, ppid, tid, .. } => self.fork(*pid, *ppid, *tid),
            ProcessEvent::Exit { pid, tid } => self.exit(*pid, *tid),
        }
    }

    /// Reads a live process's name, threads and executable mappings from
    /// `/proc` (for `-p`, `--global` and the launcher's target).
    pub fn load_from_proc(&mut self, pid: u32) -> std::io::Result<()> {
        self.generation = Generation::next();
        let name = read_lossy(format!("/proc/{pid}/comm"))?
            .trim_end_matches('\n')
            .to_string();
        let maps = read_lossy(format!("/proc/{pid}/maps"))?;
        let mut process = Process {
            name: name.clone(),
            container: crate::container::container_of(pid),
            ..Process::default()
        };
        if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
            for task in tasks.flatten() {
                let Some(tid) = task.file_name().to_str().and_then(|t| t.parse().ok()) else {
                    continue;
                };
                let thread_name = read_lossy(task.path().join("comm"))
                    .map(|n| n.trim_end_matches('\n').to_string())
                    .unwrap_or_else(|_| name.clone());
                process.threads.insert(tid, thread_name);
            }
        }
        process.code_changed();
        process.names_changed();
        self.came_back(pid);
        self.processes.insert(pid, process);
        self.add_maps(pid, &maps);
        Ok(())
    }

    /// [`ProcessTable::load_from_proc`] without the names: only the
    /// mappings, from `/proc/PID/maps`, for a table that only describes
    /// code (the BPF engine's syncs of new processes, one per process a
    /// compiler driver or a shell starts).
    pub fn load_mappings_from_proc(&mut self, pid: u32) -> std::io::Result<()> {
        self.generation = Generation::next();
        let maps = read_lossy(format!("/proc/{pid}/maps"))?;
        let mut process = Process::default();
        process.code_changed();
        process.names_changed();
        self.came_back(pid);
        self.processes.insert(pid, process);
        self.add_maps(pid, &maps);
        Ok(())
    }

    fn add_maps(&mut self, pid: u32, maps: &str) {
        for line in maps.lines() {
            if let Some(record) = parse_maps_line(pid, line) {
                // The kernel's fixed vsyscall page is no mmap, so the
                // records never describe it: a process read from /proc must
                // look the same as when its records are applied, or the BPF
                // engine rewrites the entry of every new process it read
                // when the records arrive.
                if record.path != "[vsyscall]" {
                    self.add_mapping(&record);
                }
            }
        }
    }
}

/// Reads a `/proc` file as text. Names and paths are bytes to the kernel:
/// a command or file name that is not UTF-8, or a UTF-8 name cut inside a
/// character (comm keeps 15 bytes), must not make the process unreadable.
///
/// `/proc` files say their size is 0, so `std::fs::read` asks for their
/// size and position and then starts from a 32-byte buffer that it doubles:
/// 11 system calls for a short `/proc/PID/maps`. From a 16 KiB buffer, a
/// short one takes two reads; the BPF engine reads the maps of every new
/// process.
fn read_lossy(path: impl AsRef<std::path::Path>) -> std::io::Result<String> {
    use std::io::Read;
    let mut file = std::fs::File::open(path)?;
    let mut bytes = vec![0u8; 16 * 1024];
    let mut len = 0;
    loop {
        if len == bytes.len() {
            bytes.resize(len * 2, 0);
        }
        match file.read(&mut bytes[len..]) {
            Ok(0) => break,
            Ok(read) => len += read,
            Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
            Err(error) => return Err(error),
        }
    }
    bytes.truncate(len);
    Ok(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(error) => String::from_utf8_lossy(error.as_bytes()).into_owned(),
    })
}

/// One line of `/proc/PID/maps`, split into its fields (`path` as the
/// kernel wrote it, `""` for none): the one reader of that format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapsLine<'a> {
    pub start: u64,
    pub end: u64,
    /// `rwxp` / `rwxs`.
    pub perms: &'a str,
    pub offset: &'a str,
    pub dev: &'a str,
    pub inode: &'a str,
    pub path: &'a str,
}

impl<'a> MapsLine<'a> {
    pub fn parse(line: &'a str) -> Option<Self> {
        let mut fields = line.splitn(6, char::is_whitespace);
        let (start, end) = fields.next()?.split_once('-')?;
        Some(Self {
            start: u64::from_str_radix(start, 16).ok()?,
            end: u64::from_str_radix(end, 16).ok()?,
            perms: fields.next()?,
            offset: fields.next()?,
            dev: fields.next()?,
            inode: fields.next()?,
            path: fields.next().unwrap_or("").trim_start(),
        })
    }

    /// Private (copy-on-write) memory that no file backs (its inode is 0;
    /// the callers say which names they take: none, `[stack]`, …).
    pub fn is_private_unbacked(&self) -> bool {
        self.inode == "0" && self.perms.ends_with('p')
    }

    /// Shared memory (`s`).
    pub fn is_shared(&self) -> bool {
        self.perms.ends_with('s')
    }
}

/// Parses one line of `/proc/PID/maps`.
pub fn parse_maps_line(pid: u32, line: &str) -> Option<MappingRecord> {
    let MapsLine {
        start,
        end,
        perms,
        offset,
        dev,
        inode,
        path,
    } = MapsLine::parse(line)?;
    let path = path.to_string();
    let perms = perms.as_bytes();
    let mut prot = 0u32;
    if perms.first() == Some(&b'r') {
        prot |= libc::PROT_READ as u32;
    }
    if perms.get(1) == Some(&b'w') {
        prot |= libc::PROT_WRITE as u32;
    }
    if perms.get(2) == Some(&b'x') {
        prot |= libc::PROT_EXEC as u32;
    }
    let (major, minor) = dev.split_once(':')?;
    let dev = libc::makedev(
        u32::from_str_radix(major, 16).ok()?,
        u32::from_str_radix(minor, 16).ok()?,
    );
    Some(MappingRecord {
        pid,
        start,
        len: end.checked_sub(start)?,
        file_offset: u64::from_str_radix(offset, 16).ok()?,
        dev,
        inode: inode.parse().ok()?,
        prot,
        path,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(pid: u32, start: u64, len: u64, offset: u64, path: &str) -> MappingRecord {
        MappingRecord {
            pid,
            start,
            len,
            file_offset: offset,
            dev: 1,
            inode: 2,
            prot: (libc::PROT_READ | libc::PROT_EXEC) as u32,
            path: path.to_string(),
        }
    }

    /// The BPF engine asks `/proc` about a process only when the records
    /// did not say that it exited.
    #[test]
    fn remembers_which_processes_the_records_saw_exit() {
        let mut table = ProcessTable::new();
        table.add_mapping(&record(7, 0x1000, 0x1000, 0, "/a"));
        assert!(!table.exited(7));
        // A thread's exit is not the process's.
        table.exit(7, 8);
        assert!(!table.exited(7));
        table.exit(7, 7);
        assert!(table.exited(7) && table.get(7).is_none());
        // The pid comes back: a new process.
        table.fork(7, 1, 7);
        assert!(!table.exited(7));
        // Bounded: after many exits the oldest are forgotten ("not known"),
        // and only the oldest: the last exits are always remembered.
        let last = 100 + 3 * MAX_EXITED as u32;
        for pid in 100..last {
            table.fork(pid, 1, pid);
            table.exit(pid, pid);
            assert!(table.exited(pid));
            assert!(table.exited(pid.saturating_sub(MAX_EXITED as u32 - 1).max(100)));
        }
        assert!(!table.exited(100));
        assert!(!table.exited(last - MAX_EXITED as u32 - 1));
        // A pid that came back and exited again counts from its new exit.
        table.fork(last - 1, 1, last - 1);
        table.exit(last - 1, last - 1);
        for pid in last..last + MAX_EXITED as u32 - 1 {
            table.fork(pid, 1, pid);
            table.exit(pid, pid);
        }
        assert!(table.exited(last - 1));
        assert!(!table.exited(last - 2));
    }

    #[test]
    fn a_process_read_from_proc_has_no_vsyscall_page() {
        let mut table = ProcessTable::new();
        table.add_maps(
            5,
            "55d0c2a00000-55d0c2a01000 r-xp 00001000 fe:00 123 /bin/x\n\
             ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0 [vsyscall]\n",
        );
        let process = table.get(5).unwrap();
        assert_eq!(process.mappings.len(), 1);
        assert_eq!(process.mappings[0].file.path, "/bin/x");
    }

    #[test]
    fn finds_and_splits_mappings() {
        let mut table = ProcessTable::new();
        table.add_mapping(&record(7, 0x1000, 0x3000, 0, "/a"));
        table.add_mapping(&record(7, 0x2000, 0x1000, 0x500, "/b"));
        assert_eq!(table.find_mapping(7, 0x1800).unwrap().file.path, "/a");
        let b = table.find_mapping(7, 0x2800).unwrap();
        assert_eq!(
            (b.file.path.as_str(), b.file_offset_of(0x2800)),
            ("/b", 0xd00)
        );
        let tail = table.find_mapping(7, 0x3800).unwrap();
        assert_eq!(
            (tail.file.path.as_str(), tail.file_offset_of(0x3800)),
            ("/a", 0x2800)
        );
        assert!(table.find_mapping(7, 0x4000).is_none());
        assert!(table.find_mapping(8, 0x1800).is_none());
    }

    #[test]
    fn a_process_generations_move_only_with_its_own_changes() {
        let mut table = ProcessTable::new();
        assert_eq!(table.code_generation(7), 0, "unknown process");
        table.add_mapping(&record(7, 0x1000, 0x1000, 0, "/a"));
        table.set_comm(7, 7, "a", false);
        let (code, names) = (table.code_generation(7), table.names_generation(7));
        assert_ne!(code, 0);
        // Other processes come, map code and go.
        table.fork(9, 7, 9);
        table.add_mapping(&record(9, 0x5000, 0x1000, 0, "/b"));
        table.exit(9, 9);
        assert_eq!(
            (table.code_generation(7), table.names_generation(7)),
            (code, names)
        );
        // A new thread moves the names only.
        table.fork(7, 7, 8);
        assert_eq!(table.code_generation(7), code);
        assert_ne!(table.names_generation(7), names);
        let names = table.names_generation(7);
        table.add_mapping(&record(7, 0x3000, 0x1000, 0, "/c"));
        assert_ne!(table.code_generation(7), code);
        assert_eq!(table.names_generation(7), names);
        let code = table.code_generation(7);
        table.set_comm(7, 7, "b", true);
        assert_ne!(table.code_generation(7), code, "exec drops the mappings");
        table.exit(7, 7);
        assert_eq!(table.code_generation(7), 0, "gone");
    }

    #[test]
    fn every_change_moves_the_generation() {
        let mut table = ProcessTable::new();
        let start = table.generation();
        table.add_mapping(&record(7, 0x1000, 0x1000, 0, "/a"));
        let mapped = table.generation();
        assert_ne!(start, mapped);
        assert_eq!(table.find_mapping(7, 0x1000).map(|m| m.start), Some(0x1000));
        assert_eq!(table.generation(), mapped, "reads change nothing");
        table.fork(9, 7, 9);
        table.exit(9, 9);
        assert_ne!(table.generation(), mapped);
        assert_ne!(
            ProcessTable::new().generation(),
            table.generation(),
            "tables never share one"
        );
    }

    #[test]
    fn exec_resets_and_fork_copies() {
        let mut table = ProcessTable::new();
        table.add_mapping(&record(7, 0x1000, 0x1000, 0, "/a"));
        table.set_comm(7, 7, "parent", false);
        table.fork(9, 7, 9);
        assert_eq!(table.process_name(9), Some("parent"));
        assert!(table.find_mapping(9, 0x1000).is_some());
        table.set_comm(9, 9, "child", true);
        assert!(table.find_mapping(9, 0x1000).is_none());
        assert!(table.find_mapping(7, 0x1000).is_some());
        table.exit(9, 9);
        assert!(table.get(9).is_none());
    }

    #[test]
    fn a_forked_child_has_only_the_forking_thread() {
        let mut table = ProcessTable::new();
        table.add_mapping(&record(7, 0x1000, 0x1000, 0, "/a"));
        table.set_comm(7, 7, "parent", false);
        table.fork(7, 7, 8);
        table.set_comm(7, 8, "worker", false);
        table.fork(9, 7, 9);
        let child = table.get(9).unwrap();
        assert_eq!(child.threads.len(), 1);
        assert_eq!(table.thread_name(9, 9), Some("parent"));
        let spans = |pid| {
            let process = table.get(pid).unwrap();
            process
                .mappings
                .iter()
                .map(|m| (m.start, m.end))
                .collect::<Vec<_>>()
        };
        assert_eq!(spans(9), spans(7));
        assert_eq!(table.get(7).unwrap().threads.len(), 2);
        assert_eq!(table.thread_name(7, 8), Some("worker"));
    }

    #[test]
    fn parses_proc_maps_lines() {
        let line = "7f1c2a000000-7f1c2a1b5000 r-xp 00028000 fe:01 1311 /usr/lib/x86_64-linux-gnu/libc.so.6";
        let r = parse_maps_line(3, line).unwrap();
        assert_eq!(r.start, 0x7f1c2a000000);
        assert_eq!(r.len, 0x1b5000);
        assert_eq!(r.file_offset, 0x28000);
        assert_eq!(r.inode, 1311);
        assert_eq!(r.path, "/usr/lib/x86_64-linux-gnu/libc.so.6");
        assert!(r.prot & libc::PROT_EXEC as u32 != 0);
        assert!(parse_maps_line(3, "garbage").is_none());
    }

    #[test]
    fn loads_processes_whose_names_are_not_utf8() {
        use std::os::unix::ffi::OsStrExt;
        // A program file named with a byte that is not UTF-8: its comm and
        // its mapping's path carry that byte.
        let dir = std::env::temp_dir().join(format!("ddprof-names-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let name = std::ffi::OsStr::from_bytes(b"sl\xffeep-\xe6\x97\xa5");
        let program = dir.join(name);
        std::fs::copy("/bin/sleep", &program).unwrap();
        let mut child = std::process::Command::new(&program)
            .arg("10")
            .spawn()
            .unwrap();
        let pid = child.id();
        // Wait until the exec has mapped the program.
        let maps = format!("/proc/{pid}/maps");
        while std::fs::read(&maps).map_or(true, |m| !m.windows(3).any(|w| w == b"\xffee")) {
            std::thread::sleep(std::time::Duration::from_millis(2));
        }
        let mut table = ProcessTable::new();
        let loaded = table.load_from_proc(pid);
        let _ = child.kill();
        let _ = child.wait();
        std::fs::remove_dir_all(&dir).unwrap();
        loaded.unwrap();
        assert_eq!(table.process_name(pid), Some("sl\u{fffd}eep-日"));
        assert_eq!(table.thread_name(pid, pid), Some("sl\u{fffd}eep-日"));
        let paths: Vec<&str> = table
            .get(pid)
            .unwrap()
            .mappings
            .iter()
            .map(|m| m.file.path.as_str())
            .collect();
        assert!(
            paths.iter().any(|p| p.ends_with("/sl\u{fffd}eep-日")),
            "{paths:?}"
        );
    }

    #[test]
    fn loads_own_process_from_proc() {
        let mut table = ProcessTable::new();
        let pid = std::process::id();
        table.load_from_proc(pid).unwrap();
        let here = loads_own_process_from_proc as *const () as u64;
        let mapping = table.find_mapping(pid, here).expect("own code is mapped");
        assert!(
            mapping.file.path.contains("ddprof"),
            "{}",
            mapping.file.path
        );
    }
}

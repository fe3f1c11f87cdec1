//! Compiled unwind tables kept on disk by content, so that a later run
//! reads a file's table instead of compiling its CFI again.
//!
//! Compiling libc's `.eh_frame` (23,532 rows) takes 2-5 ms of every start,
//! and a start compiles every file the workload maps (five for a small C
//! program: ~3-5 ms, a sixth of a 4 s run's profiler CPU at 99 Hz); cc1's
//! 432,937 rows take ~55 ms. The first run that compiles a file writes its
//! table to `DIR/xx/rest.rows`, named by the digest of what it was compiled
//! from ([`ContentKey`]: the file's bytes and its split debug file's, whose
//! `.debug_frame` adds rows); later runs read it in ~0.1 ms. A build id
//! would be cheaper but is chosen by whoever builds the file: a library
//! built with another's build id got that library's table, or gave it its
//! own. Keys by digest also cover files without a build id, which were
//! compiled again at every run. Each file is checked before use — its
//! CRC-32, its key, its counts against its length, its rows sorted — so
//! that a truncated, corrupt or foreign file costs a compile, never a wrong
//! table. The directory is ddprof's own ([`PrivateDir`]), files are written
//! under a fresh name and renamed into place, and the least recently used
//! go once the directory holds more than [`STORE_MAX_BYTES`].
//!
//! A stored table is used where it lies: the file is mapped read-only and
//! its rows are the page cache's pages ([`StoredRows`]), which also fill
//! the BPF engine's map. Read into memory of their own, the rows of a big
//! program (2.4 M, 29 MB) cost more in page faults than everything else
//! its load does.

use std::sync::Arc;

#[cfg(test)]
use ddprof_common::unwind::UnwindRow;

use super::compile::{CompileStats, LoadSegment, Rows, StoredRows, UnwindTable};
use crate::files::cache_dir::CacheDir;
use crate::files::{own_build_id, ContentKey, Digest, Fields};

/// Total size of the stored tables; the least recently used go first.
pub const STORE_MAX_BYTES: u64 = 256 << 20;
const MAGIC: &[u8; 8] = b"DDPRUNW\0";
/// The layout of the file (version 5: the rows start at a multiple of
/// [`ROW_ALIGN`], zeros before them). Tables are also keyed by the build id of the
/// ddprof that compiled them ([`own_build_id`]), so that a table another
/// build compiled (whose compiler may have changed) is compiled again with
/// no version to bump by hand.
const FORMAT_VERSION: u32 = 5;
/// Bytes of a row in the file: `start`, `cfa_offset`, `rbp_offset`,
/// `slot_by_8` (version 4: the caller's RBX, was the return address),
/// `kind_bits`, little-endian.
const ROW_BYTES: usize = 12;
/// Bytes of a segment in the file: `file_offset`, `vaddr`, `file_size`.
const SEGMENT_BYTES: usize = 24;

/// The directory of stored tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableStore {
    dir: CacheDir,
}

impl TableStore {
    /// The store in `dir` (made, `0700`, at first use).
    pub fn new(dir: std::path::PathBuf) -> Self {
        Self {
            dir: CacheDir::new(dir),
        }
    }

    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// `xx` and `rest.rows` for a key's digest.
    fn place_of(key: &ContentKey) -> (String, String) {
        let hex = key.digest().hex();
        (hex[..2].to_string(), format!("{}.rows", &hex[2..]))
    }

    /// The stored table of `key`, if one was written and is whole.
    pub fn load(&self, key: &ContentKey) -> Option<UnwindTable> {
        let compiler = own_build_id()?;
        let (prefix, name) = Self::place_of(key);
        // No table is larger than the whole store may be.
        let view = Arc::new(self.dir.map(&prefix, &name, STORE_MAX_BYTES)?);
        let table = check(view.bytes(), &key.digest(), compiler).and_then(|checked| {
            Some(UnwindTable {
                rows: Rows::Stored(StoredRows::new(
                    view.clone(),
                    checked.rows_at,
                    checked.row_count,
                )?),
                segments: checked.segments,
                stats: checked.stats,
            })
        });
        if table.is_some() {
            // Marks it recently used for the eviction order.
            self.dir.touch(&prefix, &name);
        } else {
            log::debug!(
                "unwind table store: {} is stale or corrupt",
                self.dir.path().join(&prefix).join(&name).display()
            );
        }
        table
    }

    /// Writes `table`, compiled from `key`'s files, for later runs.
    pub fn save(&self, key: &ContentKey, table: &UnwindTable) -> std::io::Result<()> {
        let Some(compiler) = own_build_id() else {
            return Ok(());
        };
        let (prefix, name) = Self::place_of(key);
        let bytes = encode(&key.digest(), table, compiler);
        self.dir
            .write(&prefix, &name, |out| out.write_all(&bytes))?;
        self.evict_beyond(STORE_MAX_BYTES, (&prefix, &name));
        Ok(())
    }

    /// Removes the least recently used tables until the directory holds at
    /// most `max_bytes` (never `keep`, the table just written).
    fn evict_beyond(&self, max_bytes: u64, keep: (&str, &str)) {
        self.dir
            .trim("unwind table store", max_bytes, Some(keep), None);
    }
}

/// The file's bytes: magic, version, the key, the table, and the CRC-32 of
/// everything before it.
fn encode(key: &Digest, table: &UnwindTable, compiler: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        128 + table.segments.len() * SEGMENT_BYTES + table.rows.len() * ROW_BYTES,
    );
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(compiler.len() as u32).to_le_bytes());
    out.extend_from_slice(compiler);
    out.extend_from_slice(&key.0);
    let stats = &table.stats;
    for value in [
        stats.fdes,
        stats.skipped_fdes,
        stats.failed_fdes,
        stats.unsupported_rows,
        stats.plt_stubs,
    ] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&(table.segments.len() as u32).to_le_bytes());
    out.extend_from_slice(&(table.rows.len() as u32).to_le_bytes());
    for segment in &table.segments {
        for value in [segment.file_offset, segment.vaddr, segment.file_size] {
            out.extend_from_slice(&value.to_le_bytes());
        }
    }
    out.resize(rows_offset(out.len()), 0);
    for row in table.rows.iter() {
        out.extend_from_slice(&row.start.to_le_bytes());
        out.extend_from_slice(&row.cfa_offset.to_le_bytes());
        out.extend_from_slice(&row.rbp_offset.to_le_bytes());
        out.extend_from_slice(&row.slot_by_8.to_le_bytes());
        out.push(row.kind_bits);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// Where the parts of a stored table's file are, once it is checked.
struct Checked {
    segments: Vec<LoadSegment>,
    stats: CompileStats,
    /// Byte offset of the rows (a multiple of [`ROW_ALIGN`]).
    rows_at: usize,
    row_count: usize,
}

/// What the rows' offset in the file is a multiple of: a row's alignment
/// in memory, so that a mapped file's rows are used where they are.
const ROW_ALIGN: usize = 8;

/// The parts of `bytes` if they are a whole, uncorrupted file of this
/// format, compiled from `key`'s files, with rows sorted by address.
fn check(bytes: &[u8], key: &Digest, compiler: &[u8]) -> Option<Checked> {
    // Everything before the rows, then the rows, then the CRC-32 of both.
    let (body, stored_crc) = bytes.split_last_chunk::<4>()?;
    let mut fields = Fields::new(body);
    if fields.take(MAGIC.len())? != MAGIC || fields.u32()? != FORMAT_VERSION {
        return None;
    }
    let compiler_len = fields.u32()? as usize;
    if fields.take(compiler_len)? != compiler {
        return None;
    }
    if fields.take(key.0.len())? != key.0 {
        return None;
    }
    let stats = CompileStats {
        fdes: fields.u64()?,
        skipped_fdes: fields.u64()?,
        failed_fdes: fields.u64()?,
        unsupported_rows: fields.u64()?,
        plt_stubs: fields.u64()?,
    };
    let segment_count = fields.u32()? as usize;
    let row_count = fields.u32()? as usize;
    if segment_count == 0 {
        return None;
    }
    // The counts must account for the rest of the file exactly (checked
    // before anything of their size is allocated).
    let segment_bytes = segment_count.checked_mul(SEGMENT_BYTES)?;
    let segments_at = header_bytes(compiler_len)?;
    let rows_at = rows_offset(segments_at.checked_add(segment_bytes)?);
    let rows_end = rows_at.checked_add(row_count.checked_mul(ROW_BYTES)?)?;
    if rows_end != body.len() {
        return None;
    }
    // The CRC and the order of the rows in one pass, a chunk at a time
    // while it is in the cache: the first touch of a mapped file's pages is
    // most of what checking it costs (two passes over libLLVM's and
    // librustc_driver's 27 MB cost ~19 ms of a warm `rustc -O` run here).
    let mut crc = crc32fast::Hasher::new();
    crc.update(&body[..rows_at]);
    let mut previous: Option<u32> = None;
    for chunk in body[rows_at..].chunks(CHECK_CHUNK_ROWS * ROW_BYTES) {
        crc.update(chunk);
        // Both unwinders binary-search the rows (the BPF program too).
        for raw in chunk.as_chunks::<ROW_BYTES>().0 {
            let start = u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]);
            if previous >= Some(start) {
                return None;
            }
            previous = Some(start);
        }
    }
    if crc.finalize().to_le_bytes() != *stored_crc {
        return None;
    }
    let mut fields = Fields::new(&body[segments_at..rows_at]);
    let segments = (0..segment_count)
        .map(|_| {
            Some(LoadSegment {
                file_offset: fields.u64()?,
                vaddr: fields.u64()?,
                file_size: fields.u64()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    if fields.rest.iter().any(|&byte| byte != 0) {
        return None;
    }
    Some(Checked {
        segments,
        stats,
        rows_at,
        row_count,
    })
}

/// Rows checked at once (192 KiB: in the cache between the two checks).
const CHECK_CHUNK_ROWS: usize = 1 << 14;

/// The table in `bytes` if they are a whole, uncorrupted file of this
/// format (the checks of a mapped file, on bytes in memory).
#[cfg(test)]
fn decode(bytes: &[u8], key: &Digest, compiler: &[u8]) -> Option<UnwindTable> {
    let checked = check(bytes, key, compiler)?;
    let (rows, _) = bytes[checked.rows_at..].as_chunks::<ROW_BYTES>();
    let rows = rows[..checked.row_count]
        .iter()
        .map(|raw| UnwindRow {
            start: u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]),
            cfa_offset: i32::from_le_bytes([raw[4], raw[5], raw[6], raw[7]]),
            rbp_offset: i16::from_le_bytes([raw[8], raw[9]]),
            slot_by_8: i8::from_le_bytes([raw[10]]),
            kind_bits: raw[11],
        })
        .collect::<Vec<_>>();
    Some(UnwindTable {
        rows: rows.into(),
        segments: checked.segments,
        stats: checked.stats,
    })
}

/// Where the rows start after a header and segments of `before` bytes.
fn rows_offset(before: usize) -> usize {
    before.next_multiple_of(ROW_ALIGN)
}

/// Bytes before the segments in a file whose compiler id is
/// `compiler_len` bytes: magic, version, the id and its length, the key,
/// the five statistics, the two counts.
fn header_bytes(compiler_len: usize) -> Option<usize> {
    (MAGIC.len() + 4 + 4 + 32 + 5 * 8 + 4 + 4).checked_add(compiler_len)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddprof_common::unwind::RowKind;
    use std::fs;
    use std::path::PathBuf;
    use std::time::SystemTime;

    const COMPILER: &[u8] = b"this build";

    fn scratch_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!(
            "ddprof-store-{name}-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        let _ = fs::remove_dir_all(&dir);
        dir
    }

    fn sample_table() -> UnwindTable {
        let mut cfa = UnwindRow::with_kind(0x1010, RowKind::Cfa);
        cfa.cfa_offset = -24;
        cfa.rbp_offset = -16;
        cfa.slot_by_8 = -2;
        UnwindTable {
            rows: vec![
                UnwindRow::with_kind(0x1000, RowKind::Stop),
                cfa,
                UnwindRow::with_kind(0x1020, RowKind::NoInfo),
            ]
            .into(),
            segments: vec![LoadSegment {
                file_offset: 0x1000,
                vaddr: 0x401000,
                file_size: 0x2000,
            }],
            stats: CompileStats {
                fdes: 2,
                skipped_fdes: 1,
                failed_fdes: 0,
                unsupported_rows: 0,
                plt_stubs: 3,
            },
        }
    }

    fn key(file: &[u8], debug_file: Option<&[u8]>) -> ContentKey {
        ContentKey {
            file: Digest::of_bytes(file),
            debug_file: debug_file.map(Digest::of_bytes),
        }
    }

    fn same(a: &UnwindTable, b: &UnwindTable) -> bool {
        a.rows == b.rows && a.segments == b.segments && a.stats == b.stats
    }

    fn path_of(store: &TableStore, key: &ContentKey) -> PathBuf {
        let (prefix, name) = TableStore::place_of(key);
        store.dir().join(prefix).join(name)
    }

    #[test]
    fn a_saved_table_loads_back_the_same_for_the_same_files_only() {
        let store = TableStore::new(scratch_dir("round-trip"));
        let table = sample_table();
        let with_debug = key(b"libc", Some(b"libc.debug"));
        store.save(&with_debug, &table).unwrap();
        let hex = with_debug.digest().hex();
        assert!(path_of(&store, &with_debug).ends_with(format!(
            "{}/{}.rows",
            &hex[..2],
            &hex[2..]
        )));
        let loaded = store.load(&with_debug).expect("the stored table");
        assert!(same(&loaded, &table));
        // Used where it lies, in the mapped file.
        assert!(matches!(loaded.rows, Rows::Stored(_)), "{:?}", loaded.rows);
        // No debug file now, another one, another file: compiled again.
        assert!(store.load(&key(b"libc", None)).is_none());
        assert!(store.load(&key(b"libc", Some(b"other.debug"))).is_none());
        assert!(store.load(&key(b"libd", Some(b"libc.debug"))).is_none());
        // The directory and the file are ddprof's user's alone.
        let mode = |path: &std::path::Path| {
            std::os::unix::fs::PermissionsExt::mode(&fs::metadata(path).unwrap().permissions())
                & 0o777
        };
        assert_eq!(mode(store.dir()), 0o700);
        assert_eq!(mode(&path_of(&store, &with_debug)), 0o600);
        let _ = fs::remove_dir_all(store.dir());
    }

    /// A file written under another key's name (or copied there) is not
    /// that key's table.
    #[test]
    fn a_table_under_another_name_is_refused() {
        let store = TableStore::new(scratch_dir("renamed"));
        let (one, two) = (key(b"one", None), key(b"two", None));
        store.save(&one, &sample_table()).unwrap();
        let target = path_of(&store, &two);
        fs::create_dir_all(target.parent().unwrap()).unwrap();
        fs::copy(path_of(&store, &one), &target).unwrap();
        assert!(store.load(&one).is_some());
        assert!(store.load(&two).is_none());
        let _ = fs::remove_dir_all(store.dir());
    }

    #[test]
    fn a_damaged_file_is_refused_whatever_the_damage() {
        let table = sample_table();
        let digest = key(b"x", None).digest();
        let bytes = encode(&digest, &table, COMPILER);
        assert!(decode(&bytes, &digest, COMPILER).is_some_and(|t| same(&t, &table)));
        // Every truncation and every single-bit flip.
        for length in 0..bytes.len() {
            assert!(
                decode(&bytes[..length], &digest, COMPILER).is_none(),
                "{length}"
            );
        }
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(decode(&flipped, &digest, COMPILER).is_none(), "bit {bit}");
        }
        // Unsorted rows with a checksum that matches them (a file another
        // program wrote) are refused too.
        let mut rows = table.rows.to_vec();
        rows.swap(0, 1);
        let unsorted = UnwindTable {
            rows: rows.into(),
            ..table.clone()
        };
        assert!(decode(&encode(&digest, &unsorted, COMPILER), &digest, COMPILER).is_none());
        // Counts that claim more than the file holds.
        let mut lying = bytes[..bytes.len() - 4].to_vec();
        let row_count_at = header_bytes(COMPILER.len()).unwrap() - 4;
        lying[row_count_at..row_count_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32fast::hash(&lying);
        lying.extend_from_slice(&crc.to_le_bytes());
        assert!(decode(&lying, &digest, COMPILER).is_none());
        // Another ddprof build's table is compiled again.
        assert!(decode(&bytes, &digest, b"another build").is_none());
    }

    #[test]
    fn the_least_recently_used_tables_go_beyond_the_bound() {
        let store = TableStore::new(scratch_dir("evict"));
        let table = sample_table();
        let keys: Vec<ContentKey> = (0..3u8).map(|n| key(&[n], None)).collect();
        let old = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        for (age, key) in keys.iter().enumerate() {
            store.save(key, &table).unwrap();
            let file = fs::File::options()
                .append(true)
                .open(path_of(&store, key))
                .unwrap();
            file.set_modified(old + std::time::Duration::from_secs(age as u64))
                .unwrap();
        }
        let one = fs::metadata(path_of(&store, &keys[0])).unwrap().len();
        // Room for two: the oldest goes, never the one just written.
        let (prefix, name) = TableStore::place_of(&keys[0]);
        store.evict_beyond(2 * one, (&prefix, &name));
        assert!(store.load(&keys[0]).is_some());
        assert!(store.load(&keys[1]).is_none());
        assert!(store.load(&keys[2]).is_some());
        let _ = fs::remove_dir_all(store.dir());
    }
}

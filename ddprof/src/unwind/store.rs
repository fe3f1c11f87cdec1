//! Compiled unwind tables kept on disk by build id, so that a later run
//! reads a file's table instead of compiling its CFI again.
//!
//! Compiling libc's `.eh_frame` (23,532 rows) takes 2-5 ms of every start,
//! and a start compiles every file the workload maps (five for a small C
//! program: ~3-5 ms, a sixth of a 4 s run's profiler CPU at 99 Hz); cc1's
//! 432,937 rows take ~55 ms. The first run that compiles a file with a GNU
//! build id writes its table to `DIR/xx/rest.rows` (the build id in hex);
//! later runs read it in ~0.1 ms. A build id names one build, and the file
//! also names the split debug file the table was compiled with (its
//! `.debug_frame` adds rows): a table compiled before that debug file was
//! installed, or with another one, is compiled again. Each file is checked
//! before use — its CRC-32, its counts against its length, its rows sorted
//! — so that a truncated, corrupt or foreign file costs a compile, never a
//! wrong table. Files are written beside their name and renamed into place,
//! and the least recently used go once the directory holds more than
//! [`STORE_MAX_BYTES`].
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use ddprof_common::unwind::UnwindRow;

use super::compile::{CompileStats, LoadSegment, UnwindTable};
use crate::files::{
    build_id_hex, own_build_id, read_regular_file, remove_least_recently_used, Fields, FileStamp,
    MAX_BUILD_ID_LEN, MIN_BUILD_ID_LEN,
};

/// Total size of the stored tables; the least recently used go first.
pub const STORE_MAX_BYTES: u64 = 256 << 20;
const MAGIC: &[u8; 8] = b"DDPRUNW\0";
/// The layout of the file. Tables are also keyed by the build id of the
/// ddprof that compiled them ([`own_build_id`]), so that a table another
/// build compiled (whose compiler may have changed) is compiled again with
/// no version to bump by hand.
const FORMAT_VERSION: u32 = 2;
/// Bytes of a row in the file: `start`, `cfa_offset`, `rbp_offset`,
/// `ra_offset_by_8`, `kind_bits`, little-endian.
const ROW_BYTES: usize = 12;
/// Bytes of a segment in the file: `file_offset`, `vaddr`, `file_size`.
const SEGMENT_BYTES: usize = 24;

/// What a stored table was compiled from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreKey {
    pub build_id: Vec<u8>,
    /// The split debug file the table was compiled with, if any.
    pub debug_file: Option<FileStamp>,
}

/// The directory of stored tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableStore {
    dir: PathBuf,
}

impl TableStore {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `DIR/xx/rest.rows` for a build id; `None` for ids too short or too
    /// long to be one.
    fn path_of(&self, build_id: &[u8]) -> Option<PathBuf> {
        if !(MIN_BUILD_ID_LEN..=MAX_BUILD_ID_LEN).contains(&build_id.len()) {
            return None;
        }
        let hex = build_id_hex(build_id);
        Some(self.dir.join(&hex[..2]).join(format!("{}.rows", &hex[2..])))
    }

    /// The stored table of `key`, if one was written and is whole and
    /// compiled from the same files.
    pub fn load(&self, key: &StoreKey) -> Option<UnwindTable> {
        let compiler = own_build_id()?;
        let path = self.path_of(&key.build_id)?;
        // No table is larger than the whole store may be.
        let bytes = read_regular_file(&path, STORE_MAX_BYTES)?;
        let table = decode(&bytes, key, compiler);
        if table.is_some() {
            // Marks it recently used for the eviction order.
            let _ = fs::File::options()
                .append(true)
                .open(&path)
                .and_then(|file| file.set_modified(SystemTime::now()));
        } else {
            log::debug!("unwind table store: {} is stale or corrupt", path.display());
        }
        table
    }

    /// Writes `table`, compiled from `key`'s files, for later runs.
    pub fn save(&self, key: &StoreKey, table: &UnwindTable) -> std::io::Result<()> {
        let (Some(compiler), Some(path)) = (own_build_id(), self.path_of(&key.build_id)) else {
            return Ok(());
        };
        if let Some(parent) = path.parent() {
            fs::create_dir_all(parent)?;
        }
        let partial = path.with_extension(format!("rows.{}.partial", std::process::id()));
        let written = fs::File::create(&partial)
            .and_then(|mut file| file.write_all(&encode(key, table, compiler)))
            .and_then(|()| fs::rename(&partial, &path));
        if written.is_err() {
            let _ = fs::remove_file(&partial);
            return written;
        }
        self.evict_beyond(STORE_MAX_BYTES, &path);
        Ok(())
    }

    /// Removes the least recently used tables until the directory holds at
    /// most `max_bytes` (never `keep`, the table just written).
    fn evict_beyond(&self, max_bytes: u64, keep: &Path) {
        for path in remove_least_recently_used(&self.dir, max_bytes, keep) {
            log::info!(
                "unwind table store: removed {} (over {} MiB)",
                path.display(),
                max_bytes >> 20
            );
        }
    }
}

/// The file's bytes: magic, version, the key, the table, and the CRC-32 of
/// everything before it.
fn encode(key: &StoreKey, table: &UnwindTable, compiler: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(
        128 + key.build_id.len()
            + table.segments.len() * SEGMENT_BYTES
            + table.rows.len() * ROW_BYTES,
    );
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    out.extend_from_slice(&(compiler.len() as u32).to_le_bytes());
    out.extend_from_slice(compiler);
    out.extend_from_slice(&(key.build_id.len() as u32).to_le_bytes());
    out.extend_from_slice(&key.build_id);
    let stamp = key.debug_file;
    out.push(u8::from(stamp.is_some()));
    let stamp = stamp.unwrap_or_default();
    for value in [stamp.inode, stamp.size] {
        out.extend_from_slice(&value.to_le_bytes());
    }
    for value in [stamp.mtime, stamp.mtime_nsec] {
        out.extend_from_slice(&value.to_le_bytes());
    }
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
    for row in &table.rows {
        out.extend_from_slice(&row.start.to_le_bytes());
        out.extend_from_slice(&row.cfa_offset.to_le_bytes());
        out.extend_from_slice(&row.rbp_offset.to_le_bytes());
        out.extend_from_slice(&row.ra_offset_by_8.to_le_bytes());
        out.push(row.kind_bits);
    }
    let crc = crc32fast::hash(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out
}

/// The table in `bytes` if they are a whole, uncorrupted file of this
/// format, compiled from `key`'s files, with rows sorted by address.
fn decode(bytes: &[u8], key: &StoreKey, compiler: &[u8]) -> Option<UnwindTable> {
    let mut fields = Fields::checked(bytes, MAGIC, FORMAT_VERSION)?;
    let compiler_len = fields.u32()? as usize;
    if fields.take(compiler_len)? != compiler {
        return None;
    }
    let id_len = fields.u32()? as usize;
    if fields.take(id_len)? != key.build_id.as_slice() {
        return None;
    }
    let has_debug_file = fields.u8()? != 0;
    let stamp = FileStamp {
        inode: fields.u64()?,
        size: fields.u64()?,
        mtime: fields.i64()?,
        mtime_nsec: fields.i64()?,
    };
    if key.debug_file != has_debug_file.then_some(stamp) {
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
    // The counts must account for the rest exactly (checked before any
    // allocation of their size).
    let expected = segment_count
        .checked_mul(SEGMENT_BYTES)?
        .checked_add(row_count.checked_mul(ROW_BYTES)?)?;
    if fields.rest.len() != expected || segment_count == 0 {
        return None;
    }
    let segments = (0..segment_count)
        .map(|_| {
            Some(LoadSegment {
                file_offset: fields.u64()?,
                vaddr: fields.u64()?,
                file_size: fields.u64()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let mut rows = Vec::with_capacity(row_count);
    for chunk in fields.rest.chunks_exact(ROW_BYTES) {
        let mut row = Fields::new(chunk);
        rows.push(UnwindRow {
            start: row.u32()?,
            cfa_offset: i32::from_le_bytes(row.array()?),
            rbp_offset: i16::from_le_bytes(row.array()?),
            ra_offset_by_8: i8::from_le_bytes(row.array()?),
            kind_bits: row.u8()?,
        });
    }
    // Both unwinders binary-search the rows (the BPF program too).
    if rows.windows(2).any(|pair| pair[0].start >= pair[1].start) {
        return None;
    }
    Some(UnwindTable {
        rows,
        segments,
        stats,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ddprof_common::unwind::RowKind;

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
        cfa.ra_offset_by_8 = -1;
        UnwindTable {
            rows: vec![
                UnwindRow::with_kind(0x1000, RowKind::Stop),
                cfa,
                UnwindRow::with_kind(0x1020, RowKind::NoInfo),
            ],
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

    fn key(debug_file: Option<FileStamp>) -> StoreKey {
        StoreKey {
            build_id: (1..=20).collect(),
            debug_file,
        }
    }

    fn same(a: &UnwindTable, b: &UnwindTable) -> bool {
        a.rows == b.rows && a.segments == b.segments && a.stats == b.stats
    }

    #[test]
    fn a_saved_table_loads_back_the_same_for_the_same_files_only() {
        let store = TableStore::new(scratch_dir("round-trip"));
        let table = sample_table();
        let stamp = FileStamp {
            inode: 7,
            size: 4096,
            mtime: 1_700_000_000,
            mtime_nsec: 5,
        };
        store.save(&key(Some(stamp)), &table).unwrap();
        let path = store.path_of(&key(None).build_id).unwrap();
        assert!(path.ends_with("01/02030405060708090a0b0c0d0e0f1011121314.rows"));
        let loaded = store.load(&key(Some(stamp))).expect("the stored table");
        assert!(same(&loaded, &table));
        // No debug file now, another one, another build: compiled again.
        assert!(store.load(&key(None)).is_none());
        let replaced = FileStamp {
            size: 8192,
            ..stamp
        };
        assert!(store.load(&key(Some(replaced))).is_none());
        let other_build = StoreKey {
            build_id: (2..=21).collect(),
            debug_file: Some(stamp),
        };
        assert!(store.load(&other_build).is_none());
        let _ = fs::remove_dir_all(store.dir());
    }

    #[test]
    fn a_damaged_file_is_refused_whatever_the_damage() {
        let table = sample_table();
        let bytes = encode(&key(None), &table, COMPILER);
        assert!(decode(&bytes, &key(None), COMPILER).is_some_and(|t| same(&t, &table)));
        // Every truncation and every single-bit flip.
        for length in 0..bytes.len() {
            assert!(
                decode(&bytes[..length], &key(None), COMPILER).is_none(),
                "{length}"
            );
        }
        for bit in 0..bytes.len() * 8 {
            let mut flipped = bytes.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode(&flipped, &key(None), COMPILER).is_none(),
                "bit {bit}"
            );
        }
        // Unsorted rows with a checksum that matches them (a file another
        // program wrote) are refused too.
        let mut unsorted = table.clone();
        unsorted.rows.swap(0, 1);
        assert!(decode(
            &encode(&key(None), &unsorted, COMPILER),
            &key(None),
            COMPILER
        )
        .is_none());
        // Counts that claim more than the file holds.
        let mut lying = bytes[..bytes.len() - 4].to_vec();
        let counts_at = lying.len() - 3 * ROW_BYTES - SEGMENT_BYTES - 4;
        lying[counts_at..counts_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        let crc = crc32fast::hash(&lying);
        lying.extend_from_slice(&crc.to_le_bytes());
        assert!(decode(&lying, &key(None), COMPILER).is_none());
        // Another ddprof build's table is compiled again.
        assert!(decode(&bytes, &key(None), b"another build").is_none());
    }

    #[test]
    fn short_build_ids_are_not_stored() {
        let store = TableStore::new(scratch_dir("short-id"));
        let short = StoreKey {
            build_id: vec![1, 2, 3],
            debug_file: None,
        };
        store.save(&short, &sample_table()).unwrap();
        assert!(store.load(&short).is_none());
        assert!(!store.dir().exists());
    }

    #[test]
    fn the_least_recently_used_tables_go_beyond_the_bound() {
        let store = TableStore::new(scratch_dir("evict"));
        let table = sample_table();
        let keys: Vec<StoreKey> = (0..3u8)
            .map(|n| StoreKey {
                build_id: vec![n; 20],
                debug_file: None,
            })
            .collect();
        let old = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        for (age, key) in keys.iter().enumerate() {
            store.save(key, &table).unwrap();
            let path = store.path_of(&key.build_id).unwrap();
            let file = fs::File::options().append(true).open(&path).unwrap();
            file.set_modified(old + std::time::Duration::from_secs(age as u64))
                .unwrap();
        }
        let one = fs::metadata(store.path_of(&keys[0].build_id).unwrap())
            .unwrap()
            .len();
        // Room for two: the oldest goes, never the one just written.
        store.evict_beyond(2 * one, &store.path_of(&keys[0].build_id).unwrap());
        assert!(store.load(&keys[0]).is_some());
        assert!(store.load(&keys[1]).is_none());
        assert!(store.load(&keys[2]).is_some());
        let _ = fs::remove_dir_all(store.dir());
    }
}

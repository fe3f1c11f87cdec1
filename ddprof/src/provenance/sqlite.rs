//! A reader of one table of an SQLite database file, enough for RPM's
//! package database (`rpmdb.sqlite`: a `Packages` table of header blobs),
//! without linking SQLite: the file is a container's or the host's, read as
//! hostile input. Every page number, cell offset, length and varint is
//! checked against the file before it is used; each page, b-tree or
//! overflow, is visited at most once in a walk (a cycle of pages, or two
//! records on one overflow page, ends it); an overflow chain is followed no
//! further than its record's length; records longer than the caller's bound
//! are skipped; the walk stops at the caller's deadline, checked at each
//! cell and page. The file is read page by page (`pread`): its size costs
//! time, not memory.
//!
//! Only what the file itself holds is read: changes still in a write-ahead
//! log (`-wal`) that no checkpoint has copied in are not seen.
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use thiserror::Error;

/// The deepest a table's b-tree is walked (SQLite's own bound is 20).
const MAX_DEPTH: usize = 20;

/// Why a database file could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum SqliteError {
    #[error("not an SQLite 3 database")]
    NotSqlite,
    #[error("its page size ({0}) is not one SQLite writes")]
    PageSize(u32),
    #[error("page {0} is out of the file or not a table's page")]
    BadPage(u32),
    #[error("it has no table `{0}`")]
    NoTable(String),
    #[error("reading it failed: {0}")]
    Read(String),
    #[error("reading it took longer than its bound")]
    Deadline,
}

/// One column of a record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Value<'a> {
    Null,
    Integer(i64),
    /// A float's 8 bytes (nothing here reads one).
    Real,
    Blob(&'a [u8]),
    Text(&'a [u8]),
}

/// An open database file.
pub struct Database<'f> {
    file: &'f File,
    size: u64,
    page_size: u32,
    /// The bytes of a page that hold b-tree content (the rest is reserved).
    usable: u32,
}

impl<'f> Database<'f> {
    /// Checks the file's header.
    pub fn open(file: &'f File, size: u64) -> Result<Self, SqliteError> {
        let mut header = [0u8; 100];
        if size < 100 || file.read_exact_at(&mut header, 0).is_err() {
            return Err(SqliteError::NotSqlite);
        }
        if &header[..16] != b"SQLite format 3\0" {
            return Err(SqliteError::NotSqlite);
        }
        let page_size = match u16::from_be_bytes([header[16], header[17]]) {
            1 => 65_536,
            size => u32::from(size),
        };
        if !(512..=65_536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(SqliteError::PageSize(page_size));
        }
        let usable = page_size - u32::from(header[20]);
        // SQLite's own floor: a cell's overflow arithmetic needs it.
        if usable < 480 {
            return Err(SqliteError::PageSize(page_size));
        }
        Ok(Self {
            file,
            size,
            page_size,
            usable,
        })
    }

    fn pages(&self) -> u64 {
        self.size / u64::from(self.page_size)
    }

    fn page(&self, number: u32) -> Result<Vec<u8>, SqliteError> {
        if number == 0 || u64::from(number) > self.pages() {
            return Err(SqliteError::BadPage(number));
        }
        let mut page = vec![0u8; self.page_size as usize];
        self.file
            .read_exact_at(&mut page, u64::from(number - 1) * u64::from(self.page_size))
            .map_err(|error| SqliteError::Read(error.to_string()))?;
        Ok(page)
    }

    /// The root page of the table called `name`, from the schema table.
    pub fn table_root(&self, name: &str, deadline: Instant) -> Result<u32, SqliteError> {
        let mut root = None;
        self.scan(1, 64 << 10, deadline, &mut |_, record| {
            // type, name, tbl_name, rootpage.
            let columns = columns(record, 4);
            if let [Value::Text(b"table"), Value::Text(table), _, Value::Integer(page), ..] =
                columns.as_slice()
            {
                if table.eq_ignore_ascii_case(name.as_bytes()) {
                    root = u32::try_from(*page).ok();
                    return false;
                }
            }
            true
        })?;
        root.ok_or_else(|| SqliteError::NoTable(name.to_string()))
    }

    /// Calls `visit` with each row's id and record of the table whose
    /// b-tree starts at `root`, in rowid order, until it returns false.
    /// Records over `max_record` bytes are skipped; past `deadline`, the
    /// walk ends with [`SqliteError::Deadline`].
    pub fn scan(
        &self,
        root: u32,
        max_record: u64,
        deadline: Instant,
        visit: &mut dyn FnMut(i64, &[u8]) -> bool,
    ) -> Result<(), SqliteError> {
        let mut seen = vec![false; self.pages() as usize + 1];
        // Pages to walk, each with its depth; the last pushed first.
        let mut pending = vec![(root, 0usize)];
        while let Some((number, depth)) = pending.pop() {
            if Instant::now() > deadline {
                return Err(SqliteError::Deadline);
            }
            if depth > MAX_DEPTH {
                return Err(SqliteError::BadPage(number));
            }
            match seen.get_mut(number as usize) {
                Some(seen @ false) => *seen = true,
                _ => return Err(SqliteError::BadPage(number)),
            }
            let page = self.page(number)?;
            let start = if number == 1 { 100 } else { 0 };
            let kind = page[start];
            let cells = u16::from_be_bytes([page[start + 3], page[start + 4]]) as usize;
            let header = match kind {
                5 => 12,
                13 => 8,
                _ => return Err(SqliteError::BadPage(number)),
            };
            let pointers = start + header;
            if pointers + 2 * cells > page.len() {
                return Err(SqliteError::BadPage(number));
            }
            let cell_at = |index: usize| {
                u16::from_be_bytes([page[pointers + 2 * index], page[pointers + 2 * index + 1]])
                    as usize
            };
            if kind == 5 {
                // An interior page: children in key order, pushed in reverse.
                let right = u32::from_be_bytes(page[start + 8..start + 12].try_into().unwrap());
                pending.push((right, depth + 1));
                for index in (0..cells).rev() {
                    let child = page
                        .get(cell_at(index)..cell_at(index) + 4)
                        .ok_or(SqliteError::BadPage(number))?;
                    pending.push((u32::from_be_bytes(child.try_into().unwrap()), depth + 1));
                }
                continue;
            }
            for index in 0..cells {
                if Instant::now() > deadline {
                    return Err(SqliteError::Deadline);
                }
                let cell = page
                    .get(cell_at(index)..)
                    .ok_or(SqliteError::BadPage(number))?;
                let (length, used) = varint(cell).ok_or(SqliteError::BadPage(number))?;
                let (rowid, used_too) =
                    varint(&cell[used..]).ok_or(SqliteError::BadPage(number))?;
                let payload = &cell[used + used_too..];
                if length > max_record {
                    continue;
                }
                let record = self.payload(payload, length, number, &mut seen)?;
                if !visit(rowid as i64, &record) {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// A leaf cell's record of `length` bytes: the part on its page, then
    /// its overflow pages', each marked in `seen` (no page is read twice in
    /// a walk: a chain that loops, or two records on one page, is an
    /// error).
    fn payload(
        &self,
        local: &[u8],
        length: u64,
        page: u32,
        seen: &mut [bool],
    ) -> Result<Vec<u8>, SqliteError> {
        let usable = u64::from(self.usable);
        let most_local = usable - 35;
        let on_page = if length <= most_local {
            length
        } else {
            let least = (usable - 12) * 32 / 255 - 23;
            let k = least + (length - least) % (usable - 4);
            if k <= most_local {
                k
            } else {
                least
            }
        } as usize;
        let mut record = local
            .get(..on_page)
            .ok_or(SqliteError::BadPage(page))?
            .to_vec();
        if on_page as u64 == length {
            return Ok(record);
        }
        let next = local
            .get(on_page..on_page + 4)
            .ok_or(SqliteError::BadPage(page))?;
        let mut next = u32::from_be_bytes(next.try_into().unwrap());
        // Each overflow page carries usable − 4 bytes: the chain is never
        // longer than the record needs.
        while (record.len() as u64) < length {
            match seen.get_mut(next as usize) {
                Some(seen @ false) => *seen = true,
                _ => return Err(SqliteError::BadPage(next)),
            }
            let overflow = self.page(next)?;
            let take = ((length - record.len() as u64).min(usable - 4)) as usize;
            record.extend_from_slice(&overflow[4..4 + take]);
            next = u32::from_be_bytes(overflow[..4].try_into().unwrap());
        }
        Ok(record)
    }
}

/// SQLite's variable-length integer: its value and its length in bytes.
fn varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value = 0u64;
    for (index, &byte) in bytes.iter().enumerate().take(9) {
        if index == 8 {
            return Some(((value << 8) | u64::from(byte), 9));
        }
        value = (value << 7) | u64::from(byte & 0x7f);
        if byte & 0x80 == 0 {
            return Some((value, index + 1));
        }
    }
    None
}

/// A record's first `wanted` columns (at most); a record cut short gives
/// the columns it holds.
pub fn columns(record: &[u8], wanted: usize) -> Vec<Value<'_>> {
    let mut values = Vec::new();
    let Some((header_length, mut at)) = varint(record) else {
        return values;
    };
    let Ok(header_length) = usize::try_from(header_length) else {
        return values;
    };
    let mut body = header_length;
    while at < header_length.min(record.len()) && values.len() < wanted {
        let Some((serial, used)) = varint(&record[at..header_length.min(record.len())]) else {
            break;
        };
        at += used;
        let (length, value): (usize, fn(&[u8]) -> Value<'_>) = match serial {
            0 => (0, |_| Value::Null),
            1..=6 => {
                let length = [1, 2, 3, 4, 6, 8][serial as usize - 1];
                (length, |bytes| {
                    // Big-endian two's complement, sign-extended.
                    let unsigned = bytes
                        .iter()
                        .fold(0u64, |value, &byte| (value << 8) | u64::from(byte));
                    let shift = 64 - 8 * bytes.len() as u32;
                    Value::Integer(((unsigned << shift) as i64) >> shift)
                })
            }
            7 => (8, |_| Value::Real),
            8 => (0, |_| Value::Integer(0)),
            9 => (0, |_| Value::Integer(1)),
            serial if serial >= 12 => {
                let length = ((serial - 12) / 2) as usize;
                if serial % 2 == 0 {
                    (length, |bytes| Value::Blob(bytes))
                } else {
                    (length, |bytes| Value::Text(bytes))
                }
            }
            _ => break,
        };
        let Some(bytes) = body
            .checked_add(length)
            .and_then(|end| record.get(body..end))
        else {
            break;
        };
        values.push(value(bytes));
        body += length;
    }
    values
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn later() -> Instant {
        Instant::now() + std::time::Duration::from_secs(60)
    }

    /// A database written by SQLite itself (the `sqlite3` program), with
    /// rows small and large (over several overflow pages), and enough of
    /// them for interior pages.
    fn written_by_sqlite(dir: &std::path::Path, rows: usize) -> Option<std::path::PathBuf> {
        let path = dir.join("test.sqlite");
        let _ = std::fs::remove_file(&path);
        let sql = format!(
            "PRAGMA page_size = 1024;\n\
             CREATE TABLE 'Packages' (hnum INTEGER PRIMARY KEY AUTOINCREMENT, blob BLOB NOT NULL);\n\
             WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < {rows})\n\
             INSERT INTO Packages(blob) \
             SELECT CAST(substr(replace(hex(zeroblob((i * 397) % 9000)), '0', 'x'), 1, (i * 397) % 9000) || i AS BLOB) FROM n;\n"
        );
        let status = Command::new("sqlite3").arg(&path).arg(sql).status().ok()?;
        status.success().then_some(path)
    }

    #[test]
    fn reads_every_row_sqlite_wrote_small_and_overflowing() {
        let dir = std::env::temp_dir().join(format!("ddprof-sqlite-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let Some(path) = written_by_sqlite(&dir, 700) else {
            panic!("the sqlite3 program (apt-get install sqlite3) wrote no database");
        };
        let file = File::open(&path).unwrap();
        let size = file.metadata().unwrap().len();
        let database = Database::open(&file, size).unwrap();
        let root = database.table_root("Packages", later()).unwrap();
        let mut rows = Vec::new();
        database
            .scan(root, 1 << 20, later(), &mut |rowid, record| {
                let columns = columns(record, 2);
                let [Value::Null, Value::Blob(blob)] = columns.as_slice() else {
                    panic!("row {rowid}: {columns:?}");
                };
                rows.push((
                    rowid,
                    blob.len(),
                    blob[blob.len().saturating_sub(3)..].to_vec(),
                ));
                true
            })
            .unwrap();
        assert_eq!(rows.len(), 700);
        for (index, (rowid, length, tail)) in rows.iter().enumerate() {
            let i = index + 1;
            assert_eq!(*rowid, i as i64);
            let text = i.to_string();
            assert_eq!(*length, (i * 397) % 9000 + text.len(), "row {i}");
            if text.len() >= 3 {
                assert_eq!(tail, &text.as_bytes()[text.len() - 3..], "row {i}");
            }
        }
        // Records over the bound are skipped, the others still read.
        let mut small = 0;
        database
            .scan(root, 2000, later(), &mut |_, _| {
                small += 1;
                true
            })
            .unwrap();
        assert!((1..700).contains(&small), "{small}");
        // Past its deadline, the walk stops.
        let past = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(
            database.scan(root, 1 << 20, past, &mut |_, _| true),
            Err(SqliteError::Deadline)
        );
        assert_eq!(
            database.table_root("Nothing", later()),
            Err(SqliteError::NoTable("Nothing".into()))
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn damaged_files_give_errors_not_panics() {
        let dir = std::env::temp_dir().join(format!("ddprof-sqlite-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = written_by_sqlite(&dir, 300).expect("sqlite3 wrote a database");
        let good = std::fs::read(&path).unwrap();
        let damaged = dir.join("damaged.sqlite");
        // Every byte of the first pages overwritten in turn, with values
        // that make pointers, counts and lengths point anywhere.
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..400 {
            let mut bytes = good.clone();
            for _ in 0..8 {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let at = (state >> 33) as usize % bytes.len().min(8 * 1024);
                bytes[at] = (state >> 17) as u8;
            }
            if round % 50 == 0 {
                bytes.truncate((state >> 40) as usize % good.len());
            }
            std::fs::write(&damaged, &bytes).unwrap();
            let file = File::open(&damaged).unwrap();
            let Ok(database) = Database::open(&file, bytes.len() as u64) else {
                continue;
            };
            let Ok(root) = database.table_root("Packages", later()) else {
                continue;
            };
            let _ = database.scan(root, 1 << 20, later(), &mut |_, record| {
                let _ = columns(record, 2);
                true
            });
        }
        // A page that is its own child ends the walk.
        let mut looped = good.clone();
        let page_size = 1024usize;
        let file = File::open(&path).unwrap();
        let root = Database::open(&file, good.len() as u64)
            .unwrap()
            .table_root("Packages", later())
            .unwrap() as usize;
        let at = (root - 1) * page_size;
        assert_eq!(looped[at], 5, "the table's root is an interior page");
        looped[at + 8..at + 12].copy_from_slice(&(root as u32).to_be_bytes());
        std::fs::write(&damaged, &looped).unwrap();
        let file = File::open(&damaged).unwrap();
        let database = Database::open(&file, looped.len() as u64).unwrap();
        assert_eq!(
            database.scan(root as u32, 1 << 20, later(), &mut |_, _| true),
            Err(SqliteError::BadPage(root as u32))
        );
        assert_eq!(
            Database::open(&file, 50).err(),
            Some(SqliteError::NotSqlite)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn varints_and_integers_decode_as_sqlite_writes_them() {
        assert_eq!(varint(&[0x05]), Some((5, 1)));
        assert_eq!(varint(&[0x81, 0x00]), Some((128, 2)));
        assert_eq!(varint(&[0xff; 9]), Some((u64::MAX, 9)));
        assert_eq!(varint(&[0x81]), None);
        // Header 4 bytes: int8 (-1), int16 (300), text of 2 bytes.
        let record = [4, 1, 2, 17, 0xff, 0x01, 0x2c, b'h', b'i'];
        assert_eq!(
            columns(&record, 8),
            vec![Value::Integer(-1), Value::Integer(300), Value::Text(b"hi")]
        );
    }
}

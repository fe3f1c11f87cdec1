//! A reader of the values of a Berkeley DB hash database file: the format
//! of RPM's `Packages` before RPM 4.16 (RHEL and CentOS 7 and 8, Amazon
//! Linux 2, UBI 8), without linking Berkeley DB. The file is a container's
//! or the host's, read as hostile input: every page number, offset and
//! length is checked against the file before it is used; each overflow
//! chain is followed no further than its value's length, every page of it
//! but the last full (as Berkeley DB writes them: a chain's pages are then
//! at most the value's length over a page's room); and the read stops at
//! the caller's deadline, checked at each page.
//!
//! The pages are read in order, and each hash page's key/data pairs taken
//! as they are (the buckets are not followed: every pair lives on some
//! hash page). A value too long for a page is on a chain of overflow
//! pages. Files with checksums or encryption are refused (RPM writes
//! neither).
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use thiserror::Error;

/// The hash access method's magic number.
const HASH_MAGIC: u32 = 0x0006_1561;
/// The generic page header's size: each page's items follow it.
const PAGE_HEADER: usize = 26;
/// Page types.
const P_HASH_UNSORTED: u8 = 2;
const P_OVERFLOW: u8 = 7;
const P_HASHMETA: u8 = 8;
const P_HASH: u8 = 13;
/// Item types on a hash page.
const H_KEYDATA: u8 = 1;
const H_OFFPAGE: u8 = 3;

/// Why a database file could not be read.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum BdbError {
    #[error("not a Berkeley DB hash database")]
    NotHash,
    #[error("its page size ({0}) is not one Berkeley DB writes")]
    PageSize(u32),
    #[error("it has checksums or is encrypted, which this reader does not read")]
    Unsupported,
    #[error("reading it failed: {0}")]
    Read(String),
    #[error("reading it took longer than its bound")]
    Deadline,
}

/// An open hash database file.
pub struct HashDatabase<'f> {
    file: &'f File,
    page_size: u32,
    /// The last page to read: the metadata's, within the file.
    last_page: u32,
    /// Written on a machine of the other byte order.
    swapped: bool,
}

impl<'f> HashDatabase<'f> {
    /// Checks the metadata page.
    pub fn open(file: &'f File, size: u64) -> Result<Self, BdbError> {
        let mut meta = [0u8; 72];
        if size < 512 || file.read_exact_at(&mut meta, 0).is_err() {
            return Err(BdbError::NotHash);
        }
        let word = |at: usize| u32::from_le_bytes(meta[at..at + 4].try_into().unwrap());
        let swapped = match word(12) {
            HASH_MAGIC => false,
            magic if magic.swap_bytes() == HASH_MAGIC => true,
            _ => return Err(BdbError::NotHash),
        };
        let read = |at: usize| {
            let value = word(at);
            if swapped {
                value.swap_bytes()
            } else {
                value
            }
        };
        if meta[25] != P_HASHMETA {
            return Err(BdbError::NotHash);
        }
        let page_size = read(20);
        if !(512..=65_536).contains(&page_size) || !page_size.is_power_of_two() {
            return Err(BdbError::PageSize(page_size));
        }
        // The encryption algorithm, and the metadata's checksum flag.
        if meta[24] != 0 || meta[26] & 1 != 0 {
            return Err(BdbError::Unsupported);
        }
        let pages_in_file = (size / u64::from(page_size)).min(u64::from(u32::MAX)) as u32;
        Ok(Self {
            file,
            page_size,
            last_page: read(32).min(pages_in_file.saturating_sub(1)),
            swapped,
        })
    }

    fn u16_at(&self, bytes: &[u8], at: usize) -> Option<u16> {
        let value = u16::from_le_bytes(bytes.get(at..at + 2)?.try_into().ok()?);
        Some(if self.swapped {
            value.swap_bytes()
        } else {
            value
        })
    }

    fn u32_at(&self, bytes: &[u8], at: usize) -> Option<u32> {
        let value = u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?);
        Some(if self.swapped {
            value.swap_bytes()
        } else {
            value
        })
    }

    /// Page `number`, if the file has it and it says it is that page.
    fn page(&self, number: u32) -> Result<Option<Vec<u8>>, BdbError> {
        if number == 0 || number > self.last_page {
            return Ok(None);
        }
        let mut page = vec![0u8; self.page_size as usize];
        self.file
            .read_exact_at(&mut page, u64::from(number) * u64::from(self.page_size))
            .map_err(|error| BdbError::Read(error.to_string()))?;
        Ok((self.u32_at(&page, 8) == Some(number)).then_some(page))
    }

    /// Calls `visit` with each value (the data of each key/data pair) of
    /// the database, until it returns false. Values over `max_value` bytes,
    /// and values whose overflow chain is broken, are skipped; past
    /// `deadline`, the read ends with [`BdbError::Deadline`].
    pub fn values(
        &self,
        max_value: u64,
        deadline: Instant,
        visit: &mut dyn FnMut(&[u8]) -> bool,
    ) -> Result<(), BdbError> {
        for number in 1..=self.last_page {
            if Instant::now() > deadline {
                return Err(BdbError::Deadline);
            }
            let Some(page) = self.page(number)? else {
                continue;
            };
            if page[25] != P_HASH && page[25] != P_HASH_UNSORTED {
                continue;
            }
            let entries = usize::from(self.u16_at(&page, 20).unwrap_or(0));
            let items_start = PAGE_HEADER + 2 * entries;
            if items_start > page.len() {
                continue;
            }
            // Items fill the page from its end: each ends where the one
            // before it in the index starts. Pairs: key, then data.
            for index in (1..entries).step_by(2) {
                let start = self.u16_at(&page, PAGE_HEADER + 2 * index);
                let end = self.u16_at(&page, PAGE_HEADER + 2 * (index - 1));
                let (Some(start), Some(end)) = (start, end) else {
                    continue;
                };
                let (start, end) = (usize::from(start), usize::from(end));
                if start < items_start || end <= start || end > page.len() {
                    continue;
                }
                let item = &page[start..end];
                let keep_going = match item[0] {
                    H_KEYDATA if (item.len() - 1) as u64 <= max_value => visit(&item[1..]),
                    H_OFFPAGE => match self.overflow(item, max_value, deadline)? {
                        Some(value) => visit(&value),
                        None => true,
                    },
                    _ => true,
                };
                if !keep_going {
                    return Ok(());
                }
            }
        }
        Ok(())
    }

    /// The value an off-page item points to: `{type, 3 unused bytes, first
    /// page, length}`, on a chain of overflow pages each holding its
    /// header's count of bytes.
    fn overflow(
        &self,
        item: &[u8],
        max_value: u64,
        deadline: Instant,
    ) -> Result<Option<Vec<u8>>, BdbError> {
        let (Some(mut next), Some(length)) = (self.u32_at(item, 4), self.u32_at(item, 8)) else {
            return Ok(None);
        };
        if u64::from(length) > max_value {
            return Ok(None);
        }
        let length = length as usize;
        let room = self.page_size as usize - PAGE_HEADER;
        let mut value = Vec::new();
        while value.len() < length {
            if Instant::now() > deadline {
                return Err(BdbError::Deadline);
            }
            let Some(page) = self.page(next)? else {
                return Ok(None);
            };
            let on_page = usize::from(self.u16_at(&page, 22).unwrap_or(0));
            // Every page of the chain full but the last.
            if page[25] != P_OVERFLOW || on_page != (length - value.len()).min(room) {
                return Ok(None);
            }
            value.extend_from_slice(&page[PAGE_HEADER..PAGE_HEADER + on_page]);
            next = self.u32_at(&page, 16).unwrap_or(0);
        }
        Ok(Some(value))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    fn later() -> Instant {
        Instant::now() + std::time::Duration::from_secs(60)
    }

    fn count_values(database: &HashDatabase<'_>) -> usize {
        let mut count = 0;
        database
            .values(1 << 20, later(), &mut |_| {
                count += 1;
                true
            })
            .unwrap();
        count
    }

    /// A hash database written by Berkeley DB itself (`db5.3_load`, of
    /// Debian's db5.3-util) with 4 KiB pages: values of 300 to 8,700
    /// bytes, inline and on overflow chains.
    fn written_by_berkeley_db(dir: &std::path::Path) -> std::path::PathBuf {
        let mut input =
            String::from("VERSION=3\nformat=bytevalue\ntype=hash\ndb_pagesize=4096\nHEADER=END\n");
        for key in 1u32..=29 {
            input.push_str(&format!(" {}\n ", hex(&key.to_le_bytes())));
            input.push_str(&hex(&value_of(key)));
            input.push('\n');
        }
        input.push_str("DATA=END\n");
        let text = dir.join("input.txt");
        std::fs::write(&text, input).unwrap();
        let path = dir.join("Packages");
        let _ = std::fs::remove_file(&path);
        let status = Command::new("db5.3_load")
            .arg("-f")
            .arg(&text)
            .arg(&path)
            .status()
            .expect("db5.3_load runs (apt-get install db5.3-util)");
        assert!(status.success());
        path
    }

    fn value_of(key: u32) -> Vec<u8> {
        let mut value = vec![key as u8; key as usize * 300];
        value.extend_from_slice(&key.to_be_bytes());
        value
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|byte| format!("{byte:02x}")).collect()
    }

    #[test]
    fn reads_every_value_berkeley_db_wrote_inline_and_overflowing() {
        let dir = std::env::temp_dir().join(format!("ddprof-bdb-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = written_by_berkeley_db(&dir);
        let file = File::open(&path).unwrap();
        let size = file.metadata().unwrap().len();
        let database = HashDatabase::open(&file, size).unwrap();
        let mut values = Vec::new();
        database
            .values(1 << 20, later(), &mut |value| {
                values.push(value.to_vec());
                true
            })
            .unwrap();
        values.sort_by_key(|value| value.len());
        let expected: Vec<Vec<u8>> = (1..=29).map(value_of).collect();
        assert_eq!(values.len(), expected.len());
        assert!(values == expected, "values differ");
        // Longer values than the bound are skipped.
        let mut short = 0;
        database
            .values(1000, later(), &mut |_| {
                short += 1;
                true
            })
            .unwrap();
        assert_eq!(short, 3);

        // Damaged copies: errors or fewer values, never a panic or a hang.
        let good = std::fs::read(&path).unwrap();
        let damaged = dir.join("damaged");
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for round in 0..300 {
            let mut bytes = good.clone();
            for _ in 0..6 {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let at = (state >> 33) as usize % bytes.len();
                bytes[at] = (state >> 17) as u8;
            }
            if round % 40 == 0 {
                bytes.truncate((state >> 40) as usize % good.len());
            }
            std::fs::write(&damaged, &bytes).unwrap();
            let file = File::open(&damaged).unwrap();
            if let Ok(database) = HashDatabase::open(&file, bytes.len() as u64) {
                let _ = database.values(1 << 20, later(), &mut |_| true);
            }
        }
        // An overflow page that names itself next: the chain ends at the
        // value's length, the value is dropped.
        let mut looped = good.clone();
        let page = 13 * 4096;
        assert_eq!(looped[page + 25], P_OVERFLOW);
        looped[page + 16..page + 20].copy_from_slice(&13u32.to_le_bytes());
        std::fs::write(&damaged, &looped).unwrap();
        let file = File::open(&damaged).unwrap();
        let database = HashDatabase::open(&file, looped.len() as u64).unwrap();
        assert_eq!(count_values(&database), 28);
        // A chain of pages of one byte each, the last naming the first: the
        // read ends at the first page that is not full.
        let mut trickle = good.clone();
        trickle[page + 22..page + 24].copy_from_slice(&1u16.to_le_bytes());
        std::fs::write(&damaged, &trickle).unwrap();
        let file = File::open(&damaged).unwrap();
        let database = HashDatabase::open(&file, trickle.len() as u64).unwrap();
        assert_eq!(count_values(&database), 28);
        // Past its deadline, the read stops.
        let past = Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(2));
        assert_eq!(
            database.values(1 << 20, past, &mut |_| true),
            Err(BdbError::Deadline)
        );
        assert_eq!(
            HashDatabase::open(&file, 100).err(),
            Some(BdbError::NotHash)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}

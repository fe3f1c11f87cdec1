//! What a worker leaves to the next one: state that outlives a worker (the
//! live heap of `sALLOC mode=l`, the waits `sWALL` is timing) goes into an
//! anonymous file the parent holds, and the next worker the parent forks
//! reads it back.
//!
//! A file holds one snapshot: its kind's magic, its length, then the bytes
//! its stage wrote with a [`Writer`]. The length says where a smaller
//! snapshot written over a bigger one ends. Everything read back is
//! checked (a worker may die part way through writing, and the bytes pass
//! from one process to another): a snapshot of another kind, a length
//! over [`MAX_SNAPSHOT_BYTES`], a count or a list longer than its bound
//! is refused whole.
use std::io::{Read, Seek, SeekFrom, Write};

use crate::sample::{Sample, StackEnd};

/// The largest snapshot read back.
const MAX_SNAPSHOT_BYTES: u64 = 512 << 20;

/// Frames of each kind (user, kernel) kept per carried sample: the engines
/// unwind at most 512 user frames and 127 kernel frames.
pub const MAX_FRAMES: usize = 1024;

/// The magic (8 bytes) and the length (8 bytes) before a snapshot's bytes.
const HEADER_BYTES: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum CarriedError {
    #[error("its file: {0}")]
    Io(#[from] std::io::Error),
    #[error("its file does not hold a snapshot of this ddprof")]
    NotASnapshot,
}

/// The anonymous file that carries one stage's state from a worker to the
/// next (the worker's seccomp filter allows `write`, `lseek` and `read` on
/// it).
#[derive(Debug)]
pub struct CarriedFile {
    file: std::fs::File,
    magic: [u8; 8],
}

impl CarriedFile {
    /// An empty file (close-on-exec: workers get it by fork) for snapshots
    /// that start with `magic`.
    pub fn create(name: &str, magic: &[u8; 8]) -> Result<Self, CarriedError> {
        use nix::sys::memfd::{memfd_create, MFdFlags};
        let fd = memfd_create(name, MFdFlags::MFD_CLOEXEC).map_err(std::io::Error::from)?;
        Ok(Self {
            file: std::fs::File::from(fd),
            magic: *magic,
        })
    }

    /// Another descriptor of the same file.
    pub fn try_clone(&self) -> Result<Self, CarriedError> {
        Ok(Self {
            file: self.file.try_clone()?,
            magic: self.magic,
        })
    }

    /// Writes `snapshot` over the previous one.
    pub fn save(&self, snapshot: Writer) -> Result<(), CarriedError> {
        let mut bytes = snapshot.0;
        bytes[..8].copy_from_slice(&self.magic);
        let length = bytes.len() as u64;
        bytes[8..HEADER_BYTES].copy_from_slice(&length.to_le_bytes());
        let mut file = &self.file;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&bytes)?;
        Ok(())
    }

    /// The last snapshot saved, without its header; `None` when none was,
    /// or since [`CarriedFile::clear`].
    pub fn load(&self) -> Result<Option<Vec<u8>>, CarriedError> {
        let mut file = &self.file;
        file.seek(SeekFrom::Start(0))?;
        let mut header = [0u8; HEADER_BYTES];
        match file.read_exact(&mut header) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
            Err(error) => return Err(error.into()),
        }
        if header == [0; HEADER_BYTES] {
            return Ok(None);
        }
        if header[..8] != self.magic {
            return Err(CarriedError::NotASnapshot);
        }
        let length = u64::from_le_bytes(header[8..].try_into().expect("8 bytes"));
        if !(HEADER_BYTES as u64..=MAX_SNAPSHOT_BYTES).contains(&length) {
            return Err(CarriedError::NotASnapshot);
        }
        let mut bytes = vec![0u8; length as usize - HEADER_BYTES];
        file.read_exact(&mut bytes)?;
        Ok(Some(bytes))
    }

    /// Marks the file as holding nothing: what it held was taken, and a
    /// later worker must not take it again.
    pub fn clear(&self) -> Result<(), CarriedError> {
        let mut file = &self.file;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&[0; HEADER_BYTES])?;
        Ok(())
    }
}

/// A snapshot being written: little-endian fields after room for the
/// header.
#[derive(Debug)]
pub struct Writer(Vec<u8>);

impl Default for Writer {
    fn default() -> Self {
        Self(vec![0; HEADER_BYTES])
    }
}

impl Writer {
    pub fn u8(&mut self, value: u8) {
        self.0.push(value);
    }

    pub fn u16(&mut self, value: u16) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    pub fn u32(&mut self, value: u32) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    pub fn u64(&mut self, value: u64) {
        self.0.extend_from_slice(&value.to_le_bytes());
    }

    /// `sample`'s thread, time, event, weights and stacks (at most
    /// [`MAX_FRAMES`] of each kind), not what its stage says of it (`heap`,
    /// `off_cpu`).
    pub fn sample(&mut self, sample: &Sample) {
        self.u32(sample.pid);
        self.u32(sample.tid);
        self.u64(sample.time);
        self.u32(sample.cpu);
        self.u16(sample.event);
        self.u8(sample.end as u8);
        self.u64(sample.weight);
        self.u64(sample.scaled_count);
        for frames in [&sample.frames, &sample.kernel_frames] {
            let kept = &frames[..frames.len().min(MAX_FRAMES)];
            self.u32(kept.len() as u32);
            for frame in kept {
                self.u64(*frame);
            }
        }
    }
}

/// Little-endian fields from the front of a snapshot's bytes; `None` where
/// they end too soon or a length is over its bound.
#[derive(Debug)]
pub struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    pub fn new(bytes: &'a [u8]) -> Self {
        Self(bytes)
    }

    /// Whether every byte was read (a snapshot with bytes left over is not
    /// one).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    pub fn u8(&mut self) -> Option<u8> {
        self.take::<1>().map(|[byte]| byte)
    }

    pub fn u16(&mut self) -> Option<u16> {
        self.take().map(u16::from_le_bytes)
    }

    pub fn u32(&mut self) -> Option<u32> {
        self.take().map(u32::from_le_bytes)
    }

    pub fn u64(&mut self) -> Option<u64> {
        self.take().map(u64::from_le_bytes)
    }

    /// A sample [`Writer::sample`] wrote (`heap` and `off_cpu` `None`).
    pub fn sample(&mut self) -> Option<Sample> {
        let pid = self.u32()?;
        let tid = self.u32()?;
        let time = self.u64()?;
        let cpu = self.u32()?;
        let event = self.u16()?;
        let end = StackEnd::from_raw(u32::from(self.u8()?));
        let weight = self.u64()?;
        let scaled_count = self.u64()?;
        let mut lists = [Vec::new(), Vec::new()];
        for list in lists.iter_mut() {
            let count = self.u32()? as usize;
            if count > MAX_FRAMES || count * 8 > self.0.len() {
                return None;
            }
            list.reserve(count);
            for _ in 0..count {
                list.push(self.u64()?);
            }
        }
        let [frames, kernel_frames] = lists;
        Some(Sample {
            pid,
            tid,
            time,
            cpu,
            event,
            weight,
            scaled_count,
            frames,
            kernel_frames,
            end,
            heap: None,
            off_cpu: None,
            trace: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(frames: usize) -> Sample {
        Sample {
            pid: 10,
            tid: 11,
            time: 12,
            cpu: 1,
            event: 3,
            weight: 1000,
            scaled_count: 2000,
            frames: (0..frames as u64).collect(),
            kernel_frames: vec![0xffff_ffff_8100_0000],
            end: StackEnd::Complete,
            heap: None,
            off_cpu: None,
            trace: None,
        }
    }

    #[test]
    fn a_snapshot_comes_back_as_written_and_once_cleared_is_gone() {
        let file = CarriedFile::create("test", b"ddprofT1").unwrap();
        assert_eq!(file.load().unwrap(), None);
        let mut writer = Writer::default();
        writer.u64(2);
        writer.sample(&sample(3));
        writer.sample(&sample(MAX_FRAMES + 5));
        file.save(writer).unwrap();
        let bytes = file.load().unwrap().unwrap();
        let mut reader = Reader::new(&bytes);
        assert_eq!(reader.u64(), Some(2));
        assert_eq!(reader.sample(), Some(sample(3)));
        // Cut at the bound.
        assert_eq!(reader.sample().unwrap().frames.len(), MAX_FRAMES);
        assert!(reader.is_empty());
        // A smaller snapshot over it ends where its length says.
        let mut writer = Writer::default();
        writer.u8(7);
        file.save(writer).unwrap();
        assert_eq!(file.load().unwrap(), Some(vec![7]));
        file.clear().unwrap();
        assert_eq!(file.load().unwrap(), None);
    }

    #[test]
    fn bytes_that_are_not_a_snapshot_of_its_kind_are_refused() {
        let file = CarriedFile::create("test", b"ddprofT1").unwrap();
        let mut other = file.try_clone().unwrap();
        other.magic = *b"ddprofT2";
        other.save(Writer::default()).unwrap();
        assert!(matches!(file.load(), Err(CarriedError::NotASnapshot)));
        // A length past the bound.
        let mut bytes = b"ddprofT1".to_vec();
        bytes.extend_from_slice(&(MAX_SNAPSHOT_BYTES + 1).to_le_bytes());
        (&file.file).seek(SeekFrom::Start(0)).unwrap();
        (&file.file).write_all(&bytes).unwrap();
        assert!(matches!(file.load(), Err(CarriedError::NotASnapshot)));
        // A list longer than the bytes left, or than its bound.
        let mut writer = Writer::default();
        writer.sample(&sample(2));
        let mut bytes = writer.0[HEADER_BYTES..].to_vec();
        bytes.truncate(bytes.len() - 4);
        assert_eq!(Reader::new(&bytes).sample(), None);
        let mut writer = Writer::default();
        writer.sample(&sample(0));
        let mut bytes = writer.0[HEADER_BYTES..].to_vec();
        // The user frames' count (after pid, tid, time, cpu, event, end,
        // weight and count: 39 bytes).
        bytes[39..43].copy_from_slice(&(MAX_FRAMES as u32 + 1).to_le_bytes());
        assert_eq!(Reader::new(&bytes).sample(), None);
    }
}

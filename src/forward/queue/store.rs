//! Where a shard keeps its records: in memory, or on disk in append-only segments.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::record::{FRAME_HEADER, Record};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// The disk is full (ENOSPC) or over quota (EDQUOT): the sender should retry later.
    #[error("no space left on the queue's disk: {0}")]
    NoSpace(std::io::Error),
    #[error("queue i/o: {0}")]
    Io(std::io::Error),
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        match e.raw_os_error() {
            Some(libc::ENOSPC) | Some(libc::EDQUOT) => StoreError::NoSpace(e),
            _ => StoreError::Io(e),
        }
    }
}

/// What a removed record held, for the budget and the drop counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Removed {
    pub bytes: u64,
    pub samples: u64,
}

/// A shard's FIFO of records. The front record is the one being sent; it stays until it
/// is acknowledged ([`Store::pop_front`]), so a crash re-sends it rather than losing it.
pub trait Store: Send {
    fn push(&mut self, rec: &Record) -> Result<(), StoreError>;
    /// The oldest record. Records found corrupt on the way are skipped and counted
    /// ([`Store::take_corrupt`]).
    fn front(&mut self) -> Result<Option<Record>, StoreError>;
    fn pop_front(&mut self) -> Option<Removed>;
    /// Takes back the record just pushed (a request whose other parts failed).
    fn pop_back(&mut self) -> Option<Removed>;
    /// Removes the record at `index` (0 = front) to make room (`when_full: drop_oldest`).
    fn remove(&mut self, index: usize) -> Option<Removed>;
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    fn bytes(&self) -> u64;
    fn oldest_ms(&self) -> Option<u64>;
    /// Makes appended records durable (disk); a no-op in memory.
    fn sync(&mut self) -> Result<(), StoreError>;
    /// Corrupt records skipped since the last call.
    fn take_corrupt(&mut self) -> u64;
}

#[derive(Default)]
pub struct MemoryStore {
    records: VecDeque<Record>,
    bytes: u64,
}

impl Store for MemoryStore {
    fn push(&mut self, rec: &Record) -> Result<(), StoreError> {
        self.bytes += rec.size();
        self.records.push_back(rec.clone());
        Ok(())
    }
    fn front(&mut self) -> Result<Option<Record>, StoreError> {
        Ok(self.records.front().cloned())
    }
    fn pop_front(&mut self) -> Option<Removed> {
        self.remove(0)
    }
    fn pop_back(&mut self) -> Option<Removed> {
        let last = self.records.len().checked_sub(1)?;
        self.remove(last)
    }
    fn remove(&mut self, index: usize) -> Option<Removed> {
        let r = self.records.remove(index)?;
        self.bytes -= r.size();
        Some(Removed {
            bytes: r.size(),
            samples: r.samples,
        })
    }
    fn len(&self) -> usize {
        self.records.len()
    }
    fn bytes(&self) -> u64 {
        self.bytes
    }
    fn oldest_ms(&self) -> Option<u64> {
        self.records.front().map(|r| r.enqueued_ms)
    }
    fn sync(&mut self) -> Result<(), StoreError> {
        Ok(())
    }
    fn take_corrupt(&mut self) -> u64 {
        0
    }
}

/// Where a record lives on disk.
#[derive(Clone, Copy, Debug)]
struct Entry {
    segment: u64,
    offset: u64,
    /// Frame length (header plus payload): the record's bytes on disk.
    len: u64,
    samples: u64,
    enqueued_ms: u64,
}

/// Append-only segment files `NNNNNNNNNNNNNNNNNNNN.seg` of framed records (length, CRC-32,
/// payload), and a cursor file (`cursor`: segment and offset of the first record not yet
/// acknowledged) replaced atomically (write, rename). A segment is deleted once every
/// record in it is acknowledged. On open, the segments from the cursor on are read back;
/// a record whose checksum fails is skipped and counted, a torn tail (a crash mid-write)
/// is cut off.
pub struct DiskStore {
    dir: PathBuf,
    _lock: File,
    entries: VecDeque<Entry>,
    /// Lowest segment number still on disk.
    first_segment: u64,
    write_segment: u64,
    writer: File,
    write_offset: u64,
    segment_bytes: u64,
    reader: Option<(u64, File)>,
    bytes: u64,
    corrupt: u64,
    fsync_each: bool,
    dirty: bool,
    frame: Vec<u8>,
}

/// Segments roll over at this size (smaller when the queue's budget is small).
pub const SEGMENT_BYTES: u64 = 64 << 20;

impl DiskStore {
    /// Opens (creating) the queue in `dir`, replaying what was not acknowledged. Fails
    /// when another process holds the directory.
    pub fn open(dir: &Path, segment_bytes: u64, fsync_each: bool) -> Result<DiskStore, StoreError> {
        std::fs::create_dir_all(dir)?;
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))?;
        // An advisory lock for the life of the process: two promnorms on one queue
        // would interleave records. Released by the kernel when the process dies.
        use std::os::fd::AsRawFd;
        // SAFETY: flock on a descriptor this function owns.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Err(StoreError::Io(std::io::Error::other(format!(
                "{} is in use by another process ({})",
                dir.display(),
                std::io::Error::last_os_error()
            ))));
        }
        let (cursor_segment, cursor_offset) = read_cursor(dir);
        let mut segments = list_segments(dir)?;
        for &s in segments.iter().filter(|&&s| s < cursor_segment) {
            let _ = std::fs::remove_file(segment_path(dir, s));
        }
        segments.retain(|&s| s >= cursor_segment);
        let mut store = DiskStore {
            dir: dir.to_path_buf(),
            _lock: lock,
            entries: VecDeque::new(),
            first_segment: segments.first().copied().unwrap_or(cursor_segment),
            write_segment: 0,
            // Replaced below; a placeholder that is never written.
            writer: File::open("/dev/null")?,
            write_offset: 0,
            segment_bytes: segment_bytes.max(1 << 16),
            reader: None,
            bytes: 0,
            corrupt: 0,
            fsync_each,
            dirty: false,
            frame: Vec::new(),
        };
        let last = segments.last().copied();
        for &s in &segments {
            let from = if s == cursor_segment {
                cursor_offset
            } else {
                0
            };
            store.replay_segment(s, from)?;
        }
        // New records go to a new segment: a replayed one is never appended to.
        store.write_segment = last.map_or(cursor_segment.max(1), |l| l + 1);
        store.writer = create_segment(dir, store.write_segment)?;
        if store.entries.is_empty() {
            store.remove_segments_before(store.write_segment);
        }
        store.write_cursor()?;
        Ok(store)
    }

    fn replay_segment(&mut self, segment: u64, from: u64) -> Result<(), StoreError> {
        let path = segment_path(&self.dir, segment);
        let data = std::fs::read(&path)?;
        let mut off = (from as usize).min(data.len());
        while off < data.len() {
            let header = Record::read_frame_header(&data[off..]);
            let Ok((len, crc)) = header else {
                self.torn_tail();
                break;
            };
            let end = off + FRAME_HEADER + len;
            if end > data.len() {
                self.torn_tail();
                break;
            }
            match Record::from_payload(&data[off + FRAME_HEADER..end], crc) {
                Ok(r) => {
                    let len = (end - off) as u64;
                    self.bytes += len;
                    self.entries.push_back(Entry {
                        segment,
                        offset: off as u64,
                        len,
                        samples: r.samples,
                        enqueued_ms: r.enqueued_ms,
                    });
                }
                Err(_) => self.corrupt += 1,
            }
            off = end;
        }
        Ok(())
    }

    /// Bytes that cannot be a whole record (a crash mid-write, or a damaged length):
    /// counted, and the rest of the segment skipped. Nothing is cut off the file: new
    /// records go to a new segment, and the damaged one is deleted with its neighbours
    /// once the records before and after it are acknowledged.
    fn torn_tail(&mut self) {
        self.corrupt += 1;
    }

    fn write_cursor(&self) -> Result<(), StoreError> {
        let (segment, offset) = match self.entries.front() {
            Some(e) => (e.segment, e.offset),
            None => (self.write_segment, self.write_offset),
        };
        let tmp = self.dir.join("cursor.tmp");
        std::fs::write(&tmp, format!("{segment} {offset}\n"))?;
        std::fs::rename(&tmp, self.dir.join("cursor"))?;
        Ok(())
    }

    fn remove_segments_before(&mut self, segment: u64) {
        while self.first_segment < segment {
            let _ = std::fs::remove_file(segment_path(&self.dir, self.first_segment));
            if self
                .reader
                .as_ref()
                .is_some_and(|(s, _)| *s == self.first_segment)
            {
                self.reader = None;
            }
            self.first_segment += 1;
        }
    }

    fn read_entry(&mut self, e: Entry) -> Result<Result<Record, ()>, StoreError> {
        if self.reader.as_ref().is_none_or(|(s, _)| *s != e.segment) {
            self.reader = Some((e.segment, File::open(segment_path(&self.dir, e.segment))?));
        }
        let Some((_, f)) = &self.reader else {
            return Ok(Err(()));
        };
        let mut buf = vec![0u8; e.len as usize];
        if f.read_exact_at(&mut buf, e.offset).is_err() {
            return Ok(Err(()));
        }
        Ok(Record::read_frame_header(&buf)
            .and_then(|(_, crc)| Record::from_payload(&buf[FRAME_HEADER..], crc))
            .map_err(|_| ()))
    }

    fn after_removal(&mut self) {
        let keep_from = self
            .entries
            .front()
            .map_or(self.write_segment, |e| e.segment);
        self.remove_segments_before(keep_from);
        if let Err(e) = self.write_cursor() {
            tracing::warn!(dir = %self.dir.display(), error = %e, "writing the queue cursor");
        }
    }
}

impl Store for DiskStore {
    fn push(&mut self, rec: &Record) -> Result<(), StoreError> {
        self.frame.clear();
        rec.write_framed(&mut self.frame);
        let len = self.frame.len() as u64;
        if self.write_offset > 0 && self.write_offset + len > self.segment_bytes {
            self.writer.sync_data()?;
            let next = self.write_segment + 1;
            self.writer = create_segment(&self.dir, next)?;
            self.write_segment = next;
            self.write_offset = 0;
        }
        // Written at the offset the index records (not O_APPEND): a failed write leaves
        // the next one at the same place whatever the file's length.
        if let Err(e) = self.writer.write_all_at(&self.frame, self.write_offset) {
            let _ = self.writer.set_len(self.write_offset);
            return Err(e.into());
        }
        if self.fsync_each {
            if let Err(e) = self.writer.sync_data() {
                let _ = self.writer.set_len(self.write_offset);
                return Err(e.into());
            }
        } else {
            self.dirty = true;
        }
        self.entries.push_back(Entry {
            segment: self.write_segment,
            offset: self.write_offset,
            len,
            samples: rec.samples,
            enqueued_ms: rec.enqueued_ms,
        });
        self.write_offset += len;
        self.bytes += len;
        Ok(())
    }

    fn front(&mut self) -> Result<Option<Record>, StoreError> {
        while let Some(&e) = self.entries.front() {
            match self.read_entry(e)? {
                Ok(r) => return Ok(Some(r)),
                Err(()) => {
                    self.corrupt += 1;
                    self.entries.pop_front();
                    self.bytes -= e.len;
                    self.after_removal();
                }
            }
        }
        Ok(None)
    }

    fn pop_front(&mut self) -> Option<Removed> {
        self.remove(0)
    }

    fn pop_back(&mut self) -> Option<Removed> {
        let e = *self.entries.back()?;
        if e.segment != self.write_segment || e.offset + e.len != self.write_offset {
            return self.remove(self.entries.len() - 1);
        }
        self.entries.pop_back();
        self.bytes -= e.len;
        self.write_offset = e.offset;
        let _ = self.writer.set_len(e.offset);
        Some(Removed {
            bytes: e.len,
            samples: e.samples,
        })
    }

    fn remove(&mut self, index: usize) -> Option<Removed> {
        let e = self.entries.remove(index)?;
        self.bytes -= e.len;
        self.after_removal();
        Some(Removed {
            bytes: e.len,
            samples: e.samples,
        })
    }

    fn len(&self) -> usize {
        self.entries.len()
    }

    fn bytes(&self) -> u64 {
        self.bytes
    }

    fn oldest_ms(&self) -> Option<u64> {
        self.entries.front().map(|e| e.enqueued_ms)
    }

    fn sync(&mut self) -> Result<(), StoreError> {
        if self.dirty {
            self.writer.sync_data()?;
            self.dirty = false;
        }
        Ok(())
    }

    fn take_corrupt(&mut self) -> u64 {
        std::mem::take(&mut self.corrupt)
    }
}

fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("{segment:020}.seg"))
}

fn create_segment(dir: &Path, segment: u64) -> Result<File, StoreError> {
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(segment_path(dir, segment))?;
    // The new name must survive a crash too.
    if let Ok(d) = File::open(dir) {
        let _ = d.sync_all();
    }
    Ok(f)
}

fn list_segments(dir: &Path) -> Result<Vec<u64>, StoreError> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let name = entry?.file_name();
        let name = name.to_string_lossy();
        if let Some(n) = name
            .strip_suffix(".seg")
            .and_then(|n| n.parse::<u64>().ok())
        {
            out.push(n);
        }
    }
    out.sort_unstable();
    Ok(out)
}

/// The cursor file, or the start when it is missing or unreadable (re-sending is
/// better than losing).
fn read_cursor(dir: &Path) -> (u64, u64) {
    std::fs::read_to_string(dir.join("cursor"))
        .ok()
        .and_then(|s| {
            let mut it = s.split_whitespace();
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
        .unwrap_or((0, 0))
}

/// The interval between background fsyncs of a disk queue.
pub fn sync_interval(fsync_interval: Duration) -> Option<Duration> {
    (!fsync_interval.is_zero()).then_some(fsync_interval)
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn tmp(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!(
            "promnorm-store-{name}-{}-{}",
            std::process::id(),
            super::super::record::now_ms()
        ));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    fn rec(i: u64, body_len: usize) -> Record {
        Record {
            v1: Bytes::from(vec![i as u8; body_len]),
            v2: None,
            v2_series: 0,
            headers: Vec::new(),
            samples: i,
            enqueued_ms: 1000 + i,
        }
    }

    #[test]
    fn unacknowledged_records_are_replayed_in_order_after_reopening() {
        let dir = tmp("replay");
        {
            let mut s = DiskStore::open(&dir, 1 << 16, false).unwrap();
            for i in 0..10 {
                s.push(&rec(i, 3000)).unwrap();
            }
            // Acknowledge three; the rest must come back.
            for _ in 0..3 {
                assert_eq!(s.front().unwrap().unwrap().samples, s.entries[0].samples);
                s.pop_front().unwrap();
            }
            s.sync().unwrap();
        }
        let mut s = DiskStore::open(&dir, 1 << 16, false).unwrap();
        assert_eq!(s.len(), 7);
        let mut seen = Vec::new();
        while let Some(r) = s.front().unwrap() {
            assert_eq!(r.v1.len(), 3000);
            seen.push(r.samples);
            s.pop_front();
        }
        assert_eq!(seen, (3..10).collect::<Vec<_>>());
        assert_eq!(s.take_corrupt(), 0);
        // Everything acknowledged: old segments are gone, a reopen replays nothing.
        drop(s);
        let s = DiskStore::open(&dir, 1 << 16, false).unwrap();
        assert_eq!(s.len(), 0);
        let segs = list_segments(&dir).unwrap();
        assert_eq!(segs.len(), 1, "{segs:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn acknowledged_segments_are_deleted_and_a_full_queue_rolls_segments() {
        let dir = tmp("segments");
        let mut s = DiskStore::open(&dir, 1 << 16, false).unwrap();
        for i in 0..100 {
            s.push(&rec(i, 4000)).unwrap();
        }
        let before = list_segments(&dir).unwrap().len();
        assert!(before > 5, "{before} segments for 400 KB at 64 KiB each");
        for _ in 0..90 {
            s.pop_front().unwrap();
        }
        let after = list_segments(&dir).unwrap().len();
        assert!(after <= 2, "{after} segments left holding 10 records");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_corrupt_record_is_skipped_and_counted_and_a_torn_tail_skipped() {
        let dir = tmp("corrupt");
        {
            let mut s = DiskStore::open(&dir, 1 << 20, true).unwrap();
            for i in 0..5 {
                s.push(&rec(i, 100)).unwrap();
            }
        }
        let seg = list_segments(&dir).unwrap()[0];
        let path = segment_path(&dir, seg);
        let mut data = std::fs::read(&path).unwrap();
        let frame = data.len() / 5;
        // Flip a byte in the body of the second record, and tear the last one.
        data[frame + frame / 2] ^= 0xff;
        data.truncate(data.len() - 10);
        std::fs::write(&path, &data).unwrap();
        let mut s = DiskStore::open(&dir, 1 << 20, true).unwrap();
        let mut seen = Vec::new();
        while let Some(r) = s.front().unwrap() {
            seen.push(r.samples);
            s.pop_front();
        }
        assert_eq!(seen, vec![0, 2, 3]);
        assert_eq!(s.take_corrupt(), 2, "one bad checksum, one torn tail");
        // Everything readable was acknowledged: the damaged segment is gone, and a second
        // reopen finds nothing to complain about.
        drop(s);
        let mut s = DiskStore::open(&dir, 1 << 20, true).unwrap();
        assert_eq!(s.take_corrupt(), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_queue_directory_is_held_by_one_process_at_a_time() {
        let dir = tmp("lock");
        let _a = DiskStore::open(&dir, 1 << 20, false).unwrap();
        // flock is per open file description: a second open in this process conflicts too.
        let err = DiskStore::open(&dir, 1 << 20, false).err().expect("locked");
        assert!(err.to_string().contains("in use"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_full_disk_is_no_space_not_a_panic_and_leaves_no_partial_record() {
        // /dev/full answers every write with ENOSPC.
        let dir = tmp("enospc");
        let mut s = DiskStore::open(&dir, 1 << 20, false).unwrap();
        s.push(&rec(1, 10)).unwrap();
        s.writer = File::options().append(true).open("/dev/full").unwrap();
        let err = s.push(&rec(2, 10)).unwrap_err();
        assert!(matches!(err, StoreError::NoSpace(_)), "{err:?}");
        assert_eq!(s.len(), 1);
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

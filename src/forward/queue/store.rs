//! Where a shard keeps its records: in memory, or on disk in append-only segments.

use std::collections::VecDeque;
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::record::{FrameError, Record};

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
        if crate::sys::is_no_space(&e) {
            StoreError::NoSpace(e)
        } else {
            StoreError::Io(e)
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
    /// The record at `index` (0 = front) without removing it; `None` past the end or
    /// when it cannot be read (damage is left for [`Store::front`] to skip and count).
    fn get(&mut self, index: usize) -> Result<Option<Record>, StoreError>;
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
    /// What [`Store::sync`] would flush, as handles to flush without the store: the
    /// periodic fsync runs off the runtime and outside the shard's lock, so requests
    /// being queued do not wait for the disk. `None`: nothing to flush.
    fn sync_handle(&mut self) -> Result<Option<PendingSync>, StoreError> {
        self.sync().map(|()| None)
    }
    /// Takes back what a flush from [`Store::sync_handle`] could not make durable.
    fn sync_failed(&mut self, _left: PendingSync) {}
    /// Damage skipped since the last call.
    fn take_corrupt(&mut self) -> Skipped;
}

/// Damaged queue data skipped: each damaged stretch counts as one record (how many
/// records a zeroed page held is unknowable), its samples when its header said.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Skipped {
    pub records: u64,
    pub samples: u64,
    pub bytes: u64,
}

impl Skipped {
    pub fn is_empty(&self) -> bool {
        self.records == 0
    }
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
    fn get(&mut self, index: usize) -> Result<Option<Record>, StoreError> {
        Ok(self.records.get(index).cloned())
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
    fn take_corrupt(&mut self) -> Skipped {
        Skipped::default()
    }
}

/// What a disk queue's periodic flush makes durable, taken out of the store so that the
/// fsyncs run on a blocking thread without its lock ([`Store::sync_handle`]).
pub struct PendingSync {
    /// The segments written to since the last flush, by number: segments rolled over
    /// since, then the write segment.
    files: Vec<(u64, File)>,
    /// The queue's directory, when a segment was created since: the new name must
    /// survive a crash too.
    dir: Option<File>,
}

impl PendingSync {
    /// The data first, then the names that lead to it; every one is tried. On failure,
    /// the first error and what is still to flush, to give back to the store
    /// ([`Store::sync_failed`]) for the next flush.
    pub fn run(self) -> Result<(), (std::io::Error, PendingSync)> {
        let mut first = None;
        let mut files = Vec::new();
        for (segment, f) in self.files {
            if let Err(e) = f.sync_data() {
                first.get_or_insert(e);
                files.push((segment, f));
            }
        }
        let dir = self.dir.and_then(|d| match d.sync_all() {
            Ok(()) => None,
            Err(e) => {
                first.get_or_insert(e);
                Some(d)
            }
        });
        match first {
            None => Ok(()),
            Some(e) => Err((e, PendingSync { files, dir })),
        }
    }
}

/// Rolled segments held for the next flush at most: a flush that does not come (a long
/// interval, a disk that stalls) must not hold a file open per segment rolled meanwhile.
const MAX_ROLLED: usize = 16;

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
    corrupt: Skipped,
    fsync_each: bool,
    /// The write segment has records not yet flushed.
    dirty: bool,
    /// Segments rolled over with records not yet flushed: the next flush takes them
    /// (a roll does not wait for the disk on the request's path).
    rolled: Vec<(u64, File)>,
    /// A segment was created since the last flush (its name is not yet durable).
    dir_dirty: bool,
    /// Records were acknowledged since the cursor was last written. The cursor is
    /// written with the periodic sync, when the store is synced or dropped, and before a
    /// segment is deleted, not after every record (a file write and a rename each time
    /// cost the sender as much as the record's own write): a crash re-sends at most what
    /// was delivered since, never loses anything.
    cursor_dirty: bool,
    frame: Vec<u8>,
    /// The records this process pushed, kept with their entries (`cached[i]` is
    /// `entries[i]`'s) while they fit in `cache_limit` bytes: a queue that keeps up sends
    /// what it just wrote without reading it back and checking it again. Replayed records
    /// and those pushed while the cache was full are read from disk.
    cached: VecDeque<Option<Box<Record>>>,
    cached_bytes: u64,
    cache_limit: u64,
}

/// Segments roll over at this size (smaller when the queue's budget is small).
pub const SEGMENT_BYTES: u64 = 64 << 20;

impl DiskStore {
    /// Opens (creating) the queue in `dir`, replaying what was not acknowledged. Fails
    /// at once when another process holds the directory.
    pub fn open(dir: &Path, segment_bytes: u64, fsync_each: bool) -> Result<DiskStore, StoreError> {
        DiskStore::open_waiting(dir, segment_bytes, fsync_each, Duration::ZERO)
    }

    /// [`DiskStore::open`], waiting up to `lock_wait` for another process to release the
    /// directory (a promnorm still stopping while its successor starts).
    pub fn open_waiting(
        dir: &Path,
        segment_bytes: u64,
        fsync_each: bool,
        lock_wait: Duration,
    ) -> Result<DiskStore, StoreError> {
        std::fs::create_dir_all(dir)?;
        let lock = File::options()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join("LOCK"))?;
        lock_dir(dir, &lock, lock_wait)?;
        let mut segments = list_segments(dir)?;
        let (cursor_segment, cursor_offset) = match validate_cursor(dir, &segments) {
            Ok(c) => c,
            Err(why) => {
                // Never delete on a cursor that cannot be trusted: re-sending what was
                // delivered is better than losing what was not.
                tracing::error!(
                    dir = %dir.display(),
                    "queue cursor {why}; replaying every segment from its start (records already delivered may be sent again)"
                );
                (segments.first().copied().unwrap_or(0), 0)
            }
        };
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
            corrupt: Skipped::default(),
            fsync_each,
            dirty: false,
            rolled: Vec::new(),
            dir_dirty: false,
            cursor_dirty: false,
            frame: Vec::new(),
            cached: VecDeque::new(),
            cached_bytes: 0,
            cache_limit: 0,
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
        store.writer = create_segment(dir, store.write_segment, true)?;
        if store.entries.is_empty() {
            store.remove_segments_before(store.write_segment);
        }
        store.write_cursor()?;
        Ok(store)
    }

    /// Reads a segment's records from `from` (the cursor's offset in its segment). Damage
    /// is skipped up to the next sound frame ([`Record::next_frame`]) and counted.
    fn replay_segment(&mut self, segment: u64, from: u64) -> Result<(), StoreError> {
        let path = segment_path(&self.dir, segment);
        let data = std::fs::read(&path)?;
        // The cursor's offset was checked to be a record boundary (validate_cursor).
        let from = from as usize;
        let scanned = scan(&data);
        for s in scanned.into_iter().filter(|s| s.offset >= from) {
            match s.kind {
                ScanKind::Record {
                    samples,
                    enqueued_ms,
                } => {
                    self.bytes += s.len;
                    self.entries.push_back(Entry {
                        segment,
                        offset: s.offset as u64,
                        len: s.len,
                        samples,
                        enqueued_ms,
                    });
                    self.cached.push_back(None);
                }
                ScanKind::Damage { samples } => {
                    self.corrupt.records += 1;
                    self.corrupt.samples += samples;
                    self.corrupt.bytes += s.len;
                }
            }
        }
        Ok(())
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
        // A rolled segment delivered in full needs no flush.
        self.rolled.retain(|(s, _)| *s >= segment);
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
        // The record's bodies are slices of this buffer: no second copy.
        let buf = bytes::Bytes::from(buf);
        Ok(Record::read_frame_shared(&buf)
            .ok()
            .filter(|(_, n)| *n as u64 == e.len)
            .map(|(r, _)| r)
            .ok_or(()))
    }

    /// Forgets the cached record of the entry that was at `index`.
    fn uncache(&mut self, index: usize) {
        if let Some(Some(r)) = self.cached.remove(index) {
            self.cached_bytes -= r.size();
        }
    }

    /// Keeps up to `bytes` of the records pushed from now on in memory ([`DiskStore::cached`]).
    pub fn cache_up_to(&mut self, bytes: u64) {
        self.cache_limit = bytes;
    }

    fn after_removal(&mut self) {
        let keep_from = self
            .entries
            .front()
            .map_or(self.write_segment, |e| e.segment);
        if self.first_segment < keep_from {
            // The cursor moves on before the segments behind it go: a cursor naming a
            // deleted segment would replay everything after a crash.
            self.cursor_dirty = true;
            self.flush_cursor();
            self.remove_segments_before(keep_from);
        }
        self.cursor_dirty = true;
        if self.fsync_each {
            // Every record synced as it comes (`fsync_interval: 0s`): the cursor too.
            self.flush_cursor();
        } else if self.entries.is_empty() && self.write_offset >= self.segment_bytes / 4 {
            self.reclaim();
        }
    }

    /// Writes the cursor if records were acknowledged since it was last written. A
    /// drained write segment is started again from its beginning at the same time.
    fn flush_cursor(&mut self) {
        if !self.cursor_dirty {
            return;
        }
        if self.entries.is_empty() && self.write_offset > 0 {
            self.reclaim();
            return;
        }
        match self.write_cursor() {
            Ok(()) => self.cursor_dirty = false,
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "writing the queue cursor");
            }
        }
    }

    /// Everything acknowledged, the write segment included: starts it again from its
    /// beginning so its space comes back (a full disk recovers once drained). The cursor
    /// moves first: a crash before the truncation re-sends, never loses.
    fn reclaim(&mut self) {
        let at = self.write_offset;
        self.write_offset = 0;
        match self.write_cursor() {
            Ok(()) => {
                self.cursor_dirty = false;
                if let Err(e) = self.writer.set_len(0) {
                    tracing::warn!(dir = %self.dir.display(), error = %e, "truncating the delivered queue segment");
                }
            }
            Err(e) => {
                self.write_offset = at;
                tracing::warn!(dir = %self.dir.display(), error = %e, "writing the queue cursor");
            }
        }
    }

    /// Moves writing to a new segment, so the current one can be deleted once its
    /// records are acknowledged. The old segment's unflushed records and the new name
    /// go with the next periodic flush, like any record written within its interval;
    /// with `fsync_interval: 0s` every record is already flushed and the name is at once.
    fn roll(&mut self) -> Result<(), StoreError> {
        if self.dirty && self.rolled.len() >= MAX_ROLLED {
            self.rolled[0].1.sync_data()?;
            self.rolled.remove(0);
        }
        let next = self.write_segment + 1;
        let new = create_segment(&self.dir, next, self.fsync_each)?;
        let old = std::mem::replace(&mut self.writer, new);
        if self.dirty {
            self.rolled.push((self.write_segment, old));
        }
        self.dir_dirty |= !self.fsync_each;
        self.write_segment = next;
        self.write_offset = 0;
        Ok(())
    }
}

impl Store for DiskStore {
    fn push(&mut self, rec: &Record) -> Result<(), StoreError> {
        self.frame.clear();
        rec.write_framed(&mut self.frame);
        let len = self.frame.len() as u64;
        if self.write_offset > 0 && self.write_offset + len > self.segment_bytes {
            self.roll()?;
        }
        // Written at the offset the index records (not O_APPEND): a failed write leaves
        // the next one at the same place whatever the file's length.
        let mut written = self.writer.write_all_at(&self.frame, self.write_offset);
        if written.as_ref().is_err_and(crate::sys::is_no_space)
            && self.entries.is_empty()
            && self.write_offset > 0
        {
            // A disk filled by records all delivered: their space comes back now.
            let _ = self.writer.set_len(self.write_offset);
            self.reclaim();
            if self.write_offset == 0 {
                written = self.writer.write_all_at(&self.frame, 0);
            }
        }
        if let Err(e) = written {
            let _ = self.writer.set_len(self.write_offset);
            let err = StoreError::from(e);
            // Out of space: the next record goes to a new segment, so this one's space
            // comes back as soon as its records are delivered, even while more wait.
            // Flushed now, so that the roll keeps no handle on it: deleted once
            // delivered, its space comes back at once, not at the next flush.
            if matches!(err, StoreError::NoSpace(_)) && self.write_offset > 0 {
                if self.writer.sync_data().is_ok() {
                    self.dirty = false;
                }
                let _ = self.roll();
            }
            return Err(err);
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
        if self.cached_bytes + rec.size() <= self.cache_limit {
            self.cached_bytes += rec.size();
            self.cached.push_back(Some(Box::new(rec.clone())));
        } else {
            self.cached.push_back(None);
        }
        self.write_offset += len;
        self.bytes += len;
        Ok(())
    }

    fn front(&mut self) -> Result<Option<Record>, StoreError> {
        while let Some(&e) = self.entries.front() {
            if let Some(Some(r)) = self.cached.front() {
                return Ok(Some(Record::clone(r)));
            }
            match self.read_entry(e)? {
                Ok(r) => return Ok(Some(r)),
                Err(()) => {
                    self.corrupt.records += 1;
                    self.corrupt.samples += e.samples;
                    self.corrupt.bytes += e.len;
                    self.entries.pop_front();
                    self.uncache(0);
                    self.bytes -= e.len;
                    self.after_removal();
                }
            }
        }
        Ok(None)
    }

    fn get(&mut self, index: usize) -> Result<Option<Record>, StoreError> {
        let Some(&e) = self.entries.get(index) else {
            return Ok(None);
        };
        if let Some(Some(r)) = self.cached.get(index) {
            return Ok(Some(Record::clone(r)));
        }
        Ok(self.read_entry(e)?.ok())
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
        self.uncache(self.cached.len().saturating_sub(1));
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
        self.uncache(index);
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

    /// The periodic flush's work, done here: every file and the directory tried, what
    /// fails stays due, the first error returned.
    fn sync(&mut self) -> Result<(), StoreError> {
        match self.sync_handle()? {
            None => Ok(()),
            Some(pending) => pending.run().map_err(|(e, left)| {
                self.sync_failed(left);
                e.into()
            }),
        }
    }

    fn sync_handle(&mut self) -> Result<Option<PendingSync>, StoreError> {
        self.flush_cursor();
        if !self.dirty && !self.dir_dirty && self.rolled.is_empty() {
            return Ok(None);
        }
        // Records appended from here on set `dirty` again and go with the next flush.
        let current = if self.dirty {
            Some((self.write_segment, self.writer.try_clone()?))
        } else {
            None
        };
        let dir = if self.dir_dirty {
            Some(File::open(&self.dir)?)
        } else {
            None
        };
        let mut files = std::mem::take(&mut self.rolled);
        files.extend(current);
        self.dirty = false;
        self.dir_dirty = false;
        Ok(Some(PendingSync { files, dir }))
    }

    fn sync_failed(&mut self, left: PendingSync) {
        let first = self.first_segment;
        let mut files: Vec<_> = left
            .files
            .into_iter()
            .filter(|(s, _)| *s >= first)
            .collect();
        files.append(&mut self.rolled);
        self.rolled = files;
        self.dir_dirty |= left.dir.is_some();
    }

    fn take_corrupt(&mut self) -> Skipped {
        std::mem::take(&mut self.corrupt)
    }
}

impl Drop for DiskStore {
    /// A store closed in order leaves its cursor current: nothing delivered is re-sent.
    fn drop(&mut self) {
        self.flush_cursor();
    }
}

fn segment_path(dir: &Path, segment: u64) -> PathBuf {
    dir.join(format!("{segment:020}.seg"))
}

/// `sync_dir`: the new name is made durable now (else by the next flush).
fn create_segment(dir: &Path, segment: u64, sync_dir: bool) -> Result<File, StoreError> {
    let f = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(segment_path(dir, segment))?;
    // The new name must survive a crash too.
    if sync_dir && let Ok(d) = File::open(dir) {
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

/// What a segment holds, frame by frame, from its start.
struct Scanned {
    offset: usize,
    len: u64,
    kind: ScanKind,
}

enum ScanKind {
    Record {
        samples: u64,
        enqueued_ms: u64,
    },
    /// Bytes that are no readable record, up to the next sound frame (or the end).
    Damage {
        samples: u64,
    },
}

fn scan(data: &[u8]) -> Vec<Scanned> {
    let mut out = Vec::new();
    let mut off = 0;
    // A segment with framed records is read as such throughout: damage inside it is
    // never taken for a frame of the old format (its first word would be read as a
    // length and whole sound records after it skipped).
    let magic = super::record::FRAME_MAGIC.to_le_bytes();
    let framed = data.starts_with(&magic) || Record::next_frame(data, 0).is_some();
    while off < data.len() {
        if framed && !data[off..].starts_with(&magic) {
            let next = Record::next_frame(data, off).unwrap_or(data.len());
            out.push(Scanned {
                offset: off,
                len: (next - off) as u64,
                kind: ScanKind::Damage { samples: 0 },
            });
            off = next;
            continue;
        }
        let (len, kind) = match Record::read_frame(&data[off..]) {
            Ok((r, n)) => (
                n,
                ScanKind::Record {
                    samples: r.samples,
                    enqueued_ms: r.enqueued_ms,
                },
            ),
            Err(FrameError::Payload { len, samples }) => (
                len,
                ScanKind::Damage {
                    samples: samples.unwrap_or(0),
                },
            ),
            // A header not to be trusted, or a torn tail: resume at the next sound frame.
            Err(FrameError::Header | FrameError::Truncated) => {
                let next = Record::next_frame(data, off).unwrap_or(data.len());
                (next - off, ScanKind::Damage { samples: 0 })
            }
        };
        out.push(Scanned {
            offset: off,
            len: len as u64,
            kind,
        });
        off += len;
    }
    out
}

/// The cursor (segment and offset of the first record not acknowledged), checked against
/// the segments on disk: `Err` says why it cannot be trusted. A missing cursor is the
/// start. A cursor below every segment is normal (its segment was deleted, the crash came
/// before the cursor moved on); one that names no segment, or an offset past its end,
/// is not: it would have every segment before it deleted.
fn validate_cursor(dir: &Path, segments: &[u64]) -> Result<(u64, u64), String> {
    let text = match std::fs::read_to_string(dir.join("cursor")) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(format!("unreadable ({e})")),
    };
    let mut it = text.split_whitespace();
    let parsed: Option<(u64, u64)> = (|| {
        let c = (it.next()?.parse().ok()?, it.next()?.parse().ok()?);
        it.next().is_none().then_some(c)
    })();
    let Some((segment, offset)) = parsed else {
        return Err(format!("{:?} is not \"SEGMENT OFFSET\"", text.trim()));
    };
    let (Some(&first), Some(&last)) = (segments.first(), segments.last()) else {
        return Ok((segment, offset));
    };
    if segment < first {
        return Ok((segment, 0));
    }
    if segment > last || !segments.contains(&segment) {
        return Err(format!(
            "\"{segment} {offset}\" names no segment on disk (segments {first}..={last})"
        ));
    }
    let data = std::fs::read(segment_path(dir, segment)).unwrap_or_default();
    if offset > data.len() as u64 {
        return Err(format!(
            "\"{segment} {offset}\" points past the end of its segment ({} bytes)",
            data.len()
        ));
    }
    if offset != 0
        && offset != data.len() as u64
        && !scan(&data).iter().any(|s| s.offset as u64 == offset)
    {
        return Err(format!(
            "\"{segment} {offset}\" is not at a record boundary"
        ));
    }
    Ok((segment, offset))
}

/// Takes the directory's advisory lock for the life of the process (two promnorms on
/// one queue would interleave records; the kernel releases it when the process dies),
/// waiting up to `wait` for another holder to let go.
fn lock_dir(dir: &Path, lock: &File, wait: Duration) -> Result<(), StoreError> {
    let deadline = std::time::Instant::now() + wait;
    let mut logged = false;
    loop {
        let err = match crate::sys::try_lock_exclusive(lock) {
            Ok(true) => {
                if logged {
                    tracing::info!(dir = %dir.display(), "queue directory released; opening it");
                }
                return Ok(());
            }
            Ok(false) if std::time::Instant::now() < deadline => None,
            Ok(false) => Some("held by another process".to_string()),
            Err(e) => Some(e.to_string()),
        };
        if let Some(err) = err {
            return Err(StoreError::Io(std::io::Error::other(format!(
                "{} is in use by another process ({err})",
                dir.display()
            ))));
        }
        if !logged {
            tracing::warn!(
                dir = %dir.display(),
                wait_s = wait.as_secs(),
                "queue directory held by another process (a promnorm still stopping?); waiting for it"
            );
            logged = true;
        }
        pause(Duration::from_millis(100));
    }
}

/// Sleeps the calling thread; on a tokio worker (a reload opening a queue while the
/// proxy serves) the worker's other tasks are handed to another thread first, so the
/// wait for a lock never stalls requests.
fn pause(d: Duration) {
    let on_worker = tokio::runtime::Handle::try_current()
        .is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if on_worker {
        tokio::task::block_in_place(|| std::thread::sleep(d));
    } else {
        std::thread::sleep(d);
    }
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
    fn records_within_the_cache_are_sent_from_memory_the_rest_read_from_disk() {
        let dir = tmp("cache");
        let mut s = DiskStore::open(&dir, 1 << 20, false).unwrap();
        // Room for three records of 3,000 bytes (plus framing), not four.
        let size = rec(0, 3000).size();
        s.cache_up_to(3 * size + size / 2);
        for i in 0..6 {
            s.push(&rec(i, 3000)).unwrap();
        }
        assert_eq!(s.cached.iter().filter(|c| c.is_some()).count(), 3);
        assert_eq!(s.cached_bytes, 3 * size);
        // A cached record is what was pushed even when its disk copy is damaged: what
        // is sent is the data promnorm accepted.
        let seg = segment_path(&dir, s.write_segment);
        let mut data = std::fs::read(&seg).unwrap();
        data[super::super::record::FRAME_HEADER + 40] ^= 0xff;
        std::fs::write(&seg, &data).unwrap();
        for i in 0..6 {
            let r = s.get(i as usize).unwrap().unwrap();
            assert_eq!((r.samples, r.v1.len()), (i, 3000));
        }
        for i in 0..6 {
            assert_eq!(s.front().unwrap().unwrap().samples, i);
            s.pop_front();
            // Room made at the front goes to records pushed later.
            assert!(s.cached_bytes <= 3 * size);
        }
        assert_eq!(s.cached_bytes, 0);
        assert!(s.take_corrupt().is_empty());
        drop(s);
        let _ = std::fs::remove_dir_all(&dir);
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
        assert!(s.take_corrupt().is_empty());
        // Everything acknowledged: old segments are gone, a reopen replays nothing.
        drop(s);
        let s = DiskStore::open(&dir, 1 << 16, false).unwrap();
        assert_eq!(s.len(), 0);
        let segs = list_segments(&dir).unwrap();
        assert_eq!(segs.len(), 1, "{segs:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_roll_leaves_the_old_segment_and_the_new_name_to_the_next_flush() {
        let dir = tmp("roll-flush");
        let mut s = DiskStore::open(&dir, 1 << 16, false).unwrap();
        assert!(s.sync_handle().unwrap().is_none());
        let first = s.write_segment;
        for i in 0..40 {
            s.push(&rec(i, 4000)).unwrap();
        }
        // 160 KB in 64 KiB segments: rolls, none flushed on the way.
        let rolls = (s.write_segment - first) as usize;
        assert!(rolls >= 2, "{rolls}");
        assert_eq!((s.rolled.len(), s.dir_dirty), (rolls, true));
        let pending = s.sync_handle().unwrap().unwrap();
        assert_eq!(pending.files.len(), rolls + 1);
        assert!(pending.dir.is_some());
        // A flush that failed gives its files back for the next one.
        s.sync_failed(pending);
        assert_eq!((s.rolled.len(), s.dir_dirty), (rolls + 1, true));
        let pending = s.sync_handle().unwrap().unwrap();
        assert_eq!(pending.files.len(), rolls + 1);
        assert!(pending.run().is_ok());
        assert!(s.sync_handle().unwrap().is_none());
        // Segments delivered in full are not flushed; many rolls without a flush hold
        // at most MAX_ROLLED files.
        for i in 0..400 {
            s.push(&rec(i, 4000)).unwrap();
        }
        assert_eq!(s.rolled.len(), MAX_ROLLED);
        while s.pop_front().is_some() {}
        assert!(s.rolled.is_empty(), "{}", s.rolled.len());
        // With every record flushed as written, a roll has nothing left to flush.
        let each = tmp("roll-flush-each");
        let mut s = DiskStore::open(&each, 1 << 16, true).unwrap();
        let first = s.write_segment;
        for i in 0..40 {
            s.push(&rec(i, 4000)).unwrap();
        }
        assert_eq!((s.write_segment - first) as usize, rolls);
        assert_eq!((s.rolled.len(), s.dir_dirty), (0, false));
        drop(s);
        let s = DiskStore::open(&each, 1 << 16, true).unwrap();
        assert_eq!(s.len(), 40);
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_dir_all(&each).unwrap();
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
        let skipped = s.take_corrupt();
        assert_eq!(skipped.records, 2, "one bad checksum, one torn tail");
        // The damaged record's header survived: its sample count is known.
        assert_eq!(skipped.samples, 1);
        // Everything readable was acknowledged: the damaged segment is gone, and a second
        // reopen finds nothing to complain about.
        drop(s);
        let mut s = DiskStore::open(&dir, 1 << 20, true).unwrap();
        assert!(s.take_corrupt().is_empty());
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

    fn bytes_on_disk(dir: &Path) -> u64 {
        list_segments(dir)
            .unwrap()
            .iter()
            .map(|&n| std::fs::metadata(segment_path(dir, n)).unwrap().len())
            .sum()
    }

    fn drain(s: &mut DiskStore) -> Vec<u64> {
        let mut seen = Vec::new();
        while let Some(r) = s.front().unwrap() {
            seen.push(r.samples);
            s.pop_front();
        }
        seen
    }

    /// Issue: a write segment full of delivered records was never deleted nor reused, so
    /// a queue that filled its disk refused every request after draining.
    #[test]
    fn a_drained_write_segment_gives_its_space_back() {
        let dir = tmp("reuse");
        // One large segment, as with the default max_bytes on a small disk.
        let mut s = DiskStore::open(&dir, 64 << 20, false).unwrap();
        for i in 0..50 {
            s.push(&rec(i, 4000)).unwrap();
        }
        assert!(bytes_on_disk(&dir) > 200_000);
        drain(&mut s);
        // The space comes back with the next (periodic) sync, at once when the segment
        // is large, and at once when a write finds the disk full (the tmpfs test below).
        s.sync().unwrap();
        assert_eq!(
            bytes_on_disk(&dir),
            0,
            "delivered records still hold the disk"
        );
        // The queue works on, and a reopen replays exactly what is still queued.
        for i in 100..103 {
            s.push(&rec(i, 100)).unwrap();
        }
        s.pop_front();
        s.sync().unwrap();
        drop(s);
        let mut s = DiskStore::open(&dir, 64 << 20, false).unwrap();
        assert_eq!(drain(&mut s), vec![101, 102]);
        assert!(s.take_corrupt().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// The case on a real full filesystem: an 8 MiB tmpfs (skipped where it
    /// cannot be mounted).
    #[test]
    fn a_queue_that_filled_its_disk_accepts_writes_again_once_drained() {
        let dir = tmp("tmpfs");
        std::fs::create_dir_all(&dir).unwrap();
        let mounted = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
            .arg(&dir)
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !mounted {
            eprintln!("skipped: cannot mount a tmpfs here");
            let _ = std::fs::remove_dir_all(&dir);
            return;
        }
        let result = std::panic::catch_unwind(|| {
            let q = dir.join("q");
            let mut s = DiskStore::open(&q, 64 << 20, false).unwrap();
            let mut stored = 0;
            let full = loop {
                match s.push(&rec(stored, 10_000)) {
                    Ok(()) => stored += 1,
                    Err(e) => break e,
                }
                assert!(stored < 10_000, "an 8 MiB disk never filled");
            };
            assert!(matches!(full, StoreError::NoSpace(_)), "{full:?}");
            assert!(stored > 500, "{stored}");
            // Still full while everything waits; delivered, the space comes back.
            assert!(s.push(&rec(0, 10_000)).is_err());
            assert_eq!(drain(&mut s).len() as u64, stored);
            let mut again = 0;
            while again < stored && s.push(&rec(again, 10_000)).is_ok() {
                again += 1;
            }
            assert!(again > 500, "{again} records fit after the queue drained");
            // Full again, and a second drain frees it again (the full segment was
            // rolled over: it is deleted, not truncated).
            assert!(s.push(&rec(0, 10_000)).is_err());
            assert_eq!(drain(&mut s).len() as u64, again);
            assert!(s.push(&rec(0, 10_000)).is_ok());
        });
        let _ = std::process::Command::new("umount").arg(&dir).status();
        let _ = std::fs::remove_dir_all(&dir);
        if let Err(e) = result {
            std::panic::resume_unwind(e);
        }
    }

    fn segment_bytes(dir: &Path) -> (PathBuf, Vec<u8>) {
        let seg = list_segments(dir).unwrap()[0];
        let path = segment_path(dir, seg);
        let data = std::fs::read(&path).unwrap();
        (path, data)
    }

    /// Issue: one damaged length byte discarded the rest of its segment (187 of 600
    /// records), and a zeroed page likewise; neither the records nor the samples were
    /// counted.
    #[test]
    fn damage_costs_only_the_damaged_records_and_is_counted() {
        let dir = tmp("resync");
        {
            let mut s = DiskStore::open(&dir, 64 << 20, true).unwrap();
            for i in 0..600 {
                s.push(&rec(i, 1000)).unwrap();
            }
        }
        let (path, mut data) = segment_bytes(&dir);
        let frame = data.len() / 600;
        // The length field of record 100, and a 4 KiB page of zeros in records 300..=305.
        data[100 * frame + 5] ^= 0x40;
        data[300 * frame + 10..300 * frame + 10 + 4096].fill(0);
        // And a page of zeros that starts inside record 400's body: the zeros where
        // record 401 begins must not be read as an old-format frame's length.
        let zeros_end = 400 * frame + 500 + 4096;
        data[400 * frame + 500..zeros_end].fill(0);
        // Where a reader hopping through the zeros 8 bytes at a time (empty old-format
        // frames) first meets data, a word that reads as a plausible old-format length
        // (three records): it must not make the reader jump over the sound records
        // that follow.
        let hop = 401 * frame + (zeros_end - 401 * frame).div_ceil(8) * 8;
        data[hop..hop + 4].copy_from_slice(&(3 * frame as u32).to_le_bytes());
        std::fs::write(&path, &data).unwrap();
        let mut s = DiskStore::open(&dir, 64 << 20, true).unwrap();
        let seen = drain(&mut s);
        let lost: Vec<u64> = (0..600).filter(|i| !seen.contains(i)).collect();
        let page_end = (300 * frame + 10 + 4095) / frame;
        let second_end = (hop + 3) / frame;
        let want: Vec<u64> = std::iter::once(100)
            .chain(300..=page_end as u64)
            .chain(400..=second_end as u64)
            .collect();
        assert_eq!(lost, want, "only the damaged records are lost");
        let skipped = s.take_corrupt();
        // Record 400's sound header skips its body exactly; the zeros after it are one
        // stretch up to the next sound frame.
        assert_eq!(skipped.records, 4, "four damaged stretches: {skipped:?}");
        assert!(skipped.bytes >= 4096, "{skipped:?}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A damaged payload with a sound header is skipped exactly and its samples counted.
    #[test]
    fn a_damaged_body_counts_its_samples() {
        let dir = tmp("samples");
        {
            let mut s = DiskStore::open(&dir, 64 << 20, true).unwrap();
            for i in 0..10 {
                s.push(&rec(i, 1000)).unwrap();
            }
        }
        let (path, mut data) = segment_bytes(&dir);
        let frame = data.len() / 10;
        data[4 * frame + 500] ^= 1;
        std::fs::write(&path, &data).unwrap();
        let mut s = DiskStore::open(&dir, 64 << 20, true).unwrap();
        assert_eq!(drain(&mut s), vec![0, 1, 2, 3, 5, 6, 7, 8, 9]);
        let skipped = s.take_corrupt();
        assert_eq!((skipped.records, skipped.samples), (1, 4));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Segments written before the frame magic are still replayed.
    #[test]
    fn a_queue_written_in_the_format_before_the_magic_is_replayed() {
        let dir = tmp("oldformat");
        std::fs::create_dir_all(&dir).unwrap();
        let mut data = Vec::new();
        for i in 0..5 {
            rec(i, 300).write_framed_old(&mut data);
        }
        std::fs::write(segment_path(&dir, 1), &data).unwrap();
        std::fs::write(dir.join("cursor"), "1 0\n").unwrap();
        let mut s = DiskStore::open(&dir, 64 << 20, true).unwrap();
        assert_eq!(drain(&mut s), vec![0, 1, 2, 3, 4]);
        assert!(s.take_corrupt().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// Issue: a cursor edited to point past the data deleted every segment (120,000
    /// samples) silently. A cursor that names no segment, or an offset past a segment's
    /// end or between records, is not trusted: everything is replayed.
    #[test]
    fn a_cursor_that_does_not_match_the_segments_deletes_nothing() {
        let dir = tmp("cursor");
        {
            let mut s = DiskStore::open(&dir, 1 << 16, true).unwrap();
            for i in 0..40 {
                s.push(&rec(i, 4000)).unwrap();
            }
        }
        let segs = list_segments(&dir).unwrap();
        assert!(segs.len() > 2, "{segs:?}");
        let last = *segs.last().unwrap();
        for bad in [
            format!("{} 0\n", last + 1000),
            format!("{} 99999999\n", segs[1]),
            format!("{} 7\n", segs[1]),
            "garbage\n".to_string(),
        ] {
            std::fs::write(dir.join("cursor"), &bad).unwrap();
            let s = DiskStore::open(&dir, 1 << 16, true).unwrap();
            assert_eq!(s.len(), 40, "cursor {bad:?} lost records");
        }
        // A sound cursor still skips what was acknowledged.
        std::fs::write(dir.join("cursor"), format!("{} 0\n", segs[1])).unwrap();
        let s = DiskStore::open(&dir, 1 << 16, true).unwrap();
        assert!(s.len() < 40 && !s.is_empty(), "{}", s.len());
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_held_directory_is_waited_for_within_the_bound() {
        let dir = tmp("lockwait");
        let a = DiskStore::open(&dir, 1 << 20, false).unwrap();
        let t = std::time::Instant::now();
        let err = DiskStore::open_waiting(&dir, 1 << 20, false, Duration::from_millis(300))
            .err()
            .expect("still held");
        assert!(err.to_string().contains("in use"), "{err}");
        assert!(t.elapsed() >= Duration::from_millis(300));
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(a);
        });
        DiskStore::open_waiting(&dir, 1 << 20, false, Duration::from_secs(10)).unwrap();
        releaser.join().unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

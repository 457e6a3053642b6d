//! The f32 vectors an ANN file's graph was built from, in a file beside it
//! (`set-S-Q-SUM.vectors`, the graph's name with another extension): what a search re-scores
//! its candidates and a selective filter scans, read from one mapped file instead of one
//! SQLite point lookup per candidate (~35 us each at 1M).
//!
//! It holds the same snapshot as the graph (the vectors SQLite held at the graph's log
//! position), is written and fsynced before the record points at the graph, and is covered by
//! the checksum in the graph's name: a chunk changed after that position is in the log, and a
//! reader scores it from SQLite, so a vector read here is always the one SQLite holds.
//!
//! Layout, little-endian: a 64-byte header (`RLVECS01`, dimensions u32, 0u32, count u64,
//! padding), `count x dimensions` f32 vectors in the order they were written, then the keys
//! (u64, ascending) and for each key its vector's slot (u32).

use std::io::{BufWriter, Read, Seek, SeekFrom, Write};
use std::path::Path;

const MAGIC: &[u8; 8] = b"RLVECS01";
const HEADER: usize = 64;

/// Why a vectors file cannot be written or used.
#[derive(Debug, thiserror::Error)]
pub enum VectorsError {
    #[error("{0}")]
    Io(#[from] std::io::Error),
    #[error("{0}")]
    Invalid(String),
}

/// Writes a vectors file: vectors first, as they come, then the sorted keys.
pub struct VectorsWriter {
    out: BufWriter<std::fs::File>,
    dimension: usize,
    /// (key, slot) of every vector written.
    keys: Vec<(u64, u32)>,
}

impl VectorsWriter {
    pub fn create(path: &Path, dimension: usize) -> Result<Self, VectorsError> {
        let mut out = BufWriter::with_capacity(1 << 20, std::fs::File::create(path)?);
        out.write_all(&[0u8; HEADER])?;
        Ok(VectorsWriter {
            out,
            dimension,
            keys: Vec::new(),
        })
    }

    /// Append `key`'s vector (each key once).
    pub fn push(&mut self, key: u64, vector: &[f32]) -> Result<(), VectorsError> {
        if vector.len() != self.dimension {
            return Err(VectorsError::Invalid(format!(
                "vector of {} dimensions in a file of {}",
                vector.len(),
                self.dimension
            )));
        }
        let slot = u32::try_from(self.keys.len())
            .map_err(|_| VectorsError::Invalid("more than 2^32 vectors in one set".into()))?;
        self.out.write_all(bytemuck::cast_slice(vector))?;
        self.keys.push((key, slot));
        Ok(())
    }

    /// The keys and the header, then fsync.
    pub fn finish(mut self) -> Result<(), VectorsError> {
        self.keys.sort_unstable_by_key(|k| k.0);
        if self.keys.windows(2).any(|w| w[0].0 == w[1].0) {
            return Err(VectorsError::Invalid("a key written twice".into()));
        }
        for (key, _) in &self.keys {
            self.out.write_all(&key.to_le_bytes())?;
        }
        for (_, slot) in &self.keys {
            self.out.write_all(&slot.to_le_bytes())?;
        }
        let mut header = [0u8; HEADER];
        header[..8].copy_from_slice(MAGIC);
        header[8..12].copy_from_slice(&(self.dimension as u32).to_le_bytes());
        header[16..24].copy_from_slice(&(self.keys.len() as u64).to_le_bytes());
        self.out.seek(SeekFrom::Start(0))?;
        self.out.write_all(&header)?;
        let file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        Ok(())
    }
}

/// Every (key, vector) of the file at `path`, in the order they were written, `block` at a
/// time (its keys, then its vectors row after row), by plain reads: a scan of the whole file
/// through the map would count every page as this process's resident memory.
pub fn scan(
    path: &Path,
    dimension: usize,
    block: usize,
    mut each: impl FnMut(&[u64], &[f32]),
) -> Result<(), VectorsError> {
    let count = Vectors::open(path, dimension)?.len();
    let mut file = std::fs::File::open(path)?;
    // slot -> key, from the sorted keys and their slots at the end.
    let keys_at = (HEADER + count * dimension * 4) as u64;
    file.seek(SeekFrom::Start(keys_at))?;
    let mut tail = vec![0u8; count * 12];
    file.read_exact(&mut tail)?;
    let mut by_slot = vec![0u64; count];
    for i in 0..count {
        let key = u64::from_le_bytes(tail[i * 8..i * 8 + 8].try_into().expect("8 bytes"));
        let at = count * 8 + i * 4;
        let slot = u32::from_le_bytes(tail[at..at + 4].try_into().expect("4 bytes")) as usize;
        if slot >= count {
            return Err(VectorsError::Invalid("a slot past the end".into()));
        }
        by_slot[slot] = key;
    }
    drop(tail);
    file.seek(SeekFrom::Start(HEADER as u64))?;
    let block = block.max(1);
    let mut buf = vec![0f32; block * dimension];
    let mut done = 0;
    while done < count {
        let n = block.min(count - done);
        let rows = &mut buf[..n * dimension];
        file.read_exact(bytemuck::cast_slice_mut(rows))?;
        each(&by_slot[done..done + n], rows);
        done += n;
    }
    Ok(())
}

/// A vectors file, mapped read-only.
pub struct Vectors {
    map: memmap2::Mmap,
    dimension: usize,
    count: usize,
}

impl Vectors {
    /// Map the file at `path`, checking its header and length against `dimension`.
    pub fn open(path: &Path, dimension: usize) -> Result<Self, VectorsError> {
        let file = std::fs::File::open(path)?;
        // SAFETY: the file is never written after it is renamed into place (a new snapshot is
        // a new file); a file truncated under the map by someone else faults, as any mapped
        // index does (usearch's view of the graph too).
        let map = unsafe { memmap2::Mmap::map(&file)? };
        let bad = |why: &str| VectorsError::Invalid(why.to_string());
        if map.len() < HEADER || &map[..8] != MAGIC {
            return Err(bad("not a ragline vectors file"));
        }
        let dim = u32::from_le_bytes(map[8..12].try_into().expect("4 bytes")) as usize;
        let count = u64::from_le_bytes(map[16..24].try_into().expect("8 bytes"));
        if dim != dimension {
            return Err(VectorsError::Invalid(format!(
                "its vectors have {dim} dimensions, the set's {dimension}"
            )));
        }
        let want = (count as u128) * (dim as u128 * 4 + 12) + HEADER as u128;
        if want != map.len() as u128 {
            return Err(bad("its length does not match its header"));
        }
        #[cfg(unix)]
        let _ = map.advise(memmap2::Advice::Random);
        let vectors = Vectors {
            map,
            dimension,
            count: count as usize,
        };
        if (0..vectors.count.saturating_sub(1)).any(|i| vectors.key(i) >= vectors.key(i + 1)) {
            return Err(bad("its keys are not in order"));
        }
        Ok(vectors)
    }

    pub fn len(&self) -> usize {
        self.count
    }

    pub fn dimension(&self) -> usize {
        self.dimension
    }

    fn keys_at(&self) -> usize {
        HEADER + self.count * self.dimension * 4
    }

    fn key(&self, i: usize) -> u64 {
        let at = self.keys_at() + i * 8;
        u64::from_le_bytes(self.map[at..at + 8].try_into().expect("8 bytes"))
    }

    fn slot(&self, i: usize) -> usize {
        let at = self.keys_at() + self.count * 8 + i * 4;
        u32::from_le_bytes(self.map[at..at + 4].try_into().expect("4 bytes")) as usize
    }

    fn at_slot(&self, slot: usize) -> Option<&[f32]> {
        if slot >= self.count {
            return None;
        }
        let bytes = self.dimension * 4;
        let at = HEADER + slot * bytes;
        bytemuck::try_cast_slice(&self.map[at..at + bytes]).ok()
    }

    /// Where `key` is among the sorted keys.
    fn find(&self, key: u64) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.key(mid).cmp(&key) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// `key`'s vector, if the file holds it.
    pub fn get(&self, key: u64) -> Option<&[f32]> {
        self.at_slot(self.slot(self.find(key)?))
    }

    /// The rows of `keys` the file holds, as (slot, key), in slot order (the order they lie
    /// in the file): the keys sorted, then merged with the file's sorted keys by galloping,
    /// so a few thousand keys cost a few cache misses each rather than a binary search each.
    pub fn slots_of(&self, keys: impl Iterator<Item = u64>) -> Vec<(u32, u64)> {
        let mut keys: Vec<u64> = keys.collect();
        keys.sort_unstable();
        let mut out = Vec::with_capacity(keys.len());
        let mut lo = 0;
        for key in keys {
            // Gallop from the last match: 1, 2, 4... rows ahead, then a binary search inside.
            let mut step = 1;
            let mut hi = lo;
            while hi < self.count && self.key(hi) < key {
                lo = hi + 1;
                hi = lo + step;
                step *= 2;
            }
            let hi = hi.min(self.count);
            let (mut a, mut b) = (lo, hi);
            while a < b {
                let mid = a + (b - a) / 2;
                if self.key(mid) < key {
                    a = mid + 1;
                } else {
                    b = mid;
                }
            }
            lo = a;
            if a < self.count && self.key(a) == key {
                out.push((self.slot(a) as u32, key));
            }
        }
        out.sort_unstable();
        out
    }

    /// The vector in row `slot`, if there is one.
    pub fn at(&self, slot: u32) -> Option<&[f32]> {
        self.at_slot(slot as usize)
    }

    /// Ask the CPU to read row `slot` into its caches ahead of its use.
    pub fn prefetch_slot(&self, slot: u32) {
        if let Some(v) = self.at_slot(slot as usize) {
            prefetch(v);
        }
    }

    /// Ask the kernel to read `key`'s vector in ahead of its use.
    pub fn prefetch(&self, key: u64) {
        if let Some(v) = self.get(key) {
            prefetch(v);
        }
    }

    /// Every (key, vector), keys ascending.
    #[cfg(test)]
    pub fn iter(&self) -> impl Iterator<Item = (u64, &[f32])> + '_ {
        (0..self.count).filter_map(|i| Some((self.key(i), self.at_slot(self.slot(i))?)))
    }
}

/// A hint to the CPU to bring every cache line of `v` in.
fn prefetch(v: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is a hint; every address is inside `v`.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        for line in (0..v.len()).step_by(16) {
            _mm_prefetch(v.as_ptr().add(line) as *const i8, _MM_HINT_T0);
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = v;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vectors_are_found_by_key_whatever_order_they_were_written_in() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.vectors");
        let mut w = VectorsWriter::create(&path, 3).unwrap();
        let keys = [42u64, 7, 1_000_000, 3];
        for k in keys {
            w.push(k, &[k as f32, 1.0, -(k as f32)]).unwrap();
        }
        assert!(w.push(5, &[1.0]).is_err());
        w.finish().unwrap();
        let v = Vectors::open(&path, 3).unwrap();
        assert_eq!(v.len(), 4);
        for k in keys {
            assert_eq!(v.get(k).unwrap(), &[k as f32, 1.0, -(k as f32)]);
        }
        assert!(v.get(8).is_none());
        let sorted: Vec<u64> = v.iter().map(|(k, _)| k).collect();
        assert_eq!(sorted, vec![3, 7, 42, 1_000_000]);
        // A scan reads them back in the order they were written, in blocks.
        let mut seen = Vec::new();
        scan(&path, 3, 3, |keys, rows| {
            for (k, row) in keys.iter().zip(rows.chunks(3)) {
                assert_eq!(row, &[*k as f32, 1.0, -(*k as f32)]);
                seen.push(*k);
            }
        })
        .unwrap();
        assert_eq!(seen, keys);
        assert!(Vectors::open(&path, 4).is_err());
    }

    #[test]
    fn slots_of_finds_each_held_key_once_in_file_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.vectors");
        let mut w = VectorsWriter::create(&path, 2).unwrap();
        // Keys 0, 3, 6... written in a scrambled order.
        let written: Vec<u64> = (0..3000u64).map(|i| (i * 7919 % 3000) * 3).collect();
        for &k in &written {
            w.push(k, &[k as f32, 0.5]).unwrap();
        }
        w.finish().unwrap();
        let v = Vectors::open(&path, 2).unwrap();
        for every in [1u64, 2, 5, 97, 2999] {
            // Every `every`th number: held keys (multiples of 3) and missing ones.
            let asked: Vec<u64> = (0..9100).step_by(every as usize).collect();
            let got = v.slots_of(asked.iter().rev().copied());
            let mut want: Vec<(u32, u64)> = asked
                .iter()
                .filter_map(|&k| Some((v.slot(v.find(k)?) as u32, k)))
                .collect();
            want.sort_unstable();
            assert_eq!(got, want, "every {every}");
            for (slot, key) in got {
                assert_eq!(v.at(slot).unwrap(), &[key as f32, 0.5]);
            }
        }
        assert!(v.slots_of(std::iter::empty()).is_empty());
    }

    #[test]
    fn damaged_files_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.vectors");
        let mut w = VectorsWriter::create(&path, 2).unwrap();
        w.push(1, &[1.0, 2.0]).unwrap();
        w.push(1, &[1.0, 2.0]).unwrap();
        assert!(w.finish().is_err(), "a key twice");
        let mut w = VectorsWriter::create(&path, 2).unwrap();
        w.push(1, &[1.0, 2.0]).unwrap();
        w.push(2, &[3.0, 4.0]).unwrap();
        w.finish().unwrap();
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        assert!(Vectors::open(&path, 2).is_err(), "short");
        let mut swapped = bytes.clone();
        let keys = HEADER + 2 * 2 * 4;
        swapped[keys..keys + 8].copy_from_slice(&5u64.to_le_bytes());
        std::fs::write(&path, &swapped).unwrap();
        assert!(Vectors::open(&path, 2).is_err(), "keys out of order");
        let mut slot = bytes;
        let slots = keys + 16;
        slot[slots..slots + 4].copy_from_slice(&9u32.to_le_bytes());
        std::fs::write(&path, &slot).unwrap();
        let v = Vectors::open(&path, 2).unwrap();
        assert!(v.get(1).is_none(), "a slot past the end is not read");
        std::fs::write(&path, b"garbage").unwrap();
        assert!(Vectors::open(&path, 2).is_err());
    }
}

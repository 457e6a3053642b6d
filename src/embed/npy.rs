//! Writing a float32 matrix as a NumPy `.npy` file, row by row, without knowing the number of
//! rows up front: the header is written with room to spare and rewritten at the end.

use std::fs::File;
use std::io::{BufWriter, Seek, SeekFrom, Write};
use std::path::Path;

/// Header bytes, magic included: a multiple of 64 as the format asks, with room for any shape.
const HEADER_LEN: usize = 128;

pub struct NpyWriter {
    out: BufWriter<File>,
    columns: usize,
    rows: usize,
}

impl NpyWriter {
    pub fn create(path: &Path, columns: usize) -> std::io::Result<Self> {
        let mut out = BufWriter::new(File::create(path)?);
        out.write_all(&header(0, columns))?;
        Ok(NpyWriter {
            out,
            columns,
            rows: 0,
        })
    }

    pub fn write_row(&mut self, row: &[f32]) -> std::io::Result<()> {
        if row.len() != self.columns {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "row of {} values in a matrix of {} columns",
                    row.len(),
                    self.columns
                ),
            ));
        }
        for v in row {
            self.out.write_all(&v.to_le_bytes())?;
        }
        self.rows += 1;
        Ok(())
    }

    /// Write the final shape into the header and flush.
    pub fn finish(mut self) -> std::io::Result<usize> {
        self.out.flush()?;
        let mut file = self.out.into_inner().map_err(|e| e.into_error())?;
        file.seek(SeekFrom::Start(0))?;
        file.write_all(&header(self.rows, self.columns))?;
        file.sync_data()?;
        Ok(self.rows)
    }
}

fn header(rows: usize, columns: usize) -> Vec<u8> {
    let dict =
        format!("{{'descr': '<f4', 'fortran_order': False, 'shape': ({rows}, {columns}), }}");
    let mut h = b"\x93NUMPY\x01\x00".to_vec();
    let body_len = HEADER_LEN - 10;
    h.extend_from_slice(&(body_len as u16).to_le_bytes());
    h.extend_from_slice(dict.as_bytes());
    h.resize(HEADER_LEN - 1, b' ');
    h.push(b'\n');
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_a_file_candle_reads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("v.npy");
        let mut w = NpyWriter::create(&path, 3).unwrap();
        w.write_row(&[1.0, 2.0, 3.0]).unwrap();
        w.write_row(&[4.0, 5.0, 6.5]).unwrap();
        assert!(w.write_row(&[1.0]).is_err());
        assert_eq!(w.finish().unwrap(), 2);
        let t = candle_core::Tensor::read_npy(&path).unwrap();
        assert_eq!(t.dims(), &[2, 3]);
        assert_eq!(
            t.to_vec2::<f32>().unwrap(),
            vec![vec![1.0, 2.0, 3.0], vec![4.0, 5.0, 6.5]]
        );
    }
}

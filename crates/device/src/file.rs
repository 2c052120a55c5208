//! [`FileDevice`]: a regular file or a block device, with `O_DIRECT` where it works.
//!
//! Why two descriptors: `O_DIRECT` needs memory, offset and length aligned to what the file
//! system reports (`statx` `DIOALIGN`); callers hand us page-aligned buffers on the hot path but
//! not always (superblocks, odd client sizes). Rather than fail or bounce-copy, an unaligned
//! request takes the buffered descriptor. Linux keeps the two coherent: a direct read first writes
//! back dirty cached pages in its range and a direct write invalidates them.

use crate::{check_range, Device, SECTOR_BYTES};
use rustix::fs::{FallocateFlags, FlockOperation, StatxFlags};
use std::fs::{File, OpenOptions};
use std::io::{self, IoSlice, Seek, SeekFrom};
use std::os::fd::BorrowedFd;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::Path;

/// Most pieces one `pwritev` takes (Linux's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// How to open a member.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpenMode {
    /// Read and write, `O_DIRECT` when possible.
    ReadWrite,
    /// Read only (examine).
    ReadOnly,
    /// Read and write through the page cache only (`--no-direct`, tests of fallback).
    Buffered,
}

/// A member backed by a file or block device.
pub struct FileDevice {
    name: String,
    buffered: File,
    direct: Option<File>,
    /// Alignment (bytes) that direct I/O needs for memory and for offset/length.
    dio_mem_align: usize,
    dio_offset_align: u64,
    len_bytes: u64,
}

impl FileDevice {
    /// Open `path`. Its size is rounded down to a whole sector.
    pub fn open(path: &Path, mode: OpenMode) -> io::Result<FileDevice> {
        let name = path.display().to_string();
        let writable = mode != OpenMode::ReadOnly;
        let mut buffered = OpenOptions::new().read(true).write(writable).open(path)?;
        let meta = buffered.metadata()?;
        let is_block = meta.file_type().is_block_device();
        if !is_block && !meta.is_file() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}: not a regular file or block device"),
            ));
        }
        let raw_len = if is_block {
            buffered.seek(SeekFrom::End(0))?
        } else {
            meta.len()
        };
        let len_bytes = raw_len / SECTOR_BYTES * SECTOR_BYTES;
        let (direct, dio_mem_align, dio_offset_align) = match mode {
            OpenMode::ReadWrite => open_direct(path, &buffered),
            OpenMode::ReadOnly | OpenMode::Buffered => (None, 0, 0),
        };
        Ok(FileDevice {
            name,
            buffered,
            direct,
            dio_mem_align,
            dio_offset_align,
            len_bytes,
        })
    }

    /// Whether requests that meet the alignment go around the page cache.
    pub fn uses_direct_io(&self) -> bool {
        self.direct.is_some()
    }

    /// Take an exclusive advisory lock so that two daemons cannot drive the same member.
    pub fn lock_exclusive(&self) -> io::Result<()> {
        self.lock(FlockOperation::NonBlockingLockExclusive)
    }

    /// Take a shared advisory lock: the nodes of a cluster drive the member together, and a
    /// daemon that wants it for itself alone is refused while they do.
    pub fn lock_shared(&self) -> io::Result<()> {
        self.lock(FlockOperation::NonBlockingLockShared)
    }

    fn lock(&self, how: FlockOperation) -> io::Result<()> {
        rustix::fs::flock(&self.buffered, how).map_err(|e| {
            if e == rustix::io::Errno::WOULDBLOCK {
                io::Error::new(
                    io::ErrorKind::WouldBlock,
                    format!("{}: in use by another process", self.name),
                )
            } else {
                e.into()
            }
        })
    }

    /// The descriptor the direct path uses (the buffered one without `O_DIRECT`).
    fn direct(&self) -> &File {
        self.direct.as_ref().unwrap_or(&self.buffered)
    }

    fn pick(&self, ptr: *const u8, offset_bytes: u64, len: usize) -> &File {
        match &self.direct {
            Some(direct)
                if (ptr as usize).is_multiple_of(self.dio_mem_align)
                    && offset_bytes.is_multiple_of(self.dio_offset_align)
                    && (len as u64).is_multiple_of(self.dio_offset_align) =>
            {
                direct
            }
            _ => &self.buffered,
        }
    }
}

/// Try `O_DIRECT`; `None` when the file system refuses it (tmpfs) or reports no alignment.
fn open_direct(path: &Path, buffered: &File) -> (Option<File>, usize, u64) {
    let Ok(stx) = rustix::fs::statx(
        buffered,
        "",
        rustix::fs::AtFlags::EMPTY_PATH,
        StatxFlags::DIOALIGN,
    ) else {
        return (None, 0, 0);
    };
    let mem = stx.stx_dio_mem_align as usize;
    let off = u64::from(stx.stx_dio_offset_align);
    if mem == 0 || off == 0 || off > 4096 || mem > 4096 {
        return (None, 0, 0);
    }
    let flags = rustix::fs::OFlags::DIRECT.bits() as i32;
    match OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(flags)
        .open(path)
    {
        Ok(f) => (Some(f), mem, off),
        Err(_) => (None, 0, 0),
    }
}

impl Device for FileDevice {
    fn name(&self) -> &str {
        &self.name
    }

    fn len_bytes(&self) -> u64 {
        self.len_bytes
    }

    fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
        check_range(self, offset_bytes, buf.len() as u64);
        self.pick(buf.as_ptr(), offset_bytes, buf.len())
            .read_exact_at(buf, offset_bytes)
    }

    fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
        check_range(self, offset_bytes, buf.len() as u64);
        let file = self.pick(buf.as_ptr(), offset_bytes, buf.len());
        if !fua {
            return file.write_all_at(buf, offset_bytes);
        }
        let mut done = 0usize;
        while done < buf.len() {
            let n = rustix::io::pwritev2(
                file,
                &[IoSlice::new(&buf[done..])],
                offset_bytes + done as u64,
                rustix::io::ReadWriteFlags::DSYNC,
            )?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("{}: short write", self.name),
                ));
            }
            done += n;
        }
        Ok(())
    }

    fn write_vectored_at(&self, bufs: &[&[u8]], offset_bytes: u64, fua: bool) -> io::Result<()> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        check_range(self, offset_bytes, total as u64);
        // The direct path only if every piece meets the alignment on its own.
        let direct = bufs
            .iter()
            .all(|b| std::ptr::eq(self.pick(b.as_ptr(), offset_bytes, b.len()), self.direct()));
        let file = if direct && !bufs.is_empty() {
            self.pick(bufs[0].as_ptr(), offset_bytes, total)
        } else {
            &self.buffered
        };
        let flags = if fua {
            rustix::io::ReadWriteFlags::DSYNC
        } else {
            rustix::io::ReadWriteFlags::empty()
        };
        // (piece, byte within it) of the first byte not yet written.
        let (mut piece, mut skip, mut done) = (0usize, 0usize, 0usize);
        while done < total {
            let iov: Vec<IoSlice<'_>> = std::iter::once(&bufs[piece][skip..])
                .chain(bufs[piece + 1..].iter().copied())
                .filter(|b| !b.is_empty())
                .take(IOV_MAX)
                .map(IoSlice::new)
                .collect();
            let mut n = rustix::io::pwritev2(file, &iov, offset_bytes + done as u64, flags)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::WriteZero,
                    format!("{}: short write", self.name),
                ));
            }
            done += n;
            while piece < bufs.len() && n >= bufs[piece].len() - skip {
                n -= bufs[piece].len() - skip;
                piece += 1;
                skip = 0;
            }
            skip += n;
        }
        Ok(())
    }

    /// From the buffered descriptor: the page cache is what `splice` moves (a range last
    /// written through `O_DIRECT` was dropped from it then, so it is read afresh). Never waits
    /// for room in the pipe: each page a range touches takes a slot of its own, so a range not
    /// page-aligned needs one more than its bytes say, and a full pipe no one drains would wait
    /// for ever (`WouldBlock` instead).
    fn splice_to_pipe(
        &self,
        pipe: BorrowedFd<'_>,
        offset_bytes: u64,
        len: usize,
    ) -> io::Result<()> {
        check_range(self, offset_bytes, len as u64);
        let mut at = offset_bytes;
        let end = offset_bytes + len as u64;
        while at < end {
            let left = (end - at) as usize;
            let n = rustix::pipe::splice(
                &self.buffered,
                Some(&mut at),
                pipe,
                None,
                left,
                rustix::pipe::SpliceFlags::NONBLOCK,
            )?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("{}: end of file at byte {at}", self.name),
                ));
            }
        }
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        rustix::fs::fdatasync(&self.buffered)?;
        Ok(())
    }

    fn discard_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
        check_range(self, offset_bytes, len_bytes);
        // On a file: holes. On a block device the kernel zeroes the range by the device's own
        // means (discard that zeroes, write-zeroes) and fails rather than write zeroes itself.
        let flags = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
        if rustix::fs::fallocate(&self.buffered, flags, offset_bytes, len_bytes).is_ok() {
            return Ok(());
        }
        write_zeroes(self, offset_bytes, len_bytes)
    }
}

/// Zero a range by writing, in bounded pieces.
pub(crate) fn write_zeroes(dev: &dyn Device, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
    const PIECE: u64 = 1 << 20;
    let zeroes = crate::AlignedBuf::zeroed(PIECE.min(len_bytes) as usize);
    let mut done = 0;
    while done < len_bytes {
        let n = PIECE.min(len_bytes - done);
        dev.write_at(&zeroes[..n as usize], offset_bytes + done, false)?;
        done += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::AlignedBuf;

    #[test]
    fn round_trip_aligned_and_unaligned_buffers() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m0");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 20)
            .unwrap();
        let dev = FileDevice::open(&path, OpenMode::ReadWrite).unwrap();
        assert_eq!(dev.len_bytes(), 1 << 20);
        let mut data = AlignedBuf::zeroed(8192);
        data.iter_mut().enumerate().for_each(|(i, b)| *b = i as u8);
        dev.write_at(&data, 4096, false).unwrap();
        // An unaligned view forces the buffered path; it must see the direct write.
        let mut odd = vec![0u8; 8192 + 1];
        dev.read_at(&mut odd[1..], 4096).unwrap();
        assert_eq!(&odd[1..], &data[..]);
        dev.write_at(&odd[1..513], 0, true).unwrap();
        let mut back = AlignedBuf::zeroed(512);
        dev.read_at(&mut back, 0).unwrap();
        assert_eq!(&back[..], &data[..512]);
        dev.discard_zeroes(4096, 4096).unwrap();
        let mut z = AlignedBuf::zeroed(4096);
        dev.read_at(&mut z, 4096).unwrap();
        assert!(z.iter().all(|&b| b == 0));
        dev.flush().unwrap();
    }

    /// A vectored write lands as the concatenation of its pieces: aligned pieces, an
    /// unaligned one (the buffered path), empty ones, and more pieces than one `pwritev`
    /// takes; with and without FUA.
    #[test]
    fn vectored_writes_land_as_their_concatenation() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m0");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(16 << 20)
            .unwrap();
        let dev = FileDevice::open(&path, OpenMode::ReadWrite).unwrap();
        let mut big = AlignedBuf::zeroed(3000 * 512);
        big.iter_mut()
            .enumerate()
            .for_each(|(i, b)| *b = (i % 251) as u8);
        let odd: Vec<u8> = (0..1025).map(|i| (i % 13) as u8 + 1).collect();
        let cases: Vec<Vec<&[u8]>> = vec![
            vec![&big[..4096], &big[4096..12288]],
            vec![&big[..512], &[], &odd[1..], &big[..1536]],
            big.chunks(512).collect(), // 3000 pieces: several pwritev calls
        ];
        for (i, pieces) in cases.iter().enumerate() {
            for fua in [false, true] {
                let want: Vec<u8> = pieces.concat();
                let at = (i as u64 + 1) << 21;
                dev.write_vectored_at(pieces, at, fua).unwrap();
                let mut back = vec![0u8; want.len()];
                dev.read_at(&mut back, at).unwrap();
                assert!(back == want, "case {i} fua {fua}");
                // The default (gathering) implementation agrees.
                dev.write_at(&AlignedBuf::zeroed(want.len()), at, false)
                    .unwrap();
                let gathered: &dyn Device = &Gathering(&dev);
                gathered.write_vectored_at(pieces, at, fua).unwrap();
                dev.read_at(&mut back, at).unwrap();
                assert!(back == want, "case {i} fua {fua}, gathered");
            }
        }
    }

    /// A device with only the required methods: the trait's default vectored write.
    struct Gathering<'a>(&'a FileDevice);

    impl Device for Gathering<'_> {
        fn name(&self) -> &str {
            self.0.name()
        }
        fn len_bytes(&self) -> u64 {
            self.0.len_bytes()
        }
        fn read_at(&self, buf: &mut [u8], offset_bytes: u64) -> io::Result<()> {
            self.0.read_at(buf, offset_bytes)
        }
        fn write_at(&self, buf: &[u8], offset_bytes: u64, fua: bool) -> io::Result<()> {
            self.0.write_at(buf, offset_bytes, fua)
        }
        fn flush(&self) -> io::Result<()> {
            self.0.flush()
        }
        fn discard_zeroes(&self, offset_bytes: u64, len_bytes: u64) -> io::Result<()> {
            self.0.discard_zeroes(offset_bytes, len_bytes)
        }
    }

    #[test]
    fn exclusive_lock_refuses_second_holder() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m0");
        std::fs::File::create(&path)
            .unwrap()
            .set_len(1 << 16)
            .unwrap();
        let a = FileDevice::open(&path, OpenMode::ReadWrite).unwrap();
        let b = FileDevice::open(&path, OpenMode::ReadWrite).unwrap();
        a.lock_exclusive().unwrap();
        let err = b.lock_exclusive().unwrap_err();
        assert!(err.to_string().contains("in use"), "{err}");
    }
}

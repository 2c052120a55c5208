//! Shared test harness: in-memory backends, a server on a Unix socket in a
//! tempdir (tokio runtime on a background thread), and a raw protocol client.
#![allow(dead_code)]

use std::io::{self, Read, Write};
use std::os::fd::BorrowedFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nbd::codec::{self, Request};
use nbd::proto::*;
use nbd::{Backend, BlockSizes, Export, GatheredWrite, Limits, Server, WriteHint};

/// A `Vec<u8>` behind a mutex.
pub struct MemBackend {
    pub data: Mutex<Vec<u8>>,
    pub read_only: bool,
    pub block_sizes: BlockSizes,
    /// Reads touching this byte range fail with EIO.
    pub fail_reads: Option<(u64, u64)>,
    /// Every backend call sleeps this long first (for drain tests).
    pub delay: Duration,
    pub writes: AtomicUsize,
    pub flushes: AtomicUsize,
    /// Write hints given (`write_coming`), handed back with their payload, and alive now.
    pub hints_given: AtomicUsize,
    pub hints_used: AtomicUsize,
    pub hints_live: Arc<AtomicUsize>,
    /// Ask for gathered runs of sequential WRITEs (`Backend::gathers_writes`).
    pub gathers: bool,
    /// Every run `write_gathered` was given: (WRITEs, payload bytes).
    pub runs: Mutex<Vec<(usize, usize)>>,
    /// Claim that reads fill their whole buffer (`Backend::read_fills_buffer`).
    pub fills_reads: bool,
    /// Reads whose buffer held some non-zero byte when the backend got it.
    pub reads_given_dirty: AtomicUsize,
    /// `write_coming` sleeps this long before it counts and gives its hint.
    pub hint_delay: Duration,
    /// `hints_given` as each `write` began.
    pub hints_at_write: Mutex<Vec<usize>>,
    /// Answer reads through the server's pipe (`Backend::read_to_pipe`, by writing the bytes
    /// into it); a read touching `fail_reads` puts its first half in and gives up.
    pub splices: bool,
    /// Reads put whole into the pipe, and reads given up on halfway.
    pub spliced: AtomicUsize,
    pub splices_given_up: AtomicUsize,
    /// A read given up on halfway claims success instead (a backend bug the server survives).
    pub splice_lies: bool,
}

/// A hint that counts itself out of `MemBackend::hints_live` when dropped.
struct Hint(Arc<AtomicUsize>);

impl Drop for Hint {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl MemBackend {
    pub fn new(size: usize) -> MemBackend {
        MemBackend {
            data: Mutex::new(vec![0; size]),
            read_only: false,
            block_sizes: BlockSizes {
                min: 512,
                preferred: 4096,
                max: 1 << 20,
            },
            fail_reads: None,
            delay: Duration::ZERO,
            writes: AtomicUsize::new(0),
            flushes: AtomicUsize::new(0),
            hints_given: AtomicUsize::new(0),
            hints_used: AtomicUsize::new(0),
            hints_live: Arc::new(AtomicUsize::new(0)),
            gathers: false,
            runs: Mutex::new(Vec::new()),
            fills_reads: false,
            reads_given_dirty: AtomicUsize::new(0),
            hint_delay: Duration::ZERO,
            hints_at_write: Mutex::new(Vec::new()),
            splices: false,
            spliced: AtomicUsize::new(0),
            splices_given_up: AtomicUsize::new(0),
            splice_lies: false,
        }
    }

    pub fn snapshot(&self) -> Vec<u8> {
        self.data.lock().unwrap().clone()
    }

    fn range(&self, offset: u64, len: u64) -> io::Result<std::ops::Range<usize>> {
        let size = self.data.lock().unwrap().len() as u64;
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(offset as usize..end as usize),
            _ => Err(io::Error::from_raw_os_error(libc::EINVAL)),
        }
    }

    fn pause(&self) {
        if !self.delay.is_zero() {
            std::thread::sleep(self.delay);
        }
    }
}

impl Backend for MemBackend {
    fn size_bytes(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }
    fn read_only(&self) -> bool {
        self.read_only
    }
    fn block_sizes(&self) -> BlockSizes {
        self.block_sizes
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> io::Result<()> {
        self.pause();
        let r = self.range(offset, buf.len() as u64)?;
        if let Some((s, e)) = self.fail_reads {
            if (r.start as u64) < e && (r.end as u64) > s {
                return Err(io::Error::from_raw_os_error(libc::EIO));
            }
        }
        if buf.iter().any(|&b| b != 0) {
            self.reads_given_dirty.fetch_add(1, Ordering::SeqCst);
        }
        buf.copy_from_slice(&self.data.lock().unwrap()[r]);
        Ok(())
    }
    fn splices_reads(&self) -> bool {
        self.splices
    }
    fn read_to_pipe(&self, offset: u64, len: usize, pipe: BorrowedFd<'_>) -> bool {
        let Ok(r) = self.range(offset, len as u64) else {
            return false;
        };
        let bytes = self.data.lock().unwrap()[r.clone()].to_vec();
        let fails = self
            .fail_reads
            .is_some_and(|(s, e)| (r.start as u64) < e && (r.end as u64) > s);
        let put = if fails { &bytes[..len / 2] } else { &bytes[..] };
        let mut done = 0;
        while done < put.len() {
            done += rustix::io::write(pipe, &put[done..]).expect("the pipe holds a whole read");
        }
        let counter = if fails {
            &self.splices_given_up
        } else {
            &self.spliced
        };
        counter.fetch_add(1, Ordering::SeqCst);
        !fails || self.splice_lies
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> io::Result<()> {
        let hints = self.hints_given.load(Ordering::SeqCst);
        self.hints_at_write.lock().unwrap().push(hints);
        self.pause();
        let r = self.range(offset, data.len() as u64)?;
        self.data.lock().unwrap()[r].copy_from_slice(data);
        self.writes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn write_coming(&self, _offset: u64, _len: u64) -> Option<WriteHint> {
        if !self.hint_delay.is_zero() {
            std::thread::sleep(self.hint_delay);
        }
        self.hints_given.fetch_add(1, Ordering::SeqCst);
        self.hints_live.fetch_add(1, Ordering::SeqCst);
        Some(WriteHint(Box::new(Hint(self.hints_live.clone()))))
    }
    fn write_hinted(&self, hint: WriteHint, offset: u64, data: &[u8], fua: bool) -> io::Result<()> {
        assert!(hint.0.is::<Hint>(), "a hint this backend did not give");
        self.hints_used.fetch_add(1, Ordering::SeqCst);
        let res = self.write(offset, data, fua);
        drop(hint);
        res
    }
    fn gathers_writes(&self) -> bool {
        self.gathers
    }
    fn read_fills_buffer(&self) -> bool {
        self.fills_reads
    }
    fn write_gathered(&self, writes: Vec<GatheredWrite<'_>>) -> Vec<io::Result<()>> {
        assert!(
            self.gathers,
            "a run given to a backend that did not ask for runs"
        );
        for pair in writes.windows(2) {
            assert_eq!(
                pair[0].offset + pair[0].data.len() as u64,
                pair[1].offset,
                "a run's writes are sequential"
            );
        }
        let bytes = writes.iter().map(|w| w.data.len()).sum();
        self.runs.lock().unwrap().push((writes.len(), bytes));
        writes
            .into_iter()
            .map(|w| match w.hint {
                Some(h) => self.write_hinted(h, w.offset, w.data, w.fua),
                None => self.write(w.offset, w.data, w.fua),
            })
            .collect()
    }
    fn flush(&self) -> io::Result<()> {
        self.pause();
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn trim(&self, offset: u64, len: u64, _fua: bool) -> io::Result<()> {
        self.write_zeroes(offset, len, false, true)
    }
    fn write_zeroes(&self, offset: u64, len: u64, _fua: bool, _may_trim: bool) -> io::Result<()> {
        self.pause();
        let r = self.range(offset, len)?;
        self.data.lock().unwrap()[r].fill(0);
        Ok(())
    }
    /// Zero sectors are holes, runs merged.
    fn block_status(&self, offset: u64, len: u32) -> io::Result<Vec<(u32, u32)>> {
        let r = self.range(offset, u64::from(len))?;
        let data = self.data.lock().unwrap();
        let mut out: Vec<(u32, u32)> = Vec::new();
        for piece in data[r].chunks(512) {
            let flags = if piece.iter().all(|&b| b == 0) {
                nbd::proto::STATE_HOLE | nbd::proto::STATE_ZERO
            } else {
                0
            };
            match out.last_mut() {
                Some((n, f)) if *f == flags => *n += piece.len() as u32,
                _ => out.push((piece.len() as u32, flags)),
            }
        }
        Ok(out)
    }
}

pub fn export(name: &str, backend: Arc<MemBackend>) -> Export {
    Export {
        name: name.into(),
        description: format!("test export {name}"),
        backend,
    }
}

/// A server running on its own runtime thread.
pub struct TestServer {
    pub dir: tempfile::TempDir,
    pub sock: PathBuf,
    pub server: Arc<Server>,
    thread: Option<std::thread::JoinHandle<io::Result<()>>>,
}

impl TestServer {
    pub fn start(exports: Vec<Export>, limits: Limits) -> TestServer {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nbd.sock");
        let server = Server::new(exports, limits);
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let (s, p) = (server.clone(), sock.clone());
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()?;
            rt.block_on(async move {
                let l = tokio::net::UnixListener::bind(&p)?;
                ready_tx.send(()).unwrap();
                s.serve_unix(l).await
            })
        });
        ready_rx.recv().unwrap();
        TestServer {
            dir,
            sock,
            server,
            thread: Some(thread),
        }
    }

    pub fn one(name: &str, backend: Arc<MemBackend>) -> TestServer {
        TestServer::start(vec![export(name, backend)], Limits::default())
    }

    pub fn uri(&self, name: &str) -> String {
        format!("nbd+unix:///{name}?socket={}", self.sock.display())
    }

    /// Shuts down and waits for `serve_unix` to return.
    pub fn stop(mut self) -> io::Result<()> {
        self.server.shutdown();
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.server.shutdown();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The external-tool check (`require_tools`, the `IRONRAID_ALLOW_MISSING_TOOLS` switch) lives in
/// the `testkit` crate, shared by every test.
#[allow(unused_imports)] // each test binary uses some of these
pub use testkit::{require_tools, ALLOW_MISSING_TOOLS};

/// Runs a command, panicking with its output if it fails; returns stdout.
pub fn run(cmd: &mut std::process::Command) -> String {
    let out = cmd.output().expect("spawn");
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// A hand-driven protocol client over a blocking Unix socket.
pub struct RawClient {
    pub s: UnixStream,
    pub structured: bool,
    pub flags: u16,
    pub size: u64,
}

impl RawClient {
    /// Connects and reads the greeting, sends client flags.
    pub fn greet(sock: &Path) -> RawClient {
        let mut s = UnixStream::connect(sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let mut g = [0u8; 18];
        s.read_exact(&mut g).unwrap();
        assert_eq!(g, codec::server_greeting());
        s.write_all(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes())
            .unwrap();
        RawClient {
            s,
            structured: false,
            flags: 0,
            size: 0,
        }
    }

    /// Full handshake: optional structured replies, then GO(name) asking for
    /// block sizes.
    pub fn connect(sock: &Path, name: &str, structured: bool) -> RawClient {
        RawClient::greet(sock).go(name, structured)
    }

    /// The rest of [`RawClient::connect`] on a greeted connection.
    pub fn go(self, name: &str, structured: bool) -> RawClient {
        let mut c = self;
        if structured {
            c.send_option(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(c.option_reply().0, REP_ACK);
            c.structured = true;
        }
        c.send_option(
            OPT_GO,
            &codec::encode_info_request(name, &[INFO_BLOCK_SIZE]),
        );
        loop {
            let (h, data) = c.option_reply();
            match h {
                REP_INFO if data[..2] == INFO_EXPORT.to_be_bytes() => {
                    c.size = u64::from_be_bytes(data[2..10].try_into().unwrap());
                    c.flags = u16::from_be_bytes(data[10..12].try_into().unwrap());
                }
                REP_INFO => {}
                REP_ACK => break,
                other => panic!("unexpected GO reply {other:#x}"),
            }
        }
        c
    }

    pub fn send_option(&mut self, option: u32, data: &[u8]) {
        self.s
            .write_all(&codec::encode_option(option, data))
            .unwrap();
    }

    /// Reads one option reply: (reply type, data).
    pub fn option_reply(&mut self) -> (u32, Vec<u8>) {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h).unwrap();
        let h = codec::parse_option_reply_header(&h).unwrap();
        let mut d = vec![0u8; h.length as usize];
        self.s.read_exact(&mut d).unwrap();
        (h.reply_type, d)
    }

    pub fn request(&mut self, command: u16, flags: u16, handle: u64, offset: u64, length: u32) {
        let r = Request {
            flags,
            command,
            handle,
            offset,
            length,
        };
        self.s.write_all(&codec::encode_request(&r)).unwrap();
    }

    /// Reads a simple reply header: (error, handle).
    pub fn simple_reply(&mut self) -> (u32, u64) {
        let mut h = [0u8; 16];
        self.s.read_exact(&mut h).unwrap();
        let r = codec::parse_simple_reply(&h).unwrap();
        (r.error, r.handle)
    }

    /// Reads one structured chunk: (header, payload).
    pub fn chunk(&mut self) -> (codec::ChunkHeader, Vec<u8>) {
        let mut h = [0u8; 20];
        self.s.read_exact(&mut h).unwrap();
        let h = codec::parse_chunk_header(&h).unwrap();
        let mut d = vec![0u8; h.length as usize];
        self.s.read_exact(&mut d).unwrap();
        (h, d)
    }

    /// True if the server closed the connection (EOF within the timeout).
    pub fn is_closed(&mut self) -> bool {
        let mut b = [0u8; 1];
        // A server that closes with unread data in its socket sends RST: the first read may
        // report the reset and later ones end-of-file; both mean closed.
        match self.s.read(&mut b) {
            Ok(0) => true,
            Err(e) => matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe
            ),
            Ok(_) => false,
        }
    }
}

/// Waits (up to 10 s) until `f` holds.
pub fn wait_until(mut f: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while !f() {
        assert!(
            t.elapsed() < Duration::from_secs(10),
            "condition never became true"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

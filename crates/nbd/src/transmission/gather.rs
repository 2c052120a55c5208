//! Gathering a sequential stream's WRITEs that arrived together into one backend call: the
//! server's half of md's plug (a submitter queues its bios, then releases them at once, so the
//! RAID layer sees the whole run and merges what shares a stripe).
//!
//! When the backend asks for it ([`Backend::gathers_writes`]) and the thread holding the read
//! side has just read a WRITE, it also takes every request right behind it that
//! * is a WRITE beginning where the run so far ends (a sequential stream),
//! * has arrived whole: header and payload are in the read buffer already, so gathering never
//!   waits on the socket,
//! * fits the run's byte limit ([`GATHER_MAX_BYTES`]) and the connection's in-flight limit,
//! * gets its payload grant without waiting ([`PayloadGrant::try_acquire`]: the thread holds
//!   the run's earlier grants, so waiting could close a cycle).
//!
//! The run goes to [`Backend::write_gathered`] in one call and its replies go out in one
//! socket write. Anything else (another command, a gap, a partial payload) ends the run and is
//! read as usual next. Invariants kept from `transmission`: every request of the run is
//! counted in flight from its header on, its grant is held until its reply is written, and
//! its reply is written only after the backend returned.
//! A run always runs on the thread that read it, which keeps the read side meanwhile (see
//! `may_inline`); `last_exec_ns` takes the run's whole time.

use std::io::BufRead;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::{status_reply, Command, Conn, Job, Next, ReadSide};
use crate::backend::GatheredWrite;
use crate::budget::PayloadGrant;
use crate::codec;
use crate::proto::{CMD_WRITE, REQUEST_LEN};

/// Payload bytes one gathered run may hold: what one reading thread may run inline.
const GATHER_MAX_BYTES: u32 = super::INLINE_MAX_LEN;

impl Conn {
    /// `first`, followed by the WRITEs right behind it that continue it (see the module doc).
    /// Notes in `rd` whether they continue a stream (`in_stream`: the first begins where the
    /// connection's last WRITE ended).
    pub(super) fn gather(&self, rd: &mut ReadSide, first: Job) -> Vec<Job> {
        let mut run = Vec::new();
        let next = match first.cmd {
            Command::Write { offset, len, .. } if self.ctx.gathers && len > 0 => {
                Some((offset, offset + u64::from(len), len))
            }
            _ => None,
        };
        run.push(first);
        let Some((offset, mut end, mut bytes)) = next else {
            rd.in_stream = false;
            return run;
        };
        rd.in_stream = offset == rd.write_end;
        while let Some(job) = self.next_gathered(rd, end, GATHER_MAX_BYTES.saturating_sub(bytes)) {
            let Command::Write { offset, len, .. } = job.cmd else {
                unreachable!("only WRITEs are gathered");
            };
            assert_eq!(offset, end, "a gathered WRITE continues the run");
            end += u64::from(len);
            bytes += len;
            run.push(job);
        }
        rd.write_end = end;
        run
    }

    /// The next request, if it is a WRITE of at most `room` bytes at `at` that has arrived
    /// whole and can be taken without waiting.
    fn next_gathered(&self, rd: &mut ReadSide, at: u64, room: u32) -> Option<Job> {
        if rd.closed
            || rd.announced.is_some()
            || self.stop.load(Ordering::SeqCst)
            || self.inflight.load(Ordering::SeqCst) >= self.max_threads
        {
            return None;
        }
        let buf = rd.r.buffer();
        let req = codec::parse_request(buf.get(..REQUEST_LEN)?).ok()?;
        let whole = REQUEST_LEN + req.length as usize;
        if req.command != CMD_WRITE
            || req.offset != at
            || req.length == 0
            || req.length > room
            || buf.len() < whole
        {
            return None;
        }
        let grant =
            PayloadGrant::try_acquire(&self.budget, &self.server_budget, req.length as usize)?;
        rd.r.consume(REQUEST_LEN);
        match self.request_body(rd, req, Some(grant), None) {
            Next::Run(job) if matches!(job.cmd, Command::Write { .. }) => Some(job),
            Next::Run(_) => unreachable!("a WRITE header gives a WRITE"),
            // Refused (and answered): the run ends here.
            Next::Answered => None,
            Next::Stop => {
                rd.closed = true;
                None
            }
        }
    }

    /// Runs a gathered run in one backend call and writes its replies in one go.
    pub(super) fn run_gathered(&self, jobs: Vec<Job>) {
        let start = Instant::now();
        let n = jobs.len();
        let (mut handles, mut grants, mut heads, mut payloads) = (
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
            Vec::with_capacity(n),
        );
        for job in jobs {
            let Command::Write { offset, fua, .. } = job.cmd else {
                unreachable!("only WRITEs are gathered");
            };
            handles.push(job.req.handle);
            grants.push(job.grant);
            heads.push((offset, fua, job.hint));
            payloads.push(job.payload.expect("a WRITE has its payload"));
        }
        let writes: Vec<GatheredWrite<'_>> = heads
            .into_iter()
            .zip(&payloads)
            .map(|((offset, fua, hint), p)| GatheredWrite {
                offset,
                data: p.as_slice(),
                fua,
                hint,
            })
            .collect();
        let results = self.ctx.backend.write_gathered(writes);
        assert_eq!(results.len(), n, "one result per gathered WRITE");
        let ns = u64::try_from(start.elapsed().as_nanos()).unwrap_or(u64::MAX);
        self.last_exec_ns.store(ns, Ordering::Relaxed);
        let replies: Vec<u8> = handles
            .iter()
            .zip(results)
            .flat_map(|(&h, r)| status_reply(&self.ctx, h, r))
            .collect();
        self.reply(&replies, None);
        self.inflight.fetch_sub(n, Ordering::SeqCst);
        // The payload buffers are gone: give their bytes back.
        drop(payloads);
        drop(grants);
    }
}

//! Status as users and scripts see it: the `detail --json` contract of `shared/INTERFACE.md`,
//! and the mdstat-like text of `status`.

use engine::{ArrayStatus, MemberState};
use layout::Level;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Detail {
    pub name: String,
    pub uuid: String,
    pub level: String,
    pub layout: Option<String>,
    pub chunk_bytes: u64,
    pub size_bytes: u64,
    pub raid_devices: usize,
    pub events: u64,
    pub state: String,
    pub consistency_policy: String,
    pub integrity: Option<String>,
    pub members: Vec<MemberDetail>,
    pub sync: SyncDetail,
    pub mismatch_count: u64,
    /// Extension: the write-intent bitmap (null: the array has none).
    #[serde(default)]
    pub bitmap: Option<BitmapDetail>,
    /// Extension: the used-region map (null: the array keeps none, e.g. RAID0/10/linear).
    #[serde(default)]
    pub used_regions: Option<UsedDetail>,
    /// Extension: where the NBD export listens.
    #[serde(default)]
    pub nbd: Vec<String>,
    /// Extension: NBD clients connected now (`tcp:ADDR` or `unix:pid N`): `stop` refuses
    /// while there are any.
    #[serde(default)]
    pub nbd_clients: Vec<String>,
    /// Extension: the daemon's process id.
    #[serde(default)]
    pub pid: u32,
    /// Extension: md's raid5-cache write journal (null: the array has none).
    #[serde(default)]
    pub journal: Option<JournalDetail>,
    /// Extension: the integrity records and what they found (null: the array keeps none).
    #[serde(default)]
    pub integrity_detail: Option<IntegrityDetail>,
    /// Extension: why writes are refused (null: they are accepted). Set whenever `state` is
    /// "read-only" (and for a "failed" array).
    #[serde(default)]
    pub read_only_reason: Option<String>,
    /// Extension: writes failing with ENOSPC because a member's backing store is full (null:
    /// writes go through); it ends at the next write that goes through.
    #[serde(default)]
    pub no_space: Option<NoSpaceDetail>,
    /// Extension: guided resync (null: the array's policy is not `guided`).
    #[serde(default)]
    pub guidance: Option<GuidanceDetail>,
    /// Extension: parity rows a crash may have left mid-write, not resynced yet, while the
    /// array is degraded (bitmap and guided policies know them): blocks rebuilt from them read
    /// as errors.
    #[serde(default)]
    pub torn_rows_exposed: u64,
    /// Extension: degraded reads refused for that reason since the start.
    #[serde(default)]
    pub torn_reads_refused: u64,
    /// Extension: client reads sent straight from the members' page caches (`splice`; levels
    /// without parity or integrity, local members) since the start.
    #[serde(default)]
    pub spliced_reads: u64,
    /// Extension: what each bounded pool and queue of the daemon holds, against its limit
    /// (null where the daemon's own figures are not known, e.g. in metrics).
    #[serde(default)]
    pub memory: Option<MemoryDetail>,
    /// Extension: the array's cluster as this node last read it from etcd (null: the array
    /// is not clustered).
    #[serde(default)]
    pub cluster: Option<ClusterDetail>,
}

/// A clustered array's nodes, as `detail --json` shows them.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterDetail {
    /// This node's name, its write-intent bitmap slot and its epoch (the etcd revision that
    /// created its membership: a new one at every start).
    pub node: String,
    pub slot: usize,
    pub epoch: i64,
    /// The node that runs the array's resync and recovery (null: none elected yet).
    pub coordinator: Option<String>,
    /// Every node holding a bitmap slot, by slot.
    pub nodes: Vec<ClusterNode>,
    /// Parity levels: the extents this node writes alone now, how many it got from etcd since
    /// it started, and how many it handed to other nodes.
    pub owned_extents: usize,
    pub extent_claims: u64,
    pub extent_handoffs: u64,
}

impl ClusterDetail {
    /// `cluster: node a slot 0 (this node, coordinator), b slot 1 gone`.
    pub fn mdstat_line(&self) -> String {
        let nodes: Vec<String> = self
            .nodes
            .iter()
            .map(|n| {
                let mut notes = Vec::new();
                if n.name == self.node {
                    notes.push("this node");
                }
                if self.coordinator.as_deref() == Some(n.name.as_str()) {
                    notes.push("coordinator");
                }
                let notes = match notes.is_empty() {
                    true => String::new(),
                    false => format!(" ({})", notes.join(", ")),
                };
                format!("{} slot {} {}{notes}", n.name, n.slot, n.state)
            })
            .collect();
        format!("      cluster: {}\n", nodes.join("; "))
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct ClusterNode {
    pub name: String,
    pub slot: usize,
    /// "active" (its lease lives) or "gone" (its lease ended; its slot is still its own).
    pub state: String,
}

/// A bounded pool or cache: bytes held now and the most it may hold.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Held {
    pub limit_bytes: u64,
    pub held_bytes: u64,
}

/// The daemon's memory by named limit: a client cannot make it grow past these (issue 24).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MemoryDetail {
    /// Client data placed in stripes and not yet written (64 MiB by default).
    pub stripe_cache: Held,
    /// Free stripe buffers kept for reuse.
    pub buffer_pool: Held,
    /// NBD request payloads (WRITE data, READ replies) in flight on all connections.
    pub nbd_payload: Held,
    /// The most NBD payload bytes in flight at once since the start.
    pub nbd_payload_peak_bytes: u64,
    /// Free NBD payload buffers kept for reuse.
    pub nbd_buffer_pool: Held,
    /// NBD request threads running, and the most (each connection keeps one of its own).
    pub nbd_request_threads: usize,
    pub nbd_request_threads_limit: usize,
    /// The daemon's resident memory now and at its peak (VmRSS, VmHWM).
    pub rss_bytes: u64,
    pub peak_rss_bytes: u64,
}

impl MemoryDetail {
    pub fn from_parts(m: &engine::MemoryStatus, nbd: &nbd::Server) -> MemoryDetail {
        let held = |u: &engine::PoolUsage| Held {
            limit_bytes: u.limit_bytes,
            held_bytes: u.held_bytes,
        };
        let (pool_held, pool_limit) = nbd.payload_pool_bytes();
        // One read of the process status for both figures.
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let proc_kib = |key: &str| -> u64 {
            status
                .lines()
                .find_map(|l| l.strip_prefix(key))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0)
        };
        MemoryDetail {
            stripe_cache: held(&m.stripe_cache),
            buffer_pool: held(&m.buffer_pool),
            nbd_payload: Held {
                limit_bytes: nbd.limits().max_inflight_bytes as u64,
                held_bytes: nbd.inflight_bytes() as u64,
            },
            nbd_payload_peak_bytes: nbd.inflight_bytes_peak() as u64,
            nbd_buffer_pool: Held {
                limit_bytes: pool_limit as u64,
                held_bytes: pool_held as u64,
            },
            nbd_request_threads: nbd.request_threads(),
            nbd_request_threads_limit: nbd.limits().max_threads,
            rss_bytes: proc_kib("VmRSS:") * 1024,
            peak_rss_bytes: proc_kib("VmHWM:") * 1024,
        }
    }
}

/// Guided resync: whether the array waits for a guide after an unclean stop, how that ended,
/// and the window of vulnerability (how long, over how many bytes, redundancy was not known
/// to be good).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct GuidanceDetail {
    /// "in_sync" (stopped cleanly: nothing to guide), "awaiting", "guided" or "fallback".
    pub state: String,
    pub guide: Option<String>,
    /// Why it fell back to the bitmap resync.
    pub reason: Option<String>,
    pub window_ms: u64,
    /// Bytes of each member the crash left marked in the bitmap (md sync coordinates).
    pub window_bytes: u64,
    /// Bytes of stripes verified since assembly (the guide's and client reads').
    pub verified_bytes: u64,
    /// While awaiting: milliseconds before the array falls back.
    pub fallback_in_ms: Option<u64>,
    /// The members say writes no guide would find may not be durable yet: a crash now falls
    /// back to the bitmap resync.
    #[serde(default)]
    pub unguided: bool,
    /// The ext4 write watch (`run --guide ext4`): what it judged (null: no watch).
    #[serde(default)]
    pub watch: Option<crate::watch::WatchDetail>,
}

impl GuidanceDetail {
    fn from_engine(g: &engine::GuidanceStatus) -> GuidanceDetail {
        GuidanceDetail {
            state: g.state.into(),
            guide: g.guide.clone(),
            reason: g.reason.clone(),
            window_ms: g.window_ms,
            window_bytes: g.window_bytes,
            verified_bytes: g.verified_bytes,
            fallback_in_ms: g.fallback_in_ms,
            unguided: g.unguided,
            watch: g.watched.then(crate::watch::detail).flatten(),
        }
    }

    fn mdstat_line(&self) -> String {
        let what = match self.state.as_str() {
            "awaiting" => format!(
                "awaiting a guide (fallback to the bitmap resync in {}s), {} to verify",
                self.fallback_in_ms.unwrap_or(0).div_ceil(1000),
                crate::size::human(self.window_bytes)
            ),
            "guided" => format!(
                "guided by {}: {} verified, window {} ms",
                self.guide.as_deref().unwrap_or("?"),
                crate::size::human(self.verified_bytes),
                self.window_ms
            ),
            "fallback" => format!(
                "fell back to the bitmap resync ({}), window {} ms",
                self.reason.as_deref().unwrap_or("?"),
                self.window_ms
            ),
            _ => return String::new(),
        };
        format!("      guidance: {what}\n")
    }
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct NoSpaceDetail {
    /// The member whose backing store was full at the latest failed write.
    pub member: String,
    pub since_unix_ms: u64,
    pub writes_failed: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct MemberDetail {
    pub path: String,
    pub role: Option<usize>,
    pub state: String,
    /// Extension: blocks found unreadable this run (corrected or recorded), and those
    /// corrected by rebuilding the block from redundancy and rewriting it (md's "read error
    /// corrected").
    #[serde(default)]
    pub read_errors: u64,
    #[serde(default)]
    pub read_errors_corrected: u64,
    /// Sectors in the member's bad-block log (`mdadm --examine-badblocks` lists them).
    #[serde(default)]
    pub bad_sectors: u64,
    /// Extension: reads this run whose blocks failed their integrity records (zpool's CKSUM).
    #[serde(default)]
    pub checksum_errors: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct SyncDetail {
    pub action: String,
    pub done_bytes: u64,
    pub total_bytes: u64,
    pub rate_bytes_per_s: u64,
    /// Extension: of `total_bytes - done_bytes`, what will really be read and written
    /// (regions never written are skipped): the ETA is this over the rate.
    #[serde(default)]
    pub left_bytes: u64,
    /// Extension: the action that ran last ("idle" if none yet).
    #[serde(default)]
    pub last_action: String,
    /// Extension: how long that action ran, in ms (its final flush included).
    #[serde(default)]
    pub last_duration_ms: u64,
    /// Extension: the same in microseconds.
    #[serde(default)]
    pub last_duration_us: u64,
    /// Extension: `action frozen` is in force (nothing starts).
    #[serde(default)]
    pub frozen: bool,
    /// Extension: md's `sync_speed_min`, bytes per second.
    #[serde(default)]
    pub speed_min_bytes_per_s: u64,
    /// Extension: md's `sync_speed_max`, bytes per second.
    #[serde(default)]
    pub speed_max_bytes_per_s: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct BitmapDetail {
    /// Bytes of each member (of the array for RAID10) one bit covers.
    pub chunk_bytes: u64,
    pub chunks: u64,
    /// Bits set: chunks written recently, or still to resync or recover.
    pub dirty_chunks: u64,
    /// Of those, chunks still owed a resync (a crash's, or a gone cluster node's).
    #[serde(default)]
    pub needed_chunks: u64,
    pub events_cleared: u64,
}

/// The used-region map: regions of each member's data area that may hold data. The others are
/// zero on every member and skipped by resync, check and rebuild.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct UsedDetail {
    /// Bytes of each member's data area one region covers.
    pub region_bytes: u64,
    pub regions: u64,
    /// Regions that may hold data.
    pub used: u64,
    /// `used × region_bytes`: bytes of each member's data area that may hold data (the last
    /// region may reach past the data area's end).
    pub used_bytes: u64,
}

/// Per-block CRC32C records kept on other members, and what verification found since
/// assembly (table findings include those of the load at assembly).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct IntegrityDetail {
    /// "crc32c".
    pub checksum: String,
    /// Copies of each table (each on another member).
    pub copies: usize,
    /// Bytes of tables on each member.
    pub table_bytes: u64,
    /// Epoch of the newest table write-out.
    pub epoch: u64,
    pub data_mismatches: u64,
    pub p_mismatches: u64,
    pub q_mismatches: u64,
    /// Blocks rebuilt from redundancy, rewritten and read back right.
    pub repaired: u64,
    pub rewrite_failures: u64,
    /// Stale records fixed (the block agreed with its row).
    pub records_fixed: u64,
    /// Blocks redundancy could not vouch for: reads of them failed with EIO.
    pub unrecoverable: u64,
    /// Blocks a resync after an unclean stop settled as found (unflushed writes).
    pub resolved_after_crash: u64,
    pub table_copies_bad: u64,
    pub table_copies_stale: u64,
    pub tables_rebuilt: u64,
    /// Table block copies (4 KiB) written since assembly: the records' write traffic.
    #[serde(default)]
    pub table_blocks_written: u64,
    /// The record cache (`run --integrity-cache`): table blocks it may hold, holds, and its
    /// hits, misses (each a table read) and evictions since assembly.
    #[serde(default)]
    pub cache_capacity_tables: u64,
    #[serde(default)]
    pub cache_resident_tables: u64,
    #[serde(default)]
    pub cache_hits: u64,
    #[serde(default)]
    pub cache_misses: u64,
    #[serde(default)]
    pub cache_evictions: u64,
}

impl IntegrityDetail {
    fn from_engine(s: &engine::IntegrityStatus) -> IntegrityDetail {
        let c = &s.counts;
        IntegrityDetail {
            checksum: s.checksum.into(),
            copies: s.copies,
            table_bytes: s.table_bytes,
            epoch: s.epoch,
            data_mismatches: c.data_mismatches,
            p_mismatches: c.p_mismatches,
            q_mismatches: c.q_mismatches,
            repaired: c.repaired,
            rewrite_failures: c.rewrite_failures,
            records_fixed: c.records_fixed,
            unrecoverable: c.unrecoverable,
            resolved_after_crash: c.resolved_after_crash,
            table_copies_bad: c.table_copies_bad,
            table_copies_stale: c.table_copies_stale,
            tables_rebuilt: c.tables_rebuilt,
            table_blocks_written: c.table_blocks_written,
            cache_capacity_tables: s.cache.capacity_pages,
            cache_resident_tables: s.cache.resident_pages,
            cache_hits: s.cache.hits,
            cache_misses: s.cache.misses,
            cache_evictions: s.cache.evictions,
        }
    }

    fn mdstat_line(&self) -> String {
        format!(
            "      integrity: {} x{}, mismatches data {} parity {}, repaired {}, unrecoverable {}, \
             bad table copies {}\n",
            self.checksum,
            self.copies,
            self.data_mismatches,
            self.p_mismatches + self.q_mismatches,
            self.repaired,
            self.unrecoverable,
            self.table_copies_bad + self.table_copies_stale
        )
    }
}

/// The raid5-cache write journal (reference §6): the log device and what it holds.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct JournalDetail {
    /// The log device's path.
    pub device: String,
    /// "write-through" (md's default) or "write-back".
    pub mode: String,
    /// Write-back: bytes of acknowledged data held in memory until their stripes are
    /// written home.
    #[serde(default)]
    pub cache_bytes: u64,
    /// Bytes of the ring (the log device's data area, whole 4 KiB pages).
    pub log_bytes: u64,
    /// Bytes between the tail and the head: what recovery would replay now.
    pub used_bytes: u64,
    /// `journal_tail`: the oldest meta block recovery starts from, sectors into the ring.
    pub tail_sector: u64,
    /// Sequence number the next io unit gets.
    pub next_seq: u64,
    /// Bytes of meta blocks and pages written to the log since assembly.
    pub logged_bytes: u64,
    /// Flushes of the log device since assembly.
    pub flushes: u64,
    /// Times the tail moved since assembly.
    pub reclaims: u64,
    /// Why the journal failed (null: it works). Writes are refused once it has.
    pub failed: Option<String>,
    /// "active"; "failing": the log failed and what it covered is being written out to the
    /// members (a stop or crash now leaves the log to be replayed at the next start);
    /// "failed": that is done, the members are flushed and the log is recorded faulty.
    #[serde(default = "active")]
    pub state: String,
    /// What recovery replayed at assembly.
    pub replayed: ReplayedDetail,
}

/// What journal recovery found and wrote home at assembly.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ReplayedDetail {
    /// Io units of the consistent chain from the tail (the tail's own unit included).
    pub units: u64,
    /// Units whose meta block was whole but a page was not: skipped.
    pub torn_units: u64,
    /// Pages written home.
    pub pages: u64,
    /// Data pages logged without parity (write-back mode): logged again and kept cached.
    pub data_only_pages: u64,
    pub millis: u64,
}

impl JournalDetail {
    pub fn from_engine(j: &engine::JournalStatus) -> JournalDetail {
        let r = &j.replayed;
        JournalDetail {
            device: j.device.clone(),
            mode: j.mode.to_string(),
            cache_bytes: j.cache_bytes,
            log_bytes: j.log_bytes,
            used_bytes: j.used_bytes,
            tail_sector: j.tail_sector,
            next_seq: j.next_seq,
            logged_bytes: j.logged_bytes,
            flushes: j.flushes,
            reclaims: j.reclaims,
            failed: j.failed.clone(),
            state: j.state.to_string(),
            replayed: ReplayedDetail {
                units: r.units,
                torn_units: r.torn_units,
                pages: r.pages,
                data_only_pages: r.data_only_pages,
                millis: r.millis,
            },
        }
    }

    /// `journal: write-through, log 62.00 MiB, 1.25 MiB in use, replayed 9 units (1408
    /// pages) in 287 ms`, torn units and a failure added when there are any.
    pub fn mdstat_line(&self) -> String {
        let r = &self.replayed;
        let mut line = format!(
            "      journal: {}, log {}, {} in use, replayed {} unit{} ({} page{}) in {} ms",
            self.mode,
            crate::size::human(self.log_bytes),
            crate::size::human(self.used_bytes),
            r.units,
            plural(r.units),
            r.pages,
            plural(r.pages),
            r.millis
        );
        if r.torn_units > 0 {
            line.push_str(&format!(
                ", {} torn unit{} skipped",
                r.torn_units,
                plural(r.torn_units)
            ));
        }
        if let Some(why) = &self.failed {
            line.push_str(&format!("\n      journal FAILED: {why}"));
            if self.state == "failing" {
                line.push_str(&format!(
                    "\n      journal failing: writing out {} of cache and flushing the members; \
                     until that ends a stop leaves the log to be replayed",
                    crate::size::human(self.cache_bytes)
                ));
            } else {
                line.push_str(
                    "\n      journal recorded faulty: its cache was written out and the members \
                     flushed first",
                );
            }
        }
        line.push('\n');
        line
    }
}

fn active() -> String {
    "active".into()
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

impl UsedDetail {
    pub fn from_engine(u: &engine::UsedStatus) -> UsedDetail {
        UsedDetail {
            region_bytes: u.region_bytes,
            regions: u.regions,
            used: u.used,
            used_bytes: u.used.saturating_mul(u.region_bytes),
        }
    }

    /// `used: 12/1024 regions (12 MiB of each member), 1 MiB region`.
    pub fn mdstat_line(&self) -> String {
        format!(
            "      used: {}/{} regions ({} of each member), {} region\n",
            self.used,
            self.regions,
            exact_size(self.used_bytes),
            exact_size(self.region_bytes)
        )
    }
}

/// Bytes in the largest power-of-1024 unit they reach: a whole number when exact ("12 MiB"),
/// else two decimals as `size::human` ("4.50 MiB").
fn exact_size(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut unit = 0;
    while unit + 1 < UNITS.len() && bytes >= 1 << (10 * (unit + 1)) {
        unit += 1;
    }
    let scale = 1u64 << (10 * unit);
    if bytes.is_multiple_of(scale) {
        format!("{} {}", bytes / scale, UNITS[unit])
    } else {
        crate::size::human(bytes)
    }
}

/// Counters md keeps in one 4 KiB page (16 bits per chunk): the unit of mdstat's "pages".
const COUNTERS_PER_PAGE: u64 = 2048;

impl BitmapDetail {
    /// mdstat's `bitmap: used/total pages [usedKB], chunkKB chunk` line. md counts the
    /// in-memory counter pages that hold a busy chunk; knowing how many chunks are dirty but
    /// not where, this shows the fewest pages they can occupy.
    pub fn mdstat_line(&self) -> String {
        let total = self.chunks.div_ceil(COUNTERS_PER_PAGE);
        let used = self.dirty_chunks.div_ceil(COUNTERS_PER_PAGE);
        format!(
            "      bitmap: {used}/{total} pages [{}KB], {}KB chunk\n",
            used * 4,
            self.chunk_bytes / 1024
        )
    }
}

impl SyncDetail {
    pub fn from_engine(s: &engine::SyncStatus) -> SyncDetail {
        SyncDetail {
            action: s.action.name().to_string(),
            done_bytes: s.done_bytes,
            total_bytes: s.total_bytes,
            rate_bytes_per_s: s.rate_bytes_per_s,
            left_bytes: s.left_bytes,
            last_action: s.last_action.name().to_string(),
            last_duration_ms: s.last_duration_ms,
            last_duration_us: s.last_duration_us,
            frozen: s.frozen,
            speed_min_bytes_per_s: s.speed_min_bytes,
            speed_max_bytes_per_s: s.speed_max_bytes,
        }
    }
}

impl Detail {
    pub fn from_status(s: &ArrayStatus, nbd: Vec<String>) -> Detail {
        let degraded = !s.missing_roles.is_empty();
        let rebuilding = s.members.iter().any(|m| m.state == MemberState::Rebuilding);
        let state = if s.failed {
            "failed"
        } else if s.read_only || s.read_only_reason.is_some() {
            "read-only"
        } else if s.sync.action == engine::SyncAction::Recover || rebuilding {
            "recovering"
        } else if s.sync.action == engine::SyncAction::Resync {
            "resyncing"
        } else if degraded {
            "degraded"
        } else if s.dirty {
            "active"
        } else {
            "clean"
        };
        let redundant = !matches!(s.level, Level::Raid0 | Level::Linear);
        Detail {
            name: s.name.clone(),
            uuid: format::format_uuid_mdadm(&s.uuid),
            level: s.level.name().to_string(),
            layout: s.layout.clone(),
            chunk_bytes: s.chunk_bytes,
            size_bytes: s.size_bytes,
            raid_devices: s.raid_disks,
            events: s.events,
            state: state.into(),
            consistency_policy: if redundant {
                s.consistency_policy
            } else {
                "none"
            }
            .into(),
            integrity: s.integrity.as_ref().map(|i| i.checksum.to_string()),
            members: s
                .members
                .iter()
                .map(|m| MemberDetail {
                    path: m.name.clone(),
                    role: m.role,
                    state: match m.state {
                        MemberState::InSync => "in_sync",
                        MemberState::Rebuilding => "rebuilding",
                        MemberState::Faulty => "faulty",
                        MemberState::Spare => "spare",
                        MemberState::Journal => "journal",
                    }
                    .into(),
                    read_errors: m.read_errors,
                    read_errors_corrected: m.read_errors_corrected,
                    bad_sectors: m.bad_sectors,
                    checksum_errors: m.checksum_errors,
                })
                .collect(),
            sync: SyncDetail::from_engine(&s.sync),
            mismatch_count: s.sync.mismatch_sectors,
            bitmap: s.bitmap.as_ref().map(|b| BitmapDetail {
                chunk_bytes: b.chunk_bytes,
                chunks: b.chunks,
                dirty_chunks: b.dirty_chunks,
                needed_chunks: b.needed_chunks,
                events_cleared: b.events_cleared,
            }),
            used_regions: s.used_regions.as_ref().map(UsedDetail::from_engine),
            nbd,
            nbd_clients: Vec::new(),
            pid: std::process::id(),
            journal: s.journal.as_ref().map(JournalDetail::from_engine),
            integrity_detail: s.integrity.as_ref().map(IntegrityDetail::from_engine),
            read_only_reason: s.read_only_reason.clone(),
            torn_rows_exposed: s.torn_rows_exposed,
            torn_reads_refused: s.torn_reads_refused,
            spliced_reads: s.spliced_reads,
            no_space: s.no_space.as_ref().map(|n| NoSpaceDetail {
                member: n.member.clone(),
                since_unix_ms: n.since_unix_ms,
                writes_failed: n.writes_failed,
            }),
            guidance: s.guidance.as_ref().map(GuidanceDetail::from_engine),
            memory: None,
            cluster: None,
        }
    }

    /// `state` plus what it leaves out: writes failing for lack of space.
    fn state_words(&self) -> String {
        match &self.no_space {
            Some(_) => format!("{}, no space (writes failing)", self.state),
            None => self.state.clone(),
        }
    }

    /// Whether nothing needs an administrator: not degraded, failed, read-only against its
    /// own wish, or failing writes for lack of space (`status` exits 1 otherwise, as `mdadm
    /// --detail --test`).
    pub fn healthy(&self) -> bool {
        let missing =
            self.members.iter().filter(|m| m.state == "in_sync").count() < self.raid_devices;
        let refused = self
            .read_only_reason
            .as_deref()
            .is_some_and(|r| r != engine::ASSEMBLED_READ_ONLY);
        !missing && !refused && self.no_space.is_none() && self.state != "failed"
    }

    /// Two or three lines in the spirit of /proc/mdstat.
    pub fn mdstat(&self) -> String {
        let mut line1 = format!(
            "{} : {} {}",
            self.name,
            if self.state == "failed" {
                "broken"
            } else {
                "active"
            },
            self.level
        );
        if self.state == "read-only" {
            line1 = format!("{} : active (read-only) {}", self.name, self.level);
        }
        for m in &self.members {
            // mdstat names a disk by its base name; a URI's base name would hide the export.
            let base = if device::is_nbd_uri(&m.path) {
                m.path.clone()
            } else {
                std::path::Path::new(&m.path)
                    .file_name()
                    .map(|f| f.to_string_lossy().to_string())
                    .unwrap_or_default()
            };
            let tag = match m.state.as_str() {
                "faulty" => "(F)",
                "spare" => "(S)",
                "rebuilding" => "(R)",
                "journal" => "(J)",
                _ => "",
            };
            line1.push_str(&format!(
                " {base}[{}]{tag}",
                m.role.map(|r| r.to_string()).unwrap_or_else(|| "-".into())
            ));
        }
        let mut roles = vec!['_'; self.raid_devices];
        for m in self.members.iter().filter(|m| m.state == "in_sync") {
            if let Some(r) = m.role {
                roles[r] = 'U';
            }
        }
        let working = roles.iter().filter(|&&c| c == 'U').count();
        let geometry = match self.level.as_str() {
            "raid4" | "raid5" | "raid6" => format!(
                " level {}, {}k chunk, algorithm {}",
                &self.level[4..],
                self.chunk_bytes / 1024,
                self.layout.as_deref().unwrap_or("-")
            ),
            "raid10" => format!(
                " {}K chunks {}",
                self.chunk_bytes / 1024,
                self.layout.as_deref().unwrap_or("")
            ),
            "raid0" => format!(" {}k chunks", self.chunk_bytes / 1024),
            _ => String::new(),
        };
        let mut out = format!(
            "{line1}\n      {} blocks super 1.2{geometry} [{}/{working}] [{}]  state {}\n",
            self.size_bytes / 1024,
            self.raid_devices,
            roles.iter().collect::<String>(),
            self.state_words()
        );
        if self.sync.action != "idle" && self.sync.total_bytes > 0 {
            out.push_str(&progress_line(&self.sync));
        }
        if let Some(b) = &self.bitmap {
            out.push_str(&b.mdstat_line());
        }
        if let Some(u) = &self.used_regions {
            out.push_str(&u.mdstat_line());
        }
        if let Some(j) = &self.journal {
            out.push_str(&j.mdstat_line());
        }
        if let Some(i) = &self.integrity_detail {
            out.push_str(&i.mdstat_line());
        }
        if let Some(g) = &self.guidance {
            out.push_str(&g.mdstat_line());
        }
        if let Some(c) = &self.cluster {
            out.push_str(&c.mdstat_line());
        }
        for m in self
            .members
            .iter()
            .filter(|m| m.read_errors_corrected > 0 || m.bad_sectors > 0 || m.checksum_errors > 0)
        {
            out.push_str(&format!(
                "      {}: {} read errors corrected, {} bad sectors recorded, {} checksum errors\n",
                m.path, m.read_errors_corrected, m.bad_sectors, m.checksum_errors
            ));
        }
        if let Some(n) = &self.no_space {
            let ago = unix_ms().saturating_sub(n.since_unix_ms) / 1000;
            out.push_str(&format!(
                "      writes failing (ENOSPC): no space on the file system of {} for {ago}s, {} \
                 writes failed; the member stays, the ranges are resynced once space is back\n",
                n.member, n.writes_failed
            ));
        }
        // A journal failure already said why; other reasons (assembled read-only, journal
        // missing at assembly, redundancy exhausted) get their own line.
        if let Some(why) = &self.read_only_reason {
            if self.journal.as_ref().and_then(|j| j.failed.as_ref()) != Some(why) {
                out.push_str(&format!("      writes refused: {why}\n"));
            }
        }
        out
    }
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// mdstat's progress line: bar, percent, done/total KiB, time left, speed.
pub fn progress_line(s: &SyncDetail) -> String {
    let permille = (s.done_bytes.saturating_mul(1000) / s.total_bytes.max(1)).min(1000);
    let filled = (permille / 50) as usize;
    let bar: String = "=".repeat(filled) + ">" + &".".repeat(20 - filled.min(20));
    // What is left to copy, not the span left to walk: unused regions cost nothing.
    let left = s.left_bytes;
    let finish_min = if s.rate_bytes_per_s > 0 {
        left as f64 / s.rate_bytes_per_s as f64 / 60.0
    } else {
        0.0
    };
    let what = match s.action.as_str() {
        "recover" => "recovery",
        other => other,
    };
    format!(
        "      [{bar}]  {what} = {:.1}% ({}/{}) finish={:.1}min speed={}K/sec\n",
        permille as f64 / 10.0,
        s.done_bytes / 1024,
        s.total_bytes / 1024,
        finish_min,
        s.rate_bytes_per_s / 1024
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mdstat_bitmap_line_counts_counter_pages() {
        // Reference §5.4: a 4 TB component with 64 MiB chunks has 59,605 bits, 30 pages.
        let b = BitmapDetail {
            chunk_bytes: 64 << 20,
            chunks: 59_605,
            dirty_chunks: 0,
            needed_chunks: 0,
            events_cleared: 7,
        };
        assert_eq!(
            b.mdstat_line(),
            "      bitmap: 0/30 pages [0KB], 65536KB chunk\n"
        );
        let busy = BitmapDetail {
            dirty_chunks: 2049,
            ..b
        };
        assert_eq!(
            busy.mdstat_line(),
            "      bitmap: 2/30 pages [8KB], 65536KB chunk\n"
        );
    }

    fn used(region_bytes: u64, regions: u64, used: u64) -> UsedDetail {
        UsedDetail::from_engine(&engine::UsedStatus {
            region_bytes,
            regions,
            used,
        })
    }

    #[test]
    fn used_line_counts_regions_and_bytes_of_each_member() {
        assert_eq!(
            used(1 << 20, 1024, 12).mdstat_line(),
            "      used: 12/1024 regions (12 MiB of each member), 1 MiB region\n"
        );
        assert_eq!(
            used(1 << 20, 255, 0).mdstat_line(),
            "      used: 0/255 regions (0 B of each member), 1 MiB region\n"
        );
        // 1536 regions of 2 MiB: 3 GiB; 3 of 1.5 MiB: 4.5 MiB, not a whole MiB.
        assert_eq!(
            used(2 << 20, 4096, 1536).mdstat_line(),
            "      used: 1536/4096 regions (3 GiB of each member), 2 MiB region\n"
        );
        assert_eq!(
            used(3 << 19, 10, 3).mdstat_line(),
            "      used: 3/10 regions (4.50 MiB of each member), 1.50 MiB region\n"
        );
        assert_eq!(used(1 << 20, 1024, 12).used_bytes, 12 << 20);
    }

    fn raid5_detail(used_regions: Option<UsedDetail>) -> Detail {
        let members = (0..4)
            .map(|i| MemberDetail {
                path: format!("/tmp/m{i}.img"),
                role: Some(i),
                state: "in_sync".into(),
                read_errors: 0,
                read_errors_corrected: 0,
                bad_sectors: 0,
                checksum_errors: 0,
            })
            .collect();
        Detail {
            name: "vol".into(),
            uuid: "00000000:00000000:00000000:00000000".into(),
            level: "raid5".into(),
            layout: Some("left-symmetric".into()),
            chunk_bytes: 512 << 10,
            size_bytes: 3 * (255 << 20),
            raid_devices: 4,
            events: 3,
            state: "clean".into(),
            consistency_policy: "resync".into(),
            integrity: None,
            members,
            sync: SyncDetail {
                action: "idle".into(),
                done_bytes: 0,
                total_bytes: 0,
                rate_bytes_per_s: 0,
                left_bytes: 0,
                last_action: "idle".into(),
                last_duration_ms: 0,
                last_duration_us: 0,
                frozen: false,
                speed_min_bytes_per_s: 1000 << 10,
                speed_max_bytes_per_s: 200_000 << 10,
            },
            mismatch_count: 0,
            bitmap: None,
            used_regions,
            nbd: vec![],
            nbd_clients: vec![],
            pid: 1,
            journal: None,
            integrity_detail: None,
            guidance: None,
            read_only_reason: None,
            torn_rows_exposed: 0,
            torn_reads_refused: 0,
            spliced_reads: 0,
            no_space: None,
            memory: None,
            cluster: None,
        }
    }

    /// Built here rather than through `from_engine`, so the engine's status may grow fields
    /// without touching these tests.
    fn journal(failed: Option<&str>) -> JournalDetail {
        JournalDetail {
            device: "/tmp/log.img".into(),
            mode: "write-through".into(),
            cache_bytes: 0,
            log_bytes: 62 << 20,
            used_bytes: 5 << 18,
            tail_sector: 4096,
            next_seq: 10_042,
            logged_bytes: 9 << 20,
            flushes: 17,
            reclaims: 2,
            failed: failed.map(str::to_string),
            state: if failed.is_some() { "failed" } else { "active" }.into(),
            replayed: ReplayedDetail {
                units: 9,
                torn_units: 0,
                pages: 1408,
                data_only_pages: 0,
                millis: 287,
            },
        }
    }

    #[test]
    fn mdstat_journal_line_and_tag() {
        let mut d = raid5_detail(None);
        d.consistency_policy = "journal".into();
        d.members.push(MemberDetail {
            path: "/tmp/log.img".into(),
            role: None,
            state: "journal".into(),
            read_errors: 0,
            read_errors_corrected: 0,
            bad_sectors: 0,
            checksum_errors: 0,
        });
        d.journal = Some(journal(None));
        let text = d.mdstat();
        assert!(text.contains(" m3.img[3] log.img[-](J)\n"), "{text}");
        assert!(
            text.ends_with(
                "      journal: write-through, log 62.00 MiB, 1.25 MiB in use, replayed 9 \
                 units (1408 pages) in 287 ms\n"
            ),
            "{text}"
        );
        assert!(!text.contains("refused"), "{text}");
    }

    #[test]
    fn mdstat_says_why_writes_are_refused_once() {
        let why = "journal /tmp/log.img failed: failed by administrator";
        let mut d = raid5_detail(None);
        d.state = "read-only".into();
        d.journal = Some(journal(Some(why)));
        d.read_only_reason = Some(why.into());
        let text = d.mdstat();
        assert!(text.starts_with("vol : active (read-only) raid5"), "{text}");
        assert_eq!(text.matches(why).count(), 1, "{text}");
        assert!(
            text.contains(&format!("      journal FAILED: {why}\n")),
            "{text}"
        );
        // Read-only for another reason (the journal missing at assembly): its own line.
        let mut d = raid5_detail(None);
        d.state = "read-only".into();
        d.read_only_reason = Some("its journal device (slot 4) is missing".into());
        let text = d.mdstat();
        assert!(
            text.ends_with("      writes refused: its journal device (slot 4) is missing\n"),
            "{text}"
        );
    }

    #[test]
    fn json_journal_is_an_object_or_null() {
        let mut d = raid5_detail(None);
        let v = serde_json::to_value(&d).unwrap();
        assert!(v["journal"].is_null(), "{v:#}");
        assert!(v["read_only_reason"].is_null(), "{v:#}");
        assert!(v.as_object().unwrap().contains_key("journal"), "{v:#}");
        assert!(
            v.as_object().unwrap().contains_key("read_only_reason"),
            "{v:#}"
        );
        d.journal = Some(journal(Some("gone")));
        d.read_only_reason = Some("gone".into());
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(
            v["journal"],
            serde_json::json!({
                "device": "/tmp/log.img",
                "mode": "write-through",
                "cache_bytes": 0,
                "log_bytes": 62u64 << 20,
                "used_bytes": 5u64 << 18,
                "tail_sector": 4096,
                "next_seq": 10_042,
                "logged_bytes": 9u64 << 20,
                "flushes": 17,
                "reclaims": 2,
                "failed": "gone",
                "state": "failed",
                "replayed": {
                    "units": 9,
                    "torn_units": 0,
                    "pages": 1408,
                    "data_only_pages": 0,
                    "millis": 287,
                },
            })
        );
        assert_eq!(v["read_only_reason"], "gone");
        // A daemon from before the extension: both fields absent, the CLI reads None.
        let mut old = v;
        old.as_object_mut().unwrap().remove("journal");
        old.as_object_mut().unwrap().remove("read_only_reason");
        let back: Detail = serde_json::from_value(old).unwrap();
        assert_eq!((back.journal, back.read_only_reason), (None, None));
    }

    #[test]
    fn mdstat_shows_the_used_map_last() {
        let d = raid5_detail(Some(used(1 << 20, 255, 3)));
        assert_eq!(
            d.mdstat(),
            "vol : active raid5 m0.img[0] m1.img[1] m2.img[2] m3.img[3]\n      \
             783360 blocks super 1.2 level 5, 512k chunk, algorithm left-symmetric [4/4] \
             [UUUU]  state clean\n      \
             used: 3/255 regions (3 MiB of each member), 1 MiB region\n"
        );
        let none = raid5_detail(None).mdstat();
        assert!(!none.contains("used:"), "{none}");
    }

    #[test]
    fn json_used_regions_is_an_object_or_null() {
        let v = serde_json::to_value(raid5_detail(Some(used(1 << 20, 255, 3)))).unwrap();
        assert_eq!(
            v["used_regions"],
            serde_json::json!({
                "region_bytes": 1u64 << 20,
                "regions": 255,
                "used": 3,
                "used_bytes": 3u64 << 20,
            })
        );
        let v = serde_json::to_value(raid5_detail(None)).unwrap();
        assert!(v["used_regions"].is_null(), "{v:#}");
        assert!(v.as_object().unwrap().contains_key("used_regions"), "{v:#}");
        // A daemon from before the extension: the field is absent, the CLI reads None.
        let mut old = v;
        old.as_object_mut().unwrap().remove("used_regions");
        let back: Detail = serde_json::from_value(old).unwrap();
        assert_eq!(back.used_regions, None);
    }
}

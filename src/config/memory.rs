//! The memory promnorm may use, and the sizes derived from it (`auto`).
//!
//! The limit is the container's (cgroup v2 `memory.max`, cgroup v1
//! `memory.limit_in_bytes`, the smallest along the process' cgroup path), else the host's
//! `MemTotal`. promnorm allows itself `limits.memory_allowed_percent` of it (60%, as
//! vmagent's `-memory.allowedPercent`), and sizes every `auto` key so that README's
//! memory bound
//!
//! ```text
//! RSS ≤ 64 MiB + W × 64 MiB + 4 × max_inflight_bytes + derived state + cardinality state
//!       + queues in memory
//! ```
//!
//! stays within that allowance (see [`Config::sizing_for`]).

use std::path::Path;

use super::size::human_bytes;
use super::{ByteSizeError, Config, QueueType};

/// Overrides the detected limit (a size: `512MiB`); for tests and for runtimes whose
/// limit promnorm cannot see.
pub const LIMIT_ENV: &str = "PROMNORM_MEMORY_LIMIT_BYTES";

/// What the process needs besides requests: runtime, rules, metrics.
pub const BASE_BYTES: u64 = 64 << 20;
/// Per runtime worker: its share of the idle workspaces kept for reuse (buffers and name
/// caches; the pipeline's pool holds at most `workers × WORKER_BYTES`, a workspace
/// past it keeping its caches only).
pub const WORKER_BYTES: u64 = 64 << 20;
/// Per derived series: its label set, state and eviction-clock entry.
pub const DERIVED_SERIES_BYTES: u64 = 400;
/// Per series of `limits.max_tracked_series`: the cardinality guard's table entry at
/// most (`guard::tracker::SERIES_BYTES`).
pub const TRACKED_SERIES_BYTES: u64 = 56;
/// The cardinality guard's metrics, names and label sketches at most, whatever the
/// series (`guard::tracker::max_bytes` less the series).
pub const CARDINALITY_FIXED_BYTES: u64 = 10 << 20;

/// `limits.max_tracked_series: auto` at most and at least.
const MAX_TRACKED_SERIES: u64 = 1_000_000;
const MIN_TRACKED_SERIES: u64 = 50_000;

/// The cardinality guard's state at its limits.
pub fn cardinality_bytes(max_tracked_series: usize) -> u64 {
    (max_tracked_series as u64).saturating_mul(TRACKED_SERIES_BYTES) + CARDINALITY_FIXED_BYTES
}
/// Per derived sample waiting for the writer.
pub const PENDING_SAMPLE_BYTES: u64 = 48;
/// The bytes each in-flight byte may cost: the body and its decoded copy, the re-encoded
/// output and its compressed copy.
pub const INFLIGHT_FACTOR: u64 = 4;

/// The defaults when no limit is known (no cgroup limit and no `/proc/meminfo`).
const FALLBACK_INFLIGHT: u64 = 1 << 30;
const MAX_BODY: u64 = 32 << 20;
const MAX_DECODED: u64 = 256 << 20;
const MAX_DERIVED_SERIES: u64 = 1_000_000;
const MAX_MEMORY_QUEUE: u64 = 512 << 20;
/// A disk queue's `auto`: disk, not memory, so not from the memory limit.
pub const DISK_QUEUE_BYTES: u64 = 512 << 20;
/// What a disk queue keeps in memory of the records it wrote (to send them without
/// reading them back), over all its shards.
pub const DISK_QUEUE_CACHE_BYTES: u64 = 8 << 20;
/// Floors of the `auto` sizes, for limits too small for the bound (warned about).
const MIN_INFLIGHT: u64 = 16 << 20;
const MIN_DERIVED_SERIES: u64 = 10_000;
const MIN_MEMORY_QUEUE: u64 = 16 << 20;

/// Where the memory limit came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LimitSource {
    CgroupV2,
    CgroupV1,
    Host,
    /// `PROMNORM_MEMORY_LIMIT_BYTES`.
    Env,
}

impl std::fmt::Display for LimitSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            LimitSource::CgroupV2 => "cgroup v2 memory.max",
            LimitSource::CgroupV1 => "cgroup v1 memory.limit_in_bytes",
            LimitSource::Host => "host MemTotal",
            LimitSource::Env => LIMIT_ENV,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryLimit {
    pub bytes: u64,
    pub source: LimitSource,
}

/// cgroup v1 writes "no limit" as the largest page-aligned `i64`; anything this large
/// is no limit.
const UNLIMITED_FROM: u64 = 1 << 60;

fn read_limit(path: &Path) -> Option<Option<u64>> {
    let text = std::fs::read_to_string(path).ok()?;
    let t = text.trim();
    if t == "max" {
        return Some(None);
    }
    let n: u64 = t.parse().ok()?;
    Some((n < UNLIMITED_FROM).then_some(n))
}

/// The smallest limit along `cgroup` (a path such as `/kubepods/pod1/c1`) and its
/// ancestors, each read as `base/<dir>/file`. A directory that does not exist is skipped:
/// without a cgroup namespace, `/proc/self/cgroup` names the host's path while the
/// container sees its own cgroup at `base`.
fn smallest_along(base: &Path, cgroup: &str, file: &str) -> Option<u64> {
    let mut best: Option<u64> = None;
    let mut dir = cgroup.trim_end_matches('/');
    loop {
        let p = base.join(dir.trim_start_matches('/')).join(file);
        if let Some(Some(n)) = read_limit(&p) {
            best = Some(best.map_or(n, |b| b.min(n)));
        }
        match dir.rfind('/') {
            Some(i) if !dir.is_empty() => dir = &dir[..i],
            _ => break,
        }
    }
    best
}

/// The memory limit as seen under `root` (`/` in production, a fixture directory in
/// tests): the cgroup's limit (v2, else v1) when there is one and it is below the host's
/// memory, else the host's `MemTotal`; `None` when neither can be read.
pub fn detect_memory_limit(root: &Path) -> Option<MemoryLimit> {
    let own = std::fs::read_to_string(root.join("proc/self/cgroup")).unwrap_or_default();
    let mut v2_path = "/";
    let mut v1_path = "/";
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        if id == "0" && controllers.is_empty() {
            v2_path = path;
        } else if controllers.split(',').any(|c| c == "memory") {
            v1_path = path;
        }
    }
    let cgroups = root.join("sys/fs/cgroup");
    let cgroup = if cgroups.join("cgroup.controllers").exists() {
        smallest_along(&cgroups, v2_path, "memory.max").map(|bytes| MemoryLimit {
            bytes,
            source: LimitSource::CgroupV2,
        })
    } else {
        smallest_along(&cgroups.join("memory"), v1_path, "memory.limit_in_bytes").map(|bytes| {
            MemoryLimit {
                bytes,
                source: LimitSource::CgroupV1,
            }
        })
    };
    let host = std::fs::read_to_string(root.join("proc/meminfo"))
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().strip_suffix("kB"))
                .and_then(|v| v.trim().parse::<u64>().ok())
        })
        .map(|kib| MemoryLimit {
            bytes: kib * 1024,
            source: LimitSource::Host,
        });
    match (cgroup, host) {
        (Some(c), Some(h)) if h.bytes < c.bytes => Some(h),
        (Some(c), _) => Some(c),
        (None, h) => h,
    }
}

/// `PROMNORM_MEMORY_LIMIT_BYTES`, when set.
pub fn limit_from_env() -> Result<Option<MemoryLimit>, ByteSizeError> {
    match std::env::var(LIMIT_ENV) {
        Ok(v) => super::parse_byte_size(&v).map(|bytes| {
            Some(MemoryLimit {
                bytes,
                source: LimitSource::Env,
            })
        }),
        Err(_) => Ok(None),
    }
}

/// This process' limit: the variable, else what the system says (an unreadable variable
/// is an error of `Config::check`; here it falls back to detection).
pub fn memory_limit() -> Option<MemoryLimit> {
    limit_from_env()
        .ok()
        .flatten()
        .or_else(|| detect_memory_limit(Path::new("/")))
}

/// Runtime worker threads: one per core the process may use (the cgroup's CPU quota
/// included), as tokio starts them.
pub fn worker_threads() -> u64 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u64)
}

/// The effective sizes of a configuration under a memory limit: the written ones, and
/// the `auto` ones computed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sizing {
    pub limit: Option<MemoryLimit>,
    /// `limit × limits.memory_allowed_percent / 100`.
    pub allowed: Option<u64>,
    pub workers: u64,
    pub max_inflight_bytes: u64,
    pub max_body_bytes: u64,
    pub max_decoded_bytes: u64,
    pub derived_max_series: usize,
    pub derived_max_pending_samples: usize,
    /// Per backend, in order: its queue's `max_bytes` (`0` for `type: none`).
    pub queue_max_bytes: Vec<u64>,
    /// Derived state at its limits (0 when derived series are off).
    pub derived_bytes: u64,
    /// `limits.max_tracked_series`, `auto` resolved.
    pub max_tracked_series: usize,
    /// The cardinality guard's state at its limits (`limits.max_tracked_series`).
    pub cardinality_bytes: u64,
    /// What the queues may hold in memory together: every memory queue's `max_bytes`,
    /// and each disk queue's cache of the records it wrote (`DISK_QUEUE_CACHE_BYTES`).
    pub memory_queue_bytes: u64,
    /// README's bound for these sizes.
    pub bound: u64,
}

impl Sizing {
    /// One line for the start-up log and `check-config --print`.
    pub fn summary(&self) -> String {
        let limit = match (&self.limit, self.allowed) {
            (Some(l), Some(a)) => format!(
                "limit {} ({}), {} allowed",
                human_bytes(l.bytes),
                l.source,
                human_bytes(a)
            ),
            _ => "no memory limit found".to_string(),
        };
        format!(
            "memory: {limit}; bound {} = 64MiB + {} workers x 64MiB + 4 x max_inflight_bytes {} + derived state {} + cardinality state {} + queues in memory {}",
            human_bytes(self.bound),
            self.workers,
            human_bytes(self.max_inflight_bytes),
            human_bytes(self.derived_bytes),
            human_bytes(self.cardinality_bytes),
            human_bytes(self.memory_queue_bytes),
        )
    }
}

fn round_down_mib(n: u64) -> u64 {
    if n >= 1 << 20 {
        n & !((1 << 20) - 1)
    } else {
        n
    }
}

impl Config {
    /// The sizes for this process (its memory limit, its worker threads).
    pub fn sizing(&self) -> Sizing {
        self.sizing_for(memory_limit(), worker_threads())
    }

    /// The sizes under `limit` with `workers` runtime threads. With a limit `L`, the
    /// allowance is `A = L × memory_allowed_percent / 100`, and what is left after the
    /// fixed part, `R = A − 64 MiB − workers × 64 MiB`, is shared out:
    ///
    /// - `derived.max_series: auto`: a quarter of `R`, at 448 bytes a series (its state
    ///   and one pending sample), at most 1,000,000; `max_pending_samples: auto` as many;
    /// - memory queues' `max_bytes: auto`: together a quarter of `R`, each at most 512 MiB;
    /// - `max_inflight_bytes: auto`: what is left of `R`, divided by 4 (each in-flight
    ///   byte may cost four);
    /// - `max_body_bytes: auto`: `max_inflight_bytes / 4`, at most 32 MiB;
    ///   `max_decoded_bytes: auto`: the rest of `max_inflight_bytes`, at most 256 MiB, so a
    ///   request at the limits always fits the budget.
    ///
    /// Each share is rounded down to a MiB and has a floor (16 MiB, 10,000 series) for
    /// limits too small for the bound (`warnings` says so). Without a known limit the
    /// `auto` values are the fixed defaults (1 GiB in flight, 1,000,000 series, 512 MiB
    /// queues).
    pub fn sizing_for(&self, limit: Option<MemoryLimit>, workers: u64) -> Sizing {
        let l = &self.limits;
        let d = &self.derived;
        let pct = u64::from(l.memory_allowed_percent.clamp(1, 100));
        let allowed = limit.map(|m| m.bytes / 100 * pct + m.bytes % 100 * pct / 100);
        let fixed = BASE_BYTES + workers * WORKER_BYTES;
        let rest = allowed.map(|a| a.saturating_sub(fixed));

        // Derived state.
        let series = match (d.max_series.set(), rest) {
            (Some(n), _) => n as u64,
            (None, None) => MAX_DERIVED_SERIES,
            (None, Some(r)) => (r / 4 / (DERIVED_SERIES_BYTES + PENDING_SAMPLE_BYTES))
                .clamp(MIN_DERIVED_SERIES, MAX_DERIVED_SERIES),
        };
        let pending = d.max_pending_samples.set().map_or(series, |n| n as u64);
        let derived_bytes = if d.enabled {
            series * DERIVED_SERIES_BYTES + pending * PENDING_SAMPLE_BYTES
        } else {
            0
        };

        // The cardinality guard's series: a sixteenth of R.
        let tracked = match (l.max_tracked_series.set(), rest) {
            (Some(n), _) => n as u64,
            (None, None) => MAX_TRACKED_SERIES,
            (None, Some(r)) => {
                (r / 16 / TRACKED_SERIES_BYTES).clamp(MIN_TRACKED_SERIES, MAX_TRACKED_SERIES)
            }
        };
        let cardinality_bytes = cardinality_bytes(usize::try_from(tracked).unwrap_or(usize::MAX));

        // Queues.
        let auto_memory = self
            .backends
            .iter()
            .filter(|b| b.queue.kind == QueueType::Memory && b.queue.max_bytes.set().is_none())
            .count() as u64;
        let auto_memory_each = match rest {
            None => MAX_MEMORY_QUEUE,
            Some(r) => {
                round_down_mib(r / 4 / auto_memory.max(1)).clamp(MIN_MEMORY_QUEUE, MAX_MEMORY_QUEUE)
            }
        };
        let queue_max_bytes: Vec<u64> = self
            .backends
            .iter()
            .map(|b| match (b.queue.kind, b.queue.max_bytes.set()) {
                (QueueType::None, _) => 0,
                (_, Some(n)) => n,
                (QueueType::Memory, None) => auto_memory_each,
                (QueueType::Disk, None) => DISK_QUEUE_BYTES,
            })
            .collect();
        let memory_queue_bytes = self
            .backends
            .iter()
            .zip(&queue_max_bytes)
            .map(|(b, n)| match b.queue.kind {
                QueueType::Memory => *n,
                QueueType::Disk => DISK_QUEUE_CACHE_BYTES,
                QueueType::None => 0,
            })
            .sum::<u64>();

        // Requests.
        let inflight = match (l.max_inflight_bytes.set(), rest) {
            (Some(n), _) => n,
            (None, None) => FALLBACK_INFLIGHT,
            (None, Some(r)) => round_down_mib(
                r.saturating_sub(derived_bytes)
                    .saturating_sub(cardinality_bytes)
                    .saturating_sub(memory_queue_bytes)
                    / INFLIGHT_FACTOR,
            )
            .max(MIN_INFLIGHT),
        };
        let body = l
            .max_body_bytes
            .set()
            .unwrap_or_else(|| (inflight / 4).min(MAX_BODY));
        let decoded = l
            .max_decoded_bytes
            .set()
            .unwrap_or_else(|| inflight.saturating_sub(body).min(MAX_DECODED));
        let bound = fixed
            .saturating_add(inflight.saturating_mul(INFLIGHT_FACTOR))
            .saturating_add(derived_bytes)
            .saturating_add(cardinality_bytes)
            .saturating_add(memory_queue_bytes);
        Sizing {
            limit,
            allowed,
            workers,
            max_inflight_bytes: inflight,
            max_body_bytes: body,
            max_decoded_bytes: decoded,
            derived_max_series: usize::try_from(series).unwrap_or(usize::MAX),
            derived_max_pending_samples: usize::try_from(pending).unwrap_or(usize::MAX),
            queue_max_bytes,
            derived_bytes,
            max_tracked_series: usize::try_from(tracked).unwrap_or(usize::MAX),
            cardinality_bytes,
            memory_queue_bytes,
            bound,
        }
    }

    /// A warning when the bound exceeds the memory limit (explicit sizes too large for
    /// it), or when the allowance does not even cover the fixed part (the `auto` floors
    /// apply). A warning, not an error: the bound is a worst case, and check-config may
    /// run elsewhere than serve.
    pub fn memory_warning(&self, s: &Sizing) -> Option<String> {
        let (limit, allowed) = (s.limit?, s.allowed?);
        let fixed = BASE_BYTES + s.workers * WORKER_BYTES;
        if s.bound <= limit.bytes && allowed > fixed {
            return None;
        }
        let what = if s.bound > limit.bytes {
            format!(
                "exceeds the memory limit {} ({})",
                human_bytes(limit.bytes),
                limit.source
            )
        } else {
            format!(
                "is above the {}% allowed ({}) of the memory limit {} ({}): the limit is too small for promnorm's minimums",
                self.limits.memory_allowed_percent,
                human_bytes(allowed),
                human_bytes(limit.bytes),
                limit.source
            )
        };
        Some(format!(
            "{}the memory bound {} (64MiB + {} workers x 64MiB + 4 x limits.max_inflight_bytes {} + derived state {} + cardinality state {} + queues in memory {}) {what}; promnorm may be OOM-killed under load: lower these or set them to auto",
            match self.limits.max_inflight_bytes.set() {
                Some(n) => self.size_position("max_inflight_bytes", n),
                None => self.position("max_inflight_bytes", ""),
            },
            human_bytes(s.bound),
            s.workers,
            human_bytes(s.max_inflight_bytes),
            human_bytes(s.derived_bytes),
            human_bytes(s.cardinality_bytes),
            human_bytes(s.memory_queue_bytes),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fixture root directory, removed when dropped.
    struct Root(std::path::PathBuf);

    impl Root {
        fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Root {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    /// A fixture root with the given files.
    fn root(files: &[(&str, &str)]) -> Root {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("promnorm-memory-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for (path, text) in files {
            let p = dir.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        Root(dir)
    }

    const MEMINFO: &str = "MemTotal:       16318436 kB\nMemFree:         1000000 kB\n";

    #[test]
    fn cgroup_v2_limit_along_the_path() {
        let r = root(&[
            ("proc/self/cgroup", "0::/kubepods/pod1/c1\n"),
            ("proc/meminfo", MEMINFO),
            ("sys/fs/cgroup/cgroup.controllers", "cpu memory\n"),
            ("sys/fs/cgroup/kubepods/memory.max", "max\n"),
            ("sys/fs/cgroup/kubepods/pod1/memory.max", "2147483648\n"),
            ("sys/fs/cgroup/kubepods/pod1/c1/memory.max", "max\n"),
        ]);
        assert_eq!(
            detect_memory_limit(r.path()),
            Some(MemoryLimit {
                bytes: 2 << 30,
                source: LimitSource::CgroupV2
            })
        );
        // In a cgroup namespace the container's own cgroup is the root.
        let r = root(&[
            ("proc/self/cgroup", "0::/\n"),
            ("proc/meminfo", MEMINFO),
            ("sys/fs/cgroup/cgroup.controllers", "memory\n"),
            ("sys/fs/cgroup/memory.max", "536870912\n"),
        ]);
        assert_eq!(detect_memory_limit(r.path()).unwrap().bytes, 512 << 20);
    }

    #[test]
    fn cgroup_v1_limit_and_its_unlimited_value() {
        let r = root(&[
            (
                "proc/self/cgroup",
                "5:cpu,cpuacct:/x\n4:memory:/docker/abc\n0::/\n",
            ),
            ("proc/meminfo", MEMINFO),
            (
                "sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            (
                "sys/fs/cgroup/memory/docker/abc/memory.limit_in_bytes",
                "536870912\n",
            ),
        ]);
        assert_eq!(
            detect_memory_limit(r.path()),
            Some(MemoryLimit {
                bytes: 512 << 20,
                source: LimitSource::CgroupV1
            })
        );
        // Without a cgroup namespace the path names the host's directory, absent in the
        // container: its own limit is at the mount's root.
        let r = root(&[
            ("proc/self/cgroup", "4:memory:/docker/abc\n"),
            ("proc/meminfo", MEMINFO),
            ("sys/fs/cgroup/memory/memory.limit_in_bytes", "1073741824\n"),
        ]);
        assert_eq!(detect_memory_limit(r.path()).unwrap().bytes, 1 << 30);
    }

    #[test]
    fn unlimited_cgroups_fall_back_to_the_host() {
        let host = MemoryLimit {
            bytes: 16318436 * 1024,
            source: LimitSource::Host,
        };
        let v2 = root(&[
            ("proc/self/cgroup", "0::/a\n"),
            ("proc/meminfo", MEMINFO),
            ("sys/fs/cgroup/cgroup.controllers", "memory\n"),
            ("sys/fs/cgroup/a/memory.max", "max\n"),
        ]);
        assert_eq!(detect_memory_limit(v2.path()), Some(host));
        let v1 = root(&[
            ("proc/self/cgroup", "4:memory:/\n"),
            ("proc/meminfo", MEMINFO),
            (
                "sys/fs/cgroup/memory/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
        ]);
        assert_eq!(detect_memory_limit(v1.path()), Some(host));
        // A cgroup limit above the host's memory is no limit either.
        let big = root(&[
            ("proc/self/cgroup", "0::/\n"),
            ("proc/meminfo", MEMINFO),
            ("sys/fs/cgroup/cgroup.controllers", "memory\n"),
            ("sys/fs/cgroup/memory.max", "68719476736\n"),
        ]);
        assert_eq!(detect_memory_limit(big.path()), Some(host));
        let none = root(&[("proc/self/cgroup", "0::/\n")]);
        assert_eq!(detect_memory_limit(none.path()), None);
    }

    fn limit(mib: u64) -> Option<MemoryLimit> {
        Some(MemoryLimit {
            bytes: mib << 20,
            source: LimitSource::CgroupV2,
        })
    }

    #[test]
    fn auto_sizes_keep_the_bound_within_the_allowance() {
        let cfg = Config::default();
        for (mib, workers) in [(512, 2), (1024, 1), (2048, 2), (4096, 4), (65536, 16)] {
            let s = cfg.sizing_for(limit(mib), workers);
            let allowed = s.allowed.unwrap();
            assert_eq!(allowed, (mib << 20) * 60 / 100);
            assert!(s.bound <= allowed, "{mib} MiB: {}", s.summary());
            assert!(s.max_body_bytes + s.max_decoded_bytes <= s.max_inflight_bytes);
            assert!(cfg.memory_warning(&s).is_none(), "{}", s.summary());
        }
        // 512 MiB, 2 workers: R = 307.2 - 192 = 115.2 MiB.
        let s = cfg.sizing_for(limit(512), 2);
        assert_eq!(
            s.derived_max_series,
            (115.2 * 1048576.0 / 4.0 / 448.0) as usize
        );
        // The cardinality guard's series: R / 16 at 56 bytes each, and its 10 MiB.
        assert_eq!(
            s.max_tracked_series,
            (115.2 * 1048576.0 / 16.0 / 56.0) as usize
        );
        assert_eq!(s.max_inflight_bytes, 17 << 20);
        assert_eq!(s.max_body_bytes, (17 << 20) / 4);
        assert_eq!(s.max_decoded_bytes, (17 << 20) - (17 << 20) / 4);
        // A large host: the fixed defaults cap the per-request limits and the state.
        let s = cfg.sizing_for(limit(65536), 16);
        assert_eq!(s.max_body_bytes, 32 << 20);
        assert_eq!(s.max_decoded_bytes, 256 << 20);
        assert_eq!(s.derived_max_series, 1_000_000);
        // No limit known: the fixed defaults.
        let s = cfg.sizing_for(None, 2);
        assert_eq!(s.max_inflight_bytes, 1 << 30);
        assert_eq!(s.derived_max_series, 1_000_000);
    }

    #[test]
    fn memory_queues_and_explicit_sizes_count() {
        let text = "backends:\n  - url: http://a/api/v1/write\n    queue: {type: memory}\n  - url: http://b/api/v1/write\n    queue: {type: disk, dir: /tmp/q}\n";
        let cfg = Config::parse(text, "q.yaml").unwrap();
        let s = cfg.sizing_for(limit(2048), 2);
        assert_eq!(s.queue_max_bytes[1], DISK_QUEUE_BYTES);
        // The memory queue's budget, and the disk queue's cache of what it wrote.
        assert_eq!(
            s.memory_queue_bytes,
            s.queue_max_bytes[0] + DISK_QUEUE_CACHE_BYTES
        );
        assert!(s.queue_max_bytes[0] >= 16 << 20 && s.bound <= s.allowed.unwrap());

        let text = "limits:\n  max_inflight_bytes: 1GiB\n";
        let cfg = Config::parse(text, "big.yaml").unwrap();
        let s = cfg.sizing_for(limit(512), 2);
        assert_eq!(s.max_inflight_bytes, 1 << 30);
        let w = cfg.memory_warning(&s).unwrap();
        assert!(w.starts_with("big.yaml:2:23: the memory bound "), "{w}");
        assert!(
            w.contains("exceeds the memory limit 512MiB (cgroup v2 memory.max)"),
            "{w}"
        );
        // Too small for the fixed part: floors, and a warning.
        let cfg = Config::default();
        let s = cfg.sizing_for(limit(256), 4);
        assert_eq!(s.max_inflight_bytes, MIN_INFLIGHT);
        let w = cfg.memory_warning(&s).unwrap();
        assert!(w.contains("exceeds the memory limit 256MiB"), "{w}");
        // Room for the bound, but not for the allowed part's fixed share.
        let s = cfg.sizing_for(limit(500), 4);
        assert!(s.bound <= 500 << 20);
        let w = cfg.memory_warning(&s).unwrap();
        assert!(w.contains("too small for promnorm's minimums"), "{w}");
    }
}

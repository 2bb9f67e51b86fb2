//! What a server reports about itself: a Prometheus text endpoint (`GET /metrics` on the
//! metrics port) and, when asked, one log line per table every few seconds. Per table: size,
//! episodes, inserts, samples, deletes, unique samples, calls waiting on the rate limiter and
//! their total wait, and why it blocks now; per server: open streams and the chunk bytes held.

use crate::tables::Tables;
use reverb_core::{Chunk, Table, Waiter};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

/// Open gRPC streams of a server, by kind.
#[derive(Debug, Default)]
pub struct Streams {
    insert: AtomicI64,
    sample: AtomicI64,
}

/// Which kind of stream.
#[derive(Debug, Clone, Copy)]
pub(crate) enum StreamKind {
    Insert,
    Sample,
}

/// Counts a stream as open until dropped.
pub(crate) struct OpenStream(Arc<Streams>, StreamKind);

impl Streams {
    fn counter(&self, kind: StreamKind) -> &AtomicI64 {
        match kind {
            StreamKind::Insert => &self.insert,
            StreamKind::Sample => &self.sample,
        }
    }

    /// Counts a stream of `kind` as open until the guard is dropped.
    pub(crate) fn open(self: &Arc<Self>, kind: StreamKind) -> OpenStream {
        self.counter(kind).fetch_add(1, Ordering::Relaxed);
        OpenStream(self.clone(), kind)
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.0.counter(self.1).fetch_sub(1, Ordering::Relaxed);
    }
}

/// Label value: `"` and `\` escaped, newlines removed.
fn label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', " ")
}

/// The metrics in Prometheus' text format (version 0.0.4).
pub fn render(tables: &Tables, streams: &Streams) -> String {
    let mut out = String::new();
    type Get = fn(&Table) -> f64;
    let per_table: [(&str, &str, &str, Get); 9] = [
        ("reverb_table_size", "gauge", "Items in the table.", |t| {
            t.size() as f64
        }),
        (
            "reverb_table_max_size",
            "gauge",
            "The table's max_size.",
            |t| t.config().max_size as f64,
        ),
        (
            "reverb_table_episodes",
            "gauge",
            "Episodes with an item in the table.",
            |t| t.info().num_episodes as f64,
        ),
        (
            "reverb_table_inserts_total",
            "counter",
            "Items inserted (rate limiter count).",
            |t| t.counters().0 as f64,
        ),
        (
            "reverb_table_samples_total",
            "counter",
            "Items sampled (rate limiter count).",
            |t| t.counters().1 as f64,
        ),
        (
            "reverb_table_deletes_total",
            "counter",
            "Items deleted (rate limiter count).",
            |t| t.counters().2 as f64,
        ),
        (
            "reverb_table_unique_samples_total",
            "counter",
            "Items sampled at least once.",
            |t| t.info().num_unique_samples as f64,
        ),
        (
            "reverb_table_inserts_waiting",
            "gauge",
            "Inserts waiting on the rate limiter now.",
            |t| t.waits(Waiter::Insert).0 as f64,
        ),
        (
            "reverb_table_samples_waiting",
            "gauge",
            "Sample calls waiting on the rate limiter now.",
            |t| t.waits(Waiter::Sample).0 as f64,
        ),
    ];
    for (name, kind, help, get) in per_table {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for t in tables.iter() {
            let _ = writeln!(out, "{name}{{table=\"{}\"}} {}", label(t.name()), get(t));
        }
    }
    let _ = writeln!(
        out,
        "# HELP reverb_table_wait_seconds_total Time calls waited on the rate limiter (ended \
         waits).\n# TYPE reverb_table_wait_seconds_total counter"
    );
    for t in tables.iter() {
        for (who, name) in [(Waiter::Insert, "insert"), (Waiter::Sample, "sample")] {
            let _ = writeln!(
                out,
                "reverb_table_wait_seconds_total{{table=\"{}\",call=\"{name}\"}} {}",
                label(t.name()),
                t.waits(who).1.as_secs_f64()
            );
        }
    }
    let _ = writeln!(
        out,
        "# HELP reverb_table_blocked Whether the rate limiter blocks a call of this kind now, \
         and why.\n# TYPE reverb_table_blocked gauge"
    );
    for t in tables.iter() {
        let (insert, sample) = t.block_reasons();
        for (call, reason) in [("insert", insert), ("sample", sample)] {
            let _ = writeln!(
                out,
                "reverb_table_blocked{{table=\"{}\",call=\"{call}\",reason=\"{}\"}} {}",
                label(t.name()),
                reason.map_or("none", |r| r.as_str()),
                u8::from(reason.is_some())
            );
        }
    }
    let (chunks, bytes) = Chunk::held();
    let _ = writeln!(
        out,
        "# HELP reverb_streams Open gRPC streams.\n# TYPE reverb_streams gauge\n\
         reverb_streams{{kind=\"insert\"}} {}\nreverb_streams{{kind=\"sample\"}} {}\n\
         # HELP reverb_chunks Chunks held by this process's servers (tables, streams, samples \
         in flight).\n# TYPE reverb_chunks gauge\nreverb_chunks {chunks}\n\
         # HELP reverb_chunk_bytes Payload bytes of those chunks.\n# TYPE reverb_chunk_bytes \
         gauge\nreverb_chunk_bytes {bytes}",
        streams.insert.load(Ordering::Relaxed),
        streams.sample.load(Ordering::Relaxed),
    );
    if let (Some(store), Some(journal)) = (tables.storage(), tables.journal()) {
        storage(&mut out, &store.stats(), &journal.stats());
    }
    out
}

/// The chunk store's lines (a server storing chunks on disk).
fn storage(
    out: &mut String,
    s: &reverb_core::chunk_store::StoreStats,
    j: &reverb_core::journal::JournalStats,
) {
    let lines: [(&str, &str, &str, String); 13] = [
        (
            "storage_chunks",
            "gauge",
            "Chunks whose payload is on disk.",
            s.chunks.to_string(),
        ),
        (
            "storage_disk_bytes",
            "gauge",
            "Bytes the chunk store's files take.",
            s.disk_bytes.to_string(),
        ),
        (
            "storage_live_bytes",
            "gauge",
            "Bytes of live chunks in those files.",
            s.live_bytes.to_string(),
        ),
        (
            "storage_compacted_bytes_total",
            "counter",
            "Bytes compaction copied.",
            s.compacted_bytes.to_string(),
        ),
        (
            "storage_cache_bytes",
            "gauge",
            "Payload bytes the chunk cache holds.",
            s.cache_bytes.to_string(),
        ),
        (
            "storage_cache_limit_bytes",
            "gauge",
            "The chunk cache's bound.",
            s.cache_limit.to_string(),
        ),
        (
            "storage_cache_hits_total",
            "counter",
            "Chunk reads the cache answered.",
            s.hits.to_string(),
        ),
        (
            "storage_cache_misses_total",
            "counter",
            "Chunk reads that went to disk.",
            s.misses.to_string(),
        ),
        (
            "storage_read_seconds_total",
            "counter",
            "Seconds chunk reads from disk took, in all (over the misses: the mean latency).",
            format!("{:.6}", s.read_seconds),
        ),
        (
            "storage_errors_total",
            "counter",
            "Chunk store reads and writes that failed.",
            s.errors.to_string(),
        ),
        (
            "storage_journal_bytes",
            "gauge",
            "Bytes of the journal file (a snapshot of the tables, then their changes).",
            j.bytes.to_string(),
        ),
        (
            "storage_journal_syncs_total",
            "counter",
            "Syncs of the journal that wrote changes.",
            j.syncs.to_string(),
        ),
        (
            "storage_journal_sync_seconds_total",
            "counter",
            "Seconds those syncs took (the chunk store's included).",
            format!("{:.6}", j.sync_seconds),
        ),
    ];
    for (name, kind, help, value) in lines {
        let _ = writeln!(
            out,
            "# HELP reverb_{name} {help}\n# TYPE reverb_{name} {kind}\nreverb_{name} {value}"
        );
    }
}

/// One log line per table (what `log_stats_every` prints).
pub fn summary(tables: &Tables) -> Vec<String> {
    tables
        .iter()
        .map(|t| {
            let (inserts, samples, deletes) = t.counters();
            let (insert, sample) = t.block_reasons();
            let blocked = |r: Option<reverb_core::BlockReason>| r.map_or("no", |r| r.as_str());
            format!(
                "table '{}': {} items (max {}), {inserts} inserts, {samples} samples, \
                 {deletes} deletes; inserts blocked: {}, samples blocked: {}",
                t.name(),
                t.size(),
                t.config().max_size,
                blocked(insert),
                blocked(sample)
            )
        })
        .collect()
}

/// Serves the metrics over HTTP/1.1 on `listener` until the task is dropped. Each
/// connection gets one response (any path; `HEAD` gets headers only); a client that sends no
/// complete request within 5 s, or more than 8 KiB of headers, is dropped.
pub(crate) async fn serve(listener: TcpListener, tables: Tables, streams: Arc<Streams>) {
    loop {
        let Ok((mut conn, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let (tables, streams) = (tables.clone(), streams.clone());
        tokio::spawn(async move {
            let mut request = Vec::new();
            let read = tokio::time::timeout(Duration::from_secs(5), async {
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 8192 {
                    let n = conn.read(&mut buf).await?;
                    if n == 0 {
                        break;
                    }
                    request.extend_from_slice(&buf[..n]);
                }
                Ok::<_, std::io::Error>(())
            });
            if !matches!(read.await, Ok(Ok(()))) || !request.windows(4).any(|w| w == b"\r\n\r\n") {
                return;
            }
            let head = request.starts_with(b"HEAD ");
            let (status, body) = if request.starts_with(b"GET ") || head {
                ("200 OK", render(&tables, &streams))
            } else {
                ("405 Method Not Allowed", String::new())
            };
            let mut response = format!(
                "HTTP/1.1 {status}\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            if !head {
                response.push_str(&body);
            }
            let _ = conn.write_all(response.as_bytes()).await;
            let _ = conn.shutdown().await;
        });
    }
}

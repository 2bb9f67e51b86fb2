//! The in-process sampling C ABI. The library holding the servers exports [`SampleFn`] as
//! [`SAMPLE_SYMBOL`]; a caller passes a sink and an [`EmitFn`] that receives each sample's
//! pieces in order.

use crate::sample::{plan, PlannedSample};
use crate::{ClientError, Result};
use bytes::Bytes;
use prost::Message;
use reverb_proto::{ChunkData, SampleInfo};
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tonic::Code;

/// A piece of a sample: a `SampleInfo` proto (starts a sample).
pub const INFO: u32 = 1;
/// A `ChunkData` proto without its `data` (the next piece carries it).
pub const CHUNK: u32 = 2;
/// The data bytes of the last chunk (copied by the receiver).
pub const DATA: u32 = 3;
/// An error message (the call's return value is the status code).
pub const ERROR: u32 = 4;
/// The data bytes of the last chunk, shared: `ptr` points at a [`SharedData`] the receiver
/// may keep past the call (it calls `release` once done with the bytes).
pub const SHARED_DATA: u32 = 5;

/// Bytes lent across the C ABI with their owner: `data` stays valid and unchanged until
/// `release(owner)` is called, which may happen on any thread, exactly once.
#[repr(C)]
pub struct SharedData {
    pub data: *const u8,
    pub len: usize,
    pub owner: *const c_void,
    pub release: unsafe extern "C" fn(owner: *const c_void),
}

/// Owns lent bytes on the receiving side (see [`SharedData`]).
struct Lent(SharedData);

// SAFETY: the lender's contract: the bytes are immutable while lent and `release` may be
// called from any thread.
unsafe impl Send for Lent {}

impl AsRef<[u8]> for Lent {
    fn as_ref(&self) -> &[u8] {
        if self.0.len == 0 {
            return &[];
        }
        // SAFETY: `data` points at `len` bytes that stay valid until `release` (in Drop).
        unsafe { std::slice::from_raw_parts(self.0.data, self.0.len) }
    }
}

impl Drop for Lent {
    fn drop(&mut self) {
        // SAFETY: called once, as the lender's contract requires.
        unsafe { (self.0.release)(self.0.owner) }
    }
}

/// Receives the pieces of the samples, in order; `ptr` is valid only during the call.
pub type EmitFn = unsafe extern "C" fn(sink: *mut c_void, kind: u32, ptr: *const u8, len: usize);

/// `reverb_inproc_sample_v3(port, table, table_len, max_items, wait_ms, cancel, sink, emit)`:
/// samples up to `max_items` items (none if the rate limiter blocks for `wait_ms`, or once
/// `*cancel` is set: a cancelled call takes no item after it sees the flag); returns a status
/// code (0: OK). `cancel` stays valid for the whole call.
pub type SampleFn = unsafe extern "C" fn(
    port: u16,
    table: *const u8,
    table_len: usize,
    max_items: usize,
    wait_ms: u64,
    cancel: *const AtomicBool,
    sink: *mut c_void,
    emit: EmitFn,
) -> i32;

/// The exported function's name (NUL-terminated, for `dlsym`).
pub const SAMPLE_SYMBOL: &[u8] = b"reverb_inproc_sample_v3\0";

/// A server of this process held by another library, sampled through its [`SampleFn`].
#[derive(Debug, Clone, Copy)]
pub struct Exported {
    pub sample: SampleFn,
    pub port: u16,
}

#[derive(Default)]
struct Sink {
    samples: Vec<(SampleInfo, Vec<ChunkData>)>,
    error: String,
    malformed: bool,
}

unsafe extern "C" fn emit(sink: *mut c_void, kind: u32, ptr: *const u8, len: usize) {
    // SAFETY: `sink` is the `Sink` that `Exported::sample` passed for this call, and `ptr`
    // points at `len` readable bytes for the duration of this callback (the exporter's
    // contract).
    let (sink, bytes) = unsafe {
        let bytes: &[u8] = if ptr.is_null() || len == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(ptr, len)
        };
        (&mut *(sink as *mut Sink), bytes)
    };
    match kind {
        INFO => match SampleInfo::decode(bytes) {
            Ok(info) => sink.samples.push((info, Vec::new())),
            Err(_) => sink.malformed = true,
        },
        CHUNK => match (ChunkData::decode(bytes), sink.samples.last_mut()) {
            (Ok(chunk), Some((_, chunks))) => chunks.push(chunk),
            _ => sink.malformed = true,
        },
        DATA => match sink.samples.last_mut().and_then(|(_, c)| c.last_mut()) {
            Some(chunk) => chunk.data = Bytes::copy_from_slice(bytes),
            None => sink.malformed = true,
        },
        // (A SHARED_DATA piece of another size would come from a mismatched build: it is
        // reported as malformed below, and its chunk reference leaks.)
        SHARED_DATA if bytes.len() == std::mem::size_of::<SharedData>() => {
            // SAFETY: for SHARED_DATA, `ptr` points at a `SharedData` (the exporter's
            // contract); read unaligned, as `ptr` came through as bytes.
            let lent =
                Lent(unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const SharedData) });
            match sink.samples.last_mut().and_then(|(_, c)| c.last_mut()) {
                Some(chunk) => chunk.data = Bytes::from_owner(lent),
                None => sink.malformed = true, // (dropping `lent` releases it)
            }
        }
        ERROR => sink.error = String::from_utf8_lossy(bytes).into_owned(),
        _ => sink.malformed = true,
    }
}

/// The longest one call waits, so that a stopped sampler stops soon.
const SLICE: Duration = Duration::from_millis(100);

impl Exported {
    /// Up to `max_items` samples of `table`, waiting at most `wait` for the first (an
    /// empty vector when the wait passed or `cancel` was set). Blocks: call it off the async
    /// runtime.
    pub fn sample_blocking(
        &self,
        table: &str,
        max_items: usize,
        wait: Duration,
        cancel: &AtomicBool,
    ) -> Result<Vec<PlannedSample>> {
        let mut sink = Sink::default();
        // SAFETY: `self.sample` is the exporter's function (looked up by SAMPLE_SYMBOL,
        // with this signature); the table bytes and the sink outlive the call.
        let code = unsafe {
            (self.sample)(
                self.port,
                table.as_ptr(),
                table.len(),
                max_items,
                wait.as_millis() as u64,
                cancel,
                &mut sink as *mut Sink as *mut c_void,
                emit,
            )
        };
        if code != 0 {
            return Err(ClientError::new(Code::from(code), sink.error));
        }
        if sink.malformed {
            return Err(ClientError::data_loss("Malformed in-process sample"));
        }
        sink.samples
            .into_iter()
            .map(|(info, chunks)| plan(info, &chunks))
            .collect()
    }

    /// Up to `max_items` samples of `table` (never none), waiting at most
    /// `rate_limiter_timeout` for the rate limiter (then DEADLINE_EXCEEDED), in blocking
    /// calls of at most 100 ms on the blocking pool. Dropping the future cancels the call in
    /// progress: it takes no item from then on (a caller that went away must not take items
    /// it will never receive).
    pub async fn sample(
        self,
        table: &str,
        max_items: usize,
        rate_limiter_timeout: Option<Duration>,
    ) -> Result<Vec<PlannedSample>> {
        let cancel = Arc::new(AtomicBool::new(false));
        let _cancel_on_drop = CancelOnDrop(cancel.clone());
        let mut blocked = Duration::ZERO;
        loop {
            let wait = rate_limiter_timeout
                .map_or(SLICE, |t| t.saturating_sub(blocked).min(SLICE))
                .max(Duration::from_millis(1));
            let name = table.to_string();
            let flag = cancel.clone();
            let got = tokio::task::spawn_blocking(move || {
                self.sample_blocking(&name, max_items, wait, &flag)
            })
            .await
            .unwrap_or_else(|_| {
                Err(ClientError::new(
                    Code::Internal,
                    "in-process sampling panicked",
                ))
            })?;
            if !got.is_empty() {
                return Ok(got);
            }
            blocked += wait;
            if rate_limiter_timeout.is_some_and(|t| blocked >= t) {
                return Err(ClientError::deadline(
                    "Rate Limiter: Timeout exceeded before the right to sample was acquired.",
                ));
            }
        }
    }
}

/// Sets its flag when dropped (with the future that owns it).
struct CancelOnDrop(Arc<AtomicBool>);

impl Drop for CancelOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static RELEASED: AtomicUsize = AtomicUsize::new(0);

    unsafe extern "C" fn release(owner: *const c_void) {
        assert_eq!(owner as usize, 42);
        RELEASED.fetch_add(1, Ordering::SeqCst);
    }

    fn send(sink: &mut Sink, kind: u32, bytes: &[u8]) {
        // SAFETY: `sink` is a live Sink and `bytes` is readable for the call.
        unsafe {
            emit(
                sink as *mut Sink as *mut c_void,
                kind,
                bytes.as_ptr(),
                bytes.len(),
            )
        }
    }

    #[test]
    fn lent_chunk_bytes_are_shared_and_released_once_when_dropped() {
        static DATA: [u8; 5] = [1, 2, 3, 4, 5];
        let mut sink = Sink::default();
        send(&mut sink, INFO, &SampleInfo::default().encode_to_vec());
        send(
            &mut sink,
            CHUNK,
            &ChunkData {
                chunk_key: 7,
                ..Default::default()
            }
            .encode_to_vec(),
        );
        let lent = SharedData {
            data: DATA.as_ptr(),
            len: DATA.len(),
            owner: 42 as *const c_void,
            release,
        };
        // SAFETY: viewing a live repr(C) struct as bytes during the call.
        let bytes = unsafe {
            std::slice::from_raw_parts(
                &lent as *const SharedData as *const u8,
                std::mem::size_of::<SharedData>(),
            )
        };
        send(&mut sink, SHARED_DATA, bytes);
        assert!(!sink.malformed);
        let data = sink.samples[0].1[0].data.clone();
        assert_eq!(&data[..], &DATA[..]);
        assert_eq!(data.as_ptr(), DATA.as_ptr(), "shared, not copied");
        drop(sink);
        assert_eq!(RELEASED.load(Ordering::SeqCst), 0, "a clone still holds it");
        drop(data);
        assert_eq!(RELEASED.load(Ordering::SeqCst), 1);
    }
}

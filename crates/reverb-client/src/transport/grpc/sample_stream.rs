//! A `SampleStream` call as a [`SampleStream`]: requests go out on the call's request side,
//! responses are gathered into samples ([`PartialSample`]) and planned. With a
//! shared-memory ring (offered in the call's metadata), big chunks arrive as positions in
//! the ring; the stream reports what it consumed each time another sixteenth is free. A
//! stream asking for columns (`columnar`) gets a batch's samples as rows of columns from our
//! servers ([`Columns`]), and entries from others (or for what cannot be gathered).
//!
//! A stream opened for one-shot calls (`one_shot`) may be one an earlier call left open, and
//! is left open for the next call once everything it was asked for arrived: one round trip
//! instead of opening a call. A reused call cut off before it answered (the server stopped
//! or restarted since) served none of its request: its error is marked `unsent`, and the
//! caller opens a fresh one.

use super::call::{self, Call};
use crate::sample::{plan, Columns, PartialSample};
use crate::transport::shm::{self, Ring};
use crate::transport::SampleStream;
use crate::transport::{BoxFuture, SampleStreamOptions};
use crate::{Client, ClientError, Result, Sampled};
use reverb_proto::sample_stream_response::SampleEntry;
use reverb_proto::shm::METADATA_KEY;
use reverb_proto::{SampleBatch, SampleStreamRequest, Timeout};
use std::time::Duration;
use tokio::sync::mpsc;
use tokio_stream::wrappers::UnboundedReceiverStream;
use tonic::metadata::MetadataMap;
use tonic::Code;

/// A `SampleStreamRequest`; `None` waits for the rate limiter forever.
pub(crate) fn request(
    table: &str,
    num_samples: usize,
    rate_limiter_timeout: Option<Duration>,
) -> SampleStreamRequest {
    SampleStreamRequest {
        table: table.to_string(),
        num_samples: num_samples as i64,
        rate_limiter_timeout: Some(Timeout {
            milliseconds: rate_limiter_timeout.map_or(-1, |t| t.as_millis().max(1) as i64),
        }),
        ..Default::default()
    }
}

pub(crate) struct GrpcSampleStream {
    client: Client,
    /// The call (taken when the stream is dropped).
    call: Option<Call>,
    ring: Option<Ring>,
    partial: PartialSample,
    /// Samples requested and not received.
    outstanding: usize,
    /// The call was kept open by an earlier one-shot call.
    reused: bool,
    /// A response arrived.
    answered: bool,
    /// Keep the call open for the next one-shot call once served in full.
    keep: bool,
    /// The call failed.
    failed: bool,
    /// Batches as columns are asked for.
    columnar: bool,
    /// The entries of the last response not handled yet.
    entries: std::vec::IntoIter<SampleEntry>,
}

impl GrpcSampleStream {
    /// Opens the stream with its first `request` (of `n` samples).
    pub(crate) async fn open(
        client: &Client,
        request: SampleStreamRequest,
        n: usize,
        options: SampleStreamOptions,
    ) -> Result<Self> {
        let mut stream = Self {
            client: client.clone(),
            call: None,
            ring: None,
            partial: PartialSample::default(),
            outstanding: n,
            reused: false,
            answered: false,
            keep: options.one_shot,
            failed: false,
            columnar: options.columnar,
            entries: Vec::new().into_iter(),
        };
        if options.one_shot && !options.fresh {
            // (A kept call was checked to be alive when taken; one whose request side
            // closed since is dropped.)
            while let Some(kept) = client.kept_streams.take() {
                if kept.requests.send(request.clone()).is_ok() {
                    stream.call = Some(kept);
                    stream.reused = true;
                    return Ok(stream);
                }
            }
        }
        stream.ring = options
            .ring_bytes
            .filter(|_| !options.one_shot && shm::is_this_host(client.address()))
            .and_then(|bytes| Ring::create(bytes).ok());
        let mut metadata = MetadataMap::new();
        if let Some(offer) = stream.ring.as_ref().and_then(|r| r.offer().parse().ok()) {
            metadata.insert(METADATA_KEY, offer);
        }
        // The request goes first: some servers answer a call only with its first response.
        let (requests, rx) = mpsc::unbounded_channel();
        let _ = requests.send(stream.reporting(request));
        let responses = call::sample_stream(
            client.channel.clone(),
            UnboundedReceiverStream::new(rx),
            metadata,
            client.max_message_size(),
        )
        .await
        .map_err(|s| client.status(s))?;
        stream.call = Some(Call {
            requests,
            responses,
        });
        Ok(stream)
    }

    /// `request`, reporting how much of the ring is consumed.
    fn reporting(&self, request: SampleStreamRequest) -> SampleStreamRequest {
        SampleStreamRequest {
            shm_released: self.ring.as_ref().and_then(Ring::report).unwrap_or(0),
            ..request
        }
    }

    /// The samples of a batch that arrived as columns (one with `entries` too is malformed).
    fn rows(&mut self, mut batch: SampleBatch, entries: bool) -> Result<Vec<Result<Sampled>>> {
        let address = self.client.address();
        let malformed = |what: &str| {
            ClientError::data_loss(format!(
                "Server at {address} sent a malformed sample stream: {what}"
            ))
        };
        if !self.columnar {
            return Err(malformed("columns that were not asked for"));
        }
        if entries || self.partial.started() {
            return Err(malformed("columns amid a sample's entries"));
        }
        for column in batch.columns.iter_mut().filter(|c| c.shm_length > 0) {
            let (at, len) = (column.shm_position, column.shm_length);
            column.data = ring_bytes(self.ring.as_ref(), &column.data, at, len).map_err(|e| {
                ClientError::data_loss(format!(
                    "Server at {address} sent a bad shared-memory column: {e}"
                ))
            })?;
        }
        let rows = Columns::rows(batch)?;
        if rows.is_empty() {
            return Err(malformed("an empty batch"));
        }
        if rows.len() > self.outstanding {
            return Err(ClientError::data_loss(format!(
                "Server at {address} sent more samples than requested"
            )));
        }
        self.outstanding -= rows.len();
        Ok(rows.into_iter().map(Ok).collect())
    }

    /// The error that ends the stream.
    fn fail(&mut self, error: ClientError) -> ClientError {
        self.failed = true;
        error
    }
}

impl SampleStream for GrpcSampleStream {
    fn request(
        &mut self,
        table: &str,
        n: usize,
        rate_limiter_timeout: Option<Duration>,
    ) -> Result<()> {
        let request = self.reporting(SampleStreamRequest {
            columnar: self.columnar,
            ..request(table, n, rate_limiter_timeout)
        });
        if let Some(call) = &self.call {
            // (A request that cannot be sent ends the call: `next` says how.)
            let _ = call.requests.send(request);
        }
        self.outstanding += n;
        Ok(())
    }

    fn next(&mut self) -> BoxFuture<'_, Result<Vec<Result<Sampled>>>> {
        Box::pin(async move {
            loop {
                // The entries of the last response come first, each sample handed out as soon
                // as it is complete: its consumer copies it while the next one is gathered.
                while let Some(mut entry) = self.entries.next() {
                    let complete = from_ring(&mut entry, self.ring.as_ref(), self.client.address())
                        .and_then(|()| self.partial.add(entry));
                    match complete {
                        Err(e) => return Err(self.fail(e)),
                        Ok(None) => {}
                        Ok(Some((info, chunks))) => {
                            if self.outstanding == 0 {
                                let e = ClientError::data_loss(format!(
                                    "Server at {} sent more samples than requested",
                                    self.client.address()
                                ));
                                return Err(self.fail(e));
                            }
                            self.outstanding -= 1;
                            return Ok(vec![plan(info, &chunks).map(Sampled::Planned)]);
                        }
                    }
                }
                let Some(call) = self.call.as_mut() else {
                    return Err(ClientError::new(
                        Code::Unavailable,
                        "the sample stream closed",
                    ));
                };
                // A kept call cut off before it answered served none of its request.
                let unanswered = self.reused && !self.answered;
                let response = match call.responses.message().await {
                    Ok(Some(r)) => r,
                    Ok(None) => {
                        let mut e = ClientError::new(
                            Code::Internal,
                            format!(
                                "Server at {} ended the sample stream early",
                                self.client.address()
                            ),
                        );
                        e.unsent = unanswered;
                        return Err(self.fail(e));
                    }
                    Err(status) => {
                        let cut_off = matches!(
                            status.code(),
                            Code::Unavailable | Code::Cancelled | Code::Unknown
                        );
                        let mut e = self.client.status(status);
                        // (Once the call is open, nothing else is tried again.)
                        e.unsent = cut_off && unanswered;
                        return Err(self.fail(e));
                    }
                };
                self.answered = true;
                // Releases are reported each time another sixteenth of the ring is free.
                if let Some((ring, released)) = self
                    .ring
                    .as_ref()
                    .and_then(|r| Some((r, r.unreported(r.size() as u64 / 16)?)))
                {
                    let report = SampleStreamRequest {
                        shm_released: released,
                        ..Default::default()
                    };
                    if call.requests.send(report).is_ok() {
                        ring.reported(released);
                    }
                }
                if let Some(batch) = response.batch {
                    let rows = self.rows(batch, !response.entries.is_empty());
                    return rows.map_err(|e| self.fail(e));
                }
                self.entries = response.entries.into_iter();
            }
        })
    }
}

impl Drop for GrpcSampleStream {
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        // A call served in full is kept for the next one-shot call; one that failed or is
        // dropped part-way (a call that timed out with a request still being served) is
        // dropped, which resets it.
        let served = !self.failed
            && self.outstanding == 0
            && self.entries.len() == 0
            && !self.partial.started();
        if self.keep && served {
            self.client.kept_streams.give_back(call);
        }
    }
}

/// The `len` bytes at `position` of the ring, for a field whose `inline` bytes must be empty.
fn ring_bytes(
    ring: Option<&Ring>,
    inline: &[u8],
    position: u64,
    len: u64,
) -> std::result::Result<bytes::Bytes, String> {
    match ring {
        _ if !inline.is_empty() => Err("it also has inline bytes".to_string()),
        Some(ring) => ring.take(position, len),
        None => Err("no ring was offered".to_string()),
    }
}

/// Replaces the entry's shared-memory chunk references by the bytes they point to.
fn from_ring(entry: &mut SampleEntry, ring: Option<&Ring>, address: &str) -> Result<()> {
    for chunk in entry.data.iter_mut().filter(|c| c.shm_length > 0) {
        let (at, len) = (chunk.shm_position, chunk.shm_length);
        chunk.data = ring_bytes(ring, &chunk.data, at, len).map_err(|e| {
            ClientError::data_loss(format!(
                "Server at {address} sent a bad shared-memory chunk: {e}"
            ))
        })?;
        chunk.shm_length = 0;
        chunk.shm_position = 0;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use reverb_proto::ChunkData;

    fn entry(position: u64, length: u64) -> SampleEntry {
        SampleEntry {
            data: vec![ChunkData {
                shm_position: position,
                shm_length: length,
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn ring_references_without_a_ring_or_outside_it_are_data_loss() {
        let err = from_ring(&mut entry(0, 10), None, "here:1").unwrap_err();
        assert_eq!(err.code, Code::DataLoss);
        assert!(
            err.message.contains("no ring was offered"),
            "{}",
            err.message
        );
        let ring = Ring::create(1 << 20).unwrap();
        let err = from_ring(&mut entry(1 << 20, 10), Some(&ring), "here:1").unwrap_err();
        assert!(err.message.contains("outside the ring"), "{}", err.message);
        let mut both = entry(0, 10);
        both.data[0].data = vec![1].into();
        let err = from_ring(&mut both, Some(&ring), "here:1").unwrap_err();
        assert!(
            err.message.contains("also has inline bytes"),
            "{}",
            err.message
        );
        let mut ok = entry(0, 10);
        from_ring(&mut ok, Some(&ring), "here:1").unwrap();
        assert_eq!((ok.data[0].data.len(), ok.data[0].shm_length), (10, 0));
    }
}

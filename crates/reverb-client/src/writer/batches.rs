//! The batch writer (`Client.batch_writer`): batches of steps inserted as items (N steps, N
//! items per table: the requests of [`super::runs::run_requests`]) on an insert stream of its
//! own, with several batches in flight. Where `Client::insert_requests` waits a round trip
//! per batch, [`BatchWriter::insert`] returns once the batch is sent and at most
//! `max_in_flight_items` items are unconfirmed, so the caller makes its next batch while the
//! server stores this one; [`BatchWriter::flush`] waits for the rest.
//!
//! A batch stays in flight from the call that takes it until the server confirms it, through
//! every failure but a refusal:
//! - A batch the server refuses is dropped and its error is the error of the call that
//!   learns of it (one that waits for confirmations); the batches sent after it go again on
//!   a new stream. A flush goes on until everything else is confirmed, then reports it.
//! - A stream that closes (a restarted server, a broken connection), a call cut short
//!   (Ctrl-C, a timeout while waiting) and a server that cannot be reached leave the batches
//!   in flight: the next call sends them again on a new stream. Delivery is then at least
//!   once: the server takes a key it holds as a priority update, but an item a sampler took
//!   from a queue before its batch went again is inserted again.
//! - A batch whose send the deadline cuts short (only a server of this process, which stores
//!   a request as it takes it, makes a send wait) keeps what was stored and loses the rest.
//! - [`MAX_CLOSINGS`] streams closed in a row without a confirmation fail the call (the
//!   batches stay in flight); any other failure (a wrong token, say) drops them, saying so.

use crate::transport::InsertStream;
use crate::{Client, ClientError, Result};
use futures::FutureExt;
use reverb_proto::InsertStreamRequest;
use std::collections::VecDeque;
use std::time::Instant;
use tonic::Code;

/// Streams that may close in a row without confirming anything before a call fails.
pub const MAX_CLOSINGS: u32 = 3;

/// Batches of steps as items on one insert stream, several in flight (see the module).
pub struct BatchWriter {
    client: Client,
    max_in_flight_items: usize,
    stream: Option<Box<dyn InsertStream>>,
    /// Batches sent (or to send again) and not wholly confirmed, oldest first.
    in_flight: VecDeque<Batch>,
    /// What the stream received is unknown (a send or an opening was cut short): the next
    /// call opens a new one and sends everything in flight on it.
    broken: bool,
    /// Streams closed in a row without confirming a whole batch.
    closings: u32,
    /// The next batch's id.
    next_id: u64,
}

/// One batch's requests, kept until its items are confirmed.
struct Batch {
    /// Its number among the writer's batches.
    id: u64,
    requests: Vec<InsertStreamRequest>,
    items: usize,
    /// Its items the current stream has not confirmed.
    left: usize,
}

/// What a wait for confirmations does when the server refuses a batch.
#[derive(Clone, Copy, PartialEq)]
enum OnRefusal {
    /// Returns the refusal.
    Stop,
    /// Goes on until done, then returns the first refusal.
    Continue,
}

impl BatchWriter {
    /// A writer whose inserts wait while more than `max_in_flight_items` items (at least 1)
    /// would be unconfirmed.
    pub fn new(client: Client, max_in_flight_items: usize) -> Self {
        Self {
            client,
            max_in_flight_items: max_in_flight_items.max(1),
            stream: None,
            in_flight: VecDeque::new(),
            broken: false,
            closings: 0,
            next_id: 0,
        }
    }

    /// Items sent (or to send again) and not confirmed yet.
    pub fn unconfirmed(&self) -> usize {
        self.in_flight.iter().map(|b| b.left).sum()
    }

    /// Sends one batch's `requests` (from [`super::runs::run_requests`]) once the items in
    /// flight leave room for it (an empty writer takes any batch), by `deadline`. An earlier
    /// batch's refusal learned while waiting for room is this call's error, and this batch is
    /// then not taken; once taken, a batch stays in flight whatever the call returns.
    pub async fn insert(
        &mut self,
        requests: Vec<InsertStreamRequest>,
        deadline: Option<Instant>,
    ) -> Result<()> {
        let items = super::runs::item_count(&requests);
        if items == 0 {
            return Ok(());
        }
        let max = self.max_in_flight_items;
        let room = |unconfirmed: usize| unconfirmed == 0 || unconfirmed + items <= max;
        self.settle(deadline, room, OnRefusal::Stop).await?;
        let id = self.next_id;
        self.next_id += 1;
        self.in_flight.push_back(Batch {
            id,
            requests,
            items,
            left: items,
        });
        if self.stream.is_none() {
            return self.reopen(deadline, Some(id)).await;
        }
        let last = self.in_flight.len() - 1;
        self.send_from(last, deadline, Some(id)).await
    }

    /// Waits until at most `block_until` items are unconfirmed, by `deadline` (then
    /// DEADLINE_EXCEEDED, everything still in flight). A refusal learned meanwhile is the
    /// error, once the rest is confirmed.
    pub async fn flush(&mut self, block_until: usize, deadline: Option<Instant>) -> Result<()> {
        let done = |unconfirmed: usize| unconfirmed <= block_until;
        self.settle(deadline, done, OnRefusal::Continue).await
    }

    /// Closes the stream; the items in flight are no longer followed (unconfirmed ones may
    /// be lost).
    pub fn close(&mut self) {
        self.stream = None;
        self.in_flight.clear();
        self.broken = false;
    }

    /// Takes confirmations (waiting for them by `deadline`) until `done(unconfirmed)`,
    /// sending what is in flight again first if the last stream broke.
    async fn settle(
        &mut self,
        deadline: Option<Instant>,
        done: impl Fn(usize) -> bool,
        on_refusal: OnRefusal,
    ) -> Result<()> {
        let mut refusal: Option<ClientError> = None;
        let result = loop {
            if self.broken || (self.stream.is_none() && !self.in_flight.is_empty()) {
                if let Err(e) = self.reopen(deadline, None).await {
                    break Err(e);
                }
            }
            let unconfirmed = self.unconfirmed();
            if done(unconfirmed) {
                break Ok(());
            }
            let Some(stream) = self.stream.as_mut() else {
                break Ok(()); // (nothing in flight: `done(0)` holds for every caller)
            };
            let next = stream.confirmed();
            let confirmed = match deadline {
                None => next.await,
                Some(d) => match tokio::time::timeout_at(d.into(), next).await {
                    Ok(confirmed) => confirmed,
                    Err(_) => {
                        break Err(ClientError::deadline(format!(
                            "Timeout exceeded: {unconfirmed} items the batch writer sent to {} \
                             are not confirmed yet (they stay in flight)",
                            self.client.address()
                        )))
                    }
                },
            };
            let e = match confirmed {
                Ok(Some(keys)) => {
                    self.retire(keys.len());
                    continue;
                }
                Ok(None) => ClientError::new(
                    Code::Unavailable,
                    format!(
                        "Server at {} closed the insert stream before confirming every item",
                        self.client.address()
                    ),
                ),
                Err(e) => e,
            };
            match self.failed(e) {
                Failure::Refused(e) if on_refusal == OnRefusal::Continue => {
                    refusal.get_or_insert(e);
                }
                Failure::Refused(e) => {
                    // (The batches after it go again now, not at the next call.)
                    let again = self.reopen(deadline, None).await;
                    break Err(match again {
                        Ok(()) => e,
                        Err(again) => ClientError {
                            message: format!(
                                "{}; sending the batches after it again failed: {}",
                                e.message, again.message
                            ),
                            ..e
                        },
                    });
                }
                Failure::Closed => {
                    // (A server short of memory or disk for now answers so too: a pause
                    // before the next stream, up to the deadline.)
                    let pause = std::time::Duration::from_millis(1 << (2 * self.closings));
                    let until = deadline.map_or(pause, |d| {
                        pause.min(d.saturating_duration_since(Instant::now()))
                    });
                    tokio::time::sleep(until).await;
                }
                Failure::Fatal(e) => break Err(e),
            }
        };
        match (refusal, result) {
            (None, result) => result,
            (Some(refusal), Ok(())) => Err(refusal),
            // (What failed after the refusal says what became of the rest.)
            (Some(refusal), Err(e)) => Err(ClientError {
                message: format!("{}; before that: {}", e.message, refusal.message),
                ..e
            }),
        }
    }

    /// Takes `n` confirmed items off the oldest batches.
    fn retire(&mut self, mut n: usize) {
        while n > 0 {
            let Some(batch) = self.in_flight.front_mut() else {
                return;
            };
            let taken = n.min(batch.left);
            batch.left -= taken;
            n -= taken;
            if batch.left == 0 {
                self.in_flight.pop_front();
                self.closings = 0;
            }
        }
    }

    /// What the stream's failure `e` means for the batches in flight (the stream is done
    /// either way: the next wait opens a new one).
    fn failed(&mut self, e: ClientError) -> Failure {
        self.broken = true;
        if super::stream::refuses_item(e.code) {
            // The server answers in order: the oldest batch not confirmed is the one.
            let refused = self.in_flight.pop_front().map_or(0, |b| b.left);
            let again = self.unconfirmed();
            return Failure::Refused(ClientError {
                message: format!(
                    "{} (the server refused {refused} items of a batch; the {again} items sent \
                     after them go again)",
                    e.message
                ),
                ..e
            });
        }
        if crate::client::closed(&e) || e.code == Code::ResourceExhausted {
            self.closings += 1;
            if self.closings >= MAX_CLOSINGS {
                self.closings = 0;
                return Failure::Fatal(ClientError {
                    message: format!(
                        "{} (the insert stream failed {MAX_CLOSINGS} times in a row without \
                         confirming a batch; the batch writer's {} items stay in flight)",
                        e.message,
                        self.unconfirmed()
                    ),
                    ..e
                });
            }
            return Failure::Closed;
        }
        let lost = self.unconfirmed();
        self.close();
        Failure::Fatal(ClientError {
            message: format!(
                "{} ({lost} items the batch writer sent were not confirmed and may not be stored)",
                e.message
            ),
            ..e
        })
    }

    /// A new stream with every batch in flight sent on it, oldest first: confirmations the
    /// old stream holds are taken first (a server of this process confirms a request as it
    /// stores it), so what was confirmed does not go again.
    async fn reopen(&mut self, deadline: Option<Instant>, own: Option<u64>) -> Result<()> {
        self.broken = true;
        if let Some(mut old) = self.stream.take() {
            self.take_confirmed(&mut *old);
        }
        if self.in_flight.is_empty() {
            self.broken = false;
            return Ok(());
        }
        for batch in &mut self.in_flight {
            batch.left = batch.items;
        }
        let server = self.client.server();
        let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
        server
            .ready("InsertStream", timeout, deadline.map(Into::into))
            .await?;
        self.stream = Some(server.insert_stream());
        self.send_from(0, deadline, own).await
    }

    /// Takes the confirmations `stream` holds already, without waiting.
    fn take_confirmed(&mut self, stream: &mut dyn InsertStream) {
        while let Some(Ok(Some(keys))) = stream.confirmed().now_or_never() {
            self.retire(keys.len());
        }
    }

    /// Sends the batches in flight from index `first` on, on the stream. When the deadline
    /// cuts short the send of batch `own` (the one the calling insert took; a server of this
    /// process stores a request as it takes it, and waits while its rate limiter blocks),
    /// that batch is dropped: the items stored before the timeout stay and the others are
    /// never stored, as with `Client::insert_requests`. Any other batch stays in flight.
    async fn send_from(
        &mut self,
        first: usize,
        deadline: Option<Instant>,
        own: Option<u64>,
    ) -> Result<()> {
        // (Until every request is sent: a call cut short leaves it set.)
        self.broken = true;
        let mut stream = self.stream.take().expect("a stream to send on");
        let until = deadline.map(tokio::time::Instant::from);
        let mut cut = None;
        let mut ended = None;
        'batches: for batch in self.in_flight.iter().skip(first) {
            for request in &batch.requests {
                let sent = match until {
                    None => stream.send(request.clone()).await,
                    Some(d) => match tokio::time::timeout_at(d, stream.send(request.clone())).await
                    {
                        Ok(sent) => sent,
                        Err(_) => {
                            cut = Some(batch.id);
                            break 'batches;
                        }
                    },
                };
                if let Err(e) = sent {
                    ended = Some(e);
                    break 'batches;
                }
            }
        }
        if let Some(id) = cut {
            // (The stream stays broken: the next call opens a new one.)
            let dropped = own == Some(id);
            if dropped {
                // Its stored requests' confirmations first (with those of the batches
                // before it), so that none counts for a later batch.
                self.take_confirmed(&mut *stream);
                self.in_flight.retain(|b| b.id != id);
            }
            self.stream = Some(stream);
            return Err(ClientError::deadline(if dropped {
                "Timeout exceeded while the batch writer sent a batch: the items stored before \
                 the timeout stay, the others are not stored"
            } else {
                "Timeout exceeded while the batch writer sent its batches again: they stay in \
                 flight"
            }));
        }
        self.stream = Some(stream);
        self.broken = false;
        match ended {
            // The stream ended (a refusal of an earlier request, or the connection): what was
            // not sent stays in flight, and the next wait for confirmations learns why from
            // the stream (then sends it again).
            Some(e) if crate::client::closed(&e) || super::stream::refuses_item(e.code) => Ok(()),
            // The call itself failed (a wrong token, say).
            Some(e) => match self.failed(e) {
                Failure::Fatal(e) | Failure::Refused(e) => Err(e),
                Failure::Closed => Ok(()),
            },
            None => Ok(()),
        }
    }
}

/// What a stream's failure means (see [`BatchWriter::failed`]).
enum Failure {
    /// The server refused the oldest batch (dropped): the error.
    Refused(ClientError),
    /// The stream closed: the batches go again.
    Closed,
    /// The call fails.
    Fatal(ClientError),
}

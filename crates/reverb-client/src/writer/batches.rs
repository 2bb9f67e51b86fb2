//! The batch writer (`Client.batch_writer`): batches of steps inserted as items (N steps, N
//! items per table: the requests of [`super::runs::run_requests`]) on an insert stream of its
//! own, with several batches in flight. Where `Client::insert_requests` waits a round trip
//! per batch, [`BatchWriter::insert`] returns once the batch is sent and at most
//! `max_in_flight_items` items are unconfirmed, so the caller makes its next batch while the
//! server stores this one; [`BatchWriter::flush`] waits for the rest.
//!
//! A batch the server refuses fails the call that learns of it (an insert or a flush); the
//! batches sent after it go again on a new stream, as do those of a stream that closed
//! before confirming them (a restarted server, a broken connection): the server takes a key
//! it holds as a priority update, so a batch stored twice holds its items once. A batch is
//! sent at most [`MAX_SENDS`] times; past that, the call says how many items may be lost.

use crate::transport::InsertStream;
use crate::{Client, ClientError, Result};
use reverb_proto::InsertStreamRequest;
use std::collections::VecDeque;
use std::time::Instant;
use tonic::Code;

/// Sends of one batch (the first, then again on new streams) before the writer gives up on it.
pub const MAX_SENDS: u32 = 3;

/// Batches of steps as items on one insert stream, several in flight (see the module).
pub struct BatchWriter {
    client: Client,
    max_in_flight_items: usize,
    stream: Option<Box<dyn InsertStream>>,
    /// Batches sent and not wholly confirmed, oldest first.
    in_flight: VecDeque<Batch>,
    /// A send was cut short (its call dropped): what the stream received is unknown, so the
    /// next call sends everything in flight again on a new stream.
    sending: bool,
}

/// One batch's requests, kept until its items are confirmed.
struct Batch {
    requests: Vec<InsertStreamRequest>,
    items: usize,
    /// Its items the current stream has not confirmed.
    left: usize,
    sends: u32,
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
            sending: false,
        }
    }

    /// Items sent and not confirmed yet.
    pub fn unconfirmed(&self) -> usize {
        self.in_flight.iter().map(|b| b.left).sum()
    }

    /// Closes the stream; the items in flight are no longer followed (unconfirmed ones may
    /// be lost).
    pub fn close(&mut self) {
        self.stream = None;
        self.in_flight.clear();
        self.sending = false;
    }

    /// Sends one batch's `requests` (from [`super::runs::run_requests`]) once the items in
    /// flight leave room for it (an empty writer takes any batch), by `deadline`. The error
    /// of an earlier batch the server refused is this call's, and this batch is then not
    /// sent.
    pub async fn insert(
        &mut self,
        requests: Vec<InsertStreamRequest>,
        deadline: Option<Instant>,
    ) -> Result<()> {
        let items: usize = requests
            .iter()
            .map(|r| r.items.len() + r.item_runs.iter().map(|run| run.keys.len()).sum::<usize>())
            .sum();
        if items == 0 {
            return Ok(());
        }
        let max = self.max_in_flight_items;
        self.settle(deadline, |unconfirmed| {
            unconfirmed == 0 || unconfirmed + items <= max
        })
        .await?;
        self.in_flight.push_back(Batch {
            requests,
            items,
            left: items,
            sends: 0,
        });
        let sent = self.in_flight.len() - 1;
        self.send_from(sent, deadline).await
    }

    /// Waits until at most `block_until` items are unconfirmed, by `deadline` (then
    /// DEADLINE_EXCEEDED, everything still in flight).
    pub async fn flush(&mut self, block_until: usize, deadline: Option<Instant>) -> Result<()> {
        self.settle(deadline, |unconfirmed| unconfirmed <= block_until)
            .await
    }

    /// Takes confirmations (waiting for them by `deadline`) until `done(unconfirmed)`.
    async fn settle(
        &mut self,
        deadline: Option<Instant>,
        done: impl Fn(usize) -> bool,
    ) -> Result<()> {
        if self.sending {
            self.reopen(deadline).await?;
        }
        loop {
            let unconfirmed = self.unconfirmed();
            if done(unconfirmed) {
                return Ok(());
            }
            let Some(stream) = self.stream.as_mut() else {
                // (Nothing in flight without a stream: `done(0)` holds for every caller.)
                return Ok(());
            };
            let next = stream.confirmed();
            let confirmed = match deadline {
                None => next.await,
                Some(d) => match tokio::time::timeout_at(d.into(), next).await {
                    Ok(confirmed) => confirmed,
                    Err(_) => {
                        return Err(ClientError::deadline(format!(
                            "Timeout exceeded: {unconfirmed} items the batch writer sent to {} \
                             are not confirmed yet (they stay in flight)",
                            self.client.address()
                        )))
                    }
                },
            };
            match confirmed {
                Ok(Some(keys)) => self.retire(keys.len()),
                Ok(None) => {
                    let closed = ClientError::new(
                        Code::Unavailable,
                        format!(
                            "Server at {} closed the insert stream before confirming every item",
                            self.client.address()
                        ),
                    );
                    self.failed(closed, deadline).await?
                }
                Err(e) => self.failed(e, deadline).await?,
            }
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
            }
        }
    }

    /// The stream failed with `e`: a refusal drops the oldest unconfirmed batch and is the
    /// error; a closed stream is not (the batches go again on a new one); any other failure
    /// drops everything in flight. Either way, the batches still in flight go again on a new
    /// stream.
    async fn failed(&mut self, e: ClientError, deadline: Option<Instant>) -> Result<()> {
        self.stream = None;
        if super::stream::refuses_item(e.code) {
            let refused = self.in_flight.pop_front().map_or(0, |b| b.items);
            let again = self.unconfirmed();
            let mut e = e;
            e.message = format!(
                "{} (the server refused a batch of {refused} items; the {again} items sent \
                 after it were sent again)",
                e.message
            );
            if let Err(again) = self.reopen(deadline).await {
                e.message = format!(
                    "{}; sending them again failed: {}",
                    e.message, again.message
                );
            }
            return Err(e);
        }
        if crate::client::closed(&e) {
            return self.reopen(deadline).await;
        }
        Err(self.give_up(e))
    }

    /// Drops every batch in flight, saying so in `e`.
    fn give_up(&mut self, mut e: ClientError) -> ClientError {
        let lost = self.unconfirmed();
        if lost > 0 {
            e.message = format!(
                "{} ({lost} items the batch writer sent were not confirmed and may not be stored)",
                e.message
            );
        }
        self.in_flight.clear();
        self.stream = None;
        self.sending = false;
        e
    }

    /// A new stream, with every batch in flight sent again on it, oldest first.
    async fn reopen(&mut self, deadline: Option<Instant>) -> Result<()> {
        self.stream = None;
        if self.in_flight.is_empty() {
            self.sending = false;
            return Ok(());
        }
        for batch in &mut self.in_flight {
            batch.left = batch.items;
        }
        self.send_from(0, deadline).await
    }

    /// Sends the batches in flight from index `first` on (opening a stream if there is
    /// none), each within its [`MAX_SENDS`].
    async fn send_from(&mut self, first: usize, deadline: Option<Instant>) -> Result<()> {
        if self.in_flight.iter().any(|b| b.sends >= MAX_SENDS) {
            let e = ClientError::new(
                Code::Unavailable,
                format!(
                    "The batch writer sent a batch to {} {MAX_SENDS} times without a \
                     confirmation",
                    self.client.address()
                ),
            );
            return Err(self.give_up(e));
        }
        let first = if self.stream.is_none() {
            let server = self.client.server();
            let timeout = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if let Err(e) = server
                .ready("InsertStream", timeout, deadline.map(Into::into))
                .await
            {
                return Err(self.give_up(e));
            }
            self.stream = Some(server.insert_stream());
            0
        } else {
            first
        };
        self.sending = true;
        let stream = self.stream.as_mut().expect("opened above");
        let until = deadline.map(tokio::time::Instant::from);
        for batch in self.in_flight.iter_mut().skip(first) {
            batch.sends += 1;
            for request in &batch.requests {
                let sent = match until {
                    None => stream.send(request.clone()).await,
                    Some(d) => tokio::time::timeout_at(d, stream.send(request.clone()))
                        .await
                        .unwrap_or_else(|_| {
                            Err(ClientError::deadline(
                                "Timeout exceeded: the batch writer could not send a batch in \
                                 time",
                            ))
                        }),
                };
                match sent {
                    Ok(()) => {}
                    // The call was cut short: the stream's state is unknown, and `sending`
                    // (still set) has the next call send everything in flight again.
                    Err(e) if e.code == Code::DeadlineExceeded => return Err(e),
                    // The stream ended (a refusal of an earlier request, or the connection):
                    // what was not sent stays in flight, and the next wait for confirmations
                    // learns why from the stream and sends it again.
                    Err(_) => {
                        self.sending = false;
                        return Ok(());
                    }
                }
            }
        }
        self.sending = false;
        Ok(())
    }
}

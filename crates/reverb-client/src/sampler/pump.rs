//! The one loop that takes samples off a sample stream, whatever transport it runs on: it
//! keeps a window of samples asked for (drawn from a budget of samples not yet asked for)
//! and hands on the samples that arrive together as they arrive. A prefetching sampler's
//! workers pump into the consumer's queue; a one-shot call ([`crate::Client::sample`]) pumps
//! the samples it asked for into a vector, as a sampler asked for N.

use crate::transport::SampleStream;
use crate::{Result, Sampled};
use std::future::Future;
use std::sync::atomic::{AtomicI64, Ordering};
use std::time::Duration;

/// Where a pump puts the samples that arrive.
pub(crate) trait Sink {
    /// Takes the next samples (that arrived together), each or the error in its place (a
    /// sample that could not be decoded). `Ok(false)`: the consumer went away, the stream
    /// stops; an error stops it and is the pump's.
    fn put(&mut self, samples: Vec<Result<Sampled>>) -> impl Future<Output = Result<bool>> + Send;

    /// Resolves once the consumer went away (never, for one waiting on the call itself).
    fn gone(&self) -> impl Future<Output = ()> + Send;
}

/// A one-shot call's sink: every sample in order, an undecodable one as its error (the rest
/// are still taken: they left the table).
impl Sink for Vec<Result<Sampled>> {
    async fn put(&mut self, samples: Vec<Result<Sampled>>) -> Result<bool> {
        self.extend(samples);
        Ok(true)
    }

    async fn gone(&self) {
        std::future::pending().await
    }
}

/// Takes up to `want` samples from a budget of samples not yet asked for; returns how many
/// were granted.
pub(crate) fn reserve(budget: &AtomicI64, want: usize) -> usize {
    budget
        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |left| {
            (left > 0).then(|| left - left.min(want as i64))
        })
        .map(|left| left.min(want as i64) as usize)
        .unwrap_or(0)
}

/// What a pump asks of its stream.
pub(crate) struct Window<'a> {
    /// The table sampled.
    pub table: &'a str,
    /// Samples kept asked for and not yet received, at most.
    pub size: usize,
    /// Each request's wait for the table's rate limiter.
    pub rate_limiter_timeout: Option<Duration>,
    /// Samples not yet asked for (shared with other pumps); spent as the window is refilled.
    pub budget: &'a AtomicI64,
}

/// Pumps `stream`, on which `outstanding` samples are asked for already, into `sink` until
/// the budget is spent and every sample asked for arrived (`Ok`), the consumer went away
/// (`Ok`), or the stream or the sink fails (the samples asked for and not received go back
/// to the budget). The window is refilled once half of it arrived, or at once when asking
/// is free. `received` counts the samples that arrived.
pub(crate) async fn pump(
    stream: &mut dyn SampleStream,
    window: Window<'_>,
    mut outstanding: usize,
    sink: &mut impl Sink,
    received: &mut usize,
) -> Result<()> {
    let give_back = |outstanding: usize| {
        window
            .budget
            .fetch_add(outstanding as i64, Ordering::SeqCst)
    };
    let low = if stream.requests_are_free() {
        window.size
    } else {
        window.size / 2 + 1
    };
    loop {
        if outstanding < low {
            let more = reserve(window.budget, window.size.saturating_sub(outstanding));
            if more > 0 {
                if let Err(e) = stream.request(window.table, more, window.rate_limiter_timeout) {
                    give_back(outstanding + more);
                    return Err(e);
                }
                outstanding += more;
            } else if outstanding == 0 {
                return Ok(());
            }
        }
        let samples = tokio::select! {
            got = stream.next() => match got {
                Ok(samples) => samples,
                Err(e) => {
                    give_back(outstanding);
                    return Err(e);
                }
            },
            _ = sink.gone() => return Ok(()),
        };
        outstanding -= samples.len();
        *received += samples.len();
        match sink.put(samples).await {
            Ok(true) => {}
            Ok(false) => return Ok(()),
            Err(e) => {
                give_back(outstanding);
                return Err(e);
            }
        }
    }
}

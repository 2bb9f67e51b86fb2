//! One-shot sampling: [`Client::sample`] asks one stream for N samples and pumps them into
//! a vector (the sampler's [`pump`], as a sampler asked for N); [`sample_shards`] samples
//! several servers used as one table (`ShardedClient.sample`): the shards' weights are asked
//! for at once, each sample's shard is drawn by weight, every shard drawn is sampled at once,
//! and each sample's probability and table size are made global. A shard that goes away
//! mid-call has its samples drawn from the others.

use super::pump::{pump, Window};
use crate::shards::{draw_weights, ShardWeight};
use crate::transport::SampleStreamOptions;
use crate::{connect_wait, Client, ClientError, PlannedSample, Result, Sample, Sampled};
use rand::seq::SliceRandom;
use rand::Rng;
use reverb_proto::TableInfo;
use std::sync::atomic::AtomicI64;
use std::time::Duration;
use tokio::time::Instant;
use tonic::Code;

/// How long a shard may take to say how big its table is before it counts as missing; for a
/// shard missing already, until it answers again (so a dead shard costs little).
const INFO_TIMEOUT: Duration = Duration::from_secs(1);
const MISSING_INFO_TIMEOUT: Duration = Duration::from_millis(100);
/// How often a call waiting for a non-empty table asks again.
const POLL: Duration = Duration::from_millis(50);

impl Client {
    /// Samples `num_samples` items from `table` on one stream. `rate_limiter_timeout` bounds
    /// each wait for the rate limiter on the server; `timeout` bounds the whole call.
    pub async fn sample(
        &self,
        table: &str,
        num_samples: usize,
        rate_limiter_timeout: Option<Duration>,
        timeout: Option<Duration>,
    ) -> Result<Vec<Sample>> {
        match self
            .sample_partial(table, num_samples, rate_limiter_timeout, timeout)
            .await?
        {
            (samples, None) => Ok(samples),
            (_, Some(e)) => Err(e),
        }
    }

    /// Like [`Client::sample`], but when the call fails part-way it returns the samples that
    /// arrived complete together with the error: samples taken from a table are never lost.
    pub async fn sample_partial(
        &self,
        table: &str,
        num_samples: usize,
        rate_limiter_timeout: Option<Duration>,
        timeout: Option<Duration>,
    ) -> Result<(Vec<Sample>, Option<ClientError>)> {
        if num_samples == 0 {
            return Err(ClientError::invalid("num_samples must be >= 1"));
        }
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut fresh = false;
        let (samples, failure) = loop {
            // Opening the stream waits for the server and is retried as unary calls are (an
            // attempt that never reached the server sampled nothing); a reopened call keeps
            // the deadline the first attempt started. Once the stream is open, a failure
            // ends the call.
            let options = SampleStreamOptions {
                one_shot: true,
                fresh,
                ..SampleStreamOptions::default()
            };
            let mut stream = self
                .with_deadline_at("SampleStream", timeout, deadline, |server| async move {
                    server
                        .sample_stream(table, num_samples, rate_limiter_timeout, options)
                        .await
                })
                .await?;
            // Every sample is asked for with the stream: nothing is left in the budget.
            let budget = AtomicI64::new(0);
            let window = Window {
                table,
                size: num_samples,
                rate_limiter_timeout,
                budget: &budget,
            };
            let (mut samples, mut received) = (Vec::with_capacity(num_samples), 0);
            let pumped = pump(
                &mut *stream,
                window,
                num_samples,
                &mut samples,
                &mut received,
            );
            let failure = match deadline {
                Some(d) => match tokio::time::timeout_at(d, pumped).await {
                    Ok(pumped) => pumped.err(),
                    Err(_) => Some(self.expired("SampleStream", timeout.unwrap_or_default())),
                },
                None => pumped.await.err(),
            };
            // A call kept open by an earlier one that was cut off before it answered served
            // none of this request: open a fresh call, which waits for the server as a first
            // call does.
            if !fresh && samples.is_empty() && failure.as_ref().is_some_and(|e| e.unsent) {
                fresh = true;
                continue;
            }
            break (samples, failure);
        };
        // Every sample that decodes is returned (they left the table), with the first error.
        let mut decoded = Vec::with_capacity(samples.len());
        let mut undecodable = None;
        for sample in samples {
            match sample
                .and_then(Sampled::plan)
                .and_then(PlannedSample::assemble)
            {
                Ok(sample) => decoded.push(sample),
                Err(e) => undecodable = undecodable.or(Some(e)),
            }
        }
        Ok((decoded, undecodable.or(failure)))
    }
}

/// What a one-shot sample of several servers returned.
#[derive(Debug, Default)]
pub struct ShardSamples {
    /// The samples (global probabilities and table sizes), in the order drawn.
    pub samples: Vec<Sample>,
    /// The shard each sample came from.
    pub shards: Vec<usize>,
    /// The error that stopped the call part-way (the samples before it are returned: they
    /// left their tables).
    pub failure: Option<ClientError>,
}

/// Samples `table` over `clients`' servers: `num_samples` samples, or only one when sampling
/// deletes items on some shard (`max_times_sampled`, e.g. queues: a caller that stops early
/// then consumes nothing it did not take). `missing[i]` says shard `i` did not answer last
/// time (it is asked briefly); updated. `timeout` bounds the whole call: waiting for a
/// non-empty table, and each shard's sampling.
pub async fn sample_shards(
    clients: &[Client],
    missing: &mut [bool],
    table: &str,
    num_samples: usize,
    timeout: Option<Duration>,
) -> Result<ShardSamples> {
    if num_samples == 0 {
        return Err(ClientError::invalid("num_samples must be >= 1"));
    }
    let deadline = timeout.map(|t| Instant::now() + t);
    let left = || {
        deadline.map(|d| {
            d.saturating_duration_since(Instant::now())
                .max(Duration::from_millis(1))
        })
    };
    let Some(mut weights) = wait_for_weights(clients, missing, table, deadline).await? else {
        // No shard that answered has the table: the first that answers says so, as one
        // server would.
        let first = missing.iter().position(|m| !m).unwrap_or(0);
        let (samples, failure) = match clients[first]
            .sample_partial(table, num_samples, None, left())
            .await
        {
            Ok(answer) => answer,
            Err(e) => (Vec::new(), Some(e)),
        };
        return Ok(ShardSamples {
            shards: vec![first; samples.len()],
            samples,
            failure,
        });
    };
    let deletes = weights.iter().flatten().any(|w| w.sampling_deletes);
    let wanted = if deletes { 1 } else { num_samples };
    let mut out = ShardSamples::default();
    let mut counts = draw(&weights, wanted);
    loop {
        let calls = counts
            .iter()
            .enumerate()
            .filter(|(_, &count)| count > 0)
            .map(|(shard, &count)| {
                let client = &clients[shard];
                async move {
                    (
                        shard,
                        count,
                        client.sample_partial(table, count, None, left()).await,
                    )
                }
            });
        let answers = futures::future::join_all(calls).await;
        // Probabilities and sizes as drawn: by the weights this round was drawn with.
        let (shares, size) = globals(&weights);
        let mut lost = 0;
        let mut gone = None;
        let first = out.samples.len();
        for (shard, count, answer) in answers {
            let (samples, failure) = match answer {
                Ok(answer) => answer,
                Err(e) => (Vec::new(), Some(e)),
            };
            let got = samples.len();
            for mut sample in samples {
                sample.info.probability *= shares[shard];
                sample.info.table_size = size;
                out.samples.push(sample);
                out.shards.push(shard);
            }
            match failure {
                None => {}
                // The shard went away: its samples are drawn from the others.
                Some(e) if e.code == Code::Unavailable => {
                    weights[shard] = None;
                    lost += count - got;
                    gone = Some(e);
                }
                Some(e) => out.failure = out.failure.take().or(Some(e)),
            }
        }
        shuffle_from(&mut out, first);
        if out.failure.is_some() || lost == 0 {
            return Ok(out);
        }
        if !draw_weights(&weights).iter().any(|&w| w > 0.0) {
            out.failure = gone;
            return Ok(out);
        }
        counts = draw(&weights, lost);
    }
}

/// The shards' weights once one is positive; `None` if no shard that answered has the
/// table. Waits for a non-empty table until `deadline` (then DEADLINE_EXCEEDED), and for
/// shards that cannot be reached as a call to one server does.
async fn wait_for_weights(
    clients: &[Client],
    missing: &mut [bool],
    table: &str,
    deadline: Option<Instant>,
) -> Result<Option<Vec<Option<ShardWeight>>>> {
    let mut unreachable_since = None;
    loop {
        let answers = ask(clients, missing).await;
        let weights: Vec<Option<ShardWeight>> = answers
            .iter()
            .map(|a| {
                a.as_ref()
                    .ok()
                    .and_then(|infos| ShardWeight::of(infos, table))
            })
            .collect();
        if draw_weights(&weights).iter().any(|&w| w > 0.0) {
            return Ok(Some(weights));
        }
        if answers.iter().all(Result::is_err) {
            // As a call to one server that cannot be reached: wait for one to come up.
            let since = *unreachable_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= connect_wait() {
                let first = answers.into_iter().find_map(Result::err);
                return Err(first.expect("every answer is an error"));
            }
        } else if weights.iter().all(Option::is_none) {
            return Ok(None);
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            let addresses: Vec<&str> = clients.iter().map(Client::address).collect();
            return Err(ClientError::deadline(format!(
                "No shard of table '{table}' had an item to sample in time (shards: {})",
                addresses.join(", ")
            )));
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Every shard's tables, asked at once (a shard missing last time only briefly).
async fn ask(clients: &[Client], missing: &mut [bool]) -> Vec<Result<Vec<TableInfo>>> {
    let calls = clients
        .iter()
        .zip(missing.iter())
        .map(|(client, &was_missing)| {
            let timeout = if was_missing {
                MISSING_INFO_TIMEOUT
            } else {
                INFO_TIMEOUT
            };
            client.server_info(Some(timeout))
        });
    let answers = futures::future::join_all(calls).await;
    for (m, answer) in missing.iter_mut().zip(&answers) {
        *m = answer.is_err();
    }
    answers
}

/// How many of `n` samples each shard gets, each drawn in proportion to the shards' weights.
fn draw(weights: &[Option<ShardWeight>], n: usize) -> Vec<usize> {
    let draw = draw_weights(weights);
    let total: f64 = draw.iter().sum();
    let mut counts = vec![0; draw.len()];
    let mut rng = rand::rng();
    for _ in 0..n {
        let mut at = rng.random::<f64>() * total;
        // (The last shard of positive weight takes what rounding leaves.)
        let mut chosen = draw.iter().rposition(|&w| w > 0.0).unwrap_or(0);
        for (shard, &w) in draw.iter().enumerate() {
            if w > 0.0 && at < w {
                chosen = shard;
                break;
            }
            at -= w;
        }
        counts[chosen] += 1;
    }
    counts
}

/// Each shard's share of the draws and the global table size.
fn globals(weights: &[Option<ShardWeight>]) -> (Vec<f64>, i64) {
    let draw = draw_weights(weights);
    let total: f64 = draw.iter().sum();
    let shares = draw
        .iter()
        .map(|&w| if total > 0.0 { w / total } else { 0.0 })
        .collect();
    let size = weights.iter().flatten().map(|w| w.size).sum();
    (shares, size)
}

/// Shuffles the samples from `first` on (with their shards), so they come in the order of
/// their draws rather than grouped by shard.
fn shuffle_from(out: &mut ShardSamples, first: usize) {
    let mut order: Vec<usize> = (first..out.samples.len()).collect();
    order.shuffle(&mut rand::rng());
    let mut samples: Vec<Option<Sample>> = out.samples.drain(first..).map(Some).collect();
    let shards: Vec<usize> = out.shards.drain(first..).collect();
    for i in order {
        out.samples
            .push(samples[i - first].take().expect("each taken once"));
        out.shards.push(shards[i - first]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn weight(size: i64, total: f64) -> Option<ShardWeight> {
        Some(ShardWeight {
            size,
            total_weight: total,
            sampling_blocked: false,
            sampling_deletes: false,
        })
    }

    #[test]
    fn draws_follow_the_weights_and_skip_missing_shards() {
        let weights = [weight(10, 1.0), None, weight(30, 3.0)];
        let counts = draw(&weights, 40_000);
        assert_eq!(counts.iter().sum::<usize>(), 40_000);
        assert_eq!(counts[1], 0);
        let share = counts[2] as f64 / 40_000.0;
        assert!((share - 0.75).abs() < 0.02, "{counts:?}");
        let (shares, size) = globals(&weights);
        assert_eq!(shares, vec![0.25, 0.0, 0.75]);
        assert_eq!(size, 40);
    }

    #[test]
    fn shuffling_keeps_each_sample_with_its_shard() {
        let mut out = ShardSamples::default();
        for i in 0..50 {
            let mut sample = Sample {
                info: Default::default(),
                columns: Vec::new(),
            };
            sample.info.table_size = i;
            out.samples.push(sample);
            out.shards.push(i as usize);
        }
        shuffle_from(&mut out, 10);
        assert_eq!((out.samples.len(), out.shards.len()), (50, 50));
        let pairs: Vec<(i64, usize)> = out
            .samples
            .iter()
            .map(|s| s.info.table_size)
            .zip(out.shards.iter().copied())
            .collect();
        assert!(pairs.iter().all(|&(t, s)| t as usize == s));
        assert_eq!(&out.shards[..10], &(0..10).collect::<Vec<_>>()[..]);
        let mut rest = out.shards[10..].to_vec();
        rest.sort_unstable();
        assert_eq!(rest, (10..50).collect::<Vec<_>>());
    }
}

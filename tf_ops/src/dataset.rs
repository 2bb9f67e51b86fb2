//! `ReverbRsDatasetSample`: the kernel behind `TrajectoryDataset` and `TimestepDataset`. Each
//! kernel (one per dataset iterator) owns a prefetching sampler, created at the first call and
//! stopped when TensorFlow deletes the kernel. A call returns every sample already queued (up
//! to `max_batch`), so the Python side unbatches; network latency stays inside the sampler.
//! A call returns zero rows when nothing arrived within [`WAIT`], and `end_of_sequence` once
//! the sampler has ended (max_samples reached, or the rate limiter timed out).

use crate::kernel::{Construction, Context, Kernel, Result};
use crate::samples::{same_shapes, steps, write_column, write_info, Spec};
use parking_lot::Mutex;
use reverb_client::sampler::{Sampler, SamplerOptions};
use reverb_client::{runtime, Client, Sample};
use std::collections::VecDeque;
use std::time::Duration;

pub const OP: &str = "ReverbRsDatasetSample";
pub const INPUTS: &[&str] = &[];
pub const OUTPUTS: &[&str] = &[
    "end_of_sequence: bool",
    "key: uint64",
    "probability: double",
    "table_size: int64",
    "priority: double",
    "times_sampled: int32",
    "data: dtypes",
];
pub const ATTRS: &[&str] = &[
    "server_address: string",
    "table: string",
    "max_in_flight_samples_per_worker: int",
    "num_workers: int",
    "max_samples: int",
    "rate_limiter_timeout_ms: int",
    "max_batch: int",
    "timestep: bool",
    "dtypes: list(type) >= 1",
    "ranks: list(int)",
    "dims: list(int)",
    "names: list(string)",
    "instance: int",
];

/// The longest one call waits for samples. TensorFlow's C API gives kernels no cancellation
/// hook, so a call never blocks for long: when nothing came, it returns zero rows (not the end)
/// and tf.data calls again, checking in between whether the iterator is being destroyed.
const WAIT: Duration = Duration::from_millis(200);

pub struct DatasetSample {
    address: String,
    options: SamplerOptions,
    max_batch: usize,
    timestep: bool,
    spec: Spec,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    sampler: Option<Sampler>,
    pending: VecDeque<Sample>,
    ended: bool,
}

impl Kernel for DatasetSample {
    fn create(c: &Construction) -> Result<Self> {
        let table = c.string("table")?;
        let spec = Spec::new(
            table,
            c.types("dtypes")?,
            &c.ints("ranks")?,
            &c.ints("dims")?,
            c.strings("names")?,
        )?;
        let max_samples = c.int("max_samples")?;
        let timeout = c.int("rate_limiter_timeout_ms")?;
        Ok(Self {
            address: c.string("server_address")?,
            options: SamplerOptions {
                max_in_flight_samples_per_worker: c.int("max_in_flight_samples_per_worker")?.max(1)
                    as usize,
                num_workers: c.int("num_workers")?.max(1) as usize,
                max_samples: (max_samples >= 0).then_some(max_samples as u64),
                rate_limiter_timeout: (timeout >= 0).then(|| Duration::from_millis(timeout as u64)),
            },
            max_batch: c.int("max_batch")?.max(1) as usize,
            timestep: c.bool("timestep")?,
            spec,
            state: Mutex::new(State::default()),
        })
    }

    fn compute(&self, ctx: &Context) -> Result<()> {
        let mut st = self.state.lock();
        if st.pending.is_empty() && !st.ended {
            self.refill(&mut st)?;
        }
        // The longest run of queued samples that fit one batch (same column shapes).
        let mut take = 0;
        let mut rows = 0;
        while take < st.pending.len() && take < self.max_batch {
            let s = &st.pending[take];
            if take > 0 && !same_shapes(&st.pending[0], s, self.timestep) {
                break;
            }
            self.spec.check(s, self.timestep)?;
            rows += if self.timestep { steps(s)? } else { 1 };
            take += 1;
        }
        let batch: Vec<Sample> = st.pending.drain(..take).collect();
        let end = batch.is_empty() && st.ended;
        drop(st);

        ctx.output_values(0, 10, &[], &[u8::from(end)])?;
        let dims = [rows as i64];
        let repeats: Vec<(&Sample, usize)> = batch
            .iter()
            .map(|s| {
                (
                    s,
                    if self.timestep {
                        steps(s).unwrap_or(0)
                    } else {
                        1
                    },
                )
            })
            .collect();
        write_info(ctx, 1, &repeats, &dims)?;
        let refs: Vec<&Sample> = batch.iter().collect();
        for c in 0..self.spec.dtypes.len() {
            if refs.is_empty() {
                self.write_empty(ctx, c)?;
            } else {
                write_column(ctx, 6 + c, c, &refs, Some(rows), self.timestep)?;
            }
        }
        Ok(())
    }
}

impl DatasetSample {
    /// Waits (at most [`WAIT`]) for samples or the end of the stream, and queues them.
    fn refill(&self, st: &mut State) -> Result<()> {
        if st.sampler.is_none() {
            let client = Client::new(&self.address)?;
            st.sampler = Some(Sampler::new(
                client,
                &self.spec.table,
                self.options.clone(),
            )?);
        }
        let sampler = st.sampler.as_mut().expect("created above");
        match runtime().block_on(sampler.next_ready(self.max_batch, WAIT))? {
            None => {}
            Some(v) if v.is_empty() => {
                st.ended = true;
                st.sampler = None;
            }
            Some(v) => st.pending.extend(v),
        }
        Ok(())
    }

    /// A call with nothing to return outputs zero rows of every column.
    fn write_empty(&self, ctx: &Context, c: usize) -> Result<()> {
        let mut dims = vec![0i64];
        if let Some(shape) = &self.spec.shapes[c] {
            dims.extend(shape.iter().map(|&d| d.max(0)));
        }
        ctx.output(6 + c, self.spec.dtypes[c], &dims, 1, |_| Ok(()))
    }
}

//! `ReverbRsDatasetSample`: the kernel behind `TrajectoryDataset` and `TimestepDataset`. Each
//! kernel (one per dataset iterator) owns a prefetching sampler, created at the first call and
//! stopped when TensorFlow deletes the kernel. A call returns every sample already queued (up
//! to `max_batch`), so the Python side unbatches; network latency stays inside the sampler.
//! A call returns zero rows when nothing arrived within [`WAIT`], and fails with OUT_OF_RANGE
//! once the sampler has ended (max_samples reached, or the rate limiter timed out): the kernel
//! runs in a V1 `map` (which does not preserve cardinality), where that ends the dataset.
//!
//! With `batch_size > 0` (the dataset's `.batch(n)`), a call instead returns exactly `n`
//! samples (the remainder at the end unless `drop_remainder`), so tf.data never touches single
//! elements.

use crate::kernel::Connection;
use crate::kernel::{code, Construction, Context, Error, Kernel, Result};
use crate::samples::{
    same_shapes, steps, write_column, write_info, Item, Queued, Spec, INFO_OUTPUTS,
};
use parking_lot::Mutex;
use reverb_client::sampler::{Sampler, SamplerOptions};
use reverb_client::signature::decode_signature;
use reverb_client::{runtime, Client};
use reverb_proto::TableInfo;
use std::collections::VecDeque;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub const OP: &str = "ReverbRsDatasetSample";
/// The server address and table when they are tensors known only when the graph runs (the
/// `server_address` and `table` attrs are then empty); otherwise empty strings.
pub const INPUTS: &[&str] = &["server_address_input: string", "table_input: string"];
/// Index of the first data output (after the info outputs).
const DATA: usize = INFO_OUTPUTS.len();

/// Output groups: the info columns, the data columns.
pub const OUTPUTS: &[&[&str]] = &[INFO_OUTPUTS, &["data: dtypes"]];
pub const ATTRS: &[&str] = &[
    "server_address: string",
    "table: string",
    "max_in_flight_samples_per_worker: int",
    "num_workers: int",
    "max_samples: int",
    "rate_limiter_timeout_ms: int",
    "max_batch: int",
    "batch_size: int",
    "drop_remainder: bool",
    "timestep: bool",
    "dtypes: list(type) >= 1",
    "ranks: list(int)",
    "dims: list(int)",
    "names: list(string)",
    "instance: int",
    "inproc_library: string",
    "inproc_port: int",
    "shared_memory: bool = true",
    "auth_token: string = ''",
    "tls_ca: string = ''",
    "tls_cert: string = ''",
    "tls_key: string = ''",
];

/// The longest one call waits for samples. TensorFlow's C API gives kernels no cancellation
/// hook, so a call never blocks for long: when nothing came, it returns zero rows (not the end)
/// and tf.data calls again. Once an iterator is cancelled (destroyed), TensorFlow refuses to
/// run its functions, so destroying an iterator waits at most this long. (An iterator whose
/// `GetNext` is blocked on an empty table with no rate-limiter timeout keeps polling, as the
/// reference's blocks.)
const WAIT: Duration = Duration::from_millis(200);

pub struct DatasetSample {
    /// Clients of the server (of each shard), which each sampler connects afresh, and the
    /// columns to produce (with the table's name): from the attrs, or, when the server or
    /// table is a tensor, from the inputs at the first call.
    target: OnceLock<(Vec<Client>, Spec, String)>,
    /// How clients connect, and the columns (without the table's name when it is an input),
    /// for a target made at the first call.
    connection: Connection,
    /// The `server_address` attr (empty: the first input says).
    address: String,
    columns: Spec,
    options: SamplerOptions,
    max_batch: usize,
    batch_size: usize,
    drop_remainder: bool,
    timestep: bool,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    sampler: Option<Sampler>,
    pending: VecDeque<Queued>,
    ended: bool,
    /// The table's signature, fetched before the first sampler starts.
    signature: Signature,
    /// The error that ended this iterator: its sampler is gone (so it takes no more items
    /// from the table) and every later call fails the same way (tf.data may call again).
    failed: Option<Error>,
}

/// Where the check of the declared columns against the table's signature stands.
#[derive(Default)]
enum Signature {
    #[default]
    Unchecked,
    Fetching(tokio::task::JoinHandle<reverb_client::Result<Vec<TableInfo>>>),
    Checked,
}

/// The longest the first call of an iterator waits in all for the table's signature before
/// sampling without the check (samples are still checked one by one).
const SIGNATURE_WAIT: Duration = Duration::from_secs(10);

impl Kernel for DatasetSample {
    fn create(c: &Construction) -> Result<Self> {
        let (address, table) = (c.string("server_address")?, c.string("table")?);
        let columns = Spec::new(
            table.clone(),
            c.types("dtypes")?,
            &c.ints("ranks")?,
            &c.ints("dims")?,
            c.strings("names")?,
        )?;
        let max_samples = c.int("max_samples")?;
        let timeout = c.int("rate_limiter_timeout_ms")?;
        let connection = c.connection()?;
        let target = OnceLock::new();
        if !address.is_empty() && !table.is_empty() {
            let mut clients = connection.clients(&address)?;
            // A server of this process held by the Python extension is sampled through its C
            // ABI (the Python side names it for a dataset of one server only).
            if let [client] = clients.as_mut_slice() {
                let exported =
                    crate::inproc::find(&c.string("inproc_library")?, c.int("inproc_port")?);
                *client = client.clone().with_inproc_abi(exported);
            }
            let _ = target.set((clients, columns.clone(), address.clone()));
        }
        Ok(Self {
            target,
            connection,
            address,
            columns,
            options: SamplerOptions {
                max_in_flight_samples_per_worker: c.int("max_in_flight_samples_per_worker")?.max(1)
                    as usize,
                num_workers: c.int("num_workers")?.max(0) as usize,
                max_samples: (max_samples >= 0).then_some(max_samples as u64),
                rate_limiter_timeout: (timeout >= 0).then(|| Duration::from_millis(timeout as u64)),
                shared_memory: c.bool("shared_memory")?,
                // (Every sample is checked and written on its own: rows of columns too.)
                columnar: true,
            },
            max_batch: c.int("max_batch")?.max(1) as usize,
            batch_size: c.int("batch_size")?.max(0) as usize,
            drop_remainder: c.bool("drop_remainder")?,
            timestep: c.bool("timestep")?,
            state: Mutex::new(State::default()),
        })
    }

    fn compute(&self, ctx: &Context) -> Result<()> {
        self.resolve(ctx)?;
        let mut st = self.state.lock();
        if let Some(failed) = &st.failed {
            return Err(failed.clone());
        }
        let result = self.next(ctx, &mut st);
        if let Err(e) = &result {
            // Stops the sampler now, not when TensorFlow destroys the kernel: its requests in
            // flight would take items nobody receives.
            st.sampler = None;
            st.pending.clear();
            st.failed = Some(e.clone());
        }
        result
    }
}

impl DatasetSample {
    /// Produces this call's outputs: a batch, zero rows (nothing came in time) or the end.
    fn next(&self, ctx: &Context, st: &mut State) -> Result<()> {
        let want = self.batch_size.max(1);
        let deadline = Instant::now() + WAIT;
        while st.pending.len() < want && !st.ended {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let n = if self.batch_size > 0 {
                want - st.pending.len()
            } else {
                self.max_batch
            };
            self.refill(st, n, left)?;
            if self.batch_size == 0 {
                break; // ready mode: return whatever came
            }
        }
        let take = if self.batch_size > 0 {
            self.exact_batch(st)?
        } else {
            self.ready_batch(st)?
        };
        if take == 0 && st.ended && st.pending.is_empty() {
            return Err(Error {
                code: code::OUT_OF_RANGE,
                message: format!("End of the samples of table '{}'", self.spec().table),
            });
        }
        // Write from the queue and remove the samples only once every output is written.
        let batch: Vec<&Queued> = st.pending.iter().take(take).collect();
        self.write(ctx, &batch)?;
        st.pending.drain(..take);
        Ok(())
    }

    /// Makes the target from the inputs at the first call when the attrs left it open; later
    /// calls check that the inputs did not change (one kernel samples one table).
    fn resolve(&self, ctx: &Context) -> Result<()> {
        let dynamic = self.address.is_empty() || self.columns.table.is_empty();
        if !dynamic && self.target.get().is_some() {
            return Ok(());
        }
        let given = |i: usize, attr: &str, what: &str| -> Result<String> {
            if attr.is_empty() {
                ctx.input(i)?.scalar_string(what)
            } else {
                Ok(attr.to_owned())
            }
        };
        let address = given(0, &self.address, "server_address")?;
        let table = given(1, &self.columns.table, "table")?;
        if address.is_empty() || table.is_empty() {
            return Err(Error::invalid(
                "server_address and table must be non-empty strings",
            ));
        }
        if let Some((_, spec, was)) = self.target.get() {
            if *was != address || spec.table != table {
                return Err(Error::invalid(format!(
                    "This dataset iterator samples table '{}' at {was}; it was asked for \
                     table '{table}' at {address}: make a new iterator for another server or \
                     table",
                    spec.table
                )));
            }
            return Ok(());
        }
        let clients = self.connection.clients(&address)?;
        let spec = Spec {
            table,
            ..self.columns.clone()
        };
        let _ = self.target.set((clients, spec, address));
        Ok(())
    }

    fn clients(&self) -> &[Client] {
        &self.target.get().expect("resolved by compute").0
    }

    fn spec(&self) -> &Spec {
        &self.target.get().expect("resolved by compute").1
    }

    fn write(&self, ctx: &Context, batch: &[&Queued]) -> Result<()> {
        let rows: usize = if self.timestep {
            batch.iter().map(|&s| steps(s)).sum::<Result<usize>>()?
        } else {
            batch.len()
        };
        let repeats: Vec<(&Queued, usize)> = batch
            .iter()
            .map(|&s| {
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
        write_info(ctx, 0, &repeats, &[rows as i64])?;
        for c in 0..self.spec().dtypes.len() {
            if batch.is_empty() {
                self.write_empty(ctx, c)?;
            } else {
                write_column(ctx, DATA + c, c, batch, Some(rows), self.timestep)?;
            }
        }
        Ok(())
    }

    /// Ready mode: how many queued samples to return, the longest run (up to `max_batch`)
    /// whose column shapes match, so they fit one output.
    fn ready_batch(&self, st: &State) -> Result<usize> {
        let mut take = 0;
        while take < st.pending.len() && take < self.max_batch {
            let s = &st.pending[take];
            if take > 0 && !same_shapes(&st.pending[0], s, self.timestep) {
                break;
            }
            self.spec().check(s, self.timestep)?;
            take += 1;
        }
        Ok(take)
    }

    /// Batch mode: `batch_size` samples once queued; at the end of the stream the remainder
    /// (or nothing, with `drop_remainder`); otherwise nothing yet.
    fn exact_batch(&self, st: &mut State) -> Result<usize> {
        let n = st.pending.len();
        let take = if n >= self.batch_size {
            self.batch_size
        } else if st.ended && !self.drop_remainder {
            n
        } else {
            if st.ended {
                st.pending.clear();
            }
            0
        };
        for s in st.pending.iter().take(take) {
            self.spec().check(s, self.timestep)?;
            if !same_shapes(&st.pending[0], s, self.timestep) {
                return Err(Error::invalid(format!(
                    "Cannot batch items of table '{}' with different shapes ({:?} and {:?}); \
                     declare the varying dimensions as None and batch with padded_batch",
                    self.spec().table,
                    shapes(&st.pending[0]),
                    shapes(s),
                )));
            }
        }
        Ok(take)
    }

    /// Before the first sampler: checks the declared columns against the table's signature
    /// (the reference's errors when they do not fit), waiting at most `wait` in this call.
    /// Returns whether the check is done. A server that cannot say (unreachable, no such
    /// table, no signature) leaves the check to each sample.
    fn check_signature(&self, st: &mut State, wait: Duration) -> Result<bool> {
        if let Signature::Unchecked = st.signature {
            let client = self.clients()[0].clone();
            st.signature = Signature::Fetching(runtime().spawn(async move {
                // An unreachable server fails this within the connection wait, as it would
                // fail the sampler (not after the longer SIGNATURE_WAIT).
                client.wait_reachable("ServerInfo", None).await?;
                client.server_info(Some(SIGNATURE_WAIT)).await
            }));
        }
        let fetch = match &mut st.signature {
            Signature::Fetching(fetch) => fetch,
            _ => return Ok(true),
        };
        let Ok(fetched) = runtime().block_on(async { tokio::time::timeout(wait, fetch).await })
        else {
            return Ok(false);
        };
        st.signature = Signature::Checked;
        let infos = match fetched {
            Ok(Ok(infos)) => infos,
            // Not reached within the connection wait (see the fetch): the sampler's wait
            // would begin again, so this call fails as the sampler would have.
            Ok(Err(e)) if e.code as i32 == code::UNAVAILABLE => return Err(e.into()),
            _ => return Ok(true),
        };
        let info = infos.iter().find(|t| t.name == self.spec().table);
        if let Some(Ok(Some(signature))) = info.map(|t| decode_signature(&t.signature)) {
            self.spec().check_signature(&signature)?;
        }
        Ok(true)
    }

    /// Waits at most `wait` for up to `n` samples or the end of the stream, and queues them.
    fn refill(&self, st: &mut State, n: usize, wait: Duration) -> Result<()> {
        if st.sampler.is_none() && !self.check_signature(st, wait)? {
            return Ok(());
        }
        if st.sampler.is_none() {
            let clients = self.clients().iter().map(Client::reconnected);
            st.sampler = Some(Sampler::sharded(
                clients.collect::<reverb_client::Result<_>>()?,
                &self.spec().table,
                self.options.clone(),
            )?);
        }
        let sampler = st.sampler.as_mut().expect("created above");
        match runtime().block_on(sampler.next_ready(n, wait))? {
            None => {}
            Some(v) if v.is_empty() => {
                st.ended = true;
                st.sampler = None;
            }
            // (Samples reach the kernels as messages through the C ABI or gRPC, or as rows
            // of columns from our servers.)
            Some(v) => {
                for sample in v {
                    st.pending.push_back(Queued::new(sample)?);
                }
            }
        }
        Ok(())
    }

    /// A call with nothing to return outputs zero rows of every column.
    fn write_empty(&self, ctx: &Context, c: usize) -> Result<()> {
        let mut dims = vec![0i64];
        if let Some(shape) = &self.spec().shapes[c] {
            dims.extend(shape.iter().map(|&d| d.max(0)));
        }
        ctx.output(DATA + c, self.spec().dtypes[c], &dims, 1, |_| Ok(()))
    }
}

/// Each column's shape of a sample (for error messages).
fn shapes(s: &impl Item) -> Vec<&[i64]> {
    (0..s.num_columns()).map(|c| s.shape(c)).collect()
}

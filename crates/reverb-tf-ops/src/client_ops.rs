//! The kernels behind `reverb.TFClient`: sample one item, insert one step into tables, update
//! priorities. Each kernel holds a client for its `server_address` (connected lazily).

use crate::kernel::{Construction, Context, Error, Kernel, Result};
use crate::samples::{tf_shape, write_column, write_info, Spec, INFO_OUTPUTS};
use parking_lot::Mutex;
use reverb_client::signature::{check_step, decode_signature, Spec as SignatureSpec};
use reverb_client::tensor::{dtype_name, dtype_size, encode_strings, DT_STRING};
use reverb_client::writer::Inserter;
use reverb_client::{runtime, Client, Tensor};
use std::collections::HashMap;
use std::time::{Duration, Instant};

fn timeout_attr(c: &Construction, name: &str) -> Result<Option<Duration>> {
    let ms = c.int(name)?;
    Ok((ms >= 0).then(|| Duration::from_millis(ms as u64)))
}

/// `ReverbRsClientSample`: one item from `table` (the first step of its columns).
pub struct ClientSample {
    client: Client,
    dtypes: Vec<i32>,
    rate_limiter_timeout: Option<Duration>,
}

pub mod sample {
    pub const OP: &str = "ReverbRsClientSample";
    pub const INPUTS: &[&str] = &["table: string"];
    pub const OUTPUTS: &[&[&str]] = &[super::INFO_OUTPUTS, &["data: dtypes"]];
    pub const ATTRS: &[&str] = &[
        "server_address: string",
        "dtypes: list(type) >= 1",
        "rate_limiter_timeout_ms: int = -1",
        "auth_token: string = ''",
        "tls_ca: string = ''",
        "tls_cert: string = ''",
        "tls_key: string = ''",
    ];
}

impl Kernel for ClientSample {
    fn create(c: &Construction) -> Result<Self> {
        Ok(Self {
            client: c.client()?,
            dtypes: c.types("dtypes")?,
            rate_limiter_timeout: timeout_attr(c, "rate_limiter_timeout_ms")?,
        })
    }

    fn compute(&self, ctx: &Context) -> Result<()> {
        let table = ctx.input(0)?.scalar_string("table")?;
        let mut samples =
            runtime().block_on(
                self.client
                    .sample(&table, 1, self.rate_limiter_timeout, None),
            )?;
        let mut sample = samples
            .pop()
            .ok_or_else(|| Error::invalid("no sample returned"))?;
        first_step(&mut sample);
        let spec = Spec {
            table,
            dtypes: self.dtypes.clone(),
            shapes: vec![None; self.dtypes.len()],
            names: (0..self.dtypes.len())
                .map(|i| format!("data[{i}]"))
                .collect(),
        };
        spec.check(&sample, false)?;
        write_info(ctx, 0, &[(&sample, 1)], &[])?;
        for c in 0..self.dtypes.len() {
            write_column(ctx, INFO_OUTPUTS.len() + c, c, &[&sample], None, false)?;
        }
        Ok(())
    }
}

/// Keeps only the first step of every column that has a time dimension (not squeezed), as the
/// reference's `TFClient.sample` does: items written by `insert` sample as the inserted step.
fn first_step(sample: &mut reverb_client::Sample) {
    let squeezed: Vec<bool> = sample
        .info
        .item
        .as_ref()
        .and_then(|i| i.flat_trajectory.as_ref())
        .map(|t| t.columns.iter().map(|c| c.squeeze).collect())
        .unwrap_or_default();
    for (c, t) in sample.columns.iter_mut().enumerate() {
        if squeezed.get(c).copied().unwrap_or(false) || t.shape.first().is_none_or(|&n| n == 0) {
            continue;
        }
        if t.dtype == DT_STRING {
            let per_row: usize = t.shape[1..].iter().map(|&d| d as usize).product();
            if let Ok(all) = t.strings() {
                t.data = encode_strings(all[..per_row].iter().copied());
            }
            t.shape.remove(0);
            continue;
        }
        let row = t.row_bytes();
        t.shape.remove(0);
        t.data.truncate(row);
    }
}

/// A table's flat signature (`None`: it has none), or why it could not be decoded.
type TableSignature = std::result::Result<Option<Vec<SignatureSpec>>, String>;

/// `ReverbRsClientInsert`: `data` as one step, one item per `(tables[i], priorities[i])`.
pub struct ClientInsert {
    client: Client,
    timeout: Option<Duration>,
    /// The writer of the inserts, kept between them (as `Client.insert`'s).
    inserter: Mutex<Inserter>,
    /// Each table's flat signature (`None`: it has none), learned at the first insert.
    signatures: Mutex<HashMap<String, TableSignature>>,
}

pub mod insert {
    pub const OP: &str = "ReverbRsClientInsert";
    pub const INPUTS: &[&str] = &["data: T", "tables: string", "priorities: double"];
    pub const OUTPUTS: &[&[&str]] = &[];
    pub const ATTRS: &[&str] = &[
        "server_address: string",
        "T: list(type) >= 1",
        "timeout_ms: int = -1",
        "auth_token: string = ''",
        "tls_ca: string = ''",
        "tls_cert: string = ''",
        "tls_key: string = ''",
    ];
}

impl Kernel for ClientInsert {
    fn create(c: &Construction) -> Result<Self> {
        let client = c.client()?;
        Ok(Self {
            inserter: Mutex::new(Inserter::new(client.clone())),
            client,
            timeout: timeout_attr(c, "timeout_ms")?,
            signatures: Mutex::default(),
        })
    }

    fn compute(&self, ctx: &Context) -> Result<()> {
        let n = ctx.num_inputs();
        let mut columns: Vec<Tensor> = Vec::with_capacity(n - 2);
        for i in 0..n - 2 {
            let t = ctx.input(i)?;
            if t.dtype() == DT_STRING {
                let elements = t.strings()?;
                let data = encode_strings(elements.iter().map(Vec::as_slice));
                columns.push(Tensor::new(DT_STRING, t.shape(), data)?);
                continue;
            }
            if dtype_size(t.dtype()).is_none() {
                return Err(Error::invalid(format!(
                    "data[{i}] has dtype {}, which TFClient.insert does not support yet",
                    dtype_name(t.dtype())
                )));
            }
            columns.push(Tensor::new(t.dtype(), t.shape(), t.bytes().to_vec())?);
        }
        let tables = ctx.input(n - 2)?.strings()?;
        let priorities = ctx.input(n - 1)?;
        let priorities: Vec<f64> = priorities
            .bytes()
            .chunks_exact(8)
            .map(|b| f64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        if tables.len() != priorities.len() {
            return Err(Error::invalid(format!(
                "tables and priorities must have the same length, got {} and {}",
                tables.len(),
                priorities.len()
            )));
        }
        let targets = tables
            .into_iter()
            .map(|t| String::from_utf8(t).map_err(|_| Error::invalid("table name is not UTF-8")))
            .zip(priorities)
            .map(|(t, p)| t.map(|t| (t, p)))
            .collect::<Result<Vec<_>>>()?;
        self.check_signatures(&columns, &targets)?;
        let deadline = self.timeout.map(|t| Instant::now() + t);
        // (As a call of the client: a server that cannot be reached yet is waited for.)
        runtime().block_on(self.client.wait_reachable("InsertStream", self.timeout))?;
        self.inserter.lock().insert(&columns, &targets, deadline)?;
        Ok(())
    }
}

impl ClientInsert {
    /// INVALID_ARGUMENT, before anything is sent, when the step does not fit the signature
    /// of one of the tables (unknown tables are left to the server, which names them).
    fn check_signatures(&self, columns: &[Tensor], targets: &[(String, f64)]) -> Result<()> {
        let mut known = self.signatures.lock();
        if targets.iter().any(|(t, _)| !known.contains_key(t)) {
            let infos = runtime().block_on(self.client.server_info(self.timeout))?;
            for info in infos {
                let specs = decode_signature(&info.signature).map_err(|e| e.message);
                known.insert(info.name, specs);
            }
        }
        let leaves: Vec<(i32, &[i64])> = columns.iter().map(|t| (t.dtype, &t.shape[..])).collect();
        for (table, _) in targets {
            match known.get(table) {
                Some(Ok(Some(specs))) => check_step(table, specs, &leaves)?,
                Some(Err(e)) => return Err(Error::invalid(format!("Table '{table}': {e}"))),
                _ => {}
            }
        }
        Ok(())
    }
}

/// `ReverbRsClientUpdatePriorities`: sets `priorities[i]` on item `keys[i]` of `table`.
pub struct ClientUpdatePriorities {
    client: Client,
    timeout: Option<Duration>,
}

pub mod update_priorities {
    pub const OP: &str = "ReverbRsClientUpdatePriorities";
    pub const INPUTS: &[&str] = &["table: string", "keys: uint64", "priorities: double"];
    pub const OUTPUTS: &[&[&str]] = &[];
    pub const ATTRS: &[&str] = &[
        "server_address: string",
        "timeout_ms: int = -1",
        "auth_token: string = ''",
        "tls_ca: string = ''",
        "tls_cert: string = ''",
        "tls_key: string = ''",
    ];
}

impl Kernel for ClientUpdatePriorities {
    fn create(c: &Construction) -> Result<Self> {
        Ok(Self {
            client: c.client()?,
            timeout: timeout_attr(c, "timeout_ms")?,
        })
    }

    fn compute(&self, ctx: &Context) -> Result<()> {
        let table = ctx.input(0)?.scalar_string("table")?;
        let keys = ctx.input(1)?;
        let priorities = ctx.input(2)?;
        if keys.shape() != priorities.shape() {
            return Err(Error::invalid(format!(
                "Tensors `keys` and `priorities` do not match in shape ({} vs. {})",
                tf_shape(Some(&keys.shape())),
                tf_shape(Some(&priorities.shape()))
            )));
        }
        let updates: Vec<(u64, f64)> = keys
            .bytes()
            .chunks_exact(8)
            .zip(priorities.bytes().chunks_exact(8))
            .map(|(k, p)| {
                (
                    u64::from_le_bytes(k.try_into().expect("8 bytes")),
                    f64::from_le_bytes(p.try_into().expect("8 bytes")),
                )
            })
            .collect();
        runtime().block_on(self.client.mutate_priorities(
            &table,
            updates,
            Vec::new(),
            self.timeout,
        ))?;
        Ok(())
    }
}

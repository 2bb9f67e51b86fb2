//! The kernel behind `reverb.PatternDataset`: which structured-writer configs apply on a step
//! of a `tf.data` stream of steps. A pure function of its inputs (the state it carries from
//! step to step goes in and comes out as a tensor, in the dataset's `scan`), evaluated by
//! `reverb_client::writer::schedule`, the rule the structured writer follows.

use crate::kernel::{Construction, Context, Error, Kernel, Result};
use reverb_client::tensor::TensorView;
use reverb_client::writer::patterns::decode_configs;
use reverb_client::writer::scalars::integer;
use reverb_client::writer::schedule::Schedule;

const DT_INT64: i32 = 9;
const DT_BOOL: i32 = 10;

/// `ReverbRsPatternStep`.
pub struct PatternStep {
    schedule: Schedule,
}

pub const OP: &str = "ReverbRsPatternStep";
pub const INPUTS: &[&str] = &["state: int64", "end_of_episode: bool", "data: dtypes"];
/// `made`: per config whether it applies on the step, then per config whether it applies at
/// the end of the episode; `next_state`: the state for the next step.
pub const OUTPUTS: &[&[&str]] = &[&["made: bool", "next_state: int64"]];
pub const ATTRS: &[&str] = &[
    // Serialized `StructuredWriterConfig`s.
    "configs: list(string) >= 1",
    "num_leaves: int",
    "respect_episode_boundaries: bool",
    // The dtypes of the leaves data conditions read (`Schedule::data_leaves`, in order).
    "dtypes: list(type) >= 0",
];

impl Kernel for PatternStep {
    fn create(c: &Construction) -> Result<Self> {
        let configs = decode_configs(&c.byte_strings("configs")?).map_err(Error::invalid)?;
        let num_leaves = usize::try_from(c.int("num_leaves")?)
            .map_err(|_| Error::invalid("num_leaves must be >= 0"))?;
        let schedule = Schedule::new(&configs, num_leaves, c.bool("respect_episode_boundaries")?)
            .map_err(Error::invalid)?;
        let dtypes = c.types("dtypes")?;
        if dtypes.len() != schedule.data_leaves().len() {
            return Err(Error::invalid(format!(
                "dtypes: {} given, but the configs' data conditions read {} leaves",
                dtypes.len(),
                schedule.data_leaves().len()
            )));
        }
        Ok(Self { schedule })
    }

    fn compute(&self, ctx: &Context) -> Result<()> {
        let state = ctx.input(0)?;
        let len = self.schedule.state_len();
        if state.dtype() != DT_INT64 || state.shape() != [len as i64] {
            return Err(Error::invalid(format!(
                "state must be an int64 vector of {len}, got shape {:?}",
                state.shape()
            )));
        }
        let mut next: Vec<i64> = state
            .bytes()
            .chunks_exact(8)
            .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
            .collect();
        let end = ctx.input(1)?;
        if end.dtype() != DT_BOOL || end.bytes().len() != 1 {
            return Err(Error::invalid("end_of_episode must be a bool scalar"));
        }
        let end = end.bytes()[0] != 0;
        let mut data = Vec::with_capacity(self.schedule.data_leaves().len());
        for i in 0..self.schedule.data_leaves().len() {
            let input = ctx.input(2 + i)?;
            let shape = input.shape();
            let view = TensorView {
                dtype: input.dtype(),
                shape: &shape,
                data: input.bytes(),
            };
            // Only a row of one element holds a value a condition compares.
            data.push(if shape.iter().product::<i64>() == 1 {
                integer(&view)
            } else {
                None
            });
        }
        let made: Vec<u8> = self
            .schedule
            .step(&mut next, &data, end)
            .into_iter()
            .map(u8::from)
            .collect();
        ctx.output_values(0, DT_BOOL, &[made.len() as i64], &made)?;
        ctx.output_values(1, DT_INT64, &[len as i64], &next)
    }
}

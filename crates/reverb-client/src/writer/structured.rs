//! The structured writer: a [`TrajectoryWriter`] driven by static configs (`patterns.rs`).
//! After every append (and in `end_episode`) each config's conditions are evaluated against
//! the step history, and every config whose conditions all hold makes an item of its pattern,
//! at most once per step. Only leaves some config reads are kept: pattern leaves become
//! writer columns keeping as many steps as the longest pattern reaches back; leaves only
//! conditions or TD-error priorities read are kept as numbers.

use super::patterns::{Pattern, Priority, StepFacts, Subject};
use super::scalars::{integer, integral, number};
use super::{AppendError, ItemColumn, TrajectoryWriter};
use crate::signature::{decode_signature, describe, Spec};
use crate::tensor::{AsView, TensorView};
use crate::{ClientError, Result};
use reverb_proto::{StructuredWriterConfig, TableInfo};
use std::collections::{HashMap, VecDeque};
use std::time::Instant;

/// `(episode, index in the episode)` of a step.
type StepId = (u64, u64);

/// A config and what it remembers between steps.
#[derive(Debug)]
struct Applied {
    pattern: Pattern,
    last_applied: Option<StepId>,
    last_checked: Option<StepId>,
    steps_since_applied: i64,
    /// Whether its item shapes were checked against the table signature.
    checked: bool,
}

/// What a leaf of the step is used for.
#[derive(Debug, Clone, Default)]
struct Leaf {
    /// Steps of history patterns take from it (0: it is no writer column).
    history: usize,
    /// Its values matter as numbers (data conditions, TD errors).
    numeric: bool,
    /// A data condition reads it (scalar integers or bools only).
    condition: bool,
    /// A TD-error priority reads it (scalars only).
    td: bool,
}

/// One leaf's held history: the writer-wide step of each held row (`None`: no value in that
/// step), and for numeric leaves the values.
#[derive(Debug, Clone, Default)]
struct Held {
    rows: VecDeque<Option<u64>>,
    values: VecDeque<Option<f64>>,
    /// The newest value and its writer-wide step (for conditions).
    newest: Option<(u64, i64)>,
}

/// Writes steps and makes items from them as its configs say. Not `Sync`.
pub struct StructuredWriter {
    writer: TrajectoryWriter,
    configs: Vec<Applied>,
    leaves: Vec<Leaf>,
    held: Vec<Held>,
    /// Rows held since the buffers were last cleared (capped at the longest history).
    buffer_length: usize,
    max_history: usize,
    /// Leaves per step, fixed by the first append.
    width: Option<usize>,
    episode: u64,
    /// The newest step, if any leaf some config reads has a value in it.
    current: Option<StepId>,
    /// Writer-wide step of the newest row.
    newest: u64,
    /// Signatures of the configs' tables the server has (`None`: the table has none), once
    /// known.
    signatures: Option<HashMap<String, Option<Vec<Spec>>>>,
    /// The server's tables' names, once known (for the error of a config whose table it
    /// does not have).
    server_tables: Vec<String>,
}

impl StructuredWriter {
    /// A writer applying `configs` (refused, naming the config, if any is malformed). Its
    /// columns keep as many cells as its patterns reach back; `writer` must be fresh.
    pub fn new(mut writer: TrajectoryWriter, configs: &[StructuredWriterConfig]) -> Result<Self> {
        if configs.is_empty() {
            return Err(ClientError::invalid(
                "At least one config must be provided.",
            ));
        }
        let patterns = configs
            .iter()
            .enumerate()
            .map(|(i, c)| Pattern::new(i, c))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map_err(ClientError::invalid)?;
        let width = patterns.iter().flat_map(|p| p.leaves()).max().unwrap_or(0) + 1;
        let mut leaves = vec![Leaf::default(); width];
        for p in &patterns {
            for node in &p.nodes {
                let leaf = &mut leaves[node.column];
                leaf.history = leaf.history.max(node.max_age());
            }
            for check in &p.checks {
                if let Subject::Data(i) = check.subject {
                    leaves[i].numeric = true;
                    leaves[i].condition = true;
                }
            }
            if let Some((_, node)) = p.td_node() {
                leaves[node.column].numeric = true;
                leaves[node.column].td = true;
            }
        }
        let max_history = leaves.iter().map(|l| l.history).max().unwrap_or(0).max(1);
        for (column, leaf) in leaves.iter().enumerate() {
            if leaf.history > 0 {
                writer.configure(column, leaf.history, None)?;
            }
        }
        Ok(Self {
            writer,
            configs: patterns
                .into_iter()
                .map(|pattern| Applied {
                    pattern,
                    last_applied: None,
                    last_checked: None,
                    steps_since_applied: 0,
                    checked: false,
                })
                .collect(),
            held: vec![Held::default(); leaves.len()],
            leaves,
            buffer_length: 0,
            max_history,
            width: None,
            episode: 0,
            current: None,
            newest: 0,
            signatures: None,
            server_tables: Vec::new(),
        })
    }

    /// The trajectory writer underneath (flush, confirmations, errors).
    pub fn writer(&mut self) -> &mut TrajectoryWriter {
        &mut self.writer
    }

    /// What its insert stream is retrying after, if anything (see
    /// [`TrajectoryWriter::retrying`]).
    pub fn retrying(&self) -> Option<crate::ClientError> {
        self.writer.retrying()
    }

    /// One more than the highest leaf index any config reads (leaves from here on are never
    /// read).
    pub fn width(&self) -> usize {
        self.leaves.len()
    }

    /// Whether leaf `i` of a step is read by some config (other leaves are dropped unread).
    pub fn uses(&self, leaf: usize) -> bool {
        self.leaves
            .get(leaf)
            .is_some_and(|l| l.history > 0 || l.numeric)
    }

    /// Whether a partial step is open.
    pub fn step_is_open(&self) -> bool {
        self.writer.step_is_open()
    }

    /// Whether [`Self::set_tables`] gave the tables. Until then items are queued and checked
    /// against their table's signature when the tables come, before they are sent.
    pub fn knows_tables(&self) -> bool {
        self.signatures.is_some()
    }

    /// Whether queued items wait for the tables (see [`Self::knows_tables`]).
    pub fn awaiting_tables(&self) -> bool {
        self.writer.awaiting_tables()
    }

    /// Takes the tables' signatures from a `ServerInfo` answer. A config whose table the
    /// server does not have is refused each time it applies (naming the config); items made
    /// for it before are dropped when they would be sent.
    pub fn set_tables(&mut self, infos: &[TableInfo]) -> Result<()> {
        let mut signatures = HashMap::new();
        for c in &self.configs {
            let table = &c.pattern.table;
            if let Some(info) = infos.iter().find(|i| &i.name == table) {
                if !signatures.contains_key(table) {
                    signatures.insert(table.clone(), decode_signature(&info.signature)?);
                }
            }
        }
        self.writer.set_tables(infos)?;
        self.server_tables = infos.iter().map(|i| i.name.clone()).collect();
        self.server_tables.sort();
        self.signatures = Some(signatures);
        Ok(())
    }

    /// Checks the leaves configs read, once their dtype is known (before anything changes).
    fn check_values(&self, values: &[Option<TensorView<'_>>]) -> Result<()> {
        for (i, value) in values.iter().enumerate() {
            let (Some(v), Some(leaf)) = (value, self.leaves.get(i)) else {
                continue;
            };
            let scalar = v.shape.iter().product::<i64>() == 1;
            if leaf.condition && !(scalar && integral(v.dtype)) {
                let c = self.reader(|p| p.checks.iter().any(|c| c.subject == Subject::Data(i)));
                return Err(ClientError::invalid(format!(
                    "Config {c} has a data condition on leaf {i} of the step, which needs scalar \
                     integer or bool values but got {}",
                    describe(v.dtype, v.shape)
                )));
            }
            if leaf.td && !(scalar && number(v).is_some()) {
                let c = self.reader(|p| p.td_node().is_some_and(|(_, n)| n.column == i));
                return Err(ClientError::invalid(format!(
                    "TD Error expects a scalar tensor: config {c} takes its priority from leaf \
                     {i} of the step, which got {}",
                    describe(v.dtype, v.shape)
                )));
            }
        }
        Ok(())
    }

    /// The index of the first config for which `reads` holds.
    fn reader(&self, reads: impl Fn(&Pattern) -> bool) -> usize {
        self.configs
            .iter()
            .find(|c| reads(&c.pattern))
            .map_or(0, |c| c.pattern.index)
    }

    /// Appends a step (`values[i]` is leaf `i` of the flattened step, `None` where the step
    /// has no value), or part of it with `partial`, then makes the items whose configs hold.
    /// Returns false when items wait for room in the in-flight window (`send_ready` sends
    /// them). Nothing changes when the values are refused.
    pub fn append<V: AsView>(
        &mut self,
        values: Vec<Option<V>>,
        partial: bool,
    ) -> std::result::Result<bool, AppendError> {
        let other = AppendError::Other;
        match self.width {
            None => {
                let width = values.len();
                for c in &self.configs {
                    if let Some(leaf) = c.pattern.leaves().find(|&l| l >= width) {
                        return Err(other(ClientError::invalid(format!(
                            "Config {} refers to leaf {leaf} (`flat_source_index`) but the \
                             appended steps have {width} leaves",
                            c.pattern.index
                        ))));
                    }
                }
            }
            Some(width) if width != values.len() => {
                return Err(other(ClientError::invalid(format!(
                    "Flattened data has an unexpected length, got {} but wanted {width}.",
                    values.len()
                ))))
            }
            Some(_) => {}
        }
        let views: Vec<Option<TensorView<'_>>> = values
            .iter()
            .map(|v| v.as_ref().map(AsView::view))
            .collect();
        self.check_values(&views).map_err(other)?;
        let width = values.len();
        let open = self.writer.step_is_open();
        let step = self.writer.episode_start() + self.writer.episode_steps();
        let index = self.writer.episode_steps();
        // Leaves read only as numbers must not be set twice in a step either.
        for (i, v) in values.iter().enumerate() {
            let leaf = self.leaves.get(i);
            if v.is_some()
                && open
                && leaf.is_some_and(|l| l.numeric && l.history == 0)
                && self.held[i].newest.is_some_and(|(s, _)| s == step)
            {
                return Err(AppendError::AlreadySet(i));
            }
        }
        let mut numbers: Vec<(usize, Option<f64>, Option<i64>)> = Vec::new();
        let mut columns = Vec::new();
        let mut any = false;
        for (i, v) in values.into_iter().enumerate() {
            let Some(leaf) = self.leaves.get(i) else {
                break;
            };
            let Some(v) = v else { continue };
            if leaf.history == 0 && !leaf.numeric {
                continue;
            }
            any = true;
            if leaf.numeric {
                numbers.push((i, number(&v.view()), integer(&v.view())));
            }
            if leaf.history > 0 {
                columns.push((i, v));
            }
        }
        let had = columns.iter().map(|(i, _)| *i).collect::<Vec<_>>();
        self.writer.append(columns, partial)?;
        self.width = Some(width);
        // The step was written: record it in the history.
        if !open {
            for (i, leaf) in self.leaves.iter().enumerate() {
                let held = &mut self.held[i];
                if leaf.history > 0 {
                    held.rows.push_back(None);
                    held.values.push_back(None);
                    while held.rows.len() > leaf.history {
                        held.rows.pop_front();
                        held.values.pop_front();
                    }
                }
            }
            self.buffer_length = (self.buffer_length + 1).min(self.max_history);
        }
        for i in had {
            *self.held[i].rows.back_mut().expect("row pushed") = Some(step);
        }
        for (i, value, int) in numbers {
            let held = &mut self.held[i];
            if let Some(back) = held.values.back_mut() {
                *back = value;
            }
            held.newest = int.map(|v| (step, v));
        }
        self.newest = step;
        let id = (self.episode, index);
        self.current = (any || (open && self.current == Some(id))).then_some(id);
        self.apply(false).map_err(other)
    }

    /// Evaluates every config on the newest step and makes the items of those that hold.
    /// A config whose item cannot be made (e.g. it disagrees with the table signature) does
    /// not stop the others; the first such error is returned after all were evaluated.
    fn apply(&mut self, end_of_episode: bool) -> Result<bool> {
        let Some(current) = self.current else {
            return Ok(true);
        };
        let facts = StepFacts {
            index: current.1 as i64,
            buffer_length: self.buffer_length as i64,
            end_of_episode,
        };
        let mut queued_any = false;
        let mut first_error = None;
        for c in 0..self.configs.len() {
            let config = &mut self.configs[c];
            if config.last_applied == Some(current) {
                continue;
            }
            if config.last_checked != Some(current) {
                config.steps_since_applied += 1;
                config.last_checked = Some(current);
            }
            let config = &self.configs[c];
            if !config
                .pattern
                .holds(&facts, config.steps_since_applied, |leaf| self.data(leaf))
            {
                continue;
            }
            let Some((columns, priority)) = self.build(&config.pattern) else {
                continue;
            };
            let table = &self.configs[c].pattern.table;
            // Queued here, sent together below. Before the tables are known, the item is
            // checked when they come (and the config with its first item after that).
            let known = self.signatures.is_some();
            let queued = if !known {
                self.writer.queue_item_deferred(table, priority, &columns)
            } else if config.checked {
                self.writer.queue_item(table, priority, &columns)
            } else {
                self.check_signature(&config.pattern, &columns)
                    .and_then(|()| self.writer.queue_item(table, priority, &columns))
            };
            match queued {
                Ok(_) => {
                    queued_any = true;
                    let config = &mut self.configs[c];
                    config.checked = known;
                    config.last_applied = Some(current);
                    config.steps_since_applied = 0;
                }
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
        }
        let all_sent = !queued_any || self.writer.send_ready(Some(Instant::now()))?;
        match first_error {
            None => Ok(all_sent),
            Some(mut e) => {
                e.message
                    .push_str(" (The step itself was appended; other configs were applied.)");
                Err(e)
            }
        }
    }

    /// The newest value of data-condition leaf `leaf`, if the newest step set it.
    fn data(&self, leaf: usize) -> Option<i64> {
        self.held[leaf]
            .newest
            .filter(|(step, _)| *step == self.newest)
            .map(|(_, v)| v)
    }

    /// The item columns and priority of `pattern` on the held history; `None` when the
    /// history is too short or a step it takes has no value.
    fn build(&self, pattern: &Pattern) -> Option<(Vec<ItemColumn>, f64)> {
        let mut columns = Vec::with_capacity(pattern.nodes.len());
        for node in &pattern.nodes {
            let rows = &self.held[node.column].rows;
            let refs = node
                .positions(rows.len())?
                .map(|p| rows[p].map(|step| (node.column, step)))
                .collect::<Option<Vec<_>>>()?;
            columns.push(ItemColumn {
                refs,
                squeeze: node.squeeze(),
            });
        }
        let priority = match pattern.priority {
            Priority::Constant(v) => v,
            Priority::TdError { .. } => match pattern.td_node() {
                None => 0.0,
                Some((weight, node)) => {
                    let values = &self.held[node.column].values;
                    let td: Vec<f64> = node
                        .positions(values.len())?
                        .map(|p| values[p].unwrap_or(0.0))
                        .collect();
                    Priority::td(weight, &td)
                }
            },
        };
        Some((columns, priority))
    }

    /// Checks the shapes of `pattern`'s items against its table's signature.
    fn check_signature(&self, pattern: &Pattern, columns: &[ItemColumn]) -> Result<()> {
        let signatures = self.signatures.as_ref().expect("tables known");
        let specs = match signatures.get(&pattern.table) {
            Some(Some(specs)) => specs,
            Some(None) => return Ok(()),
            None => {
                return Err(ClientError::invalid(format!(
                    "Config {} inserts into table '{}', which the server at {} does not have \
                     (its tables: [{}])",
                    pattern.index,
                    pattern.table,
                    self.writer.client().address(),
                    self.server_tables.join(", ")
                )));
            }
        };
        let mut problems = Vec::new();
        if specs.len() != columns.len() {
            problems.push(format!(
                "the pattern has {} columns but the signature has {}",
                columns.len(),
                specs.len()
            ));
        }
        for ((spec, column), path) in specs.iter().zip(columns).zip(&pattern.paths) {
            let leaf = column.refs[0].0;
            let Some((dtype, shape)) = self.writer.item_column_spec(column) else {
                continue;
            };
            if !spec.accepts(dtype, &shape) {
                problems.push(format!(
                    "{path} (leaf {leaf} of the step) is {}, the signature's {} is {}",
                    describe(dtype, &shape),
                    spec.path,
                    spec.describe()
                ));
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(ClientError::invalid(format!(
            "Unable to create item in table '{}' from config {}: the trajectory is inconsistent \
             with the table signature: {}.",
            pattern.table,
            pattern.index,
            problems.join("; ")
        )))
    }

    /// Applies the configs that hold at the end of an episode, then ends it (without
    /// waiting: `flush` waits for the items). `clear_buffers` drops the history.
    pub fn end_episode(&mut self, clear_buffers: bool) -> Result<()> {
        // The episode ends even when a config's item could not be made.
        let applied = self.apply(true);
        self.writer.end_episode(clear_buffers);
        self.episode += 1;
        if clear_buffers {
            for held in &mut self.held {
                *held = Held::default();
            }
            self.buffer_length = 0;
            self.current = None;
        }
        applied.map(|_| ())
    }
}

//! Structured-writer configs (`patterns.proto`), checked once and held in a form that is cheap
//! to evaluate after every step: which slices of the step history make an item (pattern
//! nodes), when (conditions) and with which priority.

use crate::signature::{flatten, path_string};
use prost::Message;
use reverb_proto::condition::{Cmp, Left};
use reverb_proto::pattern_node::{StartOrNone, StepOrNone, StopOrNone};
use reverb_proto::priority::PriorityFn;
use reverb_proto::{Condition, PatternNode, StructuredWriterConfig};

/// A column of an item: steps `start..stop` by `step` of leaf `column`, counted back from the
/// newest step (`-1` is the newest); a node without `start` is the single step `stop`,
/// squeezed.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// Index of the leaf in the flattened step.
    pub column: usize,
    /// First step (< 0), if a slice.
    pub start: Option<i32>,
    /// End (<= 0; exclusive for slices).
    pub stop: i32,
    /// Stride (> 0).
    pub step: usize,
}

impl Node {
    /// How many steps back the node reaches.
    pub fn max_age(&self) -> usize {
        self.start.unwrap_or(self.stop).unsigned_abs() as usize
    }

    /// Whether the column drops its leading dimension.
    pub fn squeeze(&self) -> bool {
        self.start.is_none()
    }

    /// Positions (from the oldest held step, 0) the node takes out of `held` steps; `None`
    /// when fewer steps are held than it reaches back.
    pub fn positions(&self, held: usize) -> Option<impl Iterator<Item = usize>> {
        let age = self.max_age();
        if age > held {
            return None;
        }
        let first = held - age;
        let len = match self.start {
            Some(start) => (self.stop - start) as usize,
            None => 1,
        };
        Some((first..first + len).step_by(self.step))
    }
}

/// The left side of a condition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Subject {
    /// Index of the newest step in its episode.
    StepIndex,
    /// Steps since the config last applied.
    StepsSinceApplied,
    /// Steps held (the longest column history).
    BufferLength,
    /// 1 while `end_episode` runs, else 0.
    IsEndEpisode,
    /// The newest value of a scalar integer or bool leaf.
    Data(usize),
}

/// The comparison of a condition.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Compare {
    /// `left == v`.
    Eq(i32),
    /// `left >= v`.
    Ge(i32),
    /// `left % m == v`.
    ModEq(i32, i32),
}

/// One condition: `subject compare`, negated when `inverse`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Check {
    /// What is compared.
    pub subject: Subject,
    /// How.
    pub compare: Compare,
    /// Negates the result.
    pub inverse: bool,
}

impl Check {
    /// Whether the condition holds for `left` (`None`: the value is missing, never holds).
    pub fn holds(&self, left: Option<i64>) -> bool {
        let Some(left) = left else { return false };
        let result = match self.compare {
            Compare::Eq(v) => left == v as i64,
            Compare::Ge(v) => left >= v as i64,
            // The remainder as C++ computes it (the sign of the dividend).
            Compare::ModEq(m, v) => left % m as i64 == v as i64,
        };
        result != self.inverse
    }
}

/// What conditions compare on one step, besides its data.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepFacts {
    /// Index of the step in its episode.
    pub index: i64,
    /// Steps held (`buffer_length`).
    pub buffer_length: i64,
    /// Whether the episode ends at the step (`is_end_episode`).
    pub end_of_episode: bool,
}

/// How an item's priority is chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Priority {
    /// Always this value.
    Constant(f64),
    /// `w * max(|td|) + (1 - w) * mean(|td|)` over the steps of leaf `column` in the item
    /// (0 when the item does not hold that leaf).
    TdError {
        /// `max_priority_weight`.
        weight: f64,
        /// The TD-error leaf.
        column: usize,
    },
}

impl Priority {
    /// The priority of a TD-error config from the leaf's values in the item.
    pub fn td(weight: f64, values: &[f64]) -> f64 {
        if values.is_empty() {
            return 0.0;
        }
        let max = values.iter().fold(0.0_f64, |m, v| m.max(v.abs()));
        let mean = values.iter().map(|v| v.abs()).sum::<f64>() / values.len() as f64;
        weight * max + (1.0 - weight) * mean
    }
}

/// A checked config.
#[derive(Debug, Clone, PartialEq)]
pub struct Pattern {
    /// Its position in the writer's configs (errors name it).
    pub index: usize,
    /// The table its items go to.
    pub table: String,
    /// The item's columns, flattened.
    pub nodes: Vec<Node>,
    /// Path of each column in the pattern's structure (errors name them).
    pub paths: Vec<String>,
    /// All must hold for the config to apply.
    pub checks: Vec<Check>,
    /// The items' priority.
    pub priority: Priority,
}

/// Most leaves a step may have (bounds what configs make the writer allocate).
pub const MAX_LEAVES: usize = 1 << 16;

/// Decodes serialized `StructuredWriterConfig`s (the error names the first that is not one).
pub fn decode_configs(configs: &[impl AsRef<[u8]>]) -> Result<Vec<StructuredWriterConfig>, String> {
    configs
        .iter()
        .enumerate()
        .map(|(i, bytes)| {
            StructuredWriterConfig::decode(bytes.as_ref()).map_err(|e| {
                format!("Invalid configuration at position {i}: not a StructuredWriterConfig ({e})")
            })
        })
        .collect()
}

/// Checks a `flat_source_index` (`what` names the field).
fn leaf_of(index: i32, what: &str) -> Result<usize, String> {
    if index < 0 {
        return Err(format!("`{what}` must be >= 0 but got {index}."));
    }
    if index as usize >= MAX_LEAVES {
        return Err(format!(
            "`{what}` must be < {MAX_LEAVES} (leaves per step) but got {index}."
        ));
    }
    Ok(index as usize)
}

fn node_of(node: &PatternNode) -> Result<Node, String> {
    let start = node.start_or_none.as_ref().map(|StartOrNone::Start(s)| *s);
    let stop = node.stop_or_none.as_ref().map(|StopOrNone::Stop(s)| *s);
    let step = node.step_or_none.as_ref().map(|StepOrNone::Step(s)| *s);
    let column = leaf_of(node.flat_source_index, "flat_source_index")?;
    if start.is_none() && stop.is_none() {
        return Err("At least one of `start` and `stop` must be specified.".into());
    }
    if let Some(s) = start.filter(|&s| s >= 0) {
        return Err(format!("`start` must be < 0 but got {s}."));
    }
    if let Some(s) = stop.filter(|&s| s > 0) {
        return Err(format!("`stop` must be <= 0 but got {s}."));
    }
    if let (Some(a), Some(b)) = (start, stop) {
        if a >= b {
            return Err(format!(
                "`stop` ({b}) must be > `start` ({a}) when both are specified."
            ));
        }
    }
    if start.is_none() && stop == Some(0) {
        return Err("`stop` must be < 0 when `start` isn't set but got 0.".into());
    }
    if step.is_some() && start.is_none() {
        return Err("`step` must only be set when `start` is set.".into());
    }
    if let Some(s) = step.filter(|&s| s <= 0) {
        return Err(format!("`step` must be > 0 but got {s}."));
    }
    Ok(Node {
        column,
        start,
        stop: stop.unwrap_or(0),
        step: step.unwrap_or(1) as usize,
    })
}

fn check_of(condition: &Condition) -> Result<Check, String> {
    let subject = match condition.left {
        None => return Err("Conditions must specify a value for `left`.".into()),
        Some(Left::StepIndex(_)) => Subject::StepIndex,
        Some(Left::StepsSinceApplied(_)) => Subject::StepsSinceApplied,
        Some(Left::BufferLength(_)) => Subject::BufferLength,
        Some(Left::IsEndEpisode(_)) => Subject::IsEndEpisode,
        Some(Left::FlatSourceIndex(i)) => Subject::Data(leaf_of(i, "flat_source_index")?),
    };
    let compare = match &condition.cmp {
        None => return Err("Conditions must specify a value for `cmp`.".into()),
        Some(Cmp::Eq(v)) => Compare::Eq(*v),
        Some(Cmp::Ge(v)) => Compare::Ge(*v),
        Some(Cmp::ModEq(m)) if m.r#mod <= 0 => {
            return Err(format!("`mod_eq.mod` must be > 0 but got {}.", m.r#mod))
        }
        Some(Cmp::ModEq(m)) if m.eq < 0 => {
            return Err(format!("`mod_eq.eq` must be >= 0 but got {}.", m.eq))
        }
        Some(Cmp::ModEq(m)) => Compare::ModEq(m.r#mod, m.eq),
    };
    if subject == Subject::IsEndEpisode && (compare != Compare::Eq(1) || condition.inverse) {
        return Err("Condition must use `eq=1` when using `is_end_episode`.".into());
    }
    Ok(Check {
        subject,
        compare,
        inverse: condition.inverse,
    })
}

impl Pattern {
    /// Checks config number `index`; the error says what is wrong, as the reference words it.
    pub fn new(index: usize, config: &StructuredWriterConfig) -> Result<Self, String> {
        let fail = |what: String| format!("Invalid configuration at position {index}: {what}");
        if config.flat.is_empty() {
            return Err(fail("`flat` must not be empty.".into()));
        }
        if config.table.is_empty() {
            return Err(fail("`table` must not be empty.".into()));
        }
        let nodes = config
            .flat
            .iter()
            .map(node_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        let checks = config
            .conditions
            .iter()
            .map(check_of)
            .collect::<Result<Vec<_>, _>>()
            .map_err(fail)?;
        let priority = match config
            .priority
            .as_ref()
            .and_then(|p| p.priority_fn.as_ref())
        {
            None => {
                return Err(fail(
                    "`priority` must be set (e.g. constant_priority_fn(1.0)).".into(),
                ))
            }
            Some(PriorityFn::ConstantFn(c)) => Priority::Constant(c.value),
            Some(PriorityFn::TdError(t)) => Priority::TdError {
                weight: t.max_priority_weight,
                column: leaf_of(t.flat_source_index, "td_error.flat_source_index").map_err(fail)?,
            },
        };
        let paths: Vec<String> = match &config.pattern_structure {
            Some(structure) => flatten(structure)
                .iter()
                .map(|(p, _)| path_string(p))
                .collect(),
            None => (0..nodes.len()).map(|i| format!("({i},)")).collect(),
        };
        if paths.len() != nodes.len() {
            return Err(fail(format!(
                "`pattern_structure` has {} leaves but `flat` has {} nodes.",
                paths.len(),
                nodes.len()
            )));
        }
        Ok(Self {
            index,
            table: config.table.clone(),
            nodes,
            paths,
            checks,
            priority,
        })
    }

    /// Whether all the config's conditions hold on a step: `since` steps since the config
    /// last applied; `data(leaf)` is the value a data condition on `leaf` compares (`None`:
    /// the condition does not hold).
    pub fn holds(
        &self,
        facts: &StepFacts,
        since: i64,
        data: impl Fn(usize) -> Option<i64>,
    ) -> bool {
        self.checks.iter().all(|check| {
            check.holds(match check.subject {
                Subject::StepIndex => Some(facts.index),
                Subject::StepsSinceApplied => Some(since),
                Subject::BufferLength => Some(facts.buffer_length),
                Subject::IsEndEpisode => Some(facts.end_of_episode as i64),
                Subject::Data(leaf) => data(leaf),
            })
        })
    }

    /// Every leaf index the config reads (its columns and data conditions; a TD-error leaf
    /// is read only where a column holds it).
    pub fn leaves(&self) -> impl Iterator<Item = usize> + '_ {
        let data = self.checks.iter().filter_map(|c| match c.subject {
            Subject::Data(i) => Some(i),
            _ => None,
        });
        self.nodes.iter().map(|n| n.column).chain(data)
    }

    /// The node the TD error is taken from (the last one of that leaf), if any.
    pub fn td_node(&self) -> Option<(f64, &Node)> {
        match self.priority {
            Priority::TdError { weight, column } => self
                .nodes
                .iter()
                .rev()
                .find(|n| n.column == column)
                .map(|n| (weight, n)),
            Priority::Constant(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use reverb_proto::condition::ModuloEq;
    use reverb_proto::priority::ConstantPriorityFn;

    fn node(start: Option<i32>, stop: Option<i32>, step: Option<i32>) -> PatternNode {
        PatternNode {
            flat_source_index: 0,
            start_or_none: start.map(StartOrNone::Start),
            stop_or_none: stop.map(StopOrNone::Stop),
            step_or_none: step.map(StepOrNone::Step),
        }
    }

    fn config(flat: Vec<PatternNode>, conditions: Vec<Condition>) -> StructuredWriterConfig {
        StructuredWriterConfig {
            flat,
            pattern_structure: None,
            table: "t".into(),
            priority: Some(reverb_proto::Priority {
                priority_fn: Some(PriorityFn::ConstantFn(ConstantPriorityFn { value: 1.0 })),
            }),
            conditions,
        }
    }

    #[test]
    fn refuses_malformed_nodes_as_the_reference() {
        let cases = [
            (
                node(Some(-3), None, Some(0)),
                "`step` must be > 0 but got 0.",
            ),
            (node(Some(0), None, None), "`start` must be < 0 but got 0."),
            (node(None, Some(1), None), "`stop` must be <= 0 but got 1."),
            (
                node(None, Some(0), None),
                "`stop` must be < 0 when `start` isn't set",
            ),
            (
                node(Some(-2), Some(-2), None),
                "`stop` (-2) must be > `start` (-2)",
            ),
            (node(None, None, None), "At least one of `start` and `stop`"),
            (
                node(None, Some(-1), Some(2)),
                "`step` must only be set when `start` is set.",
            ),
        ];
        for (n, want) in cases {
            let err = Pattern::new(3, &config(vec![n], vec![])).unwrap_err();
            assert!(
                err.starts_with("Invalid configuration at position 3: "),
                "{err}"
            );
            assert!(err.contains(want), "{n:?}: {err}");
        }
        let mut bad = config(vec![node(None, Some(-1), None)], vec![]);
        bad.flat[0].flat_source_index = -1;
        assert!(Pattern::new(0, &bad)
            .unwrap_err()
            .contains("must be >= 0 but got -1"));
        bad = config(vec![], vec![]);
        assert!(Pattern::new(0, &bad)
            .unwrap_err()
            .contains("`flat` must not be empty."));
        bad = config(vec![node(None, Some(-1), None)], vec![]);
        bad.table.clear();
        assert!(Pattern::new(0, &bad)
            .unwrap_err()
            .contains("`table` must not be empty."));
        bad = config(vec![node(None, Some(-1), None)], vec![]);
        bad.priority = None;
        assert!(Pattern::new(0, &bad)
            .unwrap_err()
            .contains("`priority` must be set"));
    }

    #[test]
    fn refuses_malformed_conditions_as_the_reference() {
        let cond = |left, cmp, inverse| Condition { left, cmp, inverse };
        let modeq = |m, eq| Some(Cmp::ModEq(ModuloEq { r#mod: m, eq }));
        let cases = [
            (
                cond(Some(Left::StepIndex(true)), modeq(0, 0), false),
                "`mod_eq.mod` must be > 0",
            ),
            (
                cond(Some(Left::StepIndex(true)), modeq(2, -1), false),
                "`mod_eq.eq` must be >= 0",
            ),
            (
                cond(None, Some(Cmp::Eq(1)), false),
                "must specify a value for `left`",
            ),
            (
                cond(Some(Left::StepIndex(true)), None, false),
                "must specify a value for `cmp`",
            ),
            (
                cond(Some(Left::IsEndEpisode(true)), Some(Cmp::Eq(2)), false),
                "`eq=1`",
            ),
            (
                cond(Some(Left::IsEndEpisode(true)), Some(Cmp::Eq(1)), true),
                "`eq=1`",
            ),
            (
                cond(Some(Left::FlatSourceIndex(-2)), Some(Cmp::Eq(1)), false),
                "got -2",
            ),
        ];
        for (c, want) in cases {
            let err = Pattern::new(0, &config(vec![node(None, Some(-1), None)], vec![c]));
            assert!(err.unwrap_err().contains(want), "{want}");
        }
    }

    #[test]
    fn comparisons_and_inverse() {
        let check = |compare, inverse| Check {
            subject: Subject::StepIndex,
            compare,
            inverse,
        };
        assert!(check(Compare::Eq(3), false).holds(Some(3)));
        assert!(!check(Compare::Eq(3), true).holds(Some(3)));
        assert!(check(Compare::Ge(3), false).holds(Some(4)));
        assert!(check(Compare::Ge(3), true).holds(Some(2)));
        assert!(check(Compare::ModEq(3, 1), false).holds(Some(7)));
        assert!(!check(Compare::ModEq(3, 1), false).holds(Some(-2)));
        // A missing value never holds, inverted or not.
        assert!(!check(Compare::Eq(3), true).holds(None));
    }

    #[test]
    fn td_priority() {
        assert_eq!(Priority::td(0.25, &[0.0, -1.0, 2.0]), 0.25 * 2.0 + 0.75);
        assert_eq!(Priority::td(0.5, &[]), 0.0);
    }

    proptest! {
        /// A node's positions are the Python slice `history[start:stop:step]` (or
        /// `history[stop]`) of the held steps, whenever enough are held.
        #[test]
        fn positions_are_python_slices(
            start in -12i32..0, len in 1i32..12, step in 1i32..5, held in 0usize..16, single in any::<bool>()
        ) {
            let stop = (start + len).min(0);
            let n = if single { node(None, Some(start), None) } else { node(Some(start), Some(stop), Some(step)) };
            let pattern = Pattern::new(0, &config(vec![n], vec![])).unwrap();
            let node = &pattern.nodes[0];
            let history: Vec<i64> = (0..held as i64).collect();
            let got: Option<Vec<usize>> = node.positions(held).map(|p| p.collect());
            if (start.unsigned_abs() as usize) > held {
                prop_assert!(got.is_none());
            } else {
                let h = held as i64;
                let want: Vec<usize> = if single {
                    vec![(h + start as i64) as usize]
                } else {
                    let (a, b) = (h + start as i64, h + stop as i64);
                    (a..b).step_by(step as usize).map(|i| history[i as usize] as usize).collect()
                };
                prop_assert_eq!(got.unwrap(), want);
            }
        }
    }
}

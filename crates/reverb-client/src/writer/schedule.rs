//! When structured-writer configs apply over a stream of steps, with no writer behind them:
//! the rule `reverb.PatternDataset` evaluates on every step (its TensorFlow kernel,
//! `ReverbRsPatternStep`, runs [`Schedule::step`]). Every step of such a stream sets every
//! leaf. The caller keeps each leaf's recent rows ([`Schedule::history`]) and cuts an applied
//! config's trajectory out of them ([`Schedule::slices`]).

use super::patterns::{Check, Compare, Pattern, StepFacts, Subject};
use reverb_proto::StructuredWriterConfig;
use std::collections::BTreeMap;

/// Where a column of a config's trajectory lies in its leaf's kept rows (the oldest row is
/// 0): rows `first..first + length` by `step`, or the single row `first` when `squeeze`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slice {
    /// The leaf of the step.
    pub leaf: usize,
    /// First row taken.
    pub first: usize,
    /// Rows spanned (1 when squeezed).
    pub length: usize,
    /// Stride.
    pub step: usize,
    /// Whether the column is one row without its leading dimension.
    pub squeeze: bool,
}

/// The configs of a `PatternDataset`, checked, with the buffer-length conditions the reference
/// adds to them.
#[derive(Debug, Clone)]
pub struct Schedule {
    patterns: Vec<Pattern>,
    /// Rows kept per leaf a trajectory takes.
    history: BTreeMap<usize, usize>,
    max_history: usize,
    /// Leaves data conditions read, in the order [`Schedule::step`] takes their values.
    data_leaves: Vec<usize>,
    respect_episode_boundaries: bool,
}

/// Position of the rows held in the state vector (then the episode index, then each config's
/// steps since it applied).
const HELD: usize = 0;
const INDEX: usize = 1;
const SINCE: usize = 2;

impl Schedule {
    /// Checks `configs` for steps of `num_leaves` leaves; the error says what is wrong, as
    /// the reference words it.
    pub fn new(
        configs: &[StructuredWriterConfig],
        num_leaves: usize,
        respect_episode_boundaries: bool,
    ) -> Result<Self, String> {
        if configs.is_empty() {
            return Err("At least one config must be provided.".into());
        }
        let mut patterns = Vec::with_capacity(configs.len());
        // The reference's configs each require the buffer to hold as many rows as the longest
        // node of this or any earlier config reaches back.
        let mut reach = 0;
        for (index, config) in configs.iter().enumerate() {
            let mut pattern = Pattern::new(index, config)?;
            if let Some(leaf) = pattern.leaves().find(|&l| l >= num_leaves) {
                return Err(format!(
                    "Config {index} refers to leaf {leaf} (`flat_source_index`) but the steps \
                     have {num_leaves} leaves."
                ));
            }
            for node in &pattern.nodes {
                reach = reach.max(node.max_age());
                let present = pattern.checks.iter().any(|c| {
                    c.subject == Subject::BufferLength
                        && matches!(c.compare, Compare::Ge(v) if v as i64 >= reach as i64)
                });
                if !present {
                    pattern.checks.push(Check {
                        subject: Subject::BufferLength,
                        compare: Compare::Ge(reach as i32),
                        inverse: false,
                    });
                }
            }
            patterns.push(pattern);
        }
        let mut history = BTreeMap::new();
        let mut data_leaves = Vec::new();
        for pattern in &patterns {
            for node in &pattern.nodes {
                let h = history.entry(node.column).or_insert(0);
                *h = (*h).max(node.max_age());
            }
            for check in &pattern.checks {
                if let Subject::Data(leaf) = check.subject {
                    if !data_leaves.contains(&leaf) {
                        data_leaves.push(leaf);
                    }
                }
            }
        }
        Ok(Self {
            max_history: history.values().copied().max().unwrap_or(0).max(1),
            history,
            data_leaves,
            patterns,
            respect_episode_boundaries,
        })
    }

    /// Number of configs.
    pub fn len(&self) -> usize {
        self.patterns.len()
    }

    /// Whether there are no configs (never: [`Schedule::new`] refuses none).
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Rows to keep of each leaf trajectories take (the newest last).
    pub fn history(&self) -> &BTreeMap<usize, usize> {
        &self.history
    }

    /// Leaves data conditions read; [`Schedule::step`] takes their values in this order.
    pub fn data_leaves(&self) -> &[usize] {
        &self.data_leaves
    }

    /// Length of the state vector [`Schedule::step`] carries from step to step; a stream
    /// starts from zeros.
    pub fn state_len(&self) -> usize {
        SINCE + self.patterns.len()
    }

    /// The columns of config `c`'s trajectory in the kept rows of their leaves.
    pub fn slices(&self, c: usize) -> Vec<Slice> {
        self.patterns[c]
            .nodes
            .iter()
            .map(|node| {
                let kept = self.history[&node.column];
                Slice {
                    leaf: node.column,
                    first: kept - node.max_age(),
                    length: node.start.map_or(1, |start| (node.stop - start) as usize),
                    step: node.step,
                    squeeze: node.squeeze(),
                }
            })
            .collect()
    }

    /// Takes one step: `data[i]` is the value a condition on `data_leaves()[i]` compares in
    /// this step (`None`: not a one-element integer or bool, never holds), `end` whether the
    /// episode ends with it. Returns, per config, whether it applies on the step, then per
    /// config whether it applies at the end of the episode (the end-of-episode pass, as the
    /// structured writer's `end_episode`; only configs that did not apply on the step).
    pub fn step(&self, state: &mut [i64], data: &[Option<i64>], end: bool) -> Vec<bool> {
        assert_eq!(state.len(), self.state_len(), "state of another schedule");
        let held = (state[HELD] + 1).min(self.max_history as i64);
        let index = state[INDEX];
        let value = |leaf: usize| {
            let i = self.data_leaves.iter().position(|&l| l == leaf)?;
            data.get(i).copied().flatten()
        };
        let n = self.patterns.len();
        let mut made = vec![false; 2 * n];
        for (pass, end_of_episode) in [(0, false), (1, true)] {
            if end_of_episode && !end {
                break;
            }
            let facts = StepFacts {
                index,
                buffer_length: held,
                end_of_episode,
            };
            for (c, pattern) in self.patterns.iter().enumerate() {
                if pass == 1 && made[c] {
                    continue;
                }
                // (Its buffer-length condition asks for the rows it reaches back.)
                made[pass * n + c] = pattern.holds(&facts, state[SINCE + c] + 1, value);
            }
        }
        for c in 0..n {
            state[SINCE + c] = if made[c] || made[n + c] {
                0
            } else {
                state[SINCE + c] + 1
            };
        }
        state[INDEX] = if end { 0 } else { index + 1 };
        state[HELD] = if end && self.respect_episode_boundaries {
            0
        } else {
            held
        };
        made
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use reverb_proto::condition::{Cmp, Left};
    use reverb_proto::pattern_node::{StartOrNone, StopOrNone};
    use reverb_proto::priority::{ConstantPriorityFn, PriorityFn};
    use reverb_proto::{Condition, PatternNode};

    fn config(
        nodes: &[(usize, Option<i32>, i32)],
        conditions: Vec<Condition>,
    ) -> StructuredWriterConfig {
        StructuredWriterConfig {
            flat: nodes
                .iter()
                .map(|&(leaf, start, stop)| PatternNode {
                    flat_source_index: leaf as i32,
                    start_or_none: start.map(StartOrNone::Start),
                    stop_or_none: (stop != 0 || start.is_none()).then_some(StopOrNone::Stop(stop)),
                    step_or_none: None,
                })
                .collect(),
            pattern_structure: None,
            table: "t".into(),
            priority: Some(reverb_proto::Priority {
                priority_fn: Some(PriorityFn::ConstantFn(ConstantPriorityFn { value: 1.0 })),
            }),
            conditions,
        }
    }

    fn condition(left: Left, cmp: Cmp) -> Condition {
        Condition {
            left: Some(left),
            cmp: Some(cmp),
            inverse: false,
        }
    }

    /// The step numbers (from 0) at which each config applies over `steps` steps in episodes
    /// of `episode` steps; data leaf 0 holds the step number.
    fn run(schedule: &Schedule, steps: i64, episode: i64) -> Vec<Vec<i64>> {
        let mut state = vec![0; schedule.state_len()];
        let mut applied = vec![Vec::new(); schedule.len()];
        for i in 0..steps {
            let data: Vec<Option<i64>> = schedule.data_leaves().iter().map(|_| Some(i)).collect();
            let made = schedule.step(&mut state, &data, i % episode == episode - 1);
            for (c, m) in made.iter().enumerate() {
                if *m {
                    applied[c % schedule.len()].push(i);
                }
            }
        }
        applied
    }

    #[test]
    fn slices_wait_for_their_history_and_respect_episodes() {
        let s = Schedule::new(
            &[config(&[(0, Some(-3), 0), (1, None, -1)], vec![])],
            2,
            true,
        )
        .unwrap();
        assert_eq!(s.history().get(&0), Some(&3));
        assert_eq!(
            s.slices(0),
            vec![
                Slice {
                    leaf: 0,
                    first: 0,
                    length: 3,
                    step: 1,
                    squeeze: false
                },
                Slice {
                    leaf: 1,
                    first: 0,
                    length: 1,
                    step: 1,
                    squeeze: true
                },
            ]
        );
        // Episodes of 4 steps: steps 2, 3 then 6, 7 then 10.
        assert_eq!(run(&s, 11, 4), vec![vec![2, 3, 6, 7, 10]]);
        let across = Schedule::new(&[config(&[(0, Some(-3), 0)], vec![])], 1, false).unwrap();
        assert_eq!(run(&across, 6, 4), vec![vec![2, 3, 4, 5]]);
    }

    #[test]
    fn conditions_are_the_structured_writers() {
        let configs = [
            config(
                &[(0, None, -1)],
                vec![condition(
                    Left::StepIndex(true),
                    Cmp::ModEq(reverb_proto::condition::ModuloEq { r#mod: 2, eq: 0 }),
                )],
            ),
            config(
                &[(0, None, -1)],
                vec![condition(Left::StepsSinceApplied(true), Cmp::Ge(3))],
            ),
            config(
                &[(0, None, -1)],
                vec![condition(Left::FlatSourceIndex(1), Cmp::Eq(4))],
            ),
            config(
                &[(0, Some(-2), 0)],
                vec![condition(Left::IsEndEpisode(true), Cmp::Eq(1))],
            ),
        ];
        let s = Schedule::new(&configs, 2, true).unwrap();
        assert_eq!(s.data_leaves(), &[1]);
        let got = run(&s, 12, 5);
        assert_eq!(got[0], vec![0, 2, 4, 5, 7, 9, 10]);
        assert_eq!(got[1], vec![2, 5, 8, 11]);
        assert_eq!(got[2], vec![4]);
        // The end-of-episode config: at the episodes' last steps once two rows are held.
        assert_eq!(got[3], vec![4, 9]);
    }

    #[test]
    fn refuses_what_the_reference_refuses() {
        assert!(Schedule::new(&[], 1, true)
            .unwrap_err()
            .contains("At least one config"));
        let err = Schedule::new(&[config(&[(3, None, -1)], vec![])], 2, true).unwrap_err();
        assert!(err.contains("refers to leaf 3"), "{err}");
        let mut bad = config(&[(0, None, -1)], vec![]);
        bad.flat.clear();
        let err = Schedule::new(&[bad], 1, true).unwrap_err();
        assert!(err.contains("Invalid configuration at position 0"), "{err}");
    }
}

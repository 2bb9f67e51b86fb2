//! Episodes: the environments a writer writes episodes of at once (one for a plain writer,
//! one per environment of a vectorised one), each with its current episode, and where their
//! fields' columns are (field `f` of env `e` is column `f * num_envs + e`). A leaf: columns
//! and the vectorised writer (`envs`) both use it.

/// One episode being written.
#[derive(Debug, Clone, Copy)]
pub(super) struct Episode {
    pub episode_id: u64,
    /// The writer-wide step where the episode began.
    pub start: u64,
}

impl Episode {
    fn new(start: u64) -> Self {
        Self {
            episode_id: rand::random(),
            start,
        }
    }
}

/// The envs of a writer with their current episodes, and where their fields' columns are.
#[derive(Debug)]
pub(super) struct Envs(Vec<Episode>);

impl Envs {
    /// `n` envs whose episodes start at step 0.
    pub fn new(n: usize) -> Self {
        Self((0..n).map(|_| Episode::new(0)).collect())
    }

    /// Number of envs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// An env's current episode.
    pub fn get(&self, env: usize) -> Episode {
        self.0[env]
    }

    /// The current episode of the env a column belongs to.
    pub fn of_column(&self, column: usize) -> Episode {
        match self.0.len() {
            1 => self.0[0],
            n => self.0[column % n],
        }
    }

    /// The column of `field` in `env`.
    pub fn column(&self, field: usize, env: usize) -> usize {
        field * self.0.len() + env
    }

    /// The columns of `env` below `len`.
    pub fn columns_of(&self, env: usize, len: usize) -> impl Iterator<Item = usize> {
        (env..len).step_by(self.0.len())
    }

    /// Starts a new episode in `env` at `step`.
    pub fn restart(&mut self, env: usize, step: u64) {
        self.0[env] = Episode::new(step);
    }

    /// Starts a new episode in every env at `step`.
    pub fn restart_all(&mut self, step: u64) {
        for env in 0..self.0.len() {
            self.restart(env, step);
        }
    }

    /// Each env's episode start.
    pub fn starts(&self) -> Vec<u64> {
        self.0.iter().map(|e| e.start).collect()
    }
}

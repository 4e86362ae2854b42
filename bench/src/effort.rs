//! How hard a run pushes: repetitions and sizes.

/// How hard a run pushes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Effort {
    /// Repetitions of each measurement; the table shows their median and spread.
    pub(crate) runs: usize,
    /// A multiplier on each scenario's size: 1.0 for a full run.
    pub(crate) scale: f64,
}

impl Effort {
    pub(crate) fn scaled(&self, full: usize) -> usize {
        ((full as f64 * self.scale) as usize).max(1)
    }
}

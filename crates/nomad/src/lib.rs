#![doc = include_str!("../README.md")]
//!
//! Modules: [`job`] (a Nomad job into wharf's spec: what is used, shown back or refused),
//! [`shapes`] (Nomad's API answers, filled from wharf's allocation state). The reading of
//! JSON objects key by key, so that nothing set is dropped unseen, lives in `fields`.

mod fields;
pub mod job;
pub mod shapes;

pub use job::{DRIVERS, GroupPlan, NomadJob, alloc_name, job_of_request, translate, type_name};

/// Why a Nomad job cannot run on wharf. Each names the field by its path in the job JSON,
/// such as `Job.TaskGroups[0].Tasks[1].Vault`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NomadError {
    /// A field wharf does not implement is set; it is refused rather than dropped.
    #[error("{field}: {reason}")]
    Unsupported {
        /// Its path.
        field: String,
        /// What wharf lacks.
        reason: String,
    },
    /// A field's value is not what Nomad's API takes there.
    #[error("{field}: {message}")]
    Invalid {
        /// Its path.
        field: String,
        /// What is wrong.
        message: String,
    },
    /// The translated job is not a valid wharf job (fields named as in wharf's spec).
    #[error("{0}")]
    Spec(#[from] wharf_state::SpecError),
}

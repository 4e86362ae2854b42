#![doc = include_str!("../README.md")]
//!
//! Modules: `fetch` (download, checksum, placing; [`Fetcher`] and its [`Limits`]), `unpack`
//! (tar, tar.gz and gz, and the rules that keep entries inside the destination), `zip` (a
//! small reader of zip's stored and deflated entries), [`ArtifactHook`] (the task hook). The
//! spec's `artifact` block is [`wharf_state::Artifact`].

mod checksum;
mod error;
mod fetch;
mod hook;
mod unpack;
mod zip;

pub use error::ArtifactError;
pub use fetch::{Fetcher, Limits, MAX_REDIRECTS};
pub use hook::ArtifactHook;

// The crates this one's API is written in.
pub use wharf_state as state;
pub use wharf_task as task;

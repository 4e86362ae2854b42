//! The wharf node: the agent, its HTTP API and the `wharf` command line, wired from the crates
//! below. It holds no lifecycle logic of its own: allocations are wharf-alloc's, tasks
//! wharf-task's, processes wharf-exec's, persistence wharf-store's.
//!
//! - [`agent`]: opens the store, restores, runs, stops, garbage-collects, shuts down; gives
//!   allocations their ports and keeps the node's service catalog.
//! - [`api`]: the HTTP API over the agent.
//! - [`cli`]: `wharf agent | run | validate | alloc ... | node status | service list | wipe`,
//!   one module per subcommand, and [`cli::common`] for what they share.
//! - [`config`]: the agent's TOML configuration with defaults.
//! - [`container`]: the container driver's settings and image collection; `images_api`:
//!   `/v1/images`.
//! - [`serve`]: serving with graceful shutdown, and the embedded agent of `wharf run`.
//! - [`wipe`]: `wharf wipe`, a node's end when the machine it stands for is destroyed.
//! - [`fleet`]: `wharf fleet`, a pool of agents driven by wharf-prober, its API, and its
//!   commands ([`fleet::cli`]).
//! - [`resources`]: what the node has and keeps, admission's totals, and the tasks' cgroups;
//!   [`usage`]: how the node's resources and tasks' usage are shown (API, CLI, metrics).
//! - [`api_token`]: the API token an agent or a fleet keeps in its data directory when none is
//!   set; [`agent_token`]: the agent's.
//! - [`metrics`]: the agent's counters and gauges, through one typed writer of the text format.
//! - [`probe`], [`client`], [`agent_file`]: what those need. Task logs are read
//!   by each task's driver (`wharf_driver::Driver::task_logs`).

pub mod agent;
pub mod agent_file;
pub mod agent_relay;
pub mod agent_token;
pub mod api;
pub mod api_token;
pub mod cli;
pub mod client;
pub mod config;
pub mod container;
pub mod fence;
pub mod fleet;
mod images_api;
pub mod metrics;
pub mod nomad;
mod nomad_http;
pub mod probe;
pub mod resources;
pub mod serve;
pub mod usage;
pub mod variables;
pub mod wipe;

#![doc = include_str!("../README.md")]
//!
//! ## Inside
//!
//! Modules, in the order a container meets them:
//! - `reference`: image references (`oci:/path:tag`, `docker-archive:/path.tar`, registry
//!   references); `fetch` and `registry`: fetching from any source, registries over the OCI
//!   distribution API;
//! - `store`, `import`, `unpack`, `digest`, `image`: the image store (blobs verified by digest,
//!   layers unpacked once per digest in overlayfs's format, nothing written outside a layer);
//! - [`config`]: a task's `config` block and the node's options;
//! - `spec`: the OCI runtime spec, the image's config merged with the task's by Docker's rules,
//!   with Docker's defaults;
//! - [`seccomp`]: the container's seccomp filter, Docker's default profile (its
//!   capability-conditional parts following `cap_add`), a profile file, or none;
//! - `mount`, `cgroup_path`: the root filesystem (overlayfs) and the task's cgroup as the
//!   runtime names it;
//! - [`waiter`]: the task's process under wharf-exec's shim: `runc create`, `runc start`, the
//!   container's init as its child, its exit passed on;
//! - `runtime`: the runtime's control commands (`state`, `delete`, `--version`), bounded;
//! - `driver`: [`ContainerDriver`], the [`wharf_driver::Driver`] implementation.

#[cfg(not(target_os = "linux"))]
compile_error!("wharf-container runs containers with Linux namespaces, overlayfs and runc");

mod cgroup_path;
pub mod config;
mod digest;
mod driver;
mod error;
mod fetch;
mod image;
mod import;
mod mount;
mod reference;
mod registry;
mod runtime;
pub mod seccomp;
pub mod spec;
mod store;
mod unpack;
pub mod waiter;

pub use config::{ContainerConfig, ContainerOptions, MountConfig, NetworkMode, Runtime};
pub use digest::Digest;
pub use driver::{CONTAINERS_DIR, ContainerDriver, DRIVER_NAME, is_mounted};
pub use error::ContainerError;
pub use fetch::fetch;
pub use image::StoredImage;
pub use mount::unmount_all_under;
pub use reference::{ImageRef, ImageSource, RegistryRef};
pub use registry::RegistryOptions;
pub use store::ImageStore;

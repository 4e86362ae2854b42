//! Where templates read the node's data: its service catalog and its variables store,
//! behind [`TemplateSources`] so that this crate knows neither, and an in-memory
//! implementation for tests and programs that keep their data themselves.

use parking_lot::RwLock;
use std::collections::BTreeMap;
use std::sync::Arc;
use tokio::sync::watch;
use wharf_state::ServiceEntry;

/// The items of one variable: names to values.
pub type VariableItems = BTreeMap<String, String>;

/// What `nomadService`, `nomadVar` and `key` read, and how a renderer learns that it changed.
pub trait TemplateSources: Send + Sync + std::fmt::Debug + 'static {
    /// The instances of the service `name`, in a stable order.
    fn services(&self, name: &str) -> Vec<ServiceEntry>;

    /// The variable at `path`, if there is one.
    fn variable(&self, path: &str) -> Option<VariableItems>;

    /// The paths of the variables that start with `prefix`, in order.
    fn variable_paths(&self, prefix: &str) -> Vec<String>;

    /// A counter that moves whenever a service or a variable changes (coalescing: a reader
    /// may see one move for many changes).
    fn changes(&self) -> watch::Receiver<u64>;
}

/// Sources held in memory: what a test sets is what templates read.
#[derive(Debug)]
pub struct MemorySources {
    services: RwLock<Vec<ServiceEntry>>,
    variables: RwLock<BTreeMap<String, VariableItems>>,
    changed: watch::Sender<u64>,
}

impl Default for MemorySources {
    fn default() -> Self {
        MemorySources {
            services: RwLock::default(),
            variables: RwLock::default(),
            changed: watch::channel(0).0,
        }
    }
}

impl MemorySources {
    /// Empty sources, shared.
    pub fn new() -> Arc<MemorySources> {
        Arc::new(MemorySources::default())
    }

    /// Sets the variable at `path` to `items`.
    pub fn put_variable<K: Into<String>, V: Into<String>>(
        &self,
        path: &str,
        items: impl IntoIterator<Item = (K, V)>,
    ) {
        let items = items.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        self.variables.write().insert(path.to_owned(), items);
        self.touch();
    }

    /// Removes the variable at `path`.
    pub fn delete_variable(&self, path: &str) {
        self.variables.write().remove(path);
        self.touch();
    }

    /// Replaces every service.
    pub fn set_services(&self, services: Vec<ServiceEntry>) {
        *self.services.write() = services;
        self.touch();
    }

    fn touch(&self) {
        self.changed.send_modify(|version| *version += 1);
    }
}

impl TemplateSources for MemorySources {
    fn services(&self, name: &str) -> Vec<ServiceEntry> {
        self.services.read().iter().filter(|s| s.name == name).cloned().collect()
    }

    fn variable(&self, path: &str) -> Option<VariableItems> {
        self.variables.read().get(path).cloned()
    }

    fn variable_paths(&self, prefix: &str) -> Vec<String> {
        self.variables.read().keys().filter(|p| p.starts_with(prefix)).cloned().collect()
    }

    fn changes(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

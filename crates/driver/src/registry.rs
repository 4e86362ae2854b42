//! Drivers by name.

use crate::Driver;
use std::collections::BTreeMap;
use std::sync::Arc;

/// The drivers a node offers, by [`Driver::name`].
#[derive(Debug, Clone, Default)]
pub struct DriverRegistry {
    drivers: BTreeMap<String, Arc<dyn Driver>>,
}

impl DriverRegistry {
    /// An empty registry.
    pub fn new() -> DriverRegistry {
        DriverRegistry::default()
    }

    /// Adds a driver, replacing one of the same name. Returns the registry for chaining.
    pub fn with(mut self, driver: Arc<dyn Driver>) -> DriverRegistry {
        self.register(driver);
        self
    }

    /// Adds a driver, replacing (and returning) one of the same name.
    pub fn register(&mut self, driver: Arc<dyn Driver>) -> Option<Arc<dyn Driver>> {
        self.drivers.insert(driver.name().to_owned(), driver)
    }

    /// The driver called `name`.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn Driver>> {
        self.drivers.get(name)
    }

    /// Every driver name, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.drivers.keys().map(String::as_str)
    }
}

//! Where check results and services are kept while their allocations run.
//!
//! - [`CheckBook`]: one per allocation, every check of its group from the start (pending until
//!   it first runs, as Nomad's stub results), with the latest result of each. It tells
//!   watchers when a status changes (not on every run: a passing check that passes again
//!   wakes nobody). Results live in memory: after an agent restart the checks run again.
//! - [`ServiceCatalog`]: one per node, the services of running tasks with their address,
//!   port and tags; their health is read from their allocation's book when listed.

use crate::check::CheckId;
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::watch;
use wharf_state::service::CheckKind;
use wharf_state::{Allocation, CheckResult, CheckState, CheckStatus, ServiceEntry};

#[derive(Debug, Clone)]
struct Entry {
    kind: CheckKind,
    last: Option<CheckResult>,
}

/// The checks of one allocation and their latest results.
#[derive(Debug)]
pub struct CheckBook {
    entries: Mutex<BTreeMap<CheckId, Entry>>,
    /// Bumped whenever a check's status changes.
    changed: watch::Sender<u64>,
    /// Results recorded, ever.
    runs: AtomicU64,
}

impl CheckBook {
    /// A book with every check of `alloc`'s group, pending.
    pub fn new(alloc: &Allocation) -> CheckBook {
        let mut entries = BTreeMap::new();
        for task in alloc.group().map(|g| g.tasks.as_slice()).unwrap_or_default() {
            for service in &task.services {
                for check in &service.checks {
                    let id = CheckId {
                        task: task.name.clone(),
                        service: service.name.clone(),
                        check: service.check_name(check),
                    };
                    entries.insert(id, Entry { kind: check.kind, last: None });
                }
            }
        }
        CheckBook {
            entries: Mutex::new(entries),
            changed: watch::channel(0).0,
            runs: AtomicU64::new(0),
        }
    }

    /// Records a run's result. A check the book does not have is ignored.
    pub fn record(&self, id: &CheckId, result: CheckResult) {
        let changed = {
            let mut entries = self.entries.lock();
            let Some(entry) = entries.get_mut(id) else { return };
            self.runs.fetch_add(1, Ordering::Relaxed);
            let before = entry.last.as_ref().map_or(CheckStatus::Pending, |r| r.status);
            let changed = before != result.status;
            entry.last = Some(result);
            changed
        };
        if changed {
            self.changed.send_modify(|generation| *generation += 1);
        }
    }

    /// A receiver woken whenever a check's status changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// How many results have been recorded: the allocation's check runs.
    pub fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// Whether the book has any check.
    pub fn is_empty(&self) -> bool {
        self.entries.lock().is_empty()
    }

    /// Every check's status, pending for those that have not run.
    pub fn statuses(&self) -> Vec<(CheckId, CheckStatus)> {
        self.entries
            .lock()
            .iter()
            .map(|(id, entry)| {
                (id.clone(), entry.last.as_ref().map_or(CheckStatus::Pending, |r| r.status))
            })
            .collect()
    }

    /// Every check with its latest result, for people.
    pub fn states(&self) -> Vec<CheckState> {
        self.entries
            .lock()
            .iter()
            .map(|(id, entry)| CheckState {
                task: id.task.clone(),
                service: id.service.clone(),
                check: id.check.clone(),
                kind: entry.kind,
                status: entry.last.as_ref().map_or(CheckStatus::Pending, |r| r.status),
                last: entry.last.clone(),
            })
            .collect()
    }

    /// The worst status of the checks of `task`'s `service`; passing if it has none.
    pub fn service_health(&self, task: &str, service: &str) -> CheckStatus {
        self.entries
            .lock()
            .iter()
            .filter(|(id, _)| id.task == task && id.service == service)
            .map(|(_, entry)| entry.last.as_ref().map_or(CheckStatus::Pending, |r| r.status))
            .max()
            .unwrap_or(CheckStatus::Passing)
    }
}

/// A service as registered, before its health is read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    /// The allocation.
    pub alloc_id: String,
    /// Its job.
    pub job_id: String,
    /// Its group.
    pub group: String,
    /// The task offering the service.
    pub task: String,
    /// The service's name.
    pub name: String,
    /// Where it is reached.
    pub address: Option<IpAddr>,
    /// Its port.
    pub port: Option<u16>,
    /// Its tags.
    pub tags: Vec<String>,
}

type Key = (String, String, String);

/// The services of the node's running tasks.
#[derive(Debug, Default)]
pub struct ServiceCatalog {
    services: RwLock<BTreeMap<Key, (Registration, Arc<CheckBook>)>>,
}

impl ServiceCatalog {
    /// An empty catalog.
    pub fn new() -> ServiceCatalog {
        ServiceCatalog::default()
    }

    /// Adds (or replaces) a service; its health is read from `book`.
    pub fn register(&self, registration: Registration, book: Arc<CheckBook>) {
        let key =
            (registration.alloc_id.clone(), registration.task.clone(), registration.name.clone());
        self.services.write().insert(key, (registration, book));
    }

    /// Removes the services of `alloc_id`'s `task`; returns how many there were.
    pub fn deregister_task(&self, alloc_id: &str, task: &str) -> usize {
        let mut services = self.services.write();
        let before = services.len();
        services.retain(|(alloc, owner, _), _| !(alloc == alloc_id && owner == task));
        before - services.len()
    }

    /// Removes every service of `alloc_id`.
    pub fn deregister_alloc(&self, alloc_id: &str) -> usize {
        let mut services = self.services.write();
        let before = services.len();
        services.retain(|(alloc, _, _), _| alloc != alloc_id);
        before - services.len()
    }

    /// Every service, by name, then allocation and task.
    pub fn list(&self) -> Vec<ServiceEntry> {
        let mut entries: Vec<ServiceEntry> = self
            .services
            .read()
            .values()
            .map(|(r, book)| ServiceEntry {
                name: r.name.clone(),
                address: r.address,
                port: r.port,
                tags: r.tags.clone(),
                health: book.service_health(&r.task, &r.name),
                alloc_id: r.alloc_id.clone(),
                job_id: r.job_id.clone(),
                group: r.group.clone(),
                task: r.task.clone(),
            })
            .collect();
        entries
            .sort_by(|a, b| (&a.name, &a.alloc_id, &a.task).cmp(&(&b.name, &b.alloc_id, &b.task)));
        entries
    }

    /// How many services are registered.
    pub fn len(&self) -> usize {
        self.services.read().len()
    }

    /// Whether no service is registered.
    pub fn is_empty(&self) -> bool {
        self.services.read().is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use wharf_state::{Timestamp, spec};

    fn alloc(id: &str) -> Allocation {
        let job = spec::parse_toml(
            "[job]\nid = \"j\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
             [[group.task]]\nname = \"t\"\ndriver = \"mock\"\n\
             [[group.task.service]]\nname = \"web\"\n\
             [[group.task.service.check]]\nname = \"a\"\ntype = \"script\"\ncommand = \"x\"\ninterval = \"1s\"\ntimeout = \"1s\"\n\
             [[group.task.service.check]]\nname = \"b\"\ntype = \"script\"\ncommand = \"x\"\ninterval = \"1s\"\ntimeout = \"1s\"\n\
             [[group.task.service]]\nname = \"bare\"\n",
        )
        .unwrap();
        Allocation {
            id: id.into(),
            job,
            task_group: "g".into(),
            desired_status: wharf_state::DesiredStatus::Run,
            modify_index: 1,
            deployment_id: None,
            ports: Vec::new(),
        }
    }

    fn id(check: &str) -> CheckId {
        CheckId { task: "t".into(), service: "web".into(), check: check.into() }
    }

    fn result(status: CheckStatus, time: u64) -> CheckResult {
        CheckResult {
            status,
            output: format!("{status} at {time}"),
            status_code: None,
            time: Timestamp(time),
        }
    }

    /// Nomad's `TestShim_Set` and `TestShim_List`: every check starts pending, the newest
    /// result is kept, and only a change of status notifies.
    #[test]
    fn book_keeps_the_latest_result_and_notifies_status_changes() {
        let book = CheckBook::new(&alloc("a1"));
        let statuses: Vec<CheckStatus> = book.statuses().into_iter().map(|(_, s)| s).collect();
        assert_eq!(statuses, [CheckStatus::Pending, CheckStatus::Pending], "stubs for every check");
        let mut changes = book.subscribe();
        book.record(&id("a"), result(CheckStatus::Passing, 1));
        assert!(changes.has_changed().unwrap(), "pending to passing is a change");
        changes.mark_unchanged();
        book.record(&id("a"), result(CheckStatus::Passing, 2));
        assert!(!changes.has_changed().unwrap(), "passing again is not");
        assert_eq!(
            book.states()[0].last,
            Some(result(CheckStatus::Passing, 2)),
            "the newest result is kept"
        );
        book.record(&id("a"), result(CheckStatus::Critical, 3));
        assert!(changes.has_changed().unwrap());
        book.record(&id("nope"), result(CheckStatus::Critical, 4));
        assert_eq!(book.states().len(), 2, "unknown checks are ignored");
        assert_eq!(book.runs(), 3);
    }

    #[test]
    fn service_health_is_its_worst_check() {
        let book = CheckBook::new(&alloc("a1"));
        assert_eq!(book.service_health("t", "web"), CheckStatus::Pending);
        assert_eq!(book.service_health("t", "bare"), CheckStatus::Passing, "no checks: passing");
        book.record(&id("a"), result(CheckStatus::Passing, 1));
        book.record(&id("b"), result(CheckStatus::Warning, 1));
        assert_eq!(book.service_health("t", "web"), CheckStatus::Warning);
        book.record(&id("b"), result(CheckStatus::Passing, 2));
        assert_eq!(book.service_health("t", "web"), CheckStatus::Passing);
    }

    #[test]
    fn catalog_lists_registered_services_with_their_health() {
        let catalog = ServiceCatalog::new();
        let reg = |alloc: &str, task: &str, name: &str| Registration {
            alloc_id: alloc.into(),
            job_id: "j".into(),
            group: "g".into(),
            task: task.into(),
            name: name.into(),
            address: Some([127, 0, 0, 1].into()),
            port: Some(20_000),
            tags: vec!["v1".into()],
        };
        let (one, two) =
            (Arc::new(CheckBook::new(&alloc("a1"))), Arc::new(CheckBook::new(&alloc("a2"))));
        catalog.register(reg("a2", "t", "web"), two.clone());
        catalog.register(reg("a1", "t", "web"), one.clone());
        catalog.register(reg("a1", "t", "bare"), one.clone());
        one.record(&id("a"), result(CheckStatus::Passing, 1));
        one.record(&id("b"), result(CheckStatus::Passing, 1));
        let listed: Vec<(String, String, CheckStatus)> =
            catalog.list().into_iter().map(|e| (e.name, e.alloc_id, e.health)).collect();
        assert_eq!(
            listed,
            [
                ("bare".into(), "a1".into(), CheckStatus::Passing),
                ("web".into(), "a1".into(), CheckStatus::Passing),
                ("web".into(), "a2".into(), CheckStatus::Pending),
            ]
        );
        assert_eq!(catalog.deregister_task("a1", "t"), 2);
        assert_eq!(catalog.deregister_task("a1", "t"), 0);
        assert_eq!(catalog.len(), 1);
        assert_eq!(catalog.deregister_alloc("a2"), 1);
        assert!(catalog.is_empty());
    }
}

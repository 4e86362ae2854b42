//! Where check results and services are kept while their allocations run.
//!
//! - [`CheckBook`]: one per allocation, every check of its group from the start (pending until
//!   it first runs, as Nomad's stub results), with the latest result of each. It tells
//!   watchers when a status changes (not on every run: a passing check that passes again
//!   wakes nobody). A task that stops has its checks' results cleared back to pending, as
//!   Nomad's checks hook purges them before a kill; an allocation update that changes the
//!   checks changes the book (a check whose definition is unchanged keeps its result).
//!   Results live in memory: after an agent restart the checks run again.
//! - [`ServiceCatalog`]: one per node, the services of running tasks with their address,
//!   port and tags; their health is read from their allocation's book when listed.

use crate::check::CheckId;
use crate::tracker::CheckView;
use parking_lot::{Mutex, RwLock};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::watch;
use wharf_state::service::{Check, CheckKind, OnUpdate};
use wharf_state::{Allocation, CheckResult, CheckState, CheckStatus, ServiceEntry};

#[derive(Debug, Clone)]
struct Entry {
    kind: CheckKind,
    on_update: OnUpdate,
    /// What the check is, to tell an update that changes it.
    definition: (Check, Option<String>),
    last: Option<CheckResult>,
}

impl Entry {
    fn status(&self) -> CheckStatus {
        self.last.as_ref().map_or(CheckStatus::Pending, |r| r.status)
    }
}

/// The checks of one allocation and their latest results.
#[derive(Debug)]
pub struct CheckBook {
    inner: Mutex<Inner>,
    /// Bumped whenever a check's status changes.
    changed: watch::Sender<u64>,
    /// Results recorded, ever.
    runs: AtomicU64,
}

#[derive(Debug)]
struct Inner {
    checks: BTreeMap<CheckId, Entry>,
    /// Per task, how many times its results were cleared: a run begun before the last clear
    /// records nothing (see [`CheckBook::record_run`]).
    runs_of: BTreeMap<String, u64>,
}

impl CheckBook {
    /// A book with every check of `alloc`'s group, pending.
    pub fn new(alloc: &Allocation) -> CheckBook {
        let inner = Inner { checks: entries_of(alloc), runs_of: BTreeMap::new() };
        CheckBook {
            inner: Mutex::new(inner),
            changed: watch::channel(0).0,
            runs: AtomicU64::new(0),
        }
    }

    /// Tells watchers if a status changed.
    fn notify(&self, changed: bool) {
        if changed {
            self.changed.send_modify(|generation| *generation += 1);
        }
    }

    /// Takes the checks of `alloc`'s group, as updated: new checks are pending, removed ones
    /// are gone, and a check whose definition did not change keeps its latest result.
    pub fn update(&self, alloc: &Allocation) {
        let mut fresh = entries_of(alloc);
        let changed = {
            let mut inner = self.inner.lock();
            for (id, entry) in &mut fresh {
                let old = inner.checks.get(id).filter(|old| old.definition == entry.definition);
                entry.last = old.and_then(|old| old.last.clone());
            }
            let statuses = |map: &BTreeMap<CheckId, Entry>| -> Vec<(CheckId, CheckStatus)> {
                map.iter().map(|(id, e)| (id.clone(), e.status())).collect()
            };
            let changed = statuses(&inner.checks) != statuses(&fresh);
            inner.checks = fresh;
            changed
        };
        self.notify(changed);
    }

    /// Clears the results of `task`'s checks back to pending: the task stopped. Runs of its
    /// checks that began before this record nothing.
    pub fn reset_task(&self, task: &str) {
        let changed = {
            let mut inner = self.inner.lock();
            *inner.runs_of.entry(task.to_owned()).or_default() += 1;
            let mut changed = false;
            for (_, entry) in inner.checks.iter_mut().filter(|(id, _)| id.task == task) {
                changed |= entry.status() != CheckStatus::Pending;
                entry.last = None;
            }
            changed
        };
        self.notify(changed);
    }

    /// Which run of `task` this is: what a run of its checks hands to
    /// [`CheckBook::record_run`].
    pub fn run_of(&self, task: &str) -> u64 {
        self.inner.lock().runs_of.get(task).copied().unwrap_or(0)
    }

    /// Records a run's result. A check the book does not have is ignored.
    pub fn record(&self, id: &CheckId, result: CheckResult) {
        self.record_run(id, None, result);
    }

    /// Records a result of a check of `run` of its task (from [`CheckBook::run_of`]), unless
    /// the task's results were cleared since: a check of a stopped task that was still running
    /// when the task stopped cannot bring back a result.
    pub fn record_run(&self, id: &CheckId, run: Option<u64>, result: CheckResult) {
        let changed = {
            let mut inner = self.inner.lock();
            let current = inner.runs_of.get(&id.task).copied().unwrap_or(0);
            if run.is_some_and(|run| run != current) {
                return;
            }
            let Some(entry) = inner.checks.get_mut(id) else { return };
            self.runs.fetch_add(1, Ordering::Relaxed);
            let changed = entry.status() != result.status;
            entry.last = Some(result);
            changed
        };
        self.notify(changed);
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
        self.inner.lock().checks.is_empty()
    }

    /// Every check's status, pending for those that have not run.
    pub fn statuses(&self) -> Vec<(CheckId, CheckStatus)> {
        self.inner.lock().checks.iter().map(|(id, entry)| (id.clone(), entry.status())).collect()
    }

    /// Every check as the health tracker sees it.
    pub fn views(&self) -> Vec<CheckView> {
        self.inner
            .lock()
            .checks
            .iter()
            .map(|(id, entry)| CheckView {
                id: id.clone(),
                status: entry.status(),
                on_update: entry.on_update,
            })
            .collect()
    }

    /// Every check with its latest result, for people.
    pub fn states(&self) -> Vec<CheckState> {
        self.inner
            .lock()
            .checks
            .iter()
            .map(|(id, entry)| CheckState {
                task: id.task.clone(),
                service: id.service.clone(),
                check: id.check.clone(),
                kind: entry.kind,
                status: entry.status(),
                last: entry.last.clone(),
            })
            .collect()
    }

    /// The worst status of the checks of `task`'s `service`; passing if it has none.
    pub fn service_health(&self, task: &str, service: &str) -> CheckStatus {
        self.inner
            .lock()
            .checks
            .iter()
            .filter(|(id, _)| id.task == task && id.service == service)
            .map(|(_, entry)| entry.status())
            .max()
            .unwrap_or(CheckStatus::Passing)
    }
}

/// Every check of `alloc`'s group, with no result.
fn entries_of(alloc: &Allocation) -> BTreeMap<CheckId, Entry> {
    let mut entries = BTreeMap::new();
    for task in alloc.group().map(|g| g.tasks.as_slice()).unwrap_or_default() {
        for service in &task.services {
            for check in &service.checks {
                let id = CheckId {
                    task: task.name.clone(),
                    service: service.name.clone(),
                    check: service.check_name(check),
                };
                let entry = Entry {
                    kind: check.kind,
                    on_update: service.check_on_update(check),
                    definition: (check.clone(), service.check_port(check).map(str::to_owned)),
                    last: None,
                };
                entries.insert(id, entry);
            }
        }
    }
    entries
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
#[derive(Debug)]
pub struct ServiceCatalog {
    services: RwLock<BTreeMap<Key, (Registration, Arc<CheckBook>)>>,
    /// Moves on every registration and removal, for whoever renders from the catalog.
    changed: watch::Sender<u64>,
}

impl Default for ServiceCatalog {
    fn default() -> Self {
        ServiceCatalog { services: RwLock::default(), changed: watch::channel(0).0 }
    }
}

impl ServiceCatalog {
    /// An empty catalog.
    pub fn new() -> ServiceCatalog {
        ServiceCatalog::default()
    }

    /// A counter that moves whenever a service is registered or removed (coalescing).
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    fn touch(&self, changes: usize) {
        if changes > 0 {
            self.changed.send_modify(|version| *version += 1);
        }
    }

    /// Adds (or replaces) a service; its health is read from `book`.
    pub fn register(&self, registration: Registration, book: Arc<CheckBook>) {
        let key =
            (registration.alloc_id.clone(), registration.task.clone(), registration.name.clone());
        self.services.write().insert(key, (registration, book));
        self.touch(1);
    }

    /// Removes the services of `alloc_id`'s `task`; returns how many there were.
    pub fn deregister_task(&self, alloc_id: &str, task: &str) -> usize {
        let removed = {
            let mut services = self.services.write();
            let before = services.len();
            services.retain(|(alloc, owner, _), _| !(alloc == alloc_id && owner == task));
            before - services.len()
        };
        self.touch(removed);
        removed
    }

    /// Removes every service of `alloc_id`.
    pub fn deregister_alloc(&self, alloc_id: &str) -> usize {
        let removed = {
            let mut services = self.services.write();
            let before = services.len();
            services.retain(|(alloc, _, _), _| alloc != alloc_id);
            before - services.len()
        };
        self.touch(removed);
        removed
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

    /// Nomad's `TestShim_Difference` and `TestShim_Purge`, as the book does them: an update
    /// drops the checks that are gone and adds new ones pending, keeping the results of the
    /// unchanged; a task that stops has its results cleared back to pending.
    #[test]
    fn book_follows_updates_and_stops() {
        let first = alloc("a1");
        let book = CheckBook::new(&first);
        book.record(&id("a"), result(CheckStatus::Passing, 1));
        book.record(&id("b"), result(CheckStatus::Critical, 1));
        let mut changes = book.subscribe();

        // `a` unchanged, `b` gone, `c` new; `a`'s path of an update that changes nothing.
        let mut updated = first.clone();
        let service = &mut updated.job.groups[0].tasks[0].services[0];
        service.checks[1].name = "c".into();
        book.update(&updated);
        assert_eq!(
            book.statuses(),
            [(id("a"), CheckStatus::Passing), (id("c"), CheckStatus::Pending)]
        );
        assert!(changes.has_changed().unwrap(), "a check went and one came");
        changes.mark_unchanged();
        book.update(&updated);
        assert!(!changes.has_changed().unwrap(), "the same checks again change nothing");

        // A changed definition is a new check: its old result does not stand for it.
        let mut changed = updated.clone();
        changed.job.groups[0].tasks[0].services[0].checks[0].args = vec!["-v".into()];
        book.update(&changed);
        assert_eq!(book.statuses()[0], (id("a"), CheckStatus::Pending));

        book.record(&id("a"), result(CheckStatus::Passing, 2));
        let run = book.run_of("t");
        changes.mark_unchanged();
        book.reset_task("other");
        assert!(!changes.has_changed().unwrap());
        book.reset_task("t");
        assert!(changes.has_changed().unwrap());
        assert!(book.states().iter().all(|s| s.status == CheckStatus::Pending && s.last.is_none()));
        // A run that began before the task stopped brings nothing back; the next run does.
        book.record_run(&id("a"), Some(run), result(CheckStatus::Passing, 3));
        assert_eq!(book.statuses()[0].1, CheckStatus::Pending);
        book.record_run(&id("a"), Some(book.run_of("t")), result(CheckStatus::Passing, 4));
        assert_eq!(book.statuses()[0].1, CheckStatus::Passing);
        assert_eq!(book.runs(), 4, "runs are counted, whatever became of their results");
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

    #[test]
    fn catalog_tells_subscribers_of_registrations_and_removals_only() {
        let catalog = ServiceCatalog::new();
        let mut changes = catalog.subscribe();
        let book = Arc::new(CheckBook::new(&alloc("a1")));
        let reg = Registration {
            alloc_id: "a1".into(),
            job_id: "j".into(),
            group: "g".into(),
            task: "t".into(),
            name: "web".into(),
            address: None,
            port: None,
            tags: Vec::new(),
        };
        catalog.register(reg, book);
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        assert_eq!(catalog.deregister_task("a1", "other"), 0);
        assert!(!changes.has_changed().unwrap(), "removing nothing changes nothing");
        assert_eq!(catalog.deregister_alloc("a1"), 1);
        assert!(changes.has_changed().unwrap());
    }
}

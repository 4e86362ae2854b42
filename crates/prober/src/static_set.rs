//! [`StaticInstanceSet`]: machines the user already has, as an instance set.
//!
//! There is no cloud to create or destroy anything, so the set maps the pool's calls onto a
//! fixed list of hosts: `list` shows every host that is in service, `create` is refused as a
//! capacity limit (the pool then holds creates), and `destroy` takes a host out of service for
//! [`StaticConfig::rejoin_after`] instead of ending it. A host that comes back is listed again
//! with the tags it had, so it starts over as an `unknown` worker and is probed before it gets
//! work: one that was unresponsive takes work again, one that was drained (by an operator, or
//! because it reported itself broken) is shut down again at once, and stays out until
//! [`StaticInstanceSet::restore`] puts it back. Whatever a returning host still runs shows in
//! its first probe, and a dispatcher that already wrote that work off can stop it there.

use crate::ProberError;
use crate::capacity::{CapacityScope, InstanceType};
use crate::clock::{Clock, Moment};
use crate::instance::{Instance, InstanceId, InstanceSet, Tags};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use wharf_state::duration::Formatted;

/// One host of a static set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaticHost {
    /// Its name: the worker id.
    pub name: String,
    /// `host:port` of its SSH server.
    pub address: String,
    /// The user commands run as.
    pub remote_user: String,
    /// Its SSH host key (OpenSSH public key line), pinned: any other key is refused.
    pub host_key: String,
    /// Arguments the runner gets on this host before each command's own
    /// ([`Instance::runner_args`]); empty for none.
    pub runner_args: String,
}

/// The hosts and how long a destroyed one stays out.
#[derive(Debug, Clone)]
pub struct StaticConfig {
    /// The hosts, with unique names.
    pub hosts: Vec<StaticHost>,
    /// A host the pool destroyed is listed again after this long.
    pub rejoin_after: Duration,
}

#[derive(Debug, Default)]
struct HostState {
    tags: Tags,
    out_until: Option<Moment>,
}

/// A fixed set of hosts.
#[derive(Debug)]
pub struct StaticInstanceSet {
    hosts: Vec<StaticHost>,
    rejoin_after: Duration,
    clock: Arc<dyn Clock>,
    state: Mutex<BTreeMap<InstanceId, HostState>>,
}

impl StaticInstanceSet {
    /// A set of `config.hosts`; refuses duplicate names and hosts without an address or key.
    pub fn new(
        config: StaticConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<StaticInstanceSet, ProberError> {
        let mut state = BTreeMap::new();
        for (index, host) in config.hosts.iter().enumerate() {
            let problem = if host.name.is_empty()
                || !host.name.bytes().all(|b| b.is_ascii_graphic())
            {
                Some(format!("name {:?} must be printable and without spaces", host.name))
            } else if host.address.is_empty() {
                Some(format!("host {} has no address", host.name))
            } else if host.host_key.split_whitespace().count() < 2 {
                Some(format!("host {} has no host key (an OpenSSH public key line)", host.name))
            } else if state.insert(InstanceId(host.name.clone()), HostState::default()).is_some() {
                Some(format!("host name {} is used twice", host.name))
            } else {
                None
            };
            if let Some(problem) = problem {
                return Err(ProberError::Config {
                    field: "hosts",
                    problem: format!("[{index}]: {problem}"),
                });
            }
        }
        Ok(StaticInstanceSet {
            hosts: config.hosts,
            rejoin_after: config.rejoin_after,
            clock,
            state: Mutex::new(state),
        })
    }

    /// Puts a host back in service now, with idle behaviour `run` (`idle_behavior_key` is the
    /// pool's tag key for it). False if there is no such host.
    pub fn restore(&self, id: &InstanceId, idle_behavior_key: &str) -> bool {
        match self.state.lock().get_mut(id) {
            Some(entry) => {
                entry.out_until = None;
                entry.tags.insert(idle_behavior_key.to_owned(), "run".to_owned());
                true
            }
            None => false,
        }
    }

    /// The hosts taken out of service, with when each comes back.
    pub fn out_of_service(&self) -> Vec<(InstanceId, Moment)> {
        let now = self.clock.now();
        self.state
            .lock()
            .iter()
            .filter_map(|(id, s)| s.out_until.filter(|until| *until > now).map(|u| (id.clone(), u)))
            .collect()
    }
}

#[async_trait::async_trait]
impl InstanceSet for StaticInstanceSet {
    async fn create(
        &self,
        instance_type: &InstanceType,
        _tags: &Tags,
        _init_command: &str,
    ) -> Result<Instance, ProberError> {
        Err(ProberError::Capacity {
            scope: CapacityScope::AllTypes,
            detail: format!(
                "a static set cannot create instances (asked for {:?}); add hosts to its list",
                instance_type.name
            ),
        })
    }

    async fn list(&self) -> Result<Vec<Instance>, ProberError> {
        let now = self.clock.now();
        let mut state = self.state.lock();
        let mut listed = Vec::with_capacity(self.hosts.len());
        for host in &self.hosts {
            let id = InstanceId(host.name.clone());
            let entry = state.entry(id.clone()).or_default();
            match entry.out_until {
                Some(until) if until > now => continue,
                Some(_) => entry.out_until = None,
                None => {}
            }
            listed.push(Instance {
                id,
                address: Some(host.address.clone()),
                remote_user: host.remote_user.clone(),
                tags: entry.tags.clone(),
                host_key: Some(host.host_key.clone()),
                runner_args: host.runner_args.clone(),
            });
        }
        Ok(listed)
    }

    async fn destroy(&self, id: &InstanceId) -> Result<(), ProberError> {
        let until = self.clock.now() + self.rejoin_after;
        if let Some(entry) = self.state.lock().get_mut(id)
            && entry.out_until.is_none()
        {
            tracing::warn!(worker = %id, rejoin_after = %Formatted(self.rejoin_after), "static host taken out of service");
            entry.out_until = Some(until);
        }
        Ok(())
    }

    async fn set_tags(&self, id: &InstanceId, tags: &Tags) -> Result<(), ProberError> {
        match self.state.lock().get_mut(id) {
            Some(entry) => {
                entry.tags = tags.clone();
                Ok(())
            }
            None => {
                Err(ProberError::Cloud { operation: "set_tags", detail: format!("no host {id}") })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::FakeClock;

    fn host(name: &str) -> StaticHost {
        StaticHost {
            name: name.into(),
            address: format!("{name}:22"),
            remote_user: "root".into(),
            host_key: "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIAbc".into(),
            runner_args: String::new(),
        }
    }

    fn ids(list: &[Instance]) -> Vec<&str> {
        list.iter().map(|i| i.id.0.as_str()).collect()
    }

    #[tokio::test]
    async fn destroyed_hosts_rejoin_after_a_while_or_when_restored() {
        let clock = Arc::new(FakeClock::default());
        let set = StaticInstanceSet::new(
            StaticConfig {
                hosts: vec![host("a"), host("b")],
                rejoin_after: Duration::from_secs(60),
            },
            clock.clone(),
        )
        .unwrap();
        assert_eq!(ids(&set.list().await.unwrap()), ["a", "b"]);
        let tags: Tags = [("wharf-IdleBehavior".to_owned(), "drain".to_owned())].into();
        set.set_tags(&"a".into(), &tags).await.unwrap();
        assert_eq!(set.list().await.unwrap()[0].tags, tags);
        assert!(matches!(
            set.create(&InstanceType::new("any"), &Tags::new(), "").await,
            Err(ProberError::Capacity { .. })
        ));
        set.destroy(&"a".into()).await.unwrap();
        assert_eq!(ids(&set.list().await.unwrap()), ["b"]);
        assert_eq!(set.out_of_service().len(), 1);
        clock.advance(Duration::from_secs(59));
        // Destroying again does not push the return further out.
        set.destroy(&"a".into()).await.unwrap();
        assert_eq!(ids(&set.list().await.unwrap()), ["b"]);
        clock.advance(Duration::from_secs(1));
        let list = set.list().await.unwrap();
        assert_eq!(ids(&list), ["a", "b"]);
        assert_eq!(list[0].tags, tags, "a host comes back as it left");
        assert!(set.out_of_service().is_empty());
        // An operator puts a drained host back at once.
        set.destroy(&"a".into()).await.unwrap();
        assert!(set.restore(&"a".into(), "wharf-IdleBehavior"));
        let list = set.list().await.unwrap();
        assert_eq!(list[0].tags["wharf-IdleBehavior"], "run");
        assert!(!set.restore(&"z".into(), "wharf-IdleBehavior"));
    }

    #[test]
    fn bad_host_lists_are_named() {
        let clock: Arc<dyn Clock> = Arc::new(FakeClock::default());
        let config = |hosts| StaticConfig { hosts, rejoin_after: Duration::from_secs(1) };
        let cases = [
            (vec![host("a"), host("a")], "[1]: host name a is used twice"),
            (
                vec![StaticHost { address: String::new(), ..host("a") }],
                "[0]: host a has no address",
            ),
            (vec![StaticHost { host_key: "nope".into(), ..host("a") }], "no host key"),
            (vec![host("a b")], "must be printable"),
        ];
        for (hosts, phrase) in cases {
            let err = StaticInstanceSet::new(config(hosts), clock.clone()).unwrap_err().to_string();
            assert!(err.contains(phrase), "{err}");
        }
    }
}

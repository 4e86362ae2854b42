//! The node's ports: which allocation holds which port, and choosing new ones.
//!
//! [`PortTable`] is pure bookkeeping: the node agent owns one, asks it for an allocation's
//! ports when it accepts the allocation, hands it back the ports of restored allocations, and
//! releases them when an allocation ends. Whether a port is free on the host (no process of
//! another owner listening) is a question the caller answers with a function, so the rules
//! here are tested without binding anything.
//!
//! Static ports are given as asked, unless another allocation holds them or the host uses
//! them. Dynamic ports come from the node's range, scanned round-robin from where the last
//! choice ended so a port just released is the last to be handed out again (its old peers
//! may still be sending to it). An allocation gets all its ports or none.

use std::collections::BTreeMap;
use std::net::IpAddr;
use wharf_state::AllocatedPort;
use wharf_state::service::Network;

/// Why an allocation cannot have the ports it asks for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// Another allocation holds a static port.
    #[error(
        "static port {port} (label {label:?}) is already held by allocation {holder} (label {holder_label:?})"
    )]
    Taken {
        /// The port.
        port: u16,
        /// The label that asked for it.
        label: String,
        /// The allocation holding it.
        holder: String,
        /// Its label there.
        holder_label: String,
    },
    /// Something other than an allocation of this node uses a static port.
    #[error("static port {port} (label {label:?}) is in use on this node by another program")]
    InUse {
        /// The port.
        port: u16,
        /// The label that asked for it.
        label: String,
    },
    /// No port of the dynamic range is left.
    #[error(
        "no dynamic port left for label {label:?}: all of {min}-{max} are held or in use ({held} held by allocations)"
    )]
    Exhausted {
        /// The label that asked.
        label: String,
        /// The range's first port.
        min: u16,
        /// Its last port.
        max: u16,
        /// How many of its ports allocations hold.
        held: usize,
    },
    /// The configured range is not a range.
    #[error("the dynamic port range {min}-{max} is empty or starts at 0")]
    BadRange {
        /// Its first port.
        min: u16,
        /// Its last port.
        max: u16,
    },
}

/// Who holds a port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// The allocation.
    pub alloc_id: String,
    /// The label it holds the port under.
    pub label: String,
}

/// The node's ports and who holds them.
#[derive(Debug, Clone)]
pub struct PortTable {
    ip: IpAddr,
    min: u16,
    max: u16,
    held: BTreeMap<u16, Holder>,
    /// Where the next dynamic scan starts.
    cursor: u16,
}

impl PortTable {
    /// A table of ports at `ip`, with dynamic ports from `min` to `max` inclusive.
    pub fn new(ip: IpAddr, min: u16, max: u16) -> Result<PortTable, PortError> {
        if min == 0 || min > max {
            return Err(PortError::BadRange { min, max });
        }
        Ok(PortTable { ip, min, max, held: BTreeMap::new(), cursor: min })
    }

    /// The address ports are handed out at.
    pub fn ip(&self) -> IpAddr {
        self.ip
    }

    /// Who holds `port`, if anyone.
    pub fn holder(&self, port: u16) -> Option<&Holder> {
        self.held.get(&port)
    }

    /// How many ports allocations hold.
    pub fn held(&self) -> usize {
        self.held.len()
    }

    /// Chooses and holds the ports `network` asks for on behalf of `alloc_id`: static ports
    /// as asked, dynamic ones from the range. `is_free` says whether the host has the port
    /// free (no other program listening). All or nothing: on an error nothing is held.
    pub fn assign(
        &mut self,
        alloc_id: &str,
        network: &Network,
        is_free: impl Fn(u16) -> bool,
    ) -> Result<Vec<AllocatedPort>, PortError> {
        let mut chosen: BTreeMap<u16, String> = BTreeMap::new();
        for (label, spec) in &network.ports {
            let Some(port) = spec.static_port else { continue };
            if let Some(holder) = self.held.get(&port) {
                return Err(PortError::Taken {
                    port,
                    label: label.clone(),
                    holder: holder.alloc_id.clone(),
                    holder_label: holder.label.clone(),
                });
            }
            if !is_free(port) {
                return Err(PortError::InUse { port, label: label.clone() });
            }
            chosen.insert(port, label.clone());
        }
        let mut cursor = self.cursor;
        for (label, spec) in &network.ports {
            if spec.static_port.is_some() {
                continue;
            }
            let port =
                self.scan(&mut cursor, &chosen, &is_free).ok_or_else(|| PortError::Exhausted {
                    label: label.clone(),
                    min: self.min,
                    max: self.max,
                    held: self.held.range(self.min..=self.max).count(),
                })?;
            chosen.insert(port, label.clone());
        }
        self.cursor = cursor;
        let mut ports: Vec<AllocatedPort> = chosen
            .into_iter()
            .map(|(value, label)| {
                self.held
                    .insert(value, Holder { alloc_id: alloc_id.to_owned(), label: label.clone() });
                AllocatedPort { label, value, host_ip: self.ip }
            })
            .collect();
        ports.sort_by(|a, b| a.label.cmp(&b.label));
        Ok(ports)
    }

    /// The next port of the range from `cursor` that nobody holds, `chosen` does not have and
    /// the host has free; `cursor` moves past it.
    fn scan(
        &self,
        cursor: &mut u16,
        chosen: &BTreeMap<u16, String>,
        is_free: &impl Fn(u16) -> bool,
    ) -> Option<u16> {
        let size = u32::from(self.max - self.min) + 1;
        for _ in 0..size {
            let port = *cursor;
            *cursor = if port >= self.max { self.min } else { port + 1 };
            if !self.held.contains_key(&port) && !chosen.contains_key(&port) && is_free(port) {
                return Some(port);
            }
        }
        None
    }

    /// Holds ports an allocation already had (restored after an agent restart). A port held
    /// by another allocation is reported and left with its holder; the others are held.
    pub fn hold(&mut self, alloc_id: &str, ports: &[AllocatedPort]) -> Result<(), PortError> {
        let mut conflict = None;
        for port in ports {
            match self.held.get(&port.value) {
                Some(holder) if holder.alloc_id != alloc_id => {
                    conflict.get_or_insert_with(|| PortError::Taken {
                        port: port.value,
                        label: port.label.clone(),
                        holder: holder.alloc_id.clone(),
                        holder_label: holder.label.clone(),
                    });
                }
                _ => {
                    self.held.insert(
                        port.value,
                        Holder { alloc_id: alloc_id.to_owned(), label: port.label.clone() },
                    );
                }
            }
        }
        conflict.map_or(Ok(()), Err)
    }

    /// Releases every port `alloc_id` holds; returns how many.
    pub fn release(&mut self, alloc_id: &str) -> usize {
        let before = self.held.len();
        self.held.retain(|_, holder| holder.alloc_id != alloc_id);
        before - self.held.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;
    use wharf_state::service::PortSpec;

    const IP: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

    fn network(ports: &[(&str, Option<u16>)]) -> Network {
        Network {
            ports: ports
                .iter()
                .map(|(label, static_port)| {
                    ((*label).to_owned(), PortSpec { static_port: *static_port })
                })
                .collect(),
        }
    }

    fn free(_: u16) -> bool {
        true
    }

    fn value(ports: &[AllocatedPort], label: &str) -> u16 {
        ports.iter().find(|p| p.label == label).unwrap().value
    }

    /// Nomad's `TestNetworkIndex_AssignPorts`: static ports as asked, dynamic ones distinct and
    /// from the free part of the range.
    #[test]
    fn assign_ports() {
        let mut table = PortTable::new(IP, 20_000, 20_009).unwrap();
        // Everything but the last two ports of the range is in use on the host.
        let is_free = |port: u16| port == 443 || port >= 20_008;
        let ports = table
            .assign(
                "a1",
                &network(&[("static", Some(443)), ("http", None), ("admin", None)]),
                is_free,
            )
            .unwrap();
        assert_eq!(value(&ports, "static"), 443);
        let (http, admin) = (value(&ports, "http"), value(&ports, "admin"));
        assert_ne!(http, admin, "assigned dynamic ports must not conflict");
        assert!((20_008..=20_009).contains(&http) && (20_008..=20_009).contains(&admin));
        assert!(ports.iter().all(|p| p.host_ip == IP));
        assert_eq!(
            table.holder(443),
            Some(&Holder { alloc_id: "a1".into(), label: "static".into() })
        );
        assert_eq!(table.held(), 3);
    }

    /// Nomad's `TestNetworkIndex_AssignPortss_SmallRange`.
    #[test]
    fn assign_ports_small_range() {
        let cases: &[(u16, u16, &[&str], Option<&str>)] = &[
            (20_000, 20_000, &["http"], None),
            (20_000, 20_000, &["http", "admin"], Some("no dynamic port left for label")),
            (20_000, 20_001, &["http", "admin"], None),
        ];
        for (min, max, labels, error) in cases {
            let mut table = PortTable::new(IP, *min, *max).unwrap();
            let ask: Vec<(&str, Option<u16>)> = labels.iter().map(|l| (*l, None)).collect();
            match (table.assign("a1", &network(&ask), free), error) {
                (Ok(ports), None) => {
                    assert_eq!(ports.len(), labels.len());
                    for label in *labels {
                        value(&ports, label);
                    }
                }
                (Err(e), Some(phrase)) => {
                    assert!(e.to_string().contains(phrase), "{e}");
                    assert_eq!(table.held(), 0, "all or nothing");
                }
                (got, want) => panic!("{min}-{max} {labels:?}: got {got:?}, wanted {want:?}"),
            }
        }
    }

    /// Nomad's `TestNetworkIndex_AssignTaskNetwork_Dynamic_Contention`: two allocations never
    /// share a dynamic port, and the range running out is an error that names the range.
    #[test]
    fn dynamic_ports_are_not_shared_and_run_out_with_a_clear_error() {
        let mut table = PortTable::new(IP, 30_000, 30_002).unwrap();
        let a = table.assign("a", &network(&[("http", None), ("admin", None)]), free).unwrap();
        let b = table.assign("b", &network(&[("http", None)]), free).unwrap();
        let mut all: Vec<u16> = a.iter().chain(&b).map(|p| p.value).collect();
        all.sort_unstable();
        assert_eq!(all, [30_000, 30_001, 30_002]);
        let error = table.assign("c", &network(&[("http", None)]), free).unwrap_err();
        assert_eq!(
            error.to_string(),
            "no dynamic port left for label \"http\": all of 30000-30002 are held or in use (3 held by allocations)"
        );
        // Released ports come back, after those never handed out.
        assert_eq!(table.release("a"), 2);
        let c = table.assign("c", &network(&[("http", None)]), free).unwrap();
        assert_eq!(value(&c, "http"), 30_000);
        assert_eq!(table.release("nobody"), 0);
    }

    #[test]
    fn released_ports_are_handed_out_last() {
        let mut table = PortTable::new(IP, 40_000, 40_003).unwrap();
        let first = table.assign("a", &network(&[("http", None)]), free).unwrap();
        table.release("a");
        let second = table.assign("b", &network(&[("http", None)]), free).unwrap();
        assert_ne!(value(&first, "http"), value(&second, "http"));
    }

    #[test]
    fn static_ports_are_refused_when_held_or_in_use_naming_the_port() {
        let mut table = PortTable::new(IP, 20_000, 20_100).unwrap();
        table.assign("a", &network(&[("web", Some(8080))]), free).unwrap();
        let taken = table.assign("b", &network(&[("http", None), ("api", Some(8080))]), free);
        assert_eq!(
            taken.unwrap_err().to_string(),
            "static port 8080 (label \"api\") is already held by allocation a (label \"web\")"
        );
        assert_eq!(table.held(), 1, "the dynamic port of the refused allocation is not held");
        let in_use = table.assign("b", &network(&[("db", Some(5432))]), |port| port != 5432);
        assert_eq!(in_use.unwrap_err(), PortError::InUse { port: 5432, label: "db".into() });
        // A static port inside the dynamic range is never handed out dynamically.
        let mut small = PortTable::new(IP, 20_000, 20_001).unwrap();
        small.assign("a", &network(&[("fixed", Some(20_000))]), free).unwrap();
        let dynamic = small.assign("b", &network(&[("http", None)]), free).unwrap();
        assert_eq!(value(&dynamic, "http"), 20_001);
    }

    #[test]
    fn restored_ports_are_held_again_and_conflicts_reported() {
        let mut table = PortTable::new(IP, 20_000, 20_100).unwrap();
        let ports = vec![
            AllocatedPort { label: "http".into(), value: 20_050, host_ip: IP },
            AllocatedPort { label: "db".into(), value: 5432, host_ip: IP },
        ];
        table.hold("a", &ports).unwrap();
        table.hold("a", &ports).unwrap();
        assert_eq!(table.held(), 2, "holding again is idempotent");
        let error = table.hold("b", &ports[1..]).unwrap_err();
        assert!(matches!(error, PortError::Taken { port: 5432, .. }), "{error}");
        assert_eq!(table.holder(5432).unwrap().alloc_id, "a");
        assert!(table.assign("c", &network(&[("x", Some(20_050))]), free).is_err());
    }

    #[test]
    fn bad_ranges_are_refused() {
        assert!(PortTable::new(IP, 0, 10).is_err());
        assert_eq!(
            PortTable::new(IP, 20, 10).unwrap_err().to_string(),
            "the dynamic port range 20-10 is empty or starts at 0"
        );
        let full = PortTable::new(IP, 1, u16::MAX).unwrap();
        assert_eq!(full.ip(), IP);
    }
}

//! [`Ec2InstanceSet`]: Amazon EC2 (or any cloud speaking its Query API, such as moto) as an
//! instance set.
//!
//! - `create` is RunInstances: the image, the type's provider type, a network interface in
//!   one of the configured subnets with the security groups and no public address, the
//!   fleet's key pair, the tags (the set's own and the pool's), IMDSv2 required, and the init
//!   command as user data; a preemptible type asks for the spot market. A subnet-specific
//!   failure tries the next subnet, and the next create starts at the subnet that last
//!   answered, so a full subnet is not asked first every time.
//! - `list` is DescribeInstances filtered by the set's tags, page after page; instances
//!   shutting down or terminated are left out.
//! - `destroy` is TerminateInstances (an instance already gone is not an error); `set_tags` is
//!   CreateTags.
//! - The fleet's SSH public key is imported once, as a key pair named after its fingerprint,
//!   and found by that name afterwards (by this process or the next).
//!
//! Errors are mapped as the `errors` module says. Credentials come from the standard chain
//! ([`credentials`]). Requests are signed by our own SigV4 ([`sigv4`]) and sent over hyper.

mod api;
pub mod credentials;
pub(crate) mod errors;
mod http;
pub mod sigv4;
mod xml;

use crate::ProberError;
use crate::capacity::{CapacityScope, InstanceType, Price};
use crate::instance::{Instance, InstanceId, InstanceSet, Tags};
use api::{Api, Params};
use base64::Engine as _;
use errors::{Backoff, CallError, is_subnet_specific, to_prober_error};
pub use sigv4::Credentials;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use xml::Element;

/// Where and how to create instances.
#[derive(Debug, Clone)]
pub struct Ec2Config {
    /// The region (`us-east-1`); part of every signature.
    pub region: String,
    /// The API's base URL (`http://127.0.0.1:5000` for moto); `None`: EC2's own for the region.
    pub endpoint: Option<String>,
    /// The image (AMI id) every instance boots.
    pub image_id: String,
    /// Subnets to create in, tried in turn when one fails for a subnet-specific reason. Empty:
    /// the account's default subnet.
    pub subnets: Vec<String>,
    /// Security groups of the instances' network interface.
    pub security_groups: Vec<String>,
    /// The user the image lets in with the key pair (`admin`, `ubuntu`, `ec2-user`).
    pub admin_user: String,
    /// The SSH port workers listen on.
    pub ssh_port: u16,
    /// The fleet's SSH public key (an OpenSSH public key line), imported as the key pair.
    /// `None`: instances get no key pair (the image or the init command lets the fleet in).
    pub public_key: Option<String>,
    /// The host key every instance presents (an OpenSSH public key line: the image's own),
    /// given to the executors to pin; `None`: none is known.
    pub host_key: Option<String>,
    /// An IAM instance profile for the instances, by name.
    pub iam_instance_profile: Option<String>,
    /// Tags put on every instance, and by which `list` finds this set's instances (give each
    /// fleet its own).
    pub tags: Tags,
    /// Keys to sign with; `None`: the standard chain ([`credentials`]).
    pub credentials: Option<Credentials>,
    /// The deadline of one HTTP request.
    pub call_deadline: Duration,
    /// Instances asked for per DescribeInstances page (EC2 takes 5 to 1000).
    pub page_size: u32,
    /// Arguments the runner gets on every instance ([`Instance::runner_args`]).
    pub runner_args: String,
}

impl Ec2Config {
    /// A configuration for `region` and `image_id`, with no subnet, group or key, user
    /// `admin`, port 22, a 30 s call deadline and pages of 1000.
    pub fn new(region: &str, image_id: &str) -> Ec2Config {
        Ec2Config {
            region: region.to_owned(),
            endpoint: None,
            image_id: image_id.to_owned(),
            subnets: Vec::new(),
            security_groups: Vec::new(),
            admin_user: "admin".to_owned(),
            ssh_port: 22,
            public_key: None,
            host_key: None,
            iam_instance_profile: None,
            tags: Tags::new(),
            credentials: None,
            call_deadline: Duration::from_secs(30),
            page_size: 1000,
            runner_args: String::new(),
        }
    }
}

/// EC2 as an instance set.
#[derive(Debug)]
pub struct Ec2InstanceSet {
    config: Ec2Config,
    api: Api,
    /// The subnet the next create tries first.
    next_subnet: AtomicUsize,
    /// The key pair's name, once imported or found.
    key_name: tokio::sync::Mutex<Option<String>>,
    create_backoff: Backoff,
    call_backoff: Backoff,
    /// RunInstances calls by subnet and success.
    starts: parking_lot::Mutex<BTreeMap<(String, bool), u64>>,
}

impl Ec2InstanceSet {
    /// A set as `config` says, with credentials from the configuration or the process's
    /// environment. Nothing is called yet.
    pub fn new(config: Ec2Config) -> Result<Ec2InstanceSet, ProberError> {
        let lookup = |name: &str| std::env::var(name).ok();
        let credentials = credentials::resolve(config.credentials.clone(), &lookup)?;
        if config.image_id.is_empty() {
            return Err(ProberError::Config { field: "ec2 image", problem: "is empty".into() });
        }
        if !(5..=1000).contains(&config.page_size) {
            return Err(ProberError::Config {
                field: "ec2 page_size",
                problem: format!("{} is not between 5 and 1000", config.page_size),
            });
        }
        let http = http::Http::new(config.call_deadline)
            .map_err(|problem| ProberError::Config { field: "ec2 endpoint", problem })?;
        let api = Api::new(http, &config.region, config.endpoint.as_deref(), credentials)?;
        let mut starts = BTreeMap::new();
        for subnet in subnet_labels(&config.subnets) {
            starts.insert((subnet.clone(), false), 0);
            starts.insert((subnet, true), 0);
        }
        Ok(Ec2InstanceSet {
            config,
            api,
            next_subnet: AtomicUsize::new(0),
            key_name: tokio::sync::Mutex::new(None),
            create_backoff: Backoff::default(),
            call_backoff: Backoff::default(),
            starts: parking_lot::Mutex::new(starts),
        })
    }

    /// RunInstances calls so far, by subnet (`""` with none configured) and success, each
    /// subnet listed from the start with zero counts.
    pub fn instance_starts(&self) -> Vec<(String, bool, u64)> {
        self.starts.lock().iter().map(|((s, ok), n)| (s.clone(), *ok, *n)).collect()
    }

    /// The latest spot price EC2 reports for `provider_type` (Linux, any availability zone:
    /// the highest of the latest per zone, so a cost is not understated), or `None` where
    /// EC2 reports none.
    pub async fn spot_price(&self, provider_type: &str) -> Result<Option<Price>, ProberError> {
        // Linux is picked out of the answer rather than by a filter: not every EC2-compatible
        // API filters on the product description.
        let mut params: Params = vec![
            ("Filter.1.Name".into(), "instance-type".into()),
            ("Filter.1.Value.1".into(), provider_type.to_owned()),
        ];
        // Per zone, the entry with the latest timestamp (RFC 3339 in UTC sorts as text).
        let mut latest: BTreeMap<String, (String, Price)> = BTreeMap::new();
        let mut token: Option<String> = None;
        loop {
            params.retain(|(k, _)| k != "NextToken");
            if let Some(token) = token.take() {
                params.push(("NextToken".into(), token));
            }
            let answer = self
                .call("DescribeSpotPriceHistory", &params)
                .await
                .map_err(|e| self.error(&e, "list", None))?;
            for item in answer.items(&["spotPriceHistorySet"]) {
                let (Some(kind), Some(zone), Some(at), Some(price)) = (
                    item.text_at(&["instanceType"]),
                    item.text_at(&["availabilityZone"]),
                    item.text_at(&["timestamp"]),
                    item.text_at(&["spotPrice"])
                        .and_then(|p| p.parse().ok())
                        .and_then(Price::per_hour),
                ) else {
                    continue;
                };
                let linux = item
                    .text_at(&["productDescription"])
                    .is_some_and(|d| d.starts_with("Linux/UNIX"));
                if kind != provider_type || !linux {
                    continue;
                }
                let newer = latest.get(zone).is_none_or(|(seen, _)| at > seen.as_str());
                if newer {
                    latest.insert(zone.to_owned(), (at.to_owned(), price));
                }
            }
            match answer.text_at(&["nextToken"]) {
                Some(next) => token = Some(next.to_owned()),
                None => return Ok(latest.into_values().map(|(_, price)| price).max()),
            }
        }
    }

    /// The key pair name for the configured public key: found by name, or imported.
    async fn key_name(&self) -> Result<Option<String>, ProberError> {
        let Some(public_key) = &self.config.public_key else { return Ok(None) };
        let mut known = self.key_name.lock().await;
        if let Some(name) = known.as_ref() {
            return Ok(Some(name.clone()));
        }
        let name = format!("wharf-{}", key_fingerprint(public_key)?);
        let found = self
            .call(
                "DescribeKeyPairs",
                &vec![
                    ("Filter.1.Name".into(), "key-name".into()),
                    ("Filter.1.Value.1".into(), name.clone()),
                ],
            )
            .await
            .map_err(|e| self.error(&e, "create", None))?;
        if found.items(&["keySet"]).is_empty() {
            let material = base64::engine::general_purpose::STANDARD.encode(public_key.trim());
            let params =
                vec![("KeyName".into(), name.clone()), ("PublicKeyMaterial".into(), material)];
            match self.call("ImportKeyPair", &params).await {
                Ok(_) => tracing::info!(key_pair = %name, "imported the fleet's key pair"),
                // Another fleet process imported it in between: the same key, the same name.
                Err(CallError::Ec2(e)) if e.code == "InvalidKeyPair.Duplicate" => {}
                Err(e) => return Err(self.error(&e, "create", None)),
            }
        }
        *known = Some(name.clone());
        Ok(Some(name))
    }

    async fn call(&self, action: &str, params: &Params) -> Result<Element, CallError> {
        let result = self.api.call(action, params).await;
        if result.is_ok() {
            let backoff =
                if action == "RunInstances" { &self.create_backoff } else { &self.call_backoff };
            backoff.reset();
        }
        result
    }

    fn error(
        &self,
        error: &CallError,
        operation: &'static str,
        it: Option<&InstanceType>,
    ) -> ProberError {
        let backoff = if operation == "create" { &self.create_backoff } else { &self.call_backoff };
        to_prober_error(error, operation, it, backoff)
    }

    /// RunInstances' parameters but for the subnet.
    fn run_params(
        &self,
        it: &InstanceType,
        tags: &Tags,
        init_command: &str,
        key: Option<String>,
    ) -> Params {
        let mut params: Params = vec![
            ("ImageId".into(), self.config.image_id.clone()),
            ("InstanceType".into(), it.provider_type.clone()),
            ("MinCount".into(), "1".into()),
            ("MaxCount".into(), "1".into()),
            ("InstanceInitiatedShutdownBehavior".into(), "terminate".into()),
            ("MetadataOptions.HttpEndpoint".into(), "enabled".into()),
            ("MetadataOptions.HttpTokens".into(), "required".into()),
            ("NetworkInterface.1.DeviceIndex".into(), "0".into()),
            ("NetworkInterface.1.AssociatePublicIpAddress".into(), "false".into()),
            ("NetworkInterface.1.DeleteOnTermination".into(), "true".into()),
            ("TagSpecification.1.ResourceType".into(), "instance".into()),
        ];
        let user_data = format!("#!/bin/sh\n{init_command}\n");
        params
            .push(("UserData".into(), base64::engine::general_purpose::STANDARD.encode(user_data)));
        for (n, group) in self.config.security_groups.iter().enumerate() {
            params.push((format!("NetworkInterface.1.SecurityGroupId.{}", n + 1), group.clone()));
        }
        let all_tags = self.config.tags.iter().chain(tags.iter());
        for (n, (key, value)) in all_tags.enumerate() {
            params.push((format!("TagSpecification.1.Tag.{}.Key", n + 1), key.clone()));
            params.push((format!("TagSpecification.1.Tag.{}.Value", n + 1), value.clone()));
        }
        if let Some(key) = key {
            params.push(("KeyName".into(), key));
        }
        if it.preemptible {
            params.push(("InstanceMarketOptions.MarketType".into(), "spot".into()));
            params.push((
                "InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior".into(),
                "terminate".into(),
            ));
        }
        if let Some(profile) = &self.config.iam_instance_profile {
            params.push(("IamInstanceProfile.Name".into(), profile.clone()));
        }
        params
    }

    /// An instance as EC2 describes it (an `item` of an `instancesSet`).
    fn instance(&self, item: &Element) -> Option<Instance> {
        let id = item.text_at(&["instanceId"])?;
        let tags = item
            .items(&["tagSet"])
            .into_iter()
            .filter_map(|t| {
                Some((
                    t.text_at(&["key"])?.to_owned(),
                    t.text_at(&["value"]).unwrap_or_default().to_owned(),
                ))
            })
            .collect();
        Some(Instance {
            id: InstanceId(id.to_owned()),
            address: item
                .text_at(&["privateIpAddress"])
                .map(|ip| format!("{ip}:{}", self.config.ssh_port)),
            remote_user: self.config.admin_user.clone(),
            tags,
            host_key: self.config.host_key.clone(),
            runner_args: self.config.runner_args.clone(),
        })
    }
}

/// The subnets as the starts are counted: `""` when none is configured.
fn subnet_labels(subnets: &[String]) -> Vec<String> {
    if subnets.is_empty() { vec![String::new()] } else { subnets.to_vec() }
}

/// `SHA256:<base64>` of an OpenSSH public key line, as `ssh-keygen -l` prints it.
pub fn key_fingerprint(public_key: &str) -> Result<String, ProberError> {
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD};
    use sha2::{Digest, Sha256};
    let blob =
        public_key.split_whitespace().nth(1).and_then(|b| STANDARD.decode(b).ok()).ok_or_else(
            || ProberError::Key {
                what: "the fleet's public key".into(),
                detail: "not an OpenSSH public key line (`ssh-ed25519 AAAA...`)".into(),
            },
        )?;
    Ok(format!("SHA256:{}", STANDARD_NO_PAD.encode(Sha256::digest(&blob))))
}

#[async_trait::async_trait]
impl InstanceSet for Ec2InstanceSet {
    async fn create(
        &self,
        instance_type: &InstanceType,
        tags: &Tags,
        init_command: &str,
    ) -> Result<Instance, ProberError> {
        let key = self.key_name().await?;
        let mut params = self.run_params(instance_type, tags, init_command, key);
        let subnets = &self.config.subnets;
        let first = self.next_subnet.load(Ordering::Relaxed);
        // The last capacity error if any, else the last error: what the pool should act on.
        let mut worst: Option<CallError> = None;
        let mut worst_is_capacity = false;
        for offset in 0..subnets.len().max(1) {
            let index = if subnets.is_empty() { 0 } else { (first + offset) % subnets.len() };
            let subnet = subnets.get(index).cloned().unwrap_or_default();
            params.retain(|(k, _)| k != "NetworkInterface.1.SubnetId");
            if !subnet.is_empty() {
                params.push(("NetworkInterface.1.SubnetId".into(), subnet.clone()));
            }
            let result = self.call("RunInstances", &params).await;
            *self.starts.lock().entry((subnet.clone(), result.is_ok())).or_default() += 1;
            self.next_subnet.store(index, Ordering::Relaxed);
            let error = match result {
                Ok(answer) => {
                    let item = answer.items(&["instancesSet"]).into_iter().next();
                    return item.and_then(|i| self.instance(i)).ok_or_else(|| ProberError::Cloud {
                        operation: "create",
                        detail: "RunInstances answered without an instance".into(),
                    });
                }
                Err(error) => error,
            };
            // A subnet out of addresses is not the type's capacity: another error (a broken
            // subnet id, say) says more.
            let is_capacity = errors::capacity_scope(&error) == Some(CapacityScope::InstanceType)
                || errors::is_quota(&error);
            if !worst_is_capacity || is_capacity {
                worst_is_capacity = is_capacity;
                worst = Some(error.clone());
            }
            if !is_subnet_specific(&error) {
                break;
            }
            tracing::warn!(subnet = %subnet, error = %error, "RunInstances failed; trying the next subnet");
        }
        let error = worst.unwrap_or_else(|| CallError::Transport("no subnet was tried".into()));
        Err(self.error(&error, "create", Some(instance_type)))
    }

    async fn list(&self) -> Result<Vec<Instance>, ProberError> {
        let mut filters: Params = Vec::new();
        for (n, (key, value)) in self.config.tags.iter().enumerate() {
            filters.push((format!("Filter.{}.Name", n + 1), format!("tag:{key}")));
            filters.push((format!("Filter.{}.Value.1", n + 1), value.clone()));
        }
        filters.push(("MaxResults".into(), self.config.page_size.to_string()));
        let mut instances = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let mut params = filters.clone();
            if let Some(token) = token.take() {
                params.push(("NextToken".into(), token));
            }
            let answer = self
                .call("DescribeInstances", &params)
                .await
                .map_err(|e| self.error(&e, "list", None))?;
            for reservation in answer.items(&["reservationSet"]) {
                for item in reservation.items(&["instancesSet"]) {
                    let state = item.text_at(&["instanceState", "name"]).unwrap_or_default();
                    if state == "shutting-down" || state == "terminated" {
                        continue;
                    }
                    instances.extend(self.instance(item));
                }
            }
            match answer.text_at(&["nextToken"]) {
                Some(next) => token = Some(next.to_owned()),
                None => return Ok(instances),
            }
        }
    }

    async fn destroy(&self, id: &InstanceId) -> Result<(), ProberError> {
        let params = vec![("InstanceId.1".into(), id.0.clone())];
        match self.call("TerminateInstances", &params).await {
            Ok(_) => Ok(()),
            Err(CallError::Ec2(e)) if e.code == "InvalidInstanceID.NotFound" => Ok(()),
            Err(e) => Err(self.error(&e, "destroy", None)),
        }
    }

    async fn set_tags(&self, id: &InstanceId, tags: &Tags) -> Result<(), ProberError> {
        let mut params: Params = vec![("ResourceId.1".into(), id.0.clone())];
        for (n, (key, value)) in self.config.tags.iter().chain(tags.iter()).enumerate() {
            params.push((format!("Tag.{}.Key", n + 1), key.clone()));
            params.push((format!("Tag.{}.Value", n + 1), value.clone()));
        }
        self.call("CreateTags", &params)
            .await
            .map(|_| ())
            .map_err(|e| self.error(&e, "set_tags", None))
    }
}

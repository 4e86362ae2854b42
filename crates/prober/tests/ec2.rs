//! The EC2 instance set against a real moto_server, with a fault-injecting proxy in front of it
//! for the errors moto never gives (capacity, quota, throttling). The cases of Arvados' own
//! EC2 driver tests are named after them (`ec2_create` for `TestCreate`).

mod moto;

use base64::Engine as _;
use moto::{Fault, Moto, Proxy};
use std::time::Duration;
use wharf_prober::{
    CapacityScope, Ec2Config, Ec2InstanceSet, InstanceId, InstanceSet, InstanceType, ProberError,
    Tags,
};

/// An ed25519 public key (the fleet's key kind).
const PUBLIC_KEY: &str =
    "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIDaKqpQhGnDKmXbd6cWVKBCGsf5dH2IK7X0vwCrxAbWx wharf-test";

/// The shared moto, behind a proxy of this test's own (its faults and its record of calls).
struct Cloud {
    moto: &'static Moto,
    proxy: Proxy,
}

async fn cloud() -> Cloud {
    let moto = tokio::task::spawn_blocking(Moto::shared).await.unwrap();
    let proxy = Proxy::start(moto.port).await;
    Cloud { moto, proxy }
}

impl Cloud {
    /// A set through the proxy, with the fleet tag `fleet` and `subnets`.
    fn set(&self, fleet: &str, subnets: &[&str]) -> Ec2InstanceSet {
        self.set_with_key(fleet, subnets, PUBLIC_KEY)
    }

    fn set_with_key(&self, fleet: &str, subnets: &[&str], public_key: &str) -> Ec2InstanceSet {
        let mut config = Ec2Config::new("us-east-1", "ami-12c6146b");
        config.endpoint = Some(self.proxy.url());
        config.subnets = subnets.iter().map(|s| (*s).to_owned()).collect();
        config.public_key = Some(public_key.into());
        config.tags = [("wharf-fleet".to_owned(), fleet.to_owned())].into();
        config.credentials = Some(wharf_prober::ec2::Credentials {
            access_key_id: "AKIDTEST".into(),
            secret_access_key: "secret".into(),
            session_token: None,
        });
        config.call_deadline = Duration::from_secs(20);
        Ec2InstanceSet::new(config).unwrap()
    }

    fn subnet(&self) -> String {
        self.moto.subnet("10.231.0.0/16", "10.231.200.0/24")
    }
}

fn tiny() -> InstanceType {
    InstanceType { provider_type: "t2.micro".into(), ..InstanceType::new("tiny") }
}

fn tags(pairs: &[(&str, &str)]) -> Tags {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

fn starts(set: &Ec2InstanceSet) -> Vec<(String, bool, u64)> {
    set.instance_starts()
}

/// Arvados' TestCreate: an instance of the type, with the tags, the init command as user data,
/// in the subnet, with the fleet's key pair; listed with its private address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_create() {
    let cloud = cloud().await;
    let subnet = cloud.subnet();
    let set = cloud.set("create", &[&subnet]);
    let init = "umask 0600; echo -n test-file-data >/var/run/test-file";
    let made =
        set.create(&tiny(), &tags(&[("TestTagName", "test tag value")]), init).await.unwrap();
    assert_eq!(made.tags.get("TestTagName").map(String::as_str), Some("test tag value"));
    assert_eq!(made.tags.get("wharf-fleet").map(String::as_str), Some("create"));
    let address = made.address.clone().expect("a private address");
    assert!(address.starts_with("10.231.200.") && address.ends_with(":22"), "{address}");
    assert_eq!(made.remote_user, "admin");

    let run = &cloud.proxy.calls("RunInstances")[0];
    let user_data =
        base64::engine::general_purpose::STANDARD.decode(run.param("UserData").unwrap()).unwrap();
    assert_eq!(String::from_utf8(user_data).unwrap(), format!("#!/bin/sh\n{init}\n"));
    assert_eq!(run.param("InstanceType"), Some("t2.micro"));
    assert_eq!(run.param("NetworkInterface.1.SubnetId"), Some(subnet.as_str()));
    assert_eq!(run.param("MetadataOptions.HttpTokens"), Some("required"));
    assert_eq!(run.param("InstanceMarketOptions.MarketType"), None);
    let key_name = run.param("KeyName").expect("a key pair").to_owned();
    assert!(key_name.starts_with("wharf-SHA256:"), "{key_name}");
    let keys = cloud.moto.call("DescribeKeyPairs", &[]);
    assert!(keys.contains(&key_name), "moto has no key pair {key_name}: {keys}");

    let listed = set.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((&listed[0].id, &listed[0].address), (&made.id, &made.address));
}

/// Arvados' TestCreatePreemptible: a preemptible type asks for the spot market.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_create_preemptible() {
    let cloud = cloud().await;
    let set = cloud.set("spot", &[]);
    let spot = InstanceType { preemptible: true, ..tiny() };
    set.create(&spot, &tags(&[("TestTagName", "test tag value")]), "true").await.unwrap();
    let run = &cloud.proxy.calls("RunInstances")[0];
    assert_eq!(run.param("InstanceMarketOptions.MarketType"), Some("spot"));
    assert_eq!(
        run.param("InstanceMarketOptions.SpotOptions.InstanceInterruptionBehavior"),
        Some("terminate")
    );
    assert!(run.answer.contains("<instanceLifecycle>spot</instanceLifecycle>"), "{}", run.answer);
}

/// Arvados' TestCreateFailoverSecondSubnet: a full subnet sends the create to the next one,
/// and the next create starts at the subnet that worked.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_create_failover_second_subnet() {
    let cloud = cloud().await;
    let good = cloud.subnet();
    cloud.proxy.inject(
        Fault::new("RunInstances", "InsufficientFreeAddressesInSubnet", "subnet is full")
            .in_subnet("subnet-full"),
    );
    let set = cloud.set("failover", &["subnet-full", &good]);
    let made = set.create(&tiny(), &Tags::new(), "").await.unwrap();
    assert!(made.address.unwrap().starts_with("10.231.200."));
    assert_eq!(cloud.proxy.calls("RunInstances").len(), 2);
    let expect = |full_failed, good_ok| {
        let mut want = vec![
            ("subnet-full".to_owned(), false, full_failed),
            ("subnet-full".to_owned(), true, 0),
            (good.clone(), false, 0),
            (good.clone(), true, good_ok),
        ];
        want.sort();
        want
    };
    assert_eq!(starts(&set), expect(1, 1));
    set.create(&tiny(), &Tags::new(), "").await.unwrap();
    assert_eq!(cloud.proxy.calls("RunInstances").len(), 3);
    assert_eq!(starts(&set), expect(1, 2));
}

/// Arvados' TestCreateAllSubnetsFailing: every subnet tried once per create, the error of the
/// last one returned, and the next create starts where the last one ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_create_all_subnets_failing() {
    let cloud = cloud().await;
    cloud.proxy.inject(
        Fault::new("RunInstances", "InsufficientFreeAddressesInSubnet", "subnet is full")
            .in_subnet("subnet-full"),
    );
    cloud.proxy.inject(
        Fault::new("RunInstances", "InvalidSubnetId.NotFound", "bogus subnet id")
            .in_subnet("subnet-broken"),
    );
    let set = cloud.set("all-failing", &["subnet-full", "subnet-broken"]);
    let error = set.create(&tiny(), &Tags::new(), "").await.unwrap_err();
    assert!(matches!(&error, ProberError::Cloud { .. }), "{error:?}");
    assert!(error.to_string().contains("InvalidSubnetId.NotFound"), "{error}");
    assert_eq!(cloud.proxy.calls("RunInstances").len(), 2);

    // The full subnet's error comes last now: no address in any subnet holds every type.
    let error = set.create(&tiny(), &Tags::new(), "").await.unwrap_err();
    assert!(error.to_string().contains("InsufficientFreeAddressesInSubnet"), "{error}");
    assert!(
        matches!(error, ProberError::Capacity { scope: CapacityScope::AllTypes, .. }),
        "{error:?}"
    );
    assert_eq!(cloud.proxy.calls("RunInstances").len(), 4);
    let mut want = vec![
        ("subnet-broken".to_owned(), false, 2),
        ("subnet-broken".to_owned(), true, 0),
        ("subnet-full".to_owned(), false, 2),
        ("subnet-full".to_owned(), true, 0),
    ];
    want.sort();
    assert_eq!(starts(&set), want);
}

/// Arvados' TestCreateOneSubnetFailingCapacity: the capacity error wins over the subnet's,
/// whichever subnet is tried last, and holds the type.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_create_one_subnet_failing_capacity() {
    let cloud = cloud().await;
    cloud.proxy.inject(
        Fault::new("RunInstances", "InsufficientFreeAddressesInSubnet", "subnet is full")
            .in_subnet("subnet-full"),
    );
    cloud.proxy.inject(
        Fault::new("RunInstances", "InsufficientInstanceCapacity", "insufficient capacity")
            .in_subnet("subnet-broken"),
    );
    let set = cloud.set("one-capacity", &["subnet-full", "subnet-broken"]);
    for _ in 0..3 {
        let error = set.create(&tiny(), &Tags::new(), "").await.unwrap_err();
        assert!(error.to_string().contains("InsufficientInstanceCapacity"), "{error}");
        assert!(
            matches!(error, ProberError::Capacity { scope: CapacityScope::InstanceType, .. }),
            "{error:?}"
        );
    }
    assert_eq!(cloud.proxy.calls("RunInstances").len(), 6);
    let counts: Vec<u64> = starts(&set).into_iter().map(|(_, _, n)| n).collect();
    assert_eq!(counts, [3, 0, 3, 0]);
}

/// Arvados' TestTagInstances: tags set on listed instances are listed back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_tag_instances() {
    let cloud = cloud().await;
    let set = cloud.set("tags", &[]);
    set.create(&tiny(), &tags(&[("TestTagName", "v")]), "").await.unwrap();
    for instance in set.list().await.unwrap() {
        let mut changed = instance.tags.clone();
        changed.insert("TestTag2".into(), "123 test tag 2".into());
        set.set_tags(&instance.id, &changed).await.unwrap();
    }
    let listed = set.list().await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].tags.get("TestTag2").map(String::as_str), Some("123 test tag 2"));
    assert_eq!(listed[0].tags.get("TestTagName").map(String::as_str), Some("v"));
}

/// Arvados' TestListInstances: every instance of this set, over several pages, and none of
/// another set's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_list_instances() {
    let cloud = cloud().await;
    let mut config_set = cloud.set("paged", &[]);
    let other = cloud.set("other", &[]);
    other.create(&tiny(), &Tags::new(), "").await.unwrap();
    let mut made = Vec::new();
    for n in 0..7 {
        made.push(
            config_set.create(&tiny(), &tags(&[("n", &n.to_string())]), "").await.unwrap().id,
        );
    }
    // Pages of 5: a second page is needed.
    config_set = {
        let mut config = Ec2Config::new("us-east-1", "ami-12c6146b");
        config.endpoint = Some(cloud.proxy.url());
        config.tags = tags(&[("wharf-fleet", "paged")]);
        config.credentials = Some(wharf_prober::ec2::Credentials {
            access_key_id: "AKIDTEST".into(),
            secret_access_key: "secret".into(),
            session_token: None,
        });
        config.page_size = 5;
        Ec2InstanceSet::new(config).unwrap()
    };
    let before = cloud.proxy.calls("DescribeInstances").len();
    let mut listed: Vec<InstanceId> =
        config_set.list().await.unwrap().into_iter().map(|i| i.id).collect();
    listed.sort();
    made.sort();
    assert_eq!(listed, made);
    let pages = &cloud.proxy.calls("DescribeInstances")[before..];
    assert!(pages.len() >= 2, "{} pages", pages.len());
    assert!(pages[1].param("NextToken").is_some());
    assert_eq!(pages[0].param("Filter.1.Name"), Some("tag:wharf-fleet"));
}

/// Arvados' TestDestroyInstances: destroyed instances leave the list; destroying one again is
/// not an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_destroy_instances() {
    let cloud = cloud().await;
    let set = cloud.set("destroy", &[]);
    set.create(&tiny(), &Tags::new(), "").await.unwrap();
    set.create(&tiny(), &Tags::new(), "").await.unwrap();
    let listed = set.list().await.unwrap();
    assert_eq!(listed.len(), 2);
    for instance in &listed {
        set.destroy(&instance.id).await.unwrap();
    }
    assert_eq!(set.list().await.unwrap(), Vec::new());
    set.destroy(&InstanceId("i-0000000000000dead".into())).await.unwrap();
}

/// Arvados' TestAWSKeyFingerprints (the ed25519 half: the fleet's keys are ed25519): the key
/// pair's name carries the fingerprint `ssh-keygen -l` prints, and the key is imported once,
/// then found by name by the next process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_aws_key_fingerprints() {
    #![allow(clippy::disallowed_methods)] // runs ssh-keygen, the reference
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("key");
    let generated = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen (Debian: openssh-client) must be installed");
    assert!(generated.status.success(), "{generated:?}");
    let listing =
        std::process::Command::new("ssh-keygen").arg("-l").arg("-f").arg(&key).output().unwrap();
    let listing = String::from_utf8(listing.stdout).unwrap();
    let expected = listing.split_whitespace().nth(1).unwrap().to_owned();
    let public = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    assert_eq!(wharf_prober::ec2::key_fingerprint(&public).unwrap(), expected);

    let cloud = cloud().await;
    let first = cloud.set_with_key("keys", &[], &public);
    first.create(&tiny(), &Tags::new(), "").await.unwrap();
    first.create(&tiny(), &Tags::new(), "").await.unwrap();
    let next = cloud.set_with_key("keys", &[], &public);
    next.create(&tiny(), &Tags::new(), "").await.unwrap();
    assert_eq!(cloud.proxy.calls("ImportKeyPair").len(), 1);
    assert_eq!(cloud.proxy.calls("DescribeKeyPairs").len(), 2);
}

/// Arvados' TestWrapError, over the wire: EC2's error bodies become the pool's refusals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_wrap_error_over_the_wire() {
    let cloud = cloud().await;
    let set = cloud.set("errors", &[]);
    let grouped = InstanceType { quota_group: Some("standard".into()), ..tiny() };
    cloud.proxy.inject(
        Fault::new("RunInstances", "RequestLimitExceeded", "Request limit exceeded.").times(2),
    );
    cloud.proxy.inject(
        Fault::new("RunInstances", "VcpuLimitExceeded", "You have requested more vCPU capacity")
            .times(1),
    );
    cloud.proxy.inject(
        Fault::new("RunInstances", "InstanceLimitExceeded", "Your quota allows for 0 more")
            .times(1),
    );
    cloud
        .proxy
        .inject(Fault::new("RunInstances", "InvalidAMIID.Malformed", "Invalid id: \"x\"").times(1));
    let mut refusals = Vec::new();
    for instance_type in [&grouped, &grouped, &grouped, &tiny(), &tiny()] {
        refusals.push(set.create(instance_type, &Tags::new(), "").await.unwrap_err());
    }
    assert!(
        matches!(refusals[0], ProberError::RateLimited { retry_after } if retry_after == Duration::from_secs(1))
    );
    assert!(
        matches!(refusals[1], ProberError::RateLimited { retry_after } if retry_after == Duration::from_secs(2))
    );
    assert!(
        matches!(refusals[2], ProberError::Capacity { scope: CapacityScope::QuotaGroup, .. }),
        "{:?}",
        refusals[2]
    );
    assert!(matches!(refusals[3], ProberError::Quota { .. }), "{:?}", refusals[3]);
    assert_eq!(
        refusals[4].to_string(),
        "cloud create failed: InvalidAMIID.Malformed: Invalid id: \"x\""
    );
    // The faults are spent: the next create goes through, and a throttle starts over at 1 s.
    set.create(&tiny(), &Tags::new(), "").await.unwrap();
    cloud.proxy.inject(Fault::new("DescribeInstances", "Throttling", "Rate exceeded").times(1));
    let throttled = set.list().await.unwrap_err();
    assert!(
        matches!(throttled, ProberError::RateLimited { retry_after } if retry_after == Duration::from_secs(1))
    );
    assert_eq!(set.list().await.unwrap().len(), 1);
}

/// The pool over EC2: what EC2 refuses holds what it should, and nothing more. An injected
/// capacity error holds that type while another is created; a vCPU limit holds the type's
/// quota group while a type of another group is created; a throttle holds every create for
/// the backoff, with no call made meanwhile; a pool restarted over a new set finds the
/// instances by their tags, with their types.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_pool_holds_what_ec2_refuses() {
    use std::sync::Arc;
    use wharf_prober::{
        FakeClock, HoldReason, Moment, NewExecutor, Pool, PoolConfig, ScriptedExecutor,
    };

    let cloud = cloud().await;
    let subnet = cloud.subnet();
    let clock = Arc::new(FakeClock::new(Moment::from_origin(Duration::from_secs(1_000))));
    let typed = |name: &str, provider: &str, group: &str| InstanceType {
        provider_type: provider.into(),
        quota_group: Some(group.into()),
        ..InstanceType::new(name)
    };
    let config = PoolConfig {
        instance_types: vec![
            typed("small", "t3.small", "standard"),
            typed("large", "m5.large", "standard"),
            typed("gpu", "p3.2xlarge", "p"),
        ],
        ..PoolConfig::default()
    };
    let new_executor: NewExecutor = Arc::new(|instance: &wharf_prober::Instance| {
        Arc::new(ScriptedExecutor::new(&instance.id.0)) as Arc<dyn wharf_prober::Executor>
    });
    let pool = |set: Ec2InstanceSet| {
        Pool::new(config.clone(), clock.clone(), Arc::new(set), new_executor.clone()).unwrap()
    };
    let first = pool(cloud.set("pool", &[&subnet]));
    let create = |pool: &Pool, name: &str| {
        let creating = pool.create(name);
        async move { creating?.finished().await }
    };
    let runs = || cloud.proxy.calls("RunInstances").len();

    cloud.proxy.inject(
        Fault::new("RunInstances", "InsufficientInstanceCapacity", "none")
            .for_type("t3.small")
            .times(1),
    );
    let refused = create(&first, "small").await.unwrap_err();
    assert!(
        matches!(refused, ProberError::Capacity { scope: CapacityScope::InstanceType, .. }),
        "{refused:?}"
    );
    assert!(first.at_capacity("small") && !first.at_capacity("large"));
    let calls = runs();
    let held = create(&first, "small").await.unwrap_err();
    assert!(
        matches!(held, ProberError::CreateHeld { reason: HoldReason::Capacity { .. }, .. }),
        "{held:?}"
    );
    assert_eq!(runs(), calls, "a held create must not reach EC2");
    let large = create(&first, "large").await.unwrap();

    cloud.proxy.inject(
        Fault::new("RunInstances", "VcpuLimitExceeded", "vCPU limit of 64")
            .for_type("m5.large")
            .times(1),
    );
    let refused = create(&first, "large").await.unwrap_err();
    assert!(
        matches!(refused, ProberError::Capacity { scope: CapacityScope::QuotaGroup, .. }),
        "{refused:?}"
    );
    assert!(first.at_capacity("large") && first.at_capacity("small") && !first.at_capacity("gpu"));
    let gpu = create(&first, "gpu").await.unwrap();

    cloud.proxy.inject(
        Fault::new("RunInstances", "RequestLimitExceeded", "slow down")
            .for_type("p3.2xlarge")
            .times(1),
    );
    let refused = create(&first, "gpu").await.unwrap_err();
    assert!(
        matches!(refused, ProberError::RateLimited { retry_after } if retry_after == Duration::from_secs(1))
    );
    let calls = runs();
    let held = create(&first, "gpu").await.unwrap_err();
    assert!(
        matches!(held, ProberError::CreateHeld { reason: HoldReason::RateLimit { .. }, .. }),
        "{held:?}"
    );
    assert_eq!(runs(), calls, "a rate-limited pool must not call EC2");
    clock.advance(Duration::from_secs(1));
    let gpu2 = create(&first, "gpu").await.unwrap();

    // A new pool over a new set (a restarted fleet) finds the three by their tags.
    let second = pool(cloud.set("pool", &[&subnet]));
    assert_eq!(second.sync().await.unwrap(), 3);
    let mut found: Vec<(InstanceId, String)> =
        second.workers().into_iter().map(|w| (w.id, w.instance_type)).collect();
    found.sort();
    let mut want =
        vec![(large, "large".to_owned()), (gpu, "gpu".to_owned()), (gpu2, "gpu".to_owned())];
    want.sort();
    assert_eq!(found, want);
}

/// Arvados' TestInstancePriceHistory, as far as moto answers: the spot price EC2 reports for a
/// type (Linux), asked for that type only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ec2_instance_price_history() {
    let cloud = cloud().await;
    let set = cloud.set("prices", &[]);
    let price = set.spot_price("t3.small").await.unwrap().expect("moto reports spot prices");
    assert!(price.hourly() > 0.0, "{price}");
    let asked = &cloud.proxy.calls("DescribeSpotPriceHistory")[0];
    assert_eq!(asked.param("Filter.1.Value.1"), Some("t3.small"));
    assert_eq!(set.spot_price("no-such.type").await.unwrap(), None);
}

//! `wharf fleet` on EC2, against a real moto_server behind the EC2 tests' fault-injecting
//! proxy: work that fits no worker makes the fleet create the smallest type that fits, shown
//! with its price and types in Arvados' instance list; a fleet restarted over the same store
//! (after a crash) finds the instance by its tag and keeps the work; an instance that never
//! boots is terminated after the boot timeout. And with a network-namespace host (sshd and the
//! agent) at the instance's private address: the worker boots, is probed, gets the fleet's
//! binary, runs the work, and is terminated once idle for `timeout_idle`. A preemptible
//! type's worker is priced at the spot price EC2 reports, or at its configured price where
//! EC2 does not answer.

#[path = "../../prober/tests/moto/mod.rs"]
mod moto;

use hyper::Method;
use moto::{Fault, Moto, Proxy};
use std::path::Path;
use std::time::Duration;
use tokio::time::Instant;
use wharf_node::client::Client;
use wharf_node::fleet::api::FleetWorker;
use wharf_node::fleet::arvados::ArvadosInstances;
use wharf_tests::fleet::Fleet;

const WHARF: &str = env!("CARGO_BIN_EXE_wharf");
/// Any single wait in this test; reaching it means something hung.
const LIMIT: Duration = Duration::from_secs(60);
const CREDENTIALS: [(&str, &str); 2] =
    [("AWS_ACCESS_KEY_ID", "AKIDTEST"), ("AWS_SECRET_ACCESS_KEY", "secret")];

/// A fleet on EC2 through `proxy`, in `subnet`, booting for at most `booting`. Its instances
/// carry the fleet tag [`fleet_tag`] of `dir`: fleets of one directory share them, as a
/// restarted fleet does, and tests running at once against the same moto keep theirs apart.
fn start(dir: &Path, proxy: &Proxy, subnet: &str, key: &Path, booting: &str) -> Fleet {
    let settings = format!(
        "probe_interval = \"200ms\"\nsync_interval = \"500ms\"\ncommand_deadline = \"1s\"\n\
         [timeouts]\nbooting = \"{booting}\"\n\
         [runner]\nagent_data_dir = \"/var/lib/wharf\"\n\
         [ec2]\nendpoint = {:?}\nimage = \"ami-12c6146b\"\nsubnets = [{subnet:?}]\n\
         identity = {:?}\nhost_key = {:?}\nfleet_tag = \"{}\"\ntimeout_idle = \"2s\"\n\
         [[ec2.instance_type]]\nname = \"small\"\nprovider_type = \"t3.small\"\nvcpus = 1\nmemory_mb = 1024\nprice = 0.0104\nquota_group = \"t3\"\n\
         [[ec2.instance_type]]\nname = \"medium\"\nprovider_type = \"t3.medium\"\nvcpus = 2\nmemory_mb = 4096\nprice = 0.0416\nquota_group = \"t3\"\n\
         [[ec2.instance_type]]\nname = \"large\"\nprovider_type = \"m5.xlarge\"\nvcpus = 4\nmemory_mb = 16384\nprice = 0.192\nquota_group = \"m5\"\n",
        proxy.url(),
        key.display().to_string(),
        std::fs::read_to_string(key.with_extension("pub")).unwrap().trim(),
        fleet_tag(dir),
    );
    Fleet::start_with_env(Path::new(WHARF), dir, &settings, "info", LIMIT, &CREDENTIALS).unwrap()
}

/// The fleet tag of the fleets started in `dir`.
fn fleet_tag(dir: &Path) -> String {
    format!("e2e-{}-{}", std::process::id(), dir.file_name().unwrap().to_string_lossy())
}

/// Polls Arvados' instance list until `check` holds.
async fn until(
    client: &Client,
    what: &str,
    check: impl Fn(&ArvadosInstances) -> bool,
) -> ArvadosInstances {
    let deadline = Instant::now() + LIMIT;
    loop {
        let list: ArvadosInstances =
            client.json(Method::GET, "/arvados/v1/dispatch/instances", None).await.unwrap();
        if check(&list) {
            return list;
        }
        assert!(Instant::now() < deadline, "never {what}: {list:#?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fleet_creates_the_smallest_fitting_ec2_type_finds_it_again_and_ends_it() {
    #![allow(clippy::disallowed_methods)] // ssh-keygen makes the fleet's key
    let moto = tokio::task::spawn_blocking(Moto::shared).await.unwrap();
    let proxy = Proxy::start(moto.port).await;
    let subnet = moto.subnet("10.231.0.0/16", "10.231.200.0/24");
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("id_ed25519");
    let made = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen (Debian: openssh-client) must be installed");
    assert!(made.status.success(), "{made:?}");

    // Work needing 1.5 cores and 2 GiB: "small" is too small, "medium" is the smallest fit.
    let first = start(dir.path(), &proxy, &subnet, &key, "5m");
    let client = Client::new(first.address(), Some(first.token().unwrap()));
    let spec = "[job]\nid = \"big\"\ntype = \"batch\"\n[group]\nname = \"g\"\n[[group.task]]\n\
                name = \"t\"\ndriver = \"raw_exec\"\nresources = { cpu = 1500, memory = 2048 }\n\
                config = { command = \"/bin/true\" }\n";
    let body = client
        .call(Method::POST, "/v1/allocations", Some(("application/toml", spec.as_bytes().to_vec())))
        .await
        .unwrap();
    let alloc = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let list = until(&client, "an instance", |l| l.items.len() == 1).await;
    let instance = &list.items[0];
    assert_eq!(
        (instance.arvados_instance_type.as_str(), instance.provider_instance_type.as_str()),
        ("medium", "t3.medium")
    );
    assert_eq!(instance.price, 0.0416);
    assert!(instance.address.starts_with("10.231.200."), "{instance:?}");
    assert!(matches!(instance.worker_state.as_str(), "booting" | "unknown"), "{instance:?}");
    let runs: Vec<_> = proxy
        .calls("RunInstances")
        .iter()
        .map(|c| c.param("InstanceType").unwrap().to_owned())
        .collect();
    assert_eq!(runs, ["t3.medium"], "only the smallest type that fits is created");
    let id = instance.instance.clone();
    let described = moto.call("DescribeInstances", &[("InstanceId.1", &id)]);
    assert!(
        described.contains(&format!("<value>{}</value>", fleet_tag(dir.path()))),
        "{described}"
    );

    // A crash, and a fleet over the same store finds the instance by its tag and keeps the
    // work; with a short boot timeout, it ends the instance that never booted.
    first.kill();
    let second = start(dir.path(), &proxy, &subnet, &key, "2s");
    let client = Client::new(second.address(), Some(second.token().unwrap()));
    let found =
        until(&client, "the instance found again", |l| l.items.iter().any(|i| i.instance == id))
            .await;
    let again = found.items.iter().find(|i| i.instance == id).unwrap();
    assert_eq!(again.arvados_instance_type, "medium");
    let kept: serde_json::Value =
        client.json(Method::GET, &format!("/v1/allocations/{alloc}"), None).await.unwrap();
    assert_eq!(kept["id"], alloc.as_str(), "{kept}");
    let deadline = Instant::now() + LIMIT;
    while !proxy
        .calls("TerminateInstances")
        .iter()
        .any(|c| c.param("InstanceId.1") == Some(id.as_str()))
    {
        assert!(Instant::now() < deadline, "the instance that never booted was not terminated");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let described = moto.call("DescribeInstances", &[("InstanceId.1", &id)]);
    assert!(
        described.contains("<name>shutting-down</name>")
            || described.contains("<name>terminated</name>"),
        "{described}"
    );
}

/// A fleet on EC2 through `proxy` whose one type, "spot", is preemptible and configured at
/// 0.0104 an hour, asking EC2 for its spot price every 300 ms.
fn start_spot(dir: &Path, proxy: &Proxy, subnet: &str) -> Fleet {
    #![allow(clippy::disallowed_methods)] // ssh-keygen makes the fleet's key
    let key = dir.join("id_ed25519");
    let made = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen (Debian: openssh-client) must be installed");
    assert!(made.status.success(), "{made:?}");
    let settings = format!(
        "probe_interval = \"200ms\"\nsync_interval = \"500ms\"\ncommand_deadline = \"1s\"\n\
         [runner]\nagent_data_dir = \"/var/lib/wharf\"\n\
         [ec2]\nendpoint = {:?}\nimage = \"ami-12c6146b\"\nsubnets = [{subnet:?}]\n\
         identity = {:?}\nhost_key = {:?}\nfleet_tag = \"{}\"\nspot_price_refresh = \"300ms\"\n\
         [[ec2.instance_type]]\nname = \"spot\"\nprovider_type = \"t3.small\"\nvcpus = 1\nmemory_mb = 1024\nprice = 0.0104\npreemptible = true\n",
        proxy.url(),
        key.display().to_string(),
        std::fs::read_to_string(key.with_extension("pub")).unwrap().trim(),
        fleet_tag(dir),
    );
    Fleet::start_with_env(Path::new(WHARF), dir, &settings, "info", LIMIT, &CREDENTIALS).unwrap()
}

/// The price of the one worker of the fleet `client` reaches, in wharf's API, Arvados' list
/// and the price metric; `None` until there is a worker.
async fn worker_prices(client: &Client) -> Option<(f64, f64, String)> {
    let workers: Vec<FleetWorker> = client.json(Method::GET, "/v1/workers", None).await.unwrap();
    let ours = workers.first()?.price_per_hour?;
    let list: ArvadosInstances =
        client.json(Method::GET, "/arvados/v1/dispatch/instances", None).await.unwrap();
    let arvados = list.items.first()?.price;
    let metrics =
        String::from_utf8(client.call(Method::GET, "/v1/metrics", None).await.unwrap().to_vec())
            .unwrap();
    let metric = metrics
        .lines()
        .filter(|l| l.starts_with("wharf_prober_instances_price{") && !l.ends_with("} 0"))
        .filter_map(|l| l.rsplit(' ').next())
        .collect::<Vec<_>>()
        .join(",");
    Some((ours, arvados, metric))
}

/// Arvados prices a spot instance at the spot price EC2 reports for its type (its
/// TestInstancePriceHistory's prices, seen through the fleet): a preemptible type's worker
/// shows moto's spot price, not the configured one, in wharf's API, Arvados' list and the
/// metrics; where DescribeSpotPriceHistory fails, the configured price stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_preemptible_worker_is_priced_at_the_spot_price_ec2_reports() {
    let moto = tokio::task::spawn_blocking(Moto::shared).await.unwrap();
    let answering = Proxy::start(moto.port).await;
    let failing = Proxy::start(moto.port).await;
    failing.inject(Fault::new("DescribeSpotPriceHistory", "UnauthorizedOperation", "no prices"));
    let (priced_dir, fallback_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let priced =
        start_spot(priced_dir.path(), &answering, &moto.subnet("10.231.0.0/16", "10.231.202.0/24"));
    let fallback =
        start_spot(fallback_dir.path(), &failing, &moto.subnet("10.231.0.0/16", "10.231.203.0/24"));
    let priced_client = Client::new(priced.address(), Some(priced.token().unwrap()));
    let fallback_client = Client::new(fallback.address(), Some(fallback.token().unwrap()));
    submit(&priced_client, "spot-work", 500, 256).await;
    submit(&fallback_client, "spot-work", 500, 256).await;

    // moto's spot price for every type is 0.00001 an hour.
    let deadline = Instant::now() + LIMIT;
    loop {
        let prices = worker_prices(&priced_client).await;
        if prices == Some((0.00001, 0.00001, "0.00001".into())) {
            break;
        }
        assert!(Instant::now() < deadline, "never priced at the spot price: {prices:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let spot_run = answering.calls("RunInstances");
    assert_eq!(spot_run[0].param("InstanceMarketOptions.MarketType"), Some("spot"));

    // Once a second ask has been made, the first one's failure has been taken in.
    let deadline = Instant::now() + LIMIT;
    let prices = loop {
        let prices = worker_prices(&fallback_client).await;
        if prices.is_some() && failing.calls("DescribeSpotPriceHistory").len() >= 2 {
            break prices;
        }
        assert!(Instant::now() < deadline, "no worker, or EC2 never asked: {prices:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(prices, Some((0.0104, 0.0104, "0.0104".into())));
    let asked = failing.calls("DescribeSpotPriceHistory");
    assert_eq!(asked[0].param("Filter.1.Value.1"), Some("t3.small"));
}

/// Submits work needing `cpu` MHz and `memory` MB to the fleet; returns its id.
async fn submit(client: &Client, id: &str, cpu: u32, memory: u32) -> String {
    let spec = format!(
        "[job]\nid = {id:?}\ntype = \"batch\"\n[group]\nname = \"g\"\n[[group.task]]\n\
         name = \"t\"\ndriver = \"raw_exec\"\nresources = {{ cpu = {cpu}, memory = {memory} }}\n\
         config = {{ command = \"/bin/true\" }}\n"
    );
    let body = client
        .call(Method::POST, "/v1/allocations", Some(("application/toml", spec.into_bytes())))
        .await
        .unwrap();
    serde_json::from_slice::<serde_json::Value>(&body).unwrap()["id"].as_str().unwrap().to_owned()
}

/// The instance types the fleet asked EC2 for, in order.
fn types_run(proxy: &Proxy) -> Vec<String> {
    let calls = proxy.calls("RunInstances");
    calls.iter().map(|c| c.param("InstanceType").unwrap_or_default().to_owned()).collect()
}

/// Arvados' holds, through the fleet's scheduler: a type the cloud has no capacity for, and
/// every type of a quota group at its quota, are passed over for the next type that fits
/// rather than leave the work waiting for the hold to end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_held_for_capacity_or_quota_is_passed_over_for_the_next_that_fits() {
    #![allow(clippy::disallowed_methods)] // ssh-keygen makes the fleet's key
    let moto = tokio::task::spawn_blocking(Moto::shared).await.unwrap();
    let proxy = Proxy::start(moto.port).await;
    let subnet = moto.subnet("10.231.0.0/16", "10.231.201.0/24");
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("id_ed25519");
    let made = std::process::Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-f"])
        .arg(&key)
        .output()
        .expect("ssh-keygen (Debian: openssh-client) must be installed");
    assert!(made.status.success(), "{made:?}");
    let fleet = start(dir.path(), &proxy, &subnet, &key, "5m");
    let client = Client::new(fleet.address(), Some(fleet.token().unwrap()));
    let large = |l: &ArvadosInstances| {
        l.items.iter().filter(|i| i.provider_instance_type == "m5.xlarge").count()
    };

    // No capacity for t3.medium, the smallest type that fits: m5.xlarge instead.
    proxy.inject(
        Fault::new("RunInstances", "InsufficientInstanceCapacity", "no t3.medium here")
            .for_type("t3.medium")
            .times(1),
    );
    submit(&client, "needs-medium", 1500, 2048).await;
    until(&client, "an m5.xlarge for the work", |l| large(l) == 1).await;
    assert_eq!(types_run(&proxy), ["t3.medium", "m5.xlarge"]);

    // t3's vCPU quota is reached: work that fits t3.small gets an m5.xlarge too, and the work
    // above, whose t3.medium is held still, counts the m5.xlarge on its way.
    proxy.inject(
        Fault::new("RunInstances", "VcpuLimitExceeded", "t3 vCPU limit")
            .for_type("t3.small")
            .times(1),
    );
    submit(&client, "needs-small", 500, 512).await;
    let list = until(&client, "a second m5.xlarge", |l| large(l) == 2).await;
    assert_eq!(types_run(&proxy), ["t3.medium", "m5.xlarge", "t3.small", "m5.xlarge"]);
    assert_eq!(list.items.len(), 2, "no t3 instance was made: {list:#?}");
}

/// The image's boot, played by the test: the instance's host is a network namespace running
/// sshd and the agent, at the private address the cloud gives the instance (the test has the
/// proxy ask moto for that address). The fleet creates the instance for work, its probes reach
/// it over SSH, it deploys itself there, the work runs and ends, and the worker, idle for
/// `timeout_idle`, is terminated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ec2_worker_boots_runs_work_and_is_terminated_when_idle() {
    #![allow(clippy::disallowed_methods)] // waits on the real clock for the agent's start
    use wharf_tests::netns::{ClientKey, Host};
    wharf_tests::netns::check_requirements().unwrap_or_else(|e| panic!("{e}"));
    let shim = Path::new(WHARF).with_file_name("wharf-shim");
    assert!(shim.exists(), "{} is missing: build wharf-exec's shim beside wharf", shim.display());
    let key = ClientKey::generate().unwrap_or_else(|e| panic!("cannot make a client key: {e}"));
    let mut host =
        Host::start(&key.public_key).unwrap_or_else(|e| panic!("cannot set up a host: {e}"));
    let data_dir = host.scratch().join("data");
    let node_config = host.scratch().join("node.toml");
    std::fs::write(&node_config, format!("data_dir = {:?}\n", data_dir.display().to_string()))
        .unwrap();
    let mut agent = host.command(WHARF);
    agent
        .args(["agent", "--config"])
        .arg(&node_config)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1");
    host.spawn("agent", agent).unwrap_or_else(|e| panic!("cannot start an agent: {e}"));
    let started = std::time::Instant::now();
    while !data_dir.join("agent.json").exists() {
        assert!(started.elapsed() < LIMIT, "the agent never started:\n{}", host.log("agent"));
        std::thread::sleep(Duration::from_millis(20));
    }

    let moto = tokio::task::spawn_blocking(Moto::shared).await.unwrap();
    let proxy = Proxy::start(moto.port).await;
    let subnet = moto.subnet("10.231.0.0/16", &format!("10.231.{}.0/24", host.number));
    proxy.add_param(
        "RunInstances",
        "NetworkInterface.1.PrivateIpAddress",
        &host.address.to_string(),
    );
    let dir = tempfile::tempdir().unwrap();
    let settings = format!(
        "probe_interval = \"300ms\"\nsync_interval = \"1s\"\ncommand_deadline = \"5s\"\n\
         [timeouts]\nbooting = \"60s\"\n\
         [runner]\ndirectory = {:?}\nagent_data_dir = {:?}\n\
         [ec2]\nendpoint = {:?}\nimage = \"ami-12c6146b\"\nsubnets = [{subnet:?}]\nadmin_user = {:?}\n\
         identity = {:?}\nhost_key = {:?}\nfleet_tag = \"netns-{}\"\ntimeout_idle = \"2s\"\n\
         [[ec2.instance_type]]\nname = \"small\"\nprovider_type = \"t3.small\"\nvcpus = 1\nmemory_mb = 1024\nprice = 0.0104\n\
         [[ec2.instance_type]]\nname = \"medium\"\nprovider_type = \"t3.medium\"\nvcpus = 2\nmemory_mb = 4096\nprice = 0.0416\n",
        host.scratch().join("runner").display().to_string(),
        data_dir.display().to_string(),
        proxy.url(),
        host.user,
        key.private_key_path().display().to_string(),
        host.host_key.trim(),
        std::process::id(),
    );
    let fleet =
        Fleet::start_with_env(Path::new(WHARF), dir.path(), &settings, "info", LIMIT, &CREDENTIALS)
            .unwrap();
    let client = Client::new(fleet.address(), Some(fleet.token().unwrap()));
    let spec = "[job]\nid = \"work\"\ntype = \"batch\"\n[group]\nname = \"g\"\n[[group.task]]\n\
                name = \"t\"\ndriver = \"raw_exec\"\nresources = { cpu = 500, memory = 256 }\n\
                config = { command = \"/bin/sh\", args = [\"-c\", \"sleep 2\"] }\n";
    let submitted = Instant::now();
    let body = client
        .call(Method::POST, "/v1/allocations", Some(("application/toml", spec.as_bytes().to_vec())))
        .await
        .unwrap();
    let alloc = serde_json::from_slice::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    let list = until(&client, "a running worker", |l| {
        l.items.len() == 1 && l.items[0].worker_state == "running"
    })
    .await;
    let worker = &list.items[0];
    assert_eq!((worker.arvados_instance_type.as_str(), worker.price), ("small", 0.0104));
    assert_eq!(worker.address, host.address.to_string());
    let id = worker.instance.clone();
    // Its price, in wharf's own API, its command line and its metrics.
    let workers: Vec<FleetWorker> = client.json(Method::GET, "/v1/workers", None).await.unwrap();
    assert_eq!(
        (workers[0].instance_type.as_str(), workers[0].price_per_hour),
        ("small", Some(0.0104))
    );
    let listed = std::process::Command::new(WHARF)
        .args(["fleet", "workers"])
        .env("WHARF_FLEET_ADDR", fleet.address())
        .env("WHARF_DATA_DIR", fleet.data_dir())
        .env_remove("WHARF_TOKEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&listed.stdout);
    assert!(text.contains("PRICE/H") && text.contains(" 0.0104 "), "{text}");
    let metrics =
        String::from_utf8(client.call(Method::GET, "/v1/metrics", None).await.unwrap().to_vec())
            .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("wharf_prober_instances_price{") && l.ends_with("} 0.0104")),
        "{metrics}"
    );
    let deadline = Instant::now() + LIMIT;
    let ended = loop {
        let record: serde_json::Value =
            client.json(Method::GET, &format!("/v1/allocations/{alloc}"), None).await.unwrap();
        if !record["finished"].is_null() {
            break record;
        }
        assert!(Instant::now() < deadline, "the work never ended: {record}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(ended["worker"], id.as_str(), "{ended}");
    assert!(ended["outcome"].as_str().unwrap_or_default().contains("complete"), "{ended}");
    // The attempt's cost: the worker's price for the time the work ran (`sleep 2`, and the
    // few moments around it until the worker reported its end).
    assert_eq!(ended["price_per_hour"], 0.0104, "{ended}");
    let cost = ended["cost"].as_f64().unwrap_or_else(|| panic!("no cost in {ended}"));
    let (least, most) = (2.0, submitted.elapsed().as_secs_f64());
    assert!(
        (0.0104 * least / 3600.0..=0.0104 * most / 3600.0).contains(&cost),
        "{cost} is not the price of {least} to {most} seconds: {ended}"
    );
    assert_eq!(ended["total_cost"].as_f64(), Some(cost), "{ended}");
    let status = std::process::Command::new(WHARF)
        .args(["fleet", "status", &alloc])
        .env("WHARF_FLEET_ADDR", fleet.address())
        .env("WHARF_DATA_DIR", fleet.data_dir())
        .env_remove("WHARF_TOKEN")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&status.stdout);
    assert!(text.contains(" COST ") && text.contains(&format!(" {cost:.6} ")), "{text}");
    let deadline = Instant::now() + LIMIT;
    while !proxy
        .calls("TerminateInstances")
        .iter()
        .any(|c| c.param("InstanceId.1") == Some(id.as_str()))
    {
        assert!(Instant::now() < deadline, "the idle worker was never terminated");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

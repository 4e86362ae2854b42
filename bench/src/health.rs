//! Service health scenario: the agent's CPU while it runs 1,000 http checks at a 1 s interval
//! against local servers, beside the same allocations with no checks.
//!
//! The agent runs in this process (so its CPU time is this process's, measured with
//! `getrusage`); the servers are raw_exec tasks, each this benchmark's own binary answering
//! HTTP on the port the agent gave it (`--serve-http`), so their work is not counted. The
//! checks run for a warm-up, then over a window the process's CPU time is divided by the
//! window's wall time; the number of check runs in the window (`wharf_check_runs_total`) is
//! reported too, so the figure is known to cover the checks it claims, and so is the whole
//! machine's CPU over the same window (the servers answering the checks included), from
//! `/proc/stat`.

use crate::Effort;
use crate::report::{Better, Row};
use crate::target::Target;
use hyper::Method;
use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};
use wharf_node::api::AllocDetail;
use wharf_node::client::{ApiPath, Client};
use wharf_node::config::NodeConfig;
use wharf_state::CheckStatus;

const FULL_CHECKS: usize = 1000;
/// Checks per allocation (one server task each).
const CHECKS_PER_ALLOC: usize = 100;
const FULL_WINDOW: Duration = Duration::from_secs(10);
const WARM_UP: Duration = Duration::from_secs(3);
/// The longest the servers may take to be ready, or to stop.
const WAIT_LIMIT: Duration = Duration::from_secs(120);

pub(crate) fn run(effort: Effort) -> Result<Vec<Row>, String> {
    let shim = crate::exec::shim()?;
    let runtime =
        tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let checks = effort.scaled(FULL_CHECKS);
    let window = if effort.scale < 1.0 { Duration::from_secs(1) } else { FULL_WINDOW };
    let (mut with_checks, mut without, mut rates, mut machine) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..effort.runs.min(3) {
        let dir = crate::scratch::dir("wharf-bench-health");
        let measured = runtime.block_on(measure(&dir, &shim, checks, true, window));
        with_checks.push(measured.cpu_percent);
        rates.push(measured.runs_per_second);
        machine.push(measured.machine_percent);
        let dir = crate::scratch::dir("wharf-bench-health");
        without.push(runtime.block_on(measure(&dir, &shim, checks, false, window)).cpu_percent);
    }
    Ok(vec![
        // The machine's load average is not in the name. The 1-minute load average decays
        // with a time constant of a minute, so read after the window it still counts the
        // 1,000 servers' start (the first run's name said 12.0), and waiting until it stops
        // falling would add minutes to every run. And the history knows a row by its name,
        // which must not change from run to run. What the machine did in the window is the
        // row after next: its CPU over the same window, every process counted.
        Row {
            name: format!("health: {checks} http checks every 1s against local servers, agent CPU"),
            unit: "% of a core",
            better: Better::Lower,
            samples: with_checks,
            baseline: None,
            target: (checks == FULL_CHECKS).then(|| Target::parse("≤ 5 %")).transpose()?,
        },
        Row {
            name: format!(
                "health: agent CPU with the same {} allocations and no checks",
                checks.div_ceil(CHECKS_PER_ALLOC)
            ),
            unit: "% of a core",
            better: Better::Lower,
            samples: without,
            baseline: None,
            target: None,
        },
        Row {
            name: format!("health: check runs per second with {checks} checks every 1s"),
            unit: "runs/s",
            better: Better::Higher,
            samples: rates,
            baseline: None,
            target: None,
        },
        Row {
            name: format!(
                "health: the machine's CPU over the same window with {checks} checks (every process: agent, servers, the rest)"
            ),
            unit: "% of a core",
            better: Better::Lower,
            samples: machine,
            baseline: None,
            target: None,
        },
    ])
}

struct Measured {
    cpu_percent: f64,
    runs_per_second: f64,
    /// The whole machine's CPU over the window.
    machine_percent: f64,
}

/// The job of one server with `checks` http checks (or none, with the same service).
fn job(index: usize, checks: usize, with_checks: bool, bench: &Path) -> String {
    let mut spec = format!(
        "[job]\nid = \"health-{index}\"\ntype = \"service\"\n[group]\nname = \"g\"\n\
         [group.network.port.http]\n\
         [[group.task]]\nname = \"server\"\ndriver = \"raw_exec\"\nkill_timeout = \"1s\"\n\
         config = {{ command = {:?}, args = [\"--serve-http\", \"${{WHARF_PORT_http}}\"] }}\n\
         [[group.task.service]]\nname = \"web\"\nport = \"http\"\n",
        bench.display().to_string()
    );
    for i in (0..checks).filter(|_| with_checks) {
        spec.push_str(&format!(
            "[[group.task.service.check]]\nname = \"c{i}\"\ntype = \"http\"\npath = \"/c{i}\"\n\
             interval = \"1s\"\ntimeout = \"1s\"\n"
        ));
    }
    spec
}

async fn measure(
    dir: &Path,
    shim: &Path,
    checks: usize,
    with_checks: bool,
    window: Duration,
) -> Measured {
    let mut config = NodeConfig { data_dir: dir.join("data"), ..NodeConfig::default() };
    config.drivers.raw_exec.shim_path = Some(shim.to_owned());
    config.network.min_dynamic_port = 26_000;
    config.network.max_dynamic_port = 26_999;
    let bench = std::env::current_exe().unwrap();
    let (client, agent) = wharf_node::serve::embedded(config).await.unwrap();
    let allocs = checks.div_ceil(CHECKS_PER_ALLOC);
    let mut ids = Vec::new();
    for index in 0..allocs {
        let count = CHECKS_PER_ALLOC.min(checks - index * CHECKS_PER_ALLOC);
        let spec = job(index, count, with_checks, &bench);
        let bytes = client
            .call(Method::POST, "/v1/allocations", Some(("application/toml", spec.into_bytes())))
            .await
            .unwrap();
        let value: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        ids.push(value["id"].as_str().unwrap().to_owned());
    }
    // Every check has passed once (or, without checks, every server runs): then warm up.
    let deadline = Instant::now() + WAIT_LIMIT;
    for id in &ids {
        let path = ApiPath::v1(["allocations", id]);
        loop {
            let detail: AllocDetail = client.json(Method::GET, &path, None).await.unwrap();
            let status = detail.state.client_status;
            assert!(!status.is_terminal() && !detail.done, "server {id} is {status:?}: {detail:?}");
            assert!(Instant::now() < deadline, "server {id} not ready within {WAIT_LIMIT:?}");
            let ready = if with_checks {
                detail.checks.iter().all(|c| c.status == CheckStatus::Passing)
            } else {
                detail.state.client_status == wharf_state::ClientStatus::Running
            };
            if ready {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    tokio::time::sleep(WARM_UP).await;
    let runs_before = check_runs(&client).await;
    let (cpu_before, machine_before, started) = (cpu_time(), machine_ticks(), Instant::now());
    tokio::time::sleep(window).await;
    let (cpu, elapsed) = (cpu_time() - cpu_before, started.elapsed());
    let machine_percent = machine_busy_percent(machine_before, machine_ticks());
    let runs = check_runs(&client).await - runs_before;
    // Every server stopped before the agent leaves (it would leave them running).
    for id in &ids {
        client.call(Method::POST, ApiPath::v1(["allocations", id, "stop"]), None).await.unwrap();
    }
    let deadline = Instant::now() + WAIT_LIMIT;
    for id in &ids {
        let mut version = String::new();
        loop {
            let path =
                ApiPath::v1(["allocations", id]).query("after", &version).query("wait", "10s");
            let detail: AllocDetail = client.json(Method::GET, &path, None).await.unwrap();
            if detail.done {
                break;
            }
            assert!(Instant::now() < deadline, "server {id} not stopped within {WAIT_LIMIT:?}");
            version = detail.version;
        }
    }
    agent.stop().await;
    Measured {
        cpu_percent: cpu.as_secs_f64() / elapsed.as_secs_f64() * 100.0,
        runs_per_second: runs / elapsed.as_secs_f64(),
        machine_percent,
    }
}

/// `wharf_check_runs_total` from the agent's metrics.
async fn check_runs(client: &Client) -> f64 {
    let text = client.call(Method::GET, "/v1/metrics", None).await.unwrap();
    String::from_utf8_lossy(&text)
        .lines()
        .find_map(|l| l.strip_prefix("wharf_check_runs_total ")?.parse().ok())
        .unwrap_or(0.0)
}

/// The machine's CPU ticks since boot, from `/proc/stat`: busy and in all (busy and idle).
fn machine_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    parse_cpu_ticks(&stat).unwrap_or((0, 0))
}

/// The `cpu` line of `/proc/stat`: user nice system idle iowait irq softirq steal ..., in
/// ticks; idle and iowait are idle, the rest busy (guest time is counted in user already).
fn parse_cpu_ticks(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let fields: Vec<u64> =
        line.split_whitespace().skip(1).take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    let all: u64 = fields.iter().sum();
    let idle = fields.get(3)? + fields.get(4)?;
    Some((all - idle, all))
}

/// The machine's busy share between two readings of [`machine_ticks`], in % of one core.
fn machine_busy_percent(before: (u64, u64), after: (u64, u64)) -> f64 {
    let busy = after.0.saturating_sub(before.0) as f64;
    let all = after.1.saturating_sub(before.1) as f64;
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    if all == 0.0 { f64::NAN } else { busy / all * cores * 100.0 }
}

/// This process's CPU time, user and system.
fn cpu_time() -> Duration {
    use nix::sys::resource::{UsageWho, getrusage};
    let usage = getrusage(UsageWho::RUSAGE_SELF).unwrap();
    let micros = |t: nix::sys::time::TimeVal| {
        Duration::from_secs(t.tv_sec() as u64) + Duration::from_micros(t.tv_usec() as u64)
    };
    micros(usage.user_time()) + micros(usage.system_time())
}

/// `--serve-http PORT`: the servers the checks reach, as an HTTP/1.1 server keeps its
/// connections: every request on a connection answered `200 OK`, a thread per connection, on
/// 127.0.0.1, until killed.
pub(crate) fn serve_http(port: &str) -> ! {
    let listener =
        std::net::TcpListener::bind(("127.0.0.1", port.parse::<u16>().unwrap())).unwrap();
    for stream in listener.incoming() {
        let Ok(mut stream) = stream else { continue };
        std::thread::spawn(move || {
            let mut request = Vec::with_capacity(2048);
            let mut buf = [0u8; 2048];
            loop {
                match stream.read(&mut buf) {
                    Ok(0) | Err(_) => return,
                    Ok(n) => request.extend_from_slice(&buf[..n]),
                }
                // Requests carry no body: each ends with an empty line.
                while let Some(end) = request.windows(4).position(|w| w == b"\r\n\r\n") {
                    request.drain(..end + 4);
                    if stream.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok").is_err()
                    {
                        return;
                    }
                }
            }
        });
    }
    std::process::exit(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_machines_busy_ticks_leave_out_idle_and_iowait() {
        let stat = "cpu  100 5 50 800 40 3 2 0 0 0\ncpu0 50 2 25 400 20 1 1 0 0 0\n";
        assert_eq!(parse_cpu_ticks(stat), Some((160, 1000)));
        assert_eq!(parse_cpu_ticks("intr 1 2 3\n"), None);
    }
}

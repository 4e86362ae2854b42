//! The client node's own calls: an allocation's files (`fs/ls`, `stat`, `cat`, `readat`,
//! `stream`), its tasks' logs (`fs/logs`), its usage, restarts and signals, and the host's
//! usage.
//!
//! Files are seen in Nomad's layout: `alloc/` (shared), `<task>/local`, `<task>/secrets`
//! (never read here, as in Nomad), and the logs under `alloc/logs/<task>.stdout.0`, which
//! wharf keeps in each task's `logs/` directory: a path there names the task's file. Paths
//! are relative to the allocation's directory (a leading `/` is its root); `..` is refused
//! outright, and everything is opened below the allocation's directory without following a
//! link, so neither a link a task made nor a FIFO it left can take the agent elsewhere or
//! hang it.

use super::common::Shared;
use crate::agent::POLL_INTERVAL;
use crate::nomad_http::{NomadApiError, NomadResult, Params, flag, json_body, number};
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde_json::{Value, json};
use std::io::{Read, Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::PathBuf;
use std::time::Duration;
use wharf_alloc::AllocRunner;
use wharf_driver::{LogFrom, LogStream};
use wharf_isolate::IsolateError;
use wharf_isolate::dirs::OpenDir;
use wharf_nomad::shapes::{AllocFileInfo, StreamFrame};
use wharf_state::{Signal, TaskStatus, Timestamp};

/// The most one `cat`, `readat` or unfollowed `logs` answer carries.
const MAX_READ: u64 = 64 << 20;
/// The most one frame carries.
const FRAME: usize = 64 << 10;
/// A followed stream with nothing new sends `{}` this often, so clients know it lives.
const HEARTBEAT: Duration = Duration::from_secs(5);

/// Where a Nomad path is in wharf's allocation directory.
#[derive(Debug, PartialEq, Eq)]
enum Place {
    /// This path, relative to the allocation's directory (empty: the directory itself).
    Real(PathBuf),
    /// `alloc/logs`: the shared directory and every task's log files.
    LogsDir,
}

/// Reads a Nomad path: `..` and secrets are refused, log files are found in their task.
fn place(path: &str, tasks: &[String]) -> NomadResult<Place> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty() && *p != ".").collect();
    if parts.contains(&"..") {
        return Err(NomadApiError::new(
            StatusCode::FORBIDDEN,
            format!("{path:?}: `..` would leave the allocation's directory"),
        ));
    }
    if parts.iter().any(|p| p.contains('\0')) {
        return Err(NomadApiError::bad_request("a path cannot hold a NUL byte"));
    }
    match parts.as_slice() {
        [task, "secrets", ..] if tasks.iter().any(|t| t == task) => {
            Err(NomadApiError::new(StatusCode::FORBIDDEN, "Reading secret files is not allowed"))
        }
        ["alloc", "logs"] => Ok(Place::LogsDir),
        ["alloc", "logs", file] => {
            let owner = tasks.iter().find(|t| {
                file.strip_prefix(t.as_str()).is_some_and(|rest| {
                    rest.starts_with(".stdout.") || rest.starts_with(".stderr.")
                })
            });
            Ok(Place::Real(match owner {
                Some(task) => PathBuf::from(task).join("logs").join(file),
                None => PathBuf::from("alloc/logs").join(file),
            }))
        }
        parts => Ok(Place::Real(parts.iter().collect())),
    }
}

fn runner(server: &Shared, id: &str) -> NomadResult<AllocRunner> {
    server
        .agent
        .get(id)
        .map_err(|_| NomadApiError::not_found(format!("unknown allocation ID {id:?}")))
}

fn task_names(runner: &AllocRunner) -> Vec<String> {
    runner.tasks().iter().map(|t| t.name().to_owned()).collect()
}

fn refused(error: IsolateError) -> NomadApiError {
    match error {
        IsolateError::NotFollowed { path } => NomadApiError::new(
            StatusCode::FORBIDDEN,
            format!(
                "{}: a link, or not a regular file or directory; it is not opened",
                path.display()
            ),
        ),
        IsolateError::Io { path, source } if source.kind() == std::io::ErrorKind::NotFound => {
            NomadApiError::not_found(format!("{}: no such file or directory", path.display()))
        }
        other => NomadApiError::internal(other),
    }
}

/// Go's `os.FileMode` string, such as `drwxr-xr-x`.
fn file_mode(meta: &std::fs::Metadata) -> String {
    let kind = meta.file_type();
    let first = if kind.is_dir() {
        'd'
    } else if kind.is_symlink() {
        'L'
    } else if kind.is_fifo() {
        'p'
    } else if kind.is_socket() {
        'S'
    } else if kind.is_block_device() || kind.is_char_device() {
        'D'
    } else {
        '-'
    };
    let bits = meta.mode();
    let mut out = String::from(first);
    for (shift, letters) in [(6, "rwx"), (3, "rwx"), (0, "rwx")] {
        for (i, letter) in letters.chars().enumerate() {
            out.push(if bits >> (shift + 2 - i) & 1 == 1 { letter } else { '-' });
        }
    }
    out
}

fn file_info(name: String, meta: &std::fs::Metadata) -> AllocFileInfo {
    let mod_time = meta
        .modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or_else(
            || wharf_nomad::shapes::ZERO_TIME.to_owned(),
            |d| Timestamp::from_unix(d).to_string(),
        );
    AllocFileInfo {
        content_type: if meta.is_dir() {
            String::new()
        } else {
            "application/octet-stream".to_owned()
        },
        is_dir: meta.is_dir(),
        size: meta.len(),
        file_mode: file_mode(meta),
        mod_time,
        name,
    }
}

fn alloc_dir(server: &Shared, id: &str) -> NomadResult<OpenDir> {
    OpenDir::open(server.agent.config().alloc_root(id)).map_err(refused)
}

fn path_param(params: &Params) -> &str {
    params.get("path").map_or("/", String::as_str)
}

/// `GET /v1/client/fs/ls/:alloc?path=`.
pub(crate) async fn ls(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<Vec<AllocFileInfo>>> {
    let runner = runner(&server, &id)?;
    let tasks = task_names(&runner);
    let root = alloc_dir(&server, &id)?;
    let mut entries = Vec::new();
    match place(path_param(&params), &tasks)? {
        Place::Real(path) => {
            let dir = if path.as_os_str().is_empty() {
                root
            } else {
                root.open_dir(&path).map_err(refused)?
            };
            entries.extend(dir.entries().map_err(refused)?);
        }
        Place::LogsDir => {
            if let Ok(shared) = root.open_dir("alloc/logs") {
                entries.extend(shared.entries().map_err(refused)?);
            }
            for task in &tasks {
                if let Ok(logs) = root.open_dir(PathBuf::from(task).join("logs")) {
                    entries.extend(logs.entries().map_err(refused)?);
                }
            }
        }
    }
    let mut infos: Vec<AllocFileInfo> = entries
        .into_iter()
        .map(|(name, meta)| file_info(name.to_string_lossy().into_owned(), &meta))
        .collect();
    infos.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(Json(infos))
}

/// `GET /v1/client/fs/stat/:alloc?path=`.
pub(crate) async fn stat(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Json<AllocFileInfo>> {
    let runner = runner(&server, &id)?;
    let root = alloc_dir(&server, &id)?;
    let path = path_param(&params);
    let name = path.trim_end_matches('/').rsplit('/').next().unwrap_or("").to_owned();
    let meta = match place(path, &task_names(&runner))? {
        Place::LogsDir => {
            root.open_dir("alloc/logs").and_then(|d| d.metadata()).map_err(refused)?
        }
        Place::Real(relative) if relative.as_os_str().is_empty() => {
            root.metadata().map_err(refused)?
        }
        Place::Real(relative) => match root.open_dir(&relative) {
            Ok(dir) => dir.metadata().map_err(refused)?,
            Err(_) => root
                .open_file(&relative)
                .map_err(refused)?
                .metadata()
                .map_err(NomadApiError::internal)?,
        },
    };
    Ok(Json(file_info(name, &meta)))
}

/// Opens the regular file a Nomad path names.
fn open(server: &Shared, id: &str, params: &Params) -> NomadResult<std::fs::File> {
    let runner = runner(server, id)?;
    let root = alloc_dir(server, id)?;
    let path = path_param(params);
    match place(path, &task_names(&runner))? {
        Place::Real(relative) if !relative.as_os_str().is_empty() => {
            root.open_file(&relative).map_err(refused)
        }
        _ => Err(NomadApiError::bad_request(format!("{path:?} is a directory"))),
    }
}

fn read_range(mut file: std::fs::File, offset: u64, limit: u64) -> NomadResult<Vec<u8>> {
    file.seek(SeekFrom::Start(offset)).map_err(NomadApiError::internal)?;
    let mut bytes = Vec::new();
    file.take(limit.min(MAX_READ)).read_to_end(&mut bytes).map_err(NomadApiError::internal)?;
    Ok(bytes)
}

fn octets(bytes: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/octet-stream")], bytes).into_response()
}

/// `GET /v1/client/fs/cat/:alloc?path=`.
pub(crate) async fn cat(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Response> {
    let file = open(&server, &id, &params)?;
    Ok(octets(read_range(file, 0, MAX_READ)?))
}

/// `GET /v1/client/fs/readat/:alloc?path=&offset=&limit=`.
pub(crate) async fn readat(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Response> {
    let file = open(&server, &id, &params)?;
    let offset = number(&params, "offset")?.unwrap_or(0);
    let limit = number(&params, "limit")?.unwrap_or(MAX_READ);
    Ok(octets(read_range(file, offset, limit)?))
}

fn frame(file: &str, offset: u64, data: &[u8]) -> Bytes {
    let frame = StreamFrame {
        offset,
        data: base64::engine::general_purpose::STANDARD.encode(data),
        file: file.to_owned(),
        file_event: String::new(),
    };
    let mut line = serde_json::to_vec(&frame).unwrap_or_default();
    line.push(b'\n');
    Bytes::from(line)
}

/// `GET /v1/client/fs/stream/:alloc?path=&offset=&origin=`: the file as frames, from
/// `offset` (from the end with `origin=end`); with `follow=true`, then as it grows.
pub(crate) async fn stream(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Response> {
    let mut file = open(&server, &id, &params)?;
    let size = file.metadata().map_err(NomadApiError::internal)?.len();
    let offset = number(&params, "offset")?.unwrap_or(0);
    let start = if params.get("origin").map(String::as_str) == Some("end") {
        size.saturating_sub(offset)
    } else {
        offset.min(size)
    };
    file.seek(SeekFrom::Start(start)).map_err(NomadApiError::internal)?;
    let name = path_param(&params).trim_start_matches('/').to_owned();
    let follow = flag(&params, "follow")?;
    let chunks = futures_util::stream::unfold(
        (file, start, tokio::time::Instant::now()),
        move |(mut file, at, quiet_since)| {
            let name = name.clone();
            async move {
                loop {
                    let mut buf = vec![0u8; FRAME];
                    let read = match file.read(&mut buf) {
                        Ok(read) => read,
                        Err(e) => return Some((Err(e), (file, at, quiet_since))),
                    };
                    if read > 0 {
                        let next = at + read as u64;
                        return Some((
                            Ok(frame(&name, next, &buf[..read])),
                            (file, next, tokio::time::Instant::now()),
                        ));
                    }
                    if !follow {
                        return None;
                    }
                    if quiet_since.elapsed() >= HEARTBEAT {
                        return Some((
                            Ok(Bytes::from_static(b"{}\n")),
                            (file, at, tokio::time::Instant::now()),
                        ));
                    }
                    tokio::time::sleep(POLL_INTERVAL).await;
                }
            }
        },
    );
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from_stream(chunks))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

/// `GET /v1/client/fs/logs/:alloc?task=&type=stdout|stderr&follow=&offset=&origin=&plain=`.
pub(crate) async fn logs(
    State(server): State<Shared>,
    Path(id): Path<String>,
    Query(params): Query<Params>,
) -> NomadResult<Response> {
    let runner = runner(&server, &id)?;
    let task = params
        .get("task")
        .filter(|t| !t.is_empty())
        .ok_or_else(|| NomadApiError::bad_request("must provide task name"))?;
    let task_runner = runner
        .tasks()
        .iter()
        .find(|t| t.name() == task)
        .cloned()
        .ok_or_else(|| NomadApiError::not_found(format!("unknown task name {task:?}")))?;
    let stream = match params.get("type").map(String::as_str) {
        Some("stdout") => LogStream::Stdout,
        Some("stderr") => LogStream::Stderr,
        other => {
            return Err(NomadApiError::bad_request(format!(
                "type: {:?} is neither stdout nor stderr",
                other.unwrap_or("")
            )));
        }
    };
    let offset = number(&params, "offset")?.unwrap_or(0);
    let from = match params.get("origin").map(String::as_str) {
        None | Some("" | "start") => LogFrom::Offset(offset),
        Some("end") => LogFrom::Tail(offset),
        Some(other) => {
            return Err(NomadApiError::bad_request(format!(
                "origin: {other:?} is neither start nor end"
            )));
        }
    };
    let (follow, plain) = (flag(&params, "follow")?, flag(&params, "plain")?);
    let mut reader = task_runner
        .logs(stream, from)
        .await
        .map_err(|e| NomadApiError::new(StatusCode::FORBIDDEN, e.to_string()))?;
    let file = format!("alloc/logs/{task}.{}.0", stream.name());
    let encode = move |offset: u64, bytes: &[u8]| {
        if plain { Bytes::copy_from_slice(bytes) } else { frame(&file, offset, bytes) }
    };
    if !follow {
        let mut body = Vec::new();
        let mut total = 0u64;
        while total < MAX_READ {
            let bytes = reader.read(FRAME).await.map_err(NomadApiError::internal)?;
            if bytes.is_empty() {
                break;
            }
            total += bytes.len() as u64;
            body.extend_from_slice(&encode(reader.offset(), &bytes));
        }
        return Ok((
            [(header::CONTENT_TYPE, if plain { "text/plain" } else { "application/json" })],
            body,
        )
            .into_response());
    }
    // Ends once the task is dead and everything is sent, or when the client goes away.
    let chunks = futures_util::stream::unfold(
        (reader, tokio::time::Instant::now()),
        move |(mut reader, quiet_since)| {
            let task_runner = task_runner.clone();
            let encode = encode.clone();
            async move {
                loop {
                    let dead = task_runner.state().status == TaskStatus::Dead;
                    match reader.read(FRAME).await {
                        Ok(bytes) if !bytes.is_empty() => {
                            let chunk = encode(reader.offset(), &bytes);
                            return Some((
                                Ok::<_, std::io::Error>(chunk),
                                (reader, tokio::time::Instant::now()),
                            ));
                        }
                        Ok(_) if dead => return None,
                        Ok(_) if !plain && quiet_since.elapsed() >= HEARTBEAT => {
                            return Some((
                                Ok(Bytes::from_static(b"{}\n")),
                                (reader, tokio::time::Instant::now()),
                            ));
                        }
                        Ok(_) => tokio::time::sleep(POLL_INTERVAL).await,
                        Err(e) => {
                            return Some((
                                Err(std::io::Error::other(e.to_string())),
                                (reader, quiet_since),
                            ));
                        }
                    }
                }
            }
        },
    );
    Ok(Response::builder()
        .header(header::CONTENT_TYPE, if plain { "text/plain" } else { "application/json" })
        .body(Body::from_stream(chunks))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response()))
}

/// `PUT|POST /v1/client/allocation/:id/restart` with `{"TaskName": ..., "AllTasks": ...}`.
pub(crate) async fn restart(
    State(server): State<Shared>,
    Path(id): Path<String>,
    body: Body,
) -> NomadResult<Json<Value>> {
    let runner = runner(&server, &id)?;
    let request = json_body(server.agent.config().max_body_bytes, body).await?;
    let task = request
        .get("TaskName")
        .or_else(|| request.get("Task"))
        .and_then(Value::as_str)
        .filter(|t| !t.is_empty());
    let all = request.get("AllTasks").and_then(Value::as_bool).unwrap_or(false);
    let reason = "restart requested through Nomad's API";
    match (task, all) {
        (Some(_), true) => {
            return Err(NomadApiError::bad_request("give either TaskName or AllTasks, not both"));
        }
        (Some(task), false) => runner.restart_task(task, reason).await?,
        (None, true) => runner.restart_all(reason).await?,
        (None, false) => runner.restart_running(reason).await?,
    }
    Ok(Json(json!({})))
}

/// `PUT|POST /v1/client/allocation/:id/signal` with `{"Signal": "SIGUSR1", "Task": ...}`.
pub(crate) async fn signal(
    State(server): State<Shared>,
    Path(id): Path<String>,
    body: Body,
) -> NomadResult<Json<Value>> {
    let runner = runner(&server, &id)?;
    let request = json_body(server.agent.config().max_body_bytes, body).await?;
    let name = request
        .get("Signal")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .unwrap_or("SIGKILL");
    let signal: Signal =
        name.parse().map_err(|e| NomadApiError::bad_request(format!("Signal: {e}")))?;
    let task = request.get("Task").and_then(Value::as_str).filter(|t| !t.is_empty());
    runner.signal(task, signal).await?;
    Ok(Json(json!({})))
}

fn resource_usage(usage: &wharf_driver::ResourceUsage) -> Value {
    let cpu = usage.cpu_time.as_secs_f64();
    json!({
        "MemoryStats": {
            "RSS": usage.memory_rss_bytes, "Cache": usage.memory_cache_bytes, "Swap": usage.memory_swap_bytes,
            "Usage": usage.memory_rss_bytes + usage.memory_cache_bytes, "MaxUsage": usage.memory_max_usage_bytes,
            "KernelUsage": 0, "KernelMaxUsage": 0, "MappedFile": 0,
            "Measured": ["RSS", "Cache", "Swap", "Max Usage"],
        },
        "CpuStats": {
            "SystemMode": usage.cpu_system.as_secs_f64(), "UserMode": usage.cpu_user.as_secs_f64(), "TotalTicks": cpu,
            "ThrottledPeriods": usage.cpu_throttled_periods, "ThrottledTime": u64::try_from(usage.cpu_throttled.as_nanos()).unwrap_or(u64::MAX),
            "Percent": 0.0, "Measured": ["System Mode", "User Mode", "Throttled Periods", "Throttled Time"],
        },
        "DeviceStats": [],
    })
}

/// `GET /v1/client/allocation/:id/stats`: Nomad's `AllocResourceUsage`.
pub(crate) async fn alloc_stats(
    State(server): State<Shared>,
    Path(id): Path<String>,
) -> NomadResult<Json<Value>> {
    let runner = runner(&server, &id)?;
    let usage = runner.usage().await;
    let now = wharf_nomad::shapes::nanos(crate::nomad_http::now());
    let tasks: serde_json::Map<String, Value> = usage
        .tasks
        .iter()
        .map(|(name, task)| {
            (
                name.clone(),
                json!({"ResourceUsage": resource_usage(task), "Timestamp": now, "Pids": null}),
            )
        })
        .collect();
    Ok(Json(
        json!({"ResourceUsage": resource_usage(&usage.total), "Tasks": tasks, "Timestamp": now}),
    ))
}

/// A `/proc/meminfo` figure in bytes.
fn meminfo(text: &str, key: &str) -> u64 {
    text.lines()
        .find_map(|line| line.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0, |kib| kib * 1024)
}

/// `GET /v1/client/stats`: Nomad's `HostStats`, from `/proc`.
pub(crate) async fn host_stats(State(server): State<Shared>) -> NomadResult<Json<Value>> {
    let memory = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let (total, available, free) = (
        meminfo(&memory, "MemTotal"),
        meminfo(&memory, "MemAvailable"),
        meminfo(&memory, "MemFree"),
    );
    let uptime = std::fs::read_to_string("/proc/uptime")
        .ok()
        .and_then(|t| t.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0);
    let status = server.agent.node_status().await;
    Ok(Json(json!({
        "Memory": {"Total": total, "Available": available, "Used": total.saturating_sub(available), "Free": free},
        "CPU": (0..status.cpu.cores).map(|core| json!({"CPU": format!("cpu{core}"), "User": 0.0, "System": 0.0, "Idle": 0.0, "Total": 0.0})).collect::<Vec<_>>(),
        "DiskStats": [],
        "AllocDirStats": null,
        "DeviceStats": [],
        "Uptime": uptime as u64,
        "Timestamp": wharf_nomad::shapes::nanos(crate::nomad_http::now()),
        "CPUTicksConsumed": 0.0,
    })))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tasks() -> Vec<String> {
        vec!["web".to_owned(), "web-2".to_owned()]
    }

    #[test]
    fn nomad_paths_map_into_the_allocation_directory() {
        let real = |p: &str| Place::Real(PathBuf::from(p));
        let table = [
            ("/", real("")),
            ("", real("")),
            ("alloc/data/x", real("alloc/data/x")),
            ("/web/local/./run.sh", real("web/local/run.sh")),
            ("alloc/logs", Place::LogsDir),
            ("alloc/logs/", Place::LogsDir),
            ("alloc/logs/web.stdout.0", real("web/logs/web.stdout.0")),
            ("alloc/logs/web-2.stderr.3", real("web-2/logs/web-2.stderr.3")),
            ("alloc/logs/other.stdout.0", real("alloc/logs/other.stdout.0")),
            // Absolute paths are the allocation directory's, not the host's.
            ("/etc/passwd", real("etc/passwd")),
        ];
        for (path, expected) in table {
            assert_eq!(place(path, &tasks()).unwrap(), expected, "{path}");
        }
    }

    #[test]
    fn dot_dot_and_secrets_are_refused() {
        for path in ["..", "../x", "alloc/../../etc/passwd", "web/local/../../.."] {
            let error = place(path, &tasks()).unwrap_err();
            assert_eq!(error.status, StatusCode::FORBIDDEN, "{path}");
        }
        let error = place("web/secrets/token", &tasks()).unwrap_err();
        assert_eq!(error.message, "Reading secret files is not allowed");
    }

    #[test]
    fn file_modes_read_as_go_writes_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        std::fs::write(&file, "x").unwrap();
        std::fs::set_permissions(&file, std::os::unix::fs::PermissionsExt::from_mode(0o640))
            .unwrap();
        assert_eq!(file_mode(&std::fs::metadata(&file).unwrap()), "-rw-r-----");
        std::fs::set_permissions(dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        assert_eq!(file_mode(&std::fs::metadata(dir.path()).unwrap()), "drwxr-xr-x");
    }
}

//! Reads a Nomad job (JSON, as `nomad job run -output` prints it) from a file or from a
//! built-in example, and prints the wharf spec each task group runs as, or why it cannot run.
//!
//! `cargo run -p wharf-nomad --example translate [job.json]`

#![allow(clippy::print_stdout, clippy::print_stderr)] // An example talks to whoever runs it.

const EXAMPLE: &str = r#"{
  "Job": {
    "ID": "cache", "Name": "cache", "Type": "service", "Datacenters": ["dc1"],
    "TaskGroups": [{
      "Name": "cache", "Count": 1,
      "Networks": [{"DynamicPorts": [{"Label": "db", "Value": 0, "To": 0}]}],
      "Tasks": [{
        "Name": "redis", "Driver": "raw_exec",
        "Config": {"command": "redis-server", "args": ["--port", "${NOMAD_PORT_db}"]},
        "Resources": {"CPU": 500, "MemoryMB": 256}
      }]
    }]
  }
}"#;

fn main() {
    let text = match std::env::args().nth(1) {
        Some(path) => match std::fs::read_to_string(&path) {
            Ok(text) => text,
            Err(error) => {
                eprintln!("{path}: {error}");
                std::process::exit(2);
            }
        },
        None => EXAMPLE.to_owned(),
    };
    let body: serde_json::Value = match serde_json::from_str(&text) {
        Ok(body) => body,
        Err(error) => {
            eprintln!("not JSON: {error}");
            std::process::exit(2);
        }
    };
    let translated = wharf_nomad::job_of_request(&body).and_then(wharf_nomad::translate);
    match translated {
        Ok(job) => {
            for group in &job.groups {
                println!("# group {:?}: {} allocation(s)", group.name, group.count);
                let spec = group.job.to_spec();
                println!("{}", serde_json::to_string_pretty(&spec).unwrap_or_default());
            }
        }
        Err(error) => {
            eprintln!("refused: {error}");
            std::process::exit(1);
        }
    }
}

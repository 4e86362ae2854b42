//! A writer for the store crash test: writes task states as fast as it can from several
//! concurrent tasks and prints `<writer> <sequence>` on stdout once each write is durable.
//! The test kills it with SIGKILL at a random point and checks the file.
//!
//! Usage: `store-crash-writer STATE_FILE WRITERS FIRST_SEQUENCE`

#![allow(clippy::print_stderr)] // A test program: its output is its interface.

use std::io::Write;
use wharf_state::{TaskState, spec};
use wharf_store::{RedbStore, StateStore};

const MAX_WRITES_PER_WRITER: u64 = 100_000;

fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(path), Some(writers), Some(first)) = (args.next(), args.next(), args.next()) else {
        eprintln!("usage: store-crash-writer STATE_FILE WRITERS FIRST_SEQUENCE");
        std::process::exit(2);
    };
    let writers: usize = writers.parse().expect("WRITERS is a number");
    let first: u64 = first.parse().expect("FIRST_SEQUENCE is a number");
    let store = RedbStore::open(&path).unwrap_or_else(|e| {
        eprintln!("{e}");
        std::process::exit(1);
    });
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
    runtime.block_on(async {
        let job = spec::parse_toml(
            "[job]\nid = \"crash\"\ntype = \"service\"\n[group]\nname = \"g\"\n[[group.task]]\nname = \"t\"\ndriver = \"mock\"\n",
        )
        .unwrap();
        let alloc = wharf_state::Allocation {
            id: "crash".into(),
            job,
            task_group: "g".into(),
            desired_status: wharf_state::DesiredStatus::Run,
            modify_index: first,
            deployment_id: None,
            ports: Vec::new(),
        };
        store.put_allocation(&alloc).await.unwrap();
        let tasks: Vec<_> = (0..writers)
            .map(|writer| {
                let store = store.clone();
                tokio::spawn(async move {
                    for sequence in first..first + MAX_WRITES_PER_WRITER {
                        let state = TaskState { restarts: sequence, ..TaskState::new() };
                        store.put_task_state("crash", &format!("w{writer}"), &state).await.unwrap();
                        let mut out = std::io::stdout().lock();
                        writeln!(out, "{writer} {sequence}").unwrap();
                        out.flush().unwrap();
                    }
                })
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    });
}

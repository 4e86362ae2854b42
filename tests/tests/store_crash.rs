//! Crash consistency of the state store: a writer process is killed with SIGKILL at random
//! points, and after every kill the file must open and hold every write the writer was told
//! was durable.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;
use wharf_store::{RedbStore, StateStore};
use wharf_tests::rng::Rng;

const ROUNDS: u64 = 50;
const WRITERS: usize = 8;
const SEQUENCE_STRIDE: u64 = 1_000_000;
/// A round that takes longer than this has hung; the bound keeps the test finite.
const ROUND_LIMIT: Duration = Duration::from_secs(30);

#[test]
fn every_acknowledged_write_survives_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.redb");
    let mut rng = Rng(0x5eed_cafe_f00d_d00d);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut killed_mid_run = 0;

    for round in 0..ROUNDS {
        // Kill after this many acknowledgements; 0 kills as soon as the process exists, which
        // can land while it opens the file.
        let kill_after = rng.below(300);
        let first = (round + 1) * SEQUENCE_STRIDE;
        #[allow(clippy::disallowed_methods)] // The test's job is to run and kill a process.
        let mut child = Command::new(env!("CARGO_BIN_EXE_store-crash-writer"))
            .args([path.to_str().unwrap(), &WRITERS.to_string(), &first.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the crash writer");
        let stdout = child.stdout.take().unwrap();
        let (lines_tx, lines) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if lines_tx.send(line).is_err() {
                    break;
                }
            }
        });

        let mut acked = [None::<u64>; WRITERS];
        let mut record = |line: String| {
            let (writer, sequence) =
                line.split_once(' ').expect("writer output is '<writer> <sequence>'");
            let (writer, sequence): (usize, u64) =
                (writer.parse().unwrap(), sequence.parse().unwrap());
            acked[writer] = Some(acked[writer].map_or(sequence, |s: u64| s.max(sequence)));
        };
        for _ in 0..kill_after {
            let line = lines.recv_timeout(ROUND_LIMIT).unwrap_or_else(|e| {
                panic!("round {round}: the writer stopped acknowledging ({e})")
            });
            record(line);
        }
        child.kill().unwrap();
        let status = child.wait().unwrap();
        // Acknowledgements printed before the kill are still in the pipe.
        reader.join().unwrap();
        for line in lines.try_iter() {
            record(line);
        }
        if kill_after > 0 {
            assert!(
                status.code().is_none(),
                "round {round}: the writer exited on its own: {status}"
            );
            killed_mid_run += 1;
        }

        let store =
            RedbStore::open(&path).unwrap_or_else(|e| panic!("round {round}: reopen failed: {e}"));
        let snapshot = runtime.block_on(store.load_all()).unwrap();
        assert!(snapshot.problems.is_empty(), "round {round}: {:?}", snapshot.problems);
        let stored = snapshot.allocs.iter().find(|a| a.alloc.id == "crash");
        for (writer, acked) in acked.iter().enumerate() {
            let Some(acked) = acked else { continue };
            let task = stored.and_then(|a| a.tasks.get(&format!("w{writer}")));
            let persisted = task.and_then(|t| t.state.as_ref()).map(|s| s.restarts);
            assert!(
                persisted.is_some_and(|p| p >= *acked),
                "round {round}, writer {writer}: acknowledged {acked}, file holds {persisted:?}"
            );
        }
    }
    assert!(killed_mid_run > ROUNDS / 2, "most rounds kill a running writer");
}

//! Fetches a tar.gz artifact from a local file into a fresh task directory, checked by its
//! sha256, and lists what was unpacked; then shows an archive entry that would land outside
//! being refused.
//!
//! Run with `cargo run -p wharf-artifact --example fetch_local`.

#![allow(clippy::print_stdout)] // An example talks to whoever runs it.

use std::io::Write;
use wharf_artifact::state::{Artifact, ArtifactMode, ArtifactOptions};
use wharf_artifact::{Fetcher, Limits};

fn tar_gz(name: &str, content: &[u8]) -> Result<Vec<u8>, Box<dyn std::error::Error>> {
    let mut header = tar::Header::new_gnu();
    header.as_old_mut().name[..name.len()].copy_from_slice(name.as_bytes());
    header.set_size(content.len() as u64);
    header.set_mode(0o644);
    header.set_cksum();
    let mut builder = tar::Builder::new(Vec::new());
    builder.append(&header, content)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&builder.into_inner()?)?;
    Ok(gz.finish()?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let files = tempfile::tempdir()?;
    let task_dir = tempfile::tempdir()?;
    let fetcher = Fetcher::new(Limits::default())?.with_local_roots([files.path().to_owned()]);

    let good = files.path().join("site.tar.gz");
    std::fs::write(&good, tar_gz("site/index.html", b"<h1>hello</h1>\n")?)?;
    let sum: String = {
        use sha2::Digest;
        sha2::Sha256::digest(std::fs::read(&good)?).iter().map(|b| format!("{b:02x}")).collect()
    };
    let artifact = Artifact {
        source: good.display().to_string(),
        destination: "local/www".into(),
        mode: ArtifactMode::Any,
        options: ArtifactOptions { checksum: Some(format!("sha256:{sum}")) },
    };
    let placed = runtime.block_on(fetcher.fetch(&artifact, task_dir.path()))?;
    let page = std::fs::read_to_string(placed.join("site/index.html"))?;
    println!("unpacked into {}: site/index.html = {page:?}", placed.display());

    let evil = files.path().join("evil.tar.gz");
    std::fs::write(&evil, tar_gz("../../escaped", b"x")?)?;
    let artifact = Artifact {
        source: evil.display().to_string(),
        options: ArtifactOptions::default(),
        ..artifact
    };
    match runtime.block_on(fetcher.fetch(&artifact, task_dir.path())) {
        Err(error) => println!("refused: {error}"),
        Ok(placed) => {
            return Err(format!("an escaping entry was unpacked into {}", placed.display()).into());
        }
    }
    Ok(())
}

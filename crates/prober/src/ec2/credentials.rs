//! Where the EC2 instance set's credentials come from: the standard chain.
//!
//! In order: the configuration's own keys; `AWS_ACCESS_KEY_ID` and `AWS_SECRET_ACCESS_KEY`
//! (with `AWS_SESSION_TOKEN`); the shared credentials file (`AWS_SHARED_CREDENTIALS_FILE`, or
//! `~/.aws/credentials`) under the profile `AWS_PROFILE` names (`default` when unset); and last
//! the instance role, through the instance metadata service's session tokens (IMDSv2). The first
//! three are read once, when the set is made; the role's temporary credentials are fetched on
//! first use and again once they are older than `ROLE_REFRESH` (10 min), well inside the hour they
//! last, so a rotated key is picked up.

use super::http::{Http, HttpError};
use super::sigv4::Credentials;
use crate::ProberError;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request};
use std::time::Duration;
use tokio::time::Instant;

/// How long role credentials are used before they are fetched again. EC2 makes new ones
/// available at least five minutes before the old ones expire, and they last an hour or more.
pub(crate) const ROLE_REFRESH: Duration = Duration::from_secs(10 * 60);

/// The metadata service, unless `AWS_EC2_METADATA_SERVICE_ENDPOINT` says otherwise.
const METADATA_ENDPOINT: &str = "http://169.254.169.254";

/// What the chain settled on when the set was made.
#[derive(Debug)]
pub(crate) enum Source {
    /// Fixed keys (configuration, environment, credentials file).
    Fixed(Credentials),
    /// The instance role, through the metadata service at this base URL.
    InstanceRole { endpoint: String, cached: parking_lot::Mutex<Option<(Credentials, Instant)>> },
}

/// Keys from the environment, `lookup` being the environment's variables.
pub(crate) fn from_environment(lookup: &dyn Fn(&str) -> Option<String>) -> Option<Credentials> {
    let nonempty = |name: &str| lookup(name).filter(|v| !v.is_empty());
    Some(Credentials {
        access_key_id: nonempty("AWS_ACCESS_KEY_ID")?,
        secret_access_key: nonempty("AWS_SECRET_ACCESS_KEY")?,
        session_token: nonempty("AWS_SESSION_TOKEN"),
    })
}

/// The keys of `profile` in a shared credentials file's `text` (INI: `[profile]` sections of
/// `key = value` lines, `#` and `;` comments). `Ok(None)`: no such profile. A profile without
/// both keys is an error naming what it lacks.
pub(crate) fn from_profile(text: &str, profile: &str) -> Result<Option<Credentials>, String> {
    let mut in_profile = false;
    let mut found = false;
    let (mut key_id, mut secret, mut token) = (None, None, None);
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(section) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_profile = section.trim() == profile;
            found |= in_profile;
            continue;
        }
        if !in_profile {
            continue;
        }
        let Some((key, value)) = line.split_once('=') else { continue };
        let value = Some(value.trim().to_owned()).filter(|v| !v.is_empty());
        match key.trim().to_ascii_lowercase().as_str() {
            "aws_access_key_id" => key_id = value,
            "aws_secret_access_key" => secret = value,
            "aws_session_token" => token = value,
            _ => {}
        }
    }
    if !found {
        return Ok(None);
    }
    match (key_id, secret) {
        (Some(access_key_id), Some(secret_access_key)) => {
            Ok(Some(Credentials { access_key_id, secret_access_key, session_token: token }))
        }
        _ => Err(format!(
            "profile [{profile}] needs both aws_access_key_id and aws_secret_access_key"
        )),
    }
}

/// Runs the chain (but for the instance role, which is only asked when a call needs keys).
pub(crate) fn resolve(
    configured: Option<Credentials>,
    lookup: &dyn Fn(&str) -> Option<String>,
) -> Result<Source, ProberError> {
    if let Some(credentials) = configured {
        return Ok(Source::Fixed(credentials));
    }
    if let Some(credentials) = from_environment(lookup) {
        return Ok(Source::Fixed(credentials));
    }
    let file = lookup("AWS_SHARED_CREDENTIALS_FILE")
        .or_else(|| lookup("HOME").map(|home| format!("{home}/.aws/credentials")));
    let profile = lookup("AWS_PROFILE").unwrap_or_else(|| "default".to_owned());
    if let Some(file) = file {
        match std::fs::read_to_string(&file) {
            Ok(text) => match from_profile(&text, &profile) {
                Ok(Some(credentials)) => return Ok(Source::Fixed(credentials)),
                Ok(None) => {}
                Err(problem) => {
                    return Err(ProberError::Config {
                        field: "ec2 credentials",
                        problem: format!("{file}: {problem}"),
                    });
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(ProberError::Config {
                    field: "ec2 credentials",
                    problem: format!("cannot read {file}: {e}"),
                });
            }
        }
    }
    let endpoint = lookup("AWS_EC2_METADATA_SERVICE_ENDPOINT")
        .unwrap_or_else(|| METADATA_ENDPOINT.to_owned())
        .trim_end_matches('/')
        .to_owned();
    Ok(Source::InstanceRole { endpoint, cached: parking_lot::Mutex::new(None) })
}

impl Source {
    /// The keys to sign the next call with.
    pub(crate) async fn current(&self, http: &Http) -> Result<Credentials, ProberError> {
        let (endpoint, cached) = match self {
            Source::Fixed(credentials) => return Ok(credentials.clone()),
            Source::InstanceRole { endpoint, cached } => (endpoint, cached),
        };
        if let Some((credentials, fetched)) = cached.lock().as_ref()
            && fetched.elapsed() < ROLE_REFRESH
        {
            return Ok(credentials.clone());
        }
        let credentials =
            instance_role(http, endpoint).await.map_err(|detail| ProberError::Cloud {
                operation: "credentials",
                detail: format!(
                    "no AWS credentials: none in the configuration, AWS_ACCESS_KEY_ID, or the \
                     shared credentials file, and the instance role at {endpoint} failed: {detail}"
                ),
            })?;
        *cached.lock() = Some((credentials.clone(), Instant::now()));
        Ok(credentials)
    }
}

/// The instance role's credentials through IMDSv2: a session token (PUT), the role's name,
/// then its keys.
async fn instance_role(http: &Http, endpoint: &str) -> Result<Credentials, String> {
    let call = |method: Method, path: &str, token: Option<&str>| {
        let mut request = Request::builder().method(method).uri(format!("{endpoint}{path}"));
        request = match token {
            Some(token) => request.header("x-aws-ec2-metadata-token", token),
            None => request.header("x-aws-ec2-metadata-token-ttl-seconds", "21600"),
        };
        request.body(Full::new(Bytes::new())).map_err(|e| e.to_string())
    };
    let text = |answer: Result<(hyper::StatusCode, Bytes), HttpError>, what: &str| {
        let (status, body) = answer.map_err(|e| format!("{what}: {e}"))?;
        if !status.is_success() {
            return Err(format!("{what}: HTTP {status}"));
        }
        String::from_utf8(body.to_vec()).map_err(|_| format!("{what}: not UTF-8"))
    };
    let token = text(http.send(call(Method::PUT, "/latest/api/token", None)?).await, "token")?;
    let roles_path = "/latest/meta-data/iam/security-credentials/";
    let roles = text(http.send(call(Method::GET, roles_path, Some(&token))?).await, "role")?;
    let role = roles.lines().next().map(str::trim).filter(|r| !r.is_empty());
    let role = role.ok_or("the instance has no role")?;
    let path = format!("{roles_path}{role}");
    let keys = text(http.send(call(Method::GET, &path, Some(&token))?).await, "role credentials")?;
    parse_role_credentials(&keys)
}

/// The keys in the metadata service's JSON answer for a role.
pub(crate) fn parse_role_credentials(json: &str) -> Result<Credentials, String> {
    #[derive(serde::Deserialize)]
    #[serde(rename_all = "PascalCase")]
    struct Answer {
        access_key_id: String,
        secret_access_key: String,
        token: Option<String>,
    }
    let answer: Answer =
        serde_json::from_str(json).map_err(|e| format!("role credentials: {e}"))?;
    Ok(Credentials {
        access_key_id: answer.access_key_id,
        secret_access_key: answer.secret_access_key,
        session_token: answer.token,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> + use<> {
        let map: HashMap<String, String> =
            pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn environment_keys_come_first_and_need_both_halves() {
        let lookup = env(&[("AWS_ACCESS_KEY_ID", "AKID"), ("AWS_SECRET_ACCESS_KEY", "s")]);
        let Source::Fixed(found) = resolve(None, &lookup).unwrap() else { panic!("not fixed") };
        assert_eq!((found.access_key_id.as_str(), found.session_token), ("AKID", None));
        assert_eq!(from_environment(&env(&[("AWS_ACCESS_KEY_ID", "AKID")])), None);
    }

    #[test]
    fn the_profile_named_by_aws_profile_is_read_from_the_credentials_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("credentials");
        std::fs::write(
            &file,
            "# keys\n[default]\naws_access_key_id = D\naws_secret_access_key = d\n\n\
             [ci]\naws_access_key_id=C\naws_secret_access_key=c\naws_session_token = t\n",
        )
        .unwrap();
        let path = file.to_str().unwrap();
        let lookup = env(&[("AWS_SHARED_CREDENTIALS_FILE", path), ("AWS_PROFILE", "ci")]);
        let Source::Fixed(found) = resolve(None, &lookup).unwrap() else { panic!("not fixed") };
        assert_eq!(
            (found.access_key_id.as_str(), found.session_token.as_deref()),
            ("C", Some("t"))
        );
        let lookup = env(&[("AWS_SHARED_CREDENTIALS_FILE", path)]);
        let Source::Fixed(found) = resolve(None, &lookup).unwrap() else { panic!("not fixed") };
        assert_eq!(found.access_key_id, "D");
        let broken = from_profile("[x]\naws_access_key_id = A\n", "x").unwrap_err();
        assert!(broken.contains("aws_secret_access_key"), "{broken}");
    }

    #[test]
    fn without_keys_the_chain_ends_at_the_instance_role() {
        let lookup = env(&[
            ("HOME", "/nonexistent-home"),
            ("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9/"),
        ]);
        match resolve(None, &lookup).unwrap() {
            Source::InstanceRole { endpoint, .. } => assert_eq!(endpoint, "http://127.0.0.1:9"),
            other => panic!("expected the instance role, got {other:?}"),
        }
    }

    /// IMDSv2 as EC2 serves it: a session token from a PUT, then the role's name and keys
    /// with the token; a request without the token is refused, as IMDSv2 refuses it.
    #[tokio::test]
    async fn the_instance_role_is_read_through_imdsv2_sessions() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let served = std::sync::Arc::new(parking_lot::Mutex::new(Vec::<String>::new()));
        let seen = served.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let mut request = vec![0u8; 4096];
                let n = stream.read(&mut request).await.unwrap_or(0);
                let request = String::from_utf8_lossy(&request[..n]).to_ascii_lowercase();
                let line = request.lines().next().unwrap_or_default().to_owned();
                let has_token = request.contains("x-aws-ec2-metadata-token: tok-1");
                let (status, body) = match line.split_whitespace().take(2).collect::<Vec<_>>()[..] {
                    ["put", "/latest/api/token"]
                        if request.contains("x-aws-ec2-metadata-token-ttl-seconds: 21600") =>
                    {
                        ("200 OK", "tok-1".to_owned())
                    }
                    [_, _] if !has_token => ("401 Unauthorized", String::new()),
                    ["get", "/latest/meta-data/iam/security-credentials/"] => ("200 OK", "fleet-role\n".into()),
                    ["get", "/latest/meta-data/iam/security-credentials/fleet-role"] => (
                        "200 OK",
                        r#"{"Code":"Success","AccessKeyId":"ASIAROLE","SecretAccessKey":"s","Token":"t"}"#.into(),
                    ),
                    _ => ("404 Not Found", String::new()),
                };
                seen.lock().push(line);
                let answer = format!(
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                    body.len()
                );
                let _ = stream.write_all(answer.as_bytes()).await;
            }
        });
        let lookup =
            env(&[("HOME", "/nonexistent-home"), ("AWS_EC2_METADATA_SERVICE_ENDPOINT", &endpoint)]);
        let source = resolve(None, &lookup).unwrap();
        let http = Http::new(Duration::from_secs(5)).unwrap();
        let found = source.current(&http).await.unwrap();
        assert_eq!(
            (found.access_key_id.as_str(), found.session_token.as_deref()),
            ("ASIAROLE", Some("t"))
        );
        assert_eq!(served.lock().len(), 3);
        // Cached: no second round trip within ROLE_REFRESH.
        source.current(&http).await.unwrap();
        assert_eq!(served.lock().len(), 3);
    }

    #[test]
    fn role_credentials_are_read_from_the_metadata_answer() {
        let json = r#"{"Code":"Success","LastUpdated":"2026-12-01T18:00:00Z","Type":"AWS-HMAC",
            "AccessKeyId":"ASIA1","SecretAccessKey":"s","Token":"t","Expiration":"2026-12-01T19:00:00Z"}"#;
        let found = parse_role_credentials(json).unwrap();
        assert_eq!(
            (found.access_key_id.as_str(), found.session_token.as_deref()),
            ("ASIA1", Some("t"))
        );
        assert!(parse_role_credentials("{}").is_err());
    }
}

//! One EC2 Query API call: the action and its parameters as a form body, signed with SigV4,
//! posted to the endpoint; the answer parsed, or EC2's error (`<Errors><Error><Code>`) taken
//! out of it.

use super::credentials::Source;
use super::errors::{CallError, Ec2Error};
use super::http::Http;
use super::sigv4::{self, Request as Signable, Scope};
use super::xml::{self, Element};
use crate::ProberError;
use http_body_util::Full;
use hyper::body::Bytes;
use hyper::{Method, Request};
use sha2::{Digest, Sha256};

/// The API version every call names.
const VERSION: &str = "2016-11-15";

/// The EC2 endpoint of one region.
#[derive(Debug)]
pub(crate) struct Api {
    http: Http,
    url: String,
    host: String,
    region: String,
    credentials: Source,
}

/// Parameters of a call, in EC2's flattened form (`TagSpecification.1.Tag.2.Key`).
pub(crate) type Params = Vec<(String, String)>;

impl Api {
    /// A client of `endpoint` (`https://ec2.<region>.amazonaws.com` when `None`).
    pub(crate) fn new(
        http: Http,
        region: &str,
        endpoint: Option<&str>,
        credentials: Source,
    ) -> Result<Api, ProberError> {
        let url = match endpoint {
            Some(endpoint) => endpoint.trim_end_matches('/').to_owned(),
            None => format!("https://ec2.{region}.amazonaws.com"),
        };
        let bad = |problem: &str| ProberError::Config {
            field: "ec2 endpoint",
            problem: format!("{url:?}: {problem}"),
        };
        let rest = url
            .strip_prefix("https://")
            .or_else(|| url.strip_prefix("http://"))
            .ok_or_else(|| bad("must start with http:// or https://"))?;
        let host = rest.split('/').next().unwrap_or_default().to_owned();
        if host.is_empty() || rest.len() != host.len() {
            return Err(bad("must be a scheme and a host (with an optional port), no path"));
        }
        if region.is_empty() {
            return Err(ProberError::Config { field: "ec2 region", problem: "is empty".into() });
        }
        Ok(Api { http, url: format!("{url}/"), host, region: region.to_owned(), credentials })
    }

    /// Calls `action` with `params` and returns the answer's root element.
    pub(crate) async fn call(&self, action: &str, params: &Params) -> Result<Element, CallError> {
        let credentials = self
            .credentials
            .current(&self.http)
            .await
            .map_err(|e| CallError::Transport(e.to_string()))?;
        let mut pairs: Vec<(&str, &str)> = vec![("Action", action), ("Version", VERSION)];
        pairs.extend(params.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        let body = sigv4::canonical_query(&pairs);
        let payload_sha256 = sigv4::hex(&Sha256::digest(body.as_bytes()));
        let amz_date = sigv4::amz_date(wall_clock());
        let content_type = "application/x-www-form-urlencoded; charset=utf-8";
        let mut headers = vec![
            ("content-type", content_type),
            ("host", self.host.as_str()),
            ("x-amz-date", amz_date.as_str()),
        ];
        if let Some(token) = &credentials.session_token {
            headers.push(("x-amz-security-token", token.as_str()));
        }
        let signed = sigv4::sign(
            &Signable {
                method: "POST",
                path: "/",
                query: &[],
                headers: &headers,
                payload_sha256: &payload_sha256,
            },
            &credentials,
            &Scope { region: &self.region, service: "ec2", amz_date: &amz_date },
        );
        let mut request = Request::builder().method(Method::POST).uri(&self.url);
        for (name, value) in &headers {
            request = request.header(*name, *value);
        }
        let request = request
            .header("authorization", signed.authorization)
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| CallError::Transport(e.to_string()))?;
        let (status, answer) = self
            .http
            .send(request)
            .await
            .map_err(|e| CallError::Transport(format!("{action} to {}: {e}", self.url)))?;
        let text = String::from_utf8_lossy(&answer);
        let parsed = xml::parse(&text);
        if status.is_success() {
            return parsed.map_err(|e| CallError::Transport(format!("{action}: {e}")));
        }
        let error = parsed.ok().as_ref().and_then(error_of).ok_or_else(|| {
            let head: String = text.chars().take(300).collect();
            CallError::Transport(format!("{action}: HTTP {status}: {head}"))
        })?;
        Err(CallError::Ec2(error))
    }
}

/// The time since the Unix epoch. A signature carries the wall-clock time, which AWS checks
/// against its own (within minutes): neither a monotonic clock nor a test's clock will do.
#[allow(clippy::disallowed_methods)]
fn wall_clock() -> std::time::Duration {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default()
}

/// EC2's error in an error answer: `<Response><Errors><Error><Code>…</Code><Message>…`.
fn error_of(root: &Element) -> Option<Ec2Error> {
    let error = root.at(&["Errors", "Error"]).or_else(|| root.child("Error"))?;
    Some(Ec2Error {
        code: error.text_at(&["Code"])?.to_owned(),
        message: error.text_at(&["Message"]).unwrap_or_default().to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_answers_give_their_code_and_message() {
        let root = xml::parse(
            "<Response><Errors><Error><Code>InsufficientInstanceCapacity</Code>\
             <Message>none &amp; left</Message></Error></Errors><RequestID>r</RequestID></Response>",
        )
        .unwrap();
        assert_eq!(
            error_of(&root),
            Some(Ec2Error {
                code: "InsufficientInstanceCapacity".into(),
                message: "none & left".into()
            })
        );
    }

    #[test]
    fn endpoints_are_checked() {
        let http = Http::new(std::time::Duration::from_secs(1)).unwrap();
        let fixed = || {
            Source::Fixed(sigv4::Credentials {
                access_key_id: "a".into(),
                secret_access_key: "b".into(),
                session_token: None,
            })
        };
        let api = Api::new(http.clone(), "eu-west-1", None, fixed()).unwrap();
        assert_eq!(
            (api.url.as_str(), api.host.as_str()),
            ("https://ec2.eu-west-1.amazonaws.com/", "ec2.eu-west-1.amazonaws.com")
        );
        let local =
            Api::new(http.clone(), "us-east-1", Some("http://127.0.0.1:5000/"), fixed()).unwrap();
        assert_eq!(local.host, "127.0.0.1:5000");
        for bad in ["127.0.0.1:5000", "http://h/path", "http://"] {
            let error = Api::new(http.clone(), "us-east-1", Some(bad), fixed()).unwrap_err();
            assert!(error.to_string().contains("ec2 endpoint"), "{bad}: {error}");
        }
    }
}

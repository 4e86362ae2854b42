//! AWS Signature Version 4, as much of it as a Query API call needs: a request's canonical
//! form, the string to sign, the derived signing key and the `Authorization` header.
//!
//! Our own, on the workspace's sha2 with a twelve-line HMAC, rather than the `aws-sigv4` crate:
//! that crate brings the AWS SDK's runtime types (smithy, http 0.2 and 1, time, a crypto
//! backend of its own), several times the build of everything else the instance set adds,
//! for a few dozen lines of hashing. AWS's published SigV4 test vectors pin it down (tests
//! below).

use sha2::{Digest, Sha256};

/// What signs a request: an access key, its secret, and a session token for temporary
/// credentials (an instance role's, an assumed role's).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The access key id (`AKIA...`, `ASIA...`).
    pub access_key_id: String,
    /// The secret access key.
    pub secret_access_key: String,
    /// The session token of temporary credentials; sent as `X-Amz-Security-Token`.
    pub session_token: Option<String>,
}

impl std::fmt::Debug for Credentials {
    /// Names the key id only: secrets stay out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("session_token", &self.session_token.as_ref().map(|_| "…"))
            .finish_non_exhaustive()
    }
}

/// Where and when a request is signed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Scope<'a> {
    pub(crate) region: &'a str,
    pub(crate) service: &'a str,
    /// `YYYYMMDDTHHMMSSZ`, the request's `X-Amz-Date`.
    pub(crate) amz_date: &'a str,
}

/// A request as the signer sees it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) method: &'a str,
    /// The path, already normalised (`/` for the Query API).
    pub(crate) path: &'a str,
    /// Query parameters, not yet encoded, in any order.
    pub(crate) query: &'a [(&'a str, &'a str)],
    /// Every header to sign, `X-Amz-Date` and `Host` among them, names in any case.
    pub(crate) headers: &'a [(&'a str, &'a str)],
    /// The hex sha256 of the body.
    pub(crate) payload_sha256: &'a str,
}

/// A signature and what it was computed over (the tests compare each step).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Signed {
    pub(crate) canonical_request: String,
    pub(crate) string_to_sign: String,
    pub(crate) signature: String,
    /// The `Authorization` header's value.
    pub(crate) authorization: String,
}

/// HMAC-SHA256 (RFC 2104) over the workspace's sha2.
pub(crate) fn hmac_sha256(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut block = [0u8; 64];
    if key.len() > block.len() {
        block[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(block.map(|b| b ^ 0x36));
    inner.update(data);
    let mut outer = Sha256::new();
    outer.update(block.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Lower-case hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

/// SigV4's URI encoding: every byte but the unreserved ones (`A-Z a-z 0-9 - _ . ~`) as `%XX`.
pub(crate) fn uri_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// `key=value` pairs, encoded and sorted as SigV4 wants (also a valid form body).
pub(crate) fn canonical_query(pairs: &[(&str, &str)]) -> String {
    let mut encoded: Vec<(String, String)> =
        pairs.iter().map(|(k, v)| (uri_encode(k), uri_encode(v))).collect();
    encoded.sort();
    encoded.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&")
}

/// Signs `request` with `credentials` for `scope`.
pub(crate) fn sign(request: &Request<'_>, credentials: &Credentials, scope: &Scope<'_>) -> Signed {
    // Headers: lower-case names, values trimmed with inner runs of spaces collapsed, sorted
    // by name, a repeated name's values joined by commas in the order given.
    let mut headers: Vec<(String, String)> = Vec::new();
    for (name, value) in request.headers {
        let name = name.to_ascii_lowercase();
        let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
        match headers.iter_mut().find(|(n, _)| *n == name) {
            Some((_, joined)) => {
                joined.push(',');
                joined.push_str(&value);
            }
            None => headers.push((name, value)),
        }
    }
    headers.sort_by(|a, b| a.0.cmp(&b.0));
    let canonical_headers: String = headers.iter().map(|(n, v)| format!("{n}:{v}\n")).collect();
    let signed_headers = headers.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>().join(";");
    let canonical_request = format!(
        "{}\n{}\n{}\n{canonical_headers}\n{signed_headers}\n{}",
        request.method,
        request.path,
        canonical_query(request.query),
        request.payload_sha256
    );
    let date = scope.amz_date.get(..8).unwrap_or(scope.amz_date);
    let credential_scope = format!("{date}/{}/{}/aws4_request", scope.region, scope.service);
    let string_to_sign = format!(
        "AWS4-HMAC-SHA256\n{}\n{credential_scope}\n{}",
        scope.amz_date,
        hex(&Sha256::digest(canonical_request.as_bytes()))
    );
    let mut key =
        hmac_sha256(format!("AWS4{}", credentials.secret_access_key).as_bytes(), date.as_bytes());
    for part in [scope.region, scope.service, "aws4_request"] {
        key = hmac_sha256(&key, part.as_bytes());
    }
    let signature = hex(&hmac_sha256(&key, string_to_sign.as_bytes()));
    let authorization = format!(
        "AWS4-HMAC-SHA256 Credential={}/{credential_scope}, SignedHeaders={signed_headers}, \
         Signature={signature}",
        credentials.access_key_id
    );
    Signed { canonical_request, string_to_sign, signature, authorization }
}

/// `YYYYMMDDTHHMMSSZ` for a time `since_epoch` after the Unix epoch.
pub(crate) fn amz_date(since_epoch: std::time::Duration) -> String {
    // wharf-state's timestamp writes RFC 3339 (`2026-11-29T16:10:17.123Z`); SigV4 wants the
    // same fields without separators or fraction.
    let rfc3339 = wharf_state::time::Timestamp::from_unix(since_epoch).to_string();
    let digits: String =
        rfc3339.chars().take(19).filter(|c| c.is_ascii_digit() || *c == 'T').collect();
    format!("{digits}Z")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The credentials and scope of AWS's SigV4 test suite.
    fn suite_credentials(token: Option<&str>) -> Credentials {
        Credentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            session_token: token.map(str::to_owned),
        }
    }

    const SCOPE: Scope<'static> =
        Scope { region: "us-east-1", service: "service", amz_date: "20150830T123600Z" };
    const EMPTY_SHA256: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    /// One case of the suite: the request, and what each step must give.
    struct Vector {
        request: Request<'static>,
        token: Option<&'static str>,
        canonical_request: &'static str,
        string_to_sign: &'static str,
        signature: &'static str,
    }

    fn check(name: &str, vector: &Vector) {
        let signed = sign(&vector.request, &suite_credentials(vector.token), &SCOPE);
        assert_eq!(signed.canonical_request, vector.canonical_request, "{name}: canonical request");
        assert_eq!(signed.string_to_sign, vector.string_to_sign, "{name}: string to sign");
        assert_eq!(signed.signature, vector.signature, "{name}: signature");
    }

    #[test]
    fn sigv4_suite_get_vanilla() {
        check(
            "get-vanilla",
            &Vector {
                request: Request {
                    method: "GET",
                    path: "/",
                    query: &[],
                    headers: &[
                        ("Host", "example.amazonaws.com"),
                        ("X-Amz-Date", "20150830T123600Z"),
                    ],
                    payload_sha256: EMPTY_SHA256,
                },
                token: None,
                canonical_request: "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                string_to_sign: "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\nbb579772317eb040ac9ed261061d46c1f17a8133879d6129b6e1c25292927e63",
                signature: "5fa00fa31553b73ebf1942676e86291e8372ff2a2260956d9b8aae1d763fbf31",
            },
        );
    }

    #[test]
    fn sigv4_suite_post_vanilla_query() {
        check(
            "post-vanilla-query",
            &Vector {
                request: Request {
                    method: "POST",
                    path: "/",
                    query: &[("Param1", "value1")],
                    headers: &[
                        ("Host", "example.amazonaws.com"),
                        ("X-Amz-Date", "20150830T123600Z"),
                    ],
                    payload_sha256: EMPTY_SHA256,
                },
                token: None,
                canonical_request: "POST\n/\nParam1=value1\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\n\nhost;x-amz-date\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                string_to_sign: "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n9d659678c1756bb3113e2ce898845a0a79dbbc57b740555917687f1b3340fbbd",
                signature: "28038455d6de14eafc1f9222cf5aa6f1a96197d7deb8263271d420d138af7f11",
            },
        );
    }

    /// The shape of an EC2 Query API call: a form body, its hash signed as a header too.
    #[test]
    fn sigv4_suite_post_x_www_form_urlencoded() {
        check(
            "post-x-www-form-urlencoded",
            &Vector {
                request: Request {
                    method: "POST",
                    path: "/",
                    query: &[],
                    headers: &[
                        ("Content-Type", "application/x-www-form-urlencoded"),
                        ("Host", "example.amazonaws.com"),
                        ("Content-Length", "13"),
                        ("X-Amz-Date", "20150830T123600Z"),
                        (
                            "X-Amz-Content-Sha256",
                            "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
                        ),
                    ],
                    payload_sha256: "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
                },
                token: None,
                canonical_request: "POST\n/\n\ncontent-length:13\ncontent-type:application/x-www-form-urlencoded\nhost:example.amazonaws.com\nx-amz-content-sha256:9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e\nx-amz-date:20150830T123600Z\n\ncontent-length;content-type;host;x-amz-content-sha256;x-amz-date\n9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e",
                string_to_sign: "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\nb1edd1d03544c25390e32085d55b57acc9a3961bb59415ff86c45c3d89d16cfb",
                signature: "d3875051da38690788ef43de4db0d8f280229d82040bfac253562e56c3f20e0b",
            },
        );
        assert_eq!(
            hex(&Sha256::digest(b"Param1=value1")),
            "9095672bbd1f56dfc5b65f3e153adc8731a4a654192329106275f4c7b24d0b6e"
        );
    }

    #[test]
    fn sigv4_suite_get_vanilla_with_session_token() {
        let token = "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267";
        check(
            "get-vanilla-with-session-token",
            &Vector {
                request: Request {
                    method: "GET",
                    path: "/",
                    query: &[],
                    headers: &[
                        ("Host", "example.amazonaws.com"),
                        ("X-Amz-Date", "20150830T123600Z"),
                        (
                            "X-Amz-Security-Token",
                            "6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267",
                        ),
                    ],
                    payload_sha256: EMPTY_SHA256,
                },
                token: Some(token),
                canonical_request: "GET\n/\n\nhost:example.amazonaws.com\nx-amz-date:20150830T123600Z\nx-amz-security-token:6e86291e8372ff2a2260956d9b8aae1d763fbf315fa00fa31553b73ebf194267\n\nhost;x-amz-date;x-amz-security-token\ne3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
                string_to_sign: "AWS4-HMAC-SHA256\n20150830T123600Z\n20150830/us-east-1/service/aws4_request\n067b36aa60031588cea4a4cde1f21215227a047690c72247f1d70b32fbbfad2b",
                signature: "07ec1639c89043aa0e3e2de82b96708f198cceab042d4a97044c66dd9f74e7f8",
            },
        );
    }

    #[test]
    fn sigv4_suite_query_order_and_unreserved() {
        let signed = sign(
            &Request {
                method: "GET",
                path: "/",
                query: &[("Param2", "value2"), ("Param1", "value1")],
                headers: &[("Host", "example.amazonaws.com"), ("X-Amz-Date", "20150830T123600Z")],
                payload_sha256: EMPTY_SHA256,
            },
            &suite_credentials(None),
            &SCOPE,
        );
        // get-vanilla-query-order-key-case
        assert_eq!(
            signed.signature,
            "b97d918cfa904a5beff61c982a1b6f458b799221646efd99d3219ec94cdf2500"
        );
        let unreserved = "-._~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
        assert_eq!(
            canonical_query(&[(unreserved, unreserved)]),
            format!("{unreserved}={unreserved}")
        );
        assert_eq!(uri_encode("a b/ü="), "a%20b%2F%C3%BC%3D");
    }

    /// RFC 4231, test cases 2 and 6 (a key longer than a block).
    #[test]
    fn hmac_sha256_matches_rfc_4231() {
        assert_eq!(
            hex(&hmac_sha256(b"Jefe", b"what do ya want for nothing?")),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
        assert_eq!(
            hex(&hmac_sha256(
                &[0xaa; 131],
                b"Test Using Larger Than Block-Size Key - Hash Key First"
            )),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"
        );
    }

    #[test]
    fn amz_date_is_the_basic_iso_8601_form() {
        let at = std::time::Duration::from_millis(1_440_938_160_456);
        assert_eq!(amz_date(at), "20150830T123600Z");
    }
}

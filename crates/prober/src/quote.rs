//! Shell quoting for values that go into remote commands.
//!
//! Runner ids, paths and user-supplied arguments are pasted into `sh -c` command lines on the
//! worker. Every such value goes through [`quote`], so a hostile id such as
//! `x; rm -rf /` or `$(reboot)` stays one literal word. Values with a NUL byte cannot be
//! passed to a shell at all and are refused.

use crate::ProberError;

/// Returns `value` as one shell word: unchanged if it has only characters no shell treats
/// specially, otherwise in single quotes with each `'` written as `'\''`.
pub fn quote(what: &'static str, value: &str) -> Result<String, ProberError> {
    if value.contains('\0') {
        return Err(ProberError::Unquotable { what, value: value.to_owned() });
    }
    let plain = !value.is_empty()
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-./=:,+@%".contains(&b));
    if plain {
        return Ok(value.to_owned());
    }
    let mut out = String::with_capacity(value.len() + 2);
    out.push('\'');
    for c in value.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_table() {
        let cases: &[(&str, &str)] = &[
            ("abc-123_x", "abc-123_x"),
            ("/tmp/wharf-runner/runner~ab", "'/tmp/wharf-runner/runner~ab'"),
            ("", "''"),
            ("a b", "'a b'"),
            ("x; rm -rf /", "'x; rm -rf /'"),
            ("$(reboot)", "'$(reboot)'"),
            ("`id`", "'`id`'"),
            ("it's", "'it'\\''s'"),
            ("'", "''\\'''"),
            ("a\nb", "'a\nb'"),
            ("--list", "--list"),
        ];
        for (input, want) in cases {
            assert_eq!(quote("id", input).unwrap(), *want, "quoting {input:?}");
        }
    }

    #[test]
    fn nul_is_refused() {
        let err = quote("runner id", "a\0b").unwrap_err();
        assert_eq!(
            err.to_string(),
            "runner id \"a\\0b\" cannot be passed to a shell: it contains a NUL byte"
        );
    }
}

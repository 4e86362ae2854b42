//! Reading one object of Nomad's job JSON: every key is either used, shown back, known to be
//! harmless when it holds Nomad's default, or refused with its path named. Nothing a user
//! set is dropped without a word: a key that is not in an object's table and holds anything
//! but an empty value (null, false, 0, "", [] or {}) is refused.

use crate::NomadError;
use serde_json::{Map, Value};
use std::time::Duration;

/// What one key of an object is to the translation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Key {
    /// Translated into wharf's spec, or chooses among placements and is shown back.
    Used,
    /// Only informs (a server's output, a deployment knob a single placement has no use for);
    /// any value is accepted and shown back.
    Informs,
    /// Refused when set, for this reason.
    Refused(&'static str),
}

/// True for the values Nomad writes for "not set".
pub(crate) fn is_empty(value: &Value) -> bool {
    match value {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
    }
}

/// One JSON object of the job, with the path it is at (`Job.TaskGroups[0].Tasks[1]`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Obj<'a> {
    pub(crate) at: &'a str,
    map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    /// `value` as an object; None for null.
    pub(crate) fn of(value: &'a Value, at: &'a str) -> Result<Option<Obj<'a>>, NomadError> {
        match value {
            Value::Null => Ok(None),
            Value::Object(map) => Ok(Some(Obj { at, map })),
            other => Err(invalid(at, format!("expected an object, found {}", kind(other)))),
        }
    }

    /// Checks every key against `table`; the first refused or unknown key that is set fails.
    pub(crate) fn check(&self, table: &[(&str, Key)]) -> Result<(), NomadError> {
        for (key, value) in self.map {
            let rule = table.iter().find(|(name, _)| name == key).map(|(_, rule)| *rule);
            match rule {
                Some(Key::Used | Key::Informs) => {}
                _ if is_empty(value) => {}
                Some(Key::Refused(reason)) => {
                    return Err(NomadError::Unsupported {
                        field: self.path(key),
                        reason: reason.to_owned(),
                    });
                }
                None => {
                    return Err(NomadError::Unsupported {
                        field: self.path(key),
                        reason: "wharf does not implement this field".to_owned(),
                    });
                }
            }
        }
        Ok(())
    }

    /// The path of `key` in this object.
    pub(crate) fn path(&self, key: &str) -> String {
        format!("{}.{key}", self.at)
    }

    /// The value of `key`, with null read as absent.
    pub(crate) fn get(&self, key: &str) -> Option<&'a Value> {
        self.map.get(key).filter(|v| !v.is_null())
    }

    pub(crate) fn str(&self, key: &str) -> Result<Option<&'a str>, NomadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::String(s)) => Ok(Some(s)),
            Some(other) => {
                Err(invalid(&self.path(key), format!("expected a string, found {}", kind(other))))
            }
        }
    }

    pub(crate) fn bool(&self, key: &str) -> Result<bool, NomadError> {
        match self.get(key) {
            None => Ok(false),
            Some(Value::Bool(b)) => Ok(*b),
            Some(other) => Err(invalid(
                &self.path(key),
                format!("expected true or false, found {}", kind(other)),
            )),
        }
    }

    pub(crate) fn u64(&self, key: &str) -> Result<Option<u64>, NomadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => n.as_u64().map(Some).ok_or_else(|| {
                invalid(
                    &self.path(key),
                    format!("expected a whole number of at least 0, found {n}"),
                )
            }),
            Some(other) => {
                Err(invalid(&self.path(key), format!("expected a number, found {}", kind(other))))
            }
        }
    }

    pub(crate) fn u32(&self, key: &str) -> Result<Option<u32>, NomadError> {
        match self.u64(key)? {
            None => Ok(None),
            Some(n) => u32::try_from(n)
                .map(Some)
                .map_err(|_| invalid(&self.path(key), format!("{n} is too large"))),
        }
    }

    /// A duration: nanoseconds as a number (Nomad's JSON), or a string such as `"30s"`.
    pub(crate) fn duration(&self, key: &str) -> Result<Option<Duration>, NomadError> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Number(n)) => {
                n.as_u64().map(|ns| Some(Duration::from_nanos(ns))).ok_or_else(|| {
                    invalid(
                        &self.path(key),
                        format!("expected nanoseconds (a whole number of at least 0), found {n}"),
                    )
                })
            }
            Some(Value::String(s)) => wharf_state::duration::parse(s)
                .map(Some)
                .map_err(|e| invalid(&self.path(key), e.to_string())),
            Some(other) => Err(invalid(
                &self.path(key),
                format!("expected nanoseconds, found {}", kind(other)),
            )),
        }
    }

    /// The items of an array; none for an absent key.
    pub(crate) fn array(&self, key: &str) -> Result<&'a [Value], NomadError> {
        match self.get(key) {
            None => Ok(&[]),
            Some(Value::Array(items)) => Ok(items),
            Some(other) => {
                Err(invalid(&self.path(key), format!("expected a list, found {}", kind(other))))
            }
        }
    }

    /// A map of strings, such as `Env` or `Meta`.
    pub(crate) fn strings(&self, key: &str) -> Result<Vec<(&'a str, &'a str)>, NomadError> {
        let Some(value) = self.get(key) else { return Ok(Vec::new()) };
        let Value::Object(map) = value else {
            return Err(invalid(
                &self.path(key),
                format!("expected an object of strings, found {}", kind(value)),
            ));
        };
        map.iter()
            .map(|(k, v)| match v {
                Value::String(s) => Ok((k.as_str(), s.as_str())),
                other => Err(invalid(
                    &format!("{}.{k}", self.path(key)),
                    format!("expected a string, found {}", kind(other)),
                )),
            })
            .collect()
    }
}

pub(crate) fn invalid(field: &str, message: String) -> NomadError {
    NomadError::Invalid { field: field.to_owned(), message }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn empty_values_of_unknown_keys_pass_and_set_ones_are_refused() {
        let value = json!({"A": 1, "B": null, "C": false, "D": [], "E": {}, "F": ""});
        let obj = Obj::of(&value, "Job").unwrap().unwrap();
        obj.check(&[("A", Key::Used)]).unwrap();
        let value = json!({"Vault": {"Policies": ["x"]}});
        let obj = Obj::of(&value, "Job.Task").unwrap().unwrap();
        let error = obj.check(&[("Vault", Key::Refused("no Vault"))]).unwrap_err();
        assert_eq!(error.to_string(), "Job.Task.Vault: no Vault");
        let error = obj.check(&[]).unwrap_err();
        assert!(
            error.to_string().starts_with("Job.Task.Vault: wharf does not implement"),
            "{error}"
        );
    }

    #[test]
    fn durations_are_nanoseconds_or_unit_strings() {
        let value = json!({"A": 5_000_000_000u64, "B": "1m", "C": -1, "D": "soon"});
        let obj = Obj::of(&value, "X").unwrap().unwrap();
        assert_eq!(obj.duration("A").unwrap(), Some(Duration::from_secs(5)));
        assert_eq!(obj.duration("B").unwrap(), Some(Duration::from_secs(60)));
        assert!(
            obj.duration("C").unwrap_err().to_string().starts_with("X.C: expected nanoseconds")
        );
        assert!(obj.duration("D").is_err());
        assert_eq!(obj.duration("E").unwrap(), None);
    }
}

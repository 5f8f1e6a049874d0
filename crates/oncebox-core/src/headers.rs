//! Message headers: a small ordered map of text names to text values.

use std::collections::BTreeMap;
use std::fmt;

use crate::error::{InvalidMessage, excerpt};

/// The W3C trace-context header, stored with the row at enqueue and carried to consumers.
pub const TRACEPARENT: &str = "traceparent";

/// Headers of a message: trace context, correlation and causation ids, anything a
/// producer wants to carry beside the payload.
///
/// Names are non-empty, at most 255 bytes of visible ASCII without `:`; values are text
/// without control characters (tab allowed), at most 8 KiB. These rules are what every
/// broker's header model can carry; the sum of all names and values is bounded by
/// [`Limits::max_header_bytes`](crate::Limits::max_header_bytes) at enqueue and publish. `Debug` prints the names only, since values may hold
/// credentials.
#[derive(Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(transparent)]
pub struct Headers(BTreeMap<String, String>);

const MAX_NAME_LEN: usize = 255;
const MAX_VALUE_LEN: usize = 8 * 1024;

impl Headers {
    /// No headers.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets `name` to `value`, replacing an earlier value.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::InvalidHeader`] if the name or value breaks the rules above.
    pub fn insert(
        &mut self,
        name: impl Into<String>,
        value: impl Into<String>,
    ) -> Result<(), InvalidMessage> {
        let (name, value) = (name.into(), value.into());
        check_name(&name)?;
        check_value(&name, &value)?;
        self.0.insert(name, value);
        Ok(())
    }

    /// Sets a header from raw bytes received from the wire.
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::InvalidHeader`] if either part is not UTF-8 or breaks the rules.
    pub fn insert_bytes(&mut self, name: &[u8], value: &[u8]) -> Result<(), InvalidMessage> {
        let invalid = |reason| InvalidMessage::InvalidHeader {
            name: excerpt(&String::from_utf8_lossy(name)),
            reason,
        };
        let name = std::str::from_utf8(name).map_err(|_| invalid("name is not UTF-8"))?;
        let value = std::str::from_utf8(value).map_err(|_| invalid("value is not UTF-8"))?;
        self.insert(name, value)
    }

    /// The value of `name`, if present.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.0.get(name).map(String::as_str)
    }

    /// Removes `name`, returning its value.
    pub fn remove(&mut self, name: &str) -> Option<String> {
        self.0.remove(name)
    }

    /// Iterates over `(name, value)` pairs in name order.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Number of headers.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// The sum of the names' and values' lengths in bytes, what
    /// [`Limits::max_header_bytes`](crate::Limits::max_header_bytes) bounds.
    pub fn size(&self) -> usize {
        self.0
            .iter()
            .map(|(name, value)| name.len() + value.len())
            .sum()
    }

    /// Whether there are no headers.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Checks every header against the rules (headers built by deserializing a stored row
    /// bypass [`Headers::insert`]).
    ///
    /// # Errors
    ///
    /// The first header that breaks a rule.
    pub fn validate(&self) -> Result<(), InvalidMessage> {
        self.0.iter().try_for_each(|(name, value)| {
            check_name(name)?;
            check_value(name, value)
        })
    }

    /// Encodes the headers as a JSON object, the form the SQL stores keep.
    pub fn to_json(&self) -> String {
        // A map of strings always serializes.
        serde_json::to_string(&self.0).unwrap_or_else(|_| "{}".to_owned())
    }

    /// Decodes headers stored by [`Headers::to_json`].
    ///
    /// # Errors
    ///
    /// [`InvalidMessage::Json`] if the text is not a JSON object of strings, or
    /// [`InvalidMessage::InvalidHeader`] if a header breaks the rules.
    pub fn from_json(text: &str) -> Result<Self, InvalidMessage> {
        let headers = Self(serde_json::from_str(text)?);
        headers.validate()?;
        Ok(headers)
    }
}

fn check_name(name: &str) -> Result<(), InvalidMessage> {
    let invalid = |reason| InvalidMessage::InvalidHeader {
        name: excerpt(name),
        reason,
    };
    if name.is_empty() {
        return Err(invalid("name is empty"));
    }
    if name.len() > MAX_NAME_LEN {
        return Err(invalid("name is longer than 255 bytes"));
    }
    if !name.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
        return Err(invalid("name must be visible ASCII without ':'"));
    }
    Ok(())
}

fn check_value(name: &str, value: &str) -> Result<(), InvalidMessage> {
    let invalid = |reason| InvalidMessage::InvalidHeader {
        name: excerpt(name),
        reason,
    };
    if value.len() > MAX_VALUE_LEN {
        return Err(invalid("value is longer than 8 KiB"));
    }
    if value.chars().any(|c| c.is_control() && c != '\t') {
        return Err(invalid("value contains a control character"));
    }
    Ok(())
}

impl fmt::Debug for Headers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_set().entries(self.0.keys()).finish()
    }
}

impl<'a> IntoIterator for &'a Headers {
    type Item = (&'a String, &'a String);
    type IntoIter = std::collections::btree_map::Iter<'a, String, String>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_names_and_values() {
        let mut h = Headers::new();
        assert!(h.insert("", "x").is_err());
        assert!(h.insert("a b", "x").is_err());
        assert!(h.insert("a:b", "x").is_err());
        assert!(h.insert("x-ok", "line\nbreak").is_err());
        assert!(h.insert("x-ok", "tab\tis fine").is_ok());
        assert!(h.insert("x-long", "v".repeat(MAX_VALUE_LEN + 1)).is_err());
    }

    #[test]
    fn invalid_wire_bytes_are_typed_errors() {
        let mut h = Headers::new();
        let err = h.insert_bytes(b"x-id", &[0xff, 0xfe]).unwrap_err();
        assert!(matches!(
            err,
            InvalidMessage::InvalidHeader {
                reason: "value is not UTF-8",
                ..
            }
        ));
        let err = h.insert_bytes(&[0xc3], b"v").unwrap_err();
        assert!(matches!(
            err,
            InvalidMessage::InvalidHeader {
                reason: "name is not UTF-8",
                ..
            }
        ));
        assert!(h.is_empty());
    }

    #[test]
    fn debug_hides_values() {
        let mut h = Headers::new();
        h.insert("authorization", "Bearer secret").unwrap();
        assert!(!format!("{h:?}").contains("secret"));
    }

    #[test]
    fn json_round_trip_and_validation() {
        let mut h = Headers::new();
        h.insert(
            TRACEPARENT,
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        )
        .unwrap();
        assert_eq!(Headers::from_json(&h.to_json()).unwrap(), h);
        assert!(Headers::from_json(r#"{"bad name":"v"}"#).is_err());
        assert!(Headers::from_json("[1,2]").is_err());
    }
}

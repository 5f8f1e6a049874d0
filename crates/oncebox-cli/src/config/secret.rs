//! A value that is never printed.

use std::fmt;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A password: shown as `<hidden>` by `Debug`, `Display` and `Serialize`, so that no
/// log line, error or `config check` output can carry it.
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct Secret(String);

impl Secret {
    /// The secret itself, for the one place that hands it to a client library.
    pub(crate) fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<hidden>")
    }
}

impl Serialize for Secret {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str("<hidden>")
    }
}

impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SecretVisitor;

        impl Visitor<'_> for SecretVisitor {
            type Value = Secret;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Secret, E> {
                Ok(Secret(text.to_owned()))
            }

            // Numbers and booleans are reported without their value.
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<Secret, E> {
                Err(E::custom("must be a string (quote it)"))
            }

            fn visit_u64<E: de::Error>(self, _: u64) -> Result<Secret, E> {
                Err(E::custom("must be a string (quote it)"))
            }

            fn visit_f64<E: de::Error>(self, _: f64) -> Result<Secret, E> {
                Err(E::custom("must be a string (quote it)"))
            }

            fn visit_bool<E: de::Error>(self, _: bool) -> Result<Secret, E> {
                Err(E::custom("must be a string (quote it)"))
            }
        }

        deserializer.deserialize_any(SecretVisitor)
    }
}

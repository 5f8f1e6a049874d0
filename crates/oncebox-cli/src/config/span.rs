//! Durations in the configuration: `"250ms"`, `"30s"`, `"7d"`, `"1h 30m"`.

use std::fmt;
use std::time::Duration;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A duration written as text with units, as humans write it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Span(Duration);

impl Span {
    pub(crate) const fn secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    pub(crate) const fn get(self) -> Duration {
        self.0
    }
}

impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&humantime::format_duration(self.0), f)
    }
}

impl std::str::FromStr for Span {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, String> {
        humantime::parse_duration(text.trim())
            .map(Self)
            .map_err(|error| {
                format!("{text:?} is not a duration such as \"30s\" or \"7d\" ({error})")
            })
    }
}

impl Serialize for Span {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Span {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SpanVisitor;

        impl Visitor<'_> for SpanVisitor {
            type Value = Span;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration with its unit, such as \"30s\" or \"7d\"")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<Span, E> {
                text.parse().map_err(E::custom)
            }
        }

        deserializer.deserialize_str(SpanVisitor)
    }
}

//! Durations in the configuration: `"250ms"`, `"30s"`, `"7d"`, `"1h 30m"`, at most
//! [`Span::MAX`].

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

    /// The longest duration a setting takes: 100 years (of 365.25 days, `"100y"`).
    /// Every use is safe far below it: a deadline on the monotonic clock (`Instant + d`)
    /// or the wall clock (`SystemTime + d`, `SystemTime - d`), the session cookie's
    /// `Max-Age`, a `jiff` timestamp (up to the year 9999), a millisecond count in an
    /// `i64`, and the stores' interval arithmetic, which `oncebox::time` clamps at ±100
    /// years. Checked once, where every duration is parsed ([`FromStr`](std::str::FromStr)),
    /// so that no setting (nor a flag such as `--older-than`) gets past it.
    pub(crate) const MAX: Self = Self(Duration::from_secs(100 * 31_557_600));

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

    /// A duration with units, at most [`Span::MAX`].
    fn from_str(text: &str) -> Result<Self, String> {
        let span = humantime::parse_duration(text.trim())
            .map(Self)
            .map_err(|error| {
                format!("{text:?} is not a duration such as \"30s\" or \"7d\" ({error})")
            })?;
        if span > Self::MAX {
            return Err(format!(
                "{text:?} is longer than {}, the longest duration a setting takes",
                Self::MAX
            ));
        }
        Ok(span)
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

#[cfg(test)]
mod tests {
    use super::Span;
    use crate::config::Config;

    /// Every duration setting refuses a value past [`Span::MAX`] when the configuration
    /// loads, naming the key and the bound: `dashboard.session_ttl = "500000000000y"`
    /// used to load, and panicked at every login (`Instant + ttl` overflowed). The keys
    /// are every default that reads as a duration, so a new one is checked too.
    #[test]
    fn every_duration_setting_refuses_one_past_the_bound() {
        let defaults: toml::Table = Config::default()
            .to_toml()
            .parse()
            .expect("the defaults print as TOML");
        let mut keys = Vec::new();
        for (section, table) in &defaults {
            let Some(table) = table.as_table() else {
                continue;
            };
            for (name, value) in table {
                if value
                    .as_str()
                    .is_some_and(|text| text.parse::<Span>().is_ok())
                {
                    keys.push((section.clone(), name.clone()));
                }
            }
        }
        assert!(
            keys.len() >= 17
                && keys
                    .iter()
                    .any(|(s, n)| s == "dashboard" && n == "session_ttl"),
            "the duration settings: {keys:?}"
        );
        for (section, name) in &keys {
            for value in ["500000000000y", "101y"] {
                let text = format!("[{section}]\n{name} = \"{value}\"\n");
                let error = Config::load_from_text(&text, &[]).expect_err(&text);
                assert!(
                    error.0.starts_with(&format!("{section}.{name}: "))
                        && error.0.contains("100years"),
                    "{text}: {error}"
                );
            }
            let variable = format!(
                "ONCEBOX_{}__{}",
                section.to_uppercase(),
                name.to_uppercase()
            );
            let error = Config::load_from_text("", &[(variable.clone(), "500000000000y".into())])
                .expect_err(&variable);
            assert!(error.0.contains(&variable), "{variable}: {error}");
        }
        let longest = format!("[dashboard]\nsession_ttl = \"{}\"\n", Span::MAX);
        let config = Config::load_from_text(&longest, &[]).expect("the bound itself is accepted");
        assert_eq!(config.dashboard.session_ttl, Span::MAX);
    }
}

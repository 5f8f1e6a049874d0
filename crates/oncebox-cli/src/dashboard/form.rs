//! Form fields and query parameters, `application/x-www-form-urlencoded`, with repeated
//! names kept (a selection of dead letters is many `id` fields).

use std::time::SystemTime;

use axum::body::Bytes;

/// The name–value pairs of a form body or a query string, in order.
#[derive(Debug, Default)]
pub(super) struct Fields(Vec<(String, String)>);

impl Fields {
    /// Decodes a form body or a query string; undecodable bytes become U+FFFD.
    pub(super) fn parse(encoded: &[u8]) -> Self {
        Self(
            url::form_urlencoded::parse(encoded)
                .map(|(name, value)| (name.into_owned(), value.into_owned()))
                .collect(),
        )
    }

    /// The query string of a request, if any.
    pub(super) fn query(query: Option<&str>) -> Self {
        query.map_or_else(Self::default, |query| Self::parse(query.as_bytes()))
    }

    /// A form body.
    pub(super) fn body(body: &Bytes) -> Self {
        Self::parse(body)
    }

    /// The first value of `name`, exactly as sent (empty, or with outer spaces), if the
    /// field is there at all: for values that are data to find again, such as a failure
    /// group's topic, where `""` and `" orders "` name groups of their own.
    pub(super) fn exact(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| value.as_str())
    }

    /// The first value of `name`, trimmed, if it is not empty: for what operators type
    /// into a filter.
    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.0
            .iter()
            .find(|(field, _)| field == name)
            .map(|(_, value)| value.trim())
            .filter(|value| !value.is_empty())
    }

    /// The time in `name`, if set: RFC 3339, or a `datetime-local` value (no seconds,
    /// no zone), taken as UTC; an error naming the field's value otherwise.
    pub(super) fn time(&self, name: &str) -> Result<Option<SystemTime>, String> {
        self.get(name)
            .map(|text| {
                parse_time(text)
                    .ok_or_else(|| format!("{text:?} is not a time such as 2026-11-27T09:30 (UTC)"))
            })
            .transpose()
    }

    /// The page position in `before`, if set.
    pub(super) fn before(&self) -> Result<Option<i64>, String> {
        self.get("before")
            .map(|seq| {
                seq.parse::<i64>()
                    .map_err(|_| format!("{seq:?} is not a position"))
            })
            .transpose()
    }

    /// The fields among `names` that are set, as a query string.
    pub(super) fn kept(&self, names: &[&str]) -> String {
        encode(
            names
                .iter()
                .filter_map(|&name| self.get(name).map(|value| (name, value))),
        )
    }

    /// Every non-empty value of `name`.
    pub(super) fn all<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        self.0
            .iter()
            .filter(move |(field, _)| field == name)
            .map(|(_, value)| value.trim())
            .filter(|value| !value.is_empty())
    }
}

/// A time typed into a filter form: RFC 3339, or a `datetime-local` value (no seconds,
/// no zone), taken as UTC.
fn parse_time(text: &str) -> Option<SystemTime> {
    let text = text.trim_end_matches(['Z', 'z']);
    let with_seconds;
    let text = if text.len() == 16 {
        with_seconds = format!("{text}:00");
        &with_seconds
    } else {
        text
    };
    humantime::parse_rfc3339_weak(text).ok()
}

/// `pairs` as a query string (values percent-encoded), without the `?`.
pub(super) fn encode<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    url::form_urlencoded::Serializer::new(String::new())
        .extend_pairs(pairs)
        .finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeated_names_are_kept_and_empty_values_are_absent() {
        let fields = Fields::parse(b"id=a&id=b&topic=&key=%20k%20&x=%3Cscript%3E");
        assert_eq!(fields.all("id").collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(fields.get("topic"), None);
        assert_eq!(fields.get("key"), Some("k"));
        assert_eq!(fields.get("x"), Some("<script>"));
        assert_eq!(fields.get("missing"), None);
    }

    #[test]
    fn exact_values_keep_their_spaces_and_emptiness() {
        let fields = Fields::parse(b"topic=&signature=+a++b+&key=%20k%20");
        assert_eq!(fields.exact("topic"), Some(""));
        assert_eq!(fields.exact("signature"), Some(" a  b "));
        assert_eq!(fields.exact("key"), Some(" k "));
        assert_eq!(fields.exact("missing"), None);
        let query = encode([("topic", " orders "), ("signature", "x")]);
        assert_eq!(
            Fields::parse(query.as_bytes()).exact("topic"),
            Some(" orders ")
        );
    }

    #[test]
    fn filter_times_are_read_as_utc() {
        let expected = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_795_759_800);
        assert_eq!(parse_time("2026-11-27T06:10"), Some(expected));
        assert_eq!(parse_time("2026-11-27T06:10:00Z"), Some(expected));
        assert_eq!(parse_time("yesterday"), None);
    }

    #[test]
    fn encoded_pairs_decode_back() {
        let query = encode([("topic", "a b&c"), ("key", "ü")]);
        let fields = Fields::parse(query.as_bytes());
        assert_eq!(fields.get("topic"), Some("a b&c"));
        assert_eq!(fields.get("key"), Some("ü"));
    }
}

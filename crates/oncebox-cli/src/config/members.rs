//! A `broker.url` naming the members of a cluster: whole URLs separated by commas, each
//! of the broker's schemes and naming a host. NATS and RabbitMQ each add their own
//! checks.

use super::ConfigError;
use super::url::redact;

/// How a broker calls the members of its cluster, and what their URLs look like.
pub(crate) struct Members {
    /// `server`, `node`.
    pub(crate) member: &'static str,
    /// `NATS`, `RabbitMQ`.
    pub(crate) cluster: &'static str,
    /// The schemes a member's URL may have, without `://`.
    pub(crate) schemes: [&'static str; 2],
    /// A list of two members, for the message about an empty one.
    pub(crate) example: &'static str,
}

impl Members {
    /// The members `url` names, each checked here and then by `check` (given the member,
    /// its parsed URL and the first member's, which returns the problem it finds).
    pub(crate) fn parse<'a>(
        &self,
        url: &'a str,
        mut check: impl FnMut(&str, &::url::Url, Option<&::url::Url>) -> Result<(), String>,
    ) -> Result<Vec<&'a str>, ConfigError> {
        let members: Vec<&str> = url.split(',').map(str::trim).collect();
        let mut first: Option<::url::Url> = None;
        for (i, member) in members.iter().enumerate() {
            let which = if members.len() == 1 {
                String::new()
            } else {
                format!("{} {} of {}: ", self.member, i + 1, members.len())
            };
            let problem = |text: String| ConfigError::key("broker.url", format!("{which}{text}"));
            if member.is_empty() {
                return Err(problem(format!(
                    "empty: separate the {}s of a {} cluster with single commas ({})",
                    self.member, self.cluster, self.example
                )));
            }
            let parsed = ::url::Url::parse(member)
                .map_err(|error| problem(format!("{:?} is not a URL: {error}", redact(member))))?;
            if !self.schemes.contains(&parsed.scheme()) {
                let [a, b] = self.schemes;
                return Err(problem(format!(
                    "{:?}: each {} of a {} cluster is a whole URL starting with {a}:// or {b}://",
                    redact(member),
                    self.member,
                    self.cluster
                )));
            }
            if parsed.host_str().is_none_or(str::is_empty) {
                return Err(problem(format!("{:?} names no host", redact(member))));
            }
            check(member, &parsed, first.as_ref()).map_err(problem)?;
            first.get_or_insert(parsed);
        }
        Ok(members)
    }
}

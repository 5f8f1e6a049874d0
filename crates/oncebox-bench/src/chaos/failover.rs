//! The database failover: every process of the run reaches PostgreSQL through an
//! address of the run's own, as a service's address (a Kubernetes `-rw` service, a
//! virtual IP, a failover proxy) in production; the failover command kills the primary
//! and promotes its standby, then the address moves to the standby.

use anyhow::Context as _;
use oncebox_testkit::proxy::Proxy;

use super::strike::run_command;

/// The address of the database that moves to the standby on a failover.
pub(crate) struct MovingAddress {
    proxy: Proxy,
    /// `host:port` of the standby.
    standby: String,
    /// The primary's URL with this address in place of its host and port.
    url: String,
}

impl MovingAddress {
    /// An address in front of `primary_url`'s server that will move to `standby_url`'s.
    pub(crate) async fn start(primary_url: &str, standby_url: &str) -> anyhow::Result<Self> {
        let primary = host_port(primary_url).context("--database-url")?;
        let standby = host_port(standby_url).context("--standby-url")?;
        let proxy = Proxy::start(primary)
            .await
            .context("starting the database's moving address")?;
        let mut url = ::url::Url::parse(primary_url).context("--database-url")?;
        url.set_host(Some("127.0.0.1"))
            .and_then(|()| {
                url.set_port(Some(proxy.port()))
                    .map_err(|()| ::url::ParseError::InvalidPort)
            })
            .context("--database-url: not a URL with a host")?;
        Ok(Self {
            proxy,
            standby,
            url: url.to_string(),
        })
    }

    /// The database's URL through this address.
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// Runs `command` (which kills the primary and promotes the standby), then moves
    /// the address to the standby: connections still open to the old primary drop, new
    /// ones reach the standby.
    pub(crate) async fn fail_over(&self, command: &str) -> anyhow::Result<()> {
        run_command(command, &[]).await?;
        self.proxy.retarget(self.standby.clone());
        Ok(())
    }
}

/// `host:port` of a PostgreSQL URL (port 5432 unless it says another).
fn host_port(url: &str) -> anyhow::Result<String> {
    let url = ::url::Url::parse(url)?;
    let host = url.host_str().context("no host")?;
    Ok(format!("{host}:{}", url.port().unwrap_or(5432)))
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn the_host_and_port_of_a_url() {
        assert_eq!(
            host_port("postgres://postgres@127.0.0.1:5433/postgres").unwrap(),
            "127.0.0.1:5433"
        );
        assert_eq!(
            host_port("postgres://db.internal/app").unwrap(),
            "db.internal:5432"
        );
        assert!(host_port("postgres:///app?host=/run/postgresql").is_err());
    }
}

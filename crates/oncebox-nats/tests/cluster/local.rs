//! A three-node JetStream cluster on this machine whose routes all pass through proxies of
//! the test's, so that one node can be partitioned away from the other two and healed.
//!
//! Node `i` solicits its route to node `j` through a proxy of its own, the link `(i, j)`:
//! cutting every link to and from node `k` separates `k` from the other two, while
//! clients still reach each node directly. Servers also tell each other the route URLs
//! they know (gossip), and a server that hears of a peer it has no route to opens one of
//! its own accord (an implicit route) — which would pass beside the links. So every node
//! advertises a route URL that leads nowhere (a proxy kept cut), and
//! [`LocalCluster::routes_through_links`] checks on each node's monitoring endpoint
//! (`/routez`) that the mesh is made of the links and nothing else.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use oncebox_core::{Error, Result};
use oncebox_testkit::proxy::Proxy;
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::support::{LocalServer, free_port, unique};

/// Nodes in the cluster.
const NODES: usize = 3;

/// Three clustered nodes; node `i`'s server name is `n{i}`.
pub(crate) struct LocalCluster {
    pub(crate) nodes: Vec<LocalServer>,
    /// The port of each node's monitoring endpoint (`-m`).
    monitors: Vec<u16>,
    /// The port each node listens on for routes; no route may reach it directly.
    cluster_ports: Vec<u16>,
    /// `(i, j)`: the proxy node `i`'s route to node `j` goes through.
    links: BTreeMap<(usize, usize), Proxy>,
    /// The route URL every node advertises: a proxy kept cut, which closes what
    /// connects at once.
    _nowhere: Proxy,
}

impl LocalCluster {
    /// Starts three nodes and returns once every pair is connected through its link.
    ///
    /// A start that fails is tried again, twice, on new ports: the ports are picked free
    /// and let go before the servers bind them, and in the meantime another test's
    /// connection can take one as its local port (a node then exits at once).
    pub(crate) async fn start() -> Result<Self> {
        let mut attempt = 1;
        loop {
            match Self::start_once().await {
                Err(error) if attempt < 3 => {
                    eprintln!("the cluster did not start (attempt {attempt}): {error}");
                    attempt += 1;
                }
                started => return started,
            }
        }
    }

    async fn start_once() -> Result<Self> {
        let cluster_ports: Vec<u16> = (0..NODES).map(|_| free_port()).collect::<Result<_>>()?;
        let monitors: Vec<u16> = (0..NODES).map(|_| free_port()).collect::<Result<_>>()?;
        let nowhere = proxy("127.0.0.1:9".to_owned()).await?;
        nowhere.cut();
        let mut links = BTreeMap::new();
        for (from, to) in pairs() {
            let link = proxy(format!("127.0.0.1:{}", cluster_ports[to])).await?;
            links.insert((from, to), link);
        }
        let name = format!("obt-{}", unique());
        let mut nodes = Vec::new();
        for i in 0..NODES {
            let routes: Vec<String> = pairs()
                .filter(|&(from, _)| from == i)
                .map(|link| format!("nats://127.0.0.1:{}", links[&link].port()))
                .collect();
            let args = [
                "--server_name".to_owned(),
                format!("n{i}"),
                "--cluster_name".to_owned(),
                name.clone(),
                "--cluster".to_owned(),
                format!("nats://127.0.0.1:{}", cluster_ports[i]),
                "--routes".to_owned(),
                routes.join(","),
                "--cluster_advertise".to_owned(),
                format!("127.0.0.1:{}", nowhere.port()),
                // Clients learn no other node: each stays on the nodes it was given.
                "--no_advertise".to_owned(),
                "-m".to_owned(),
                monitors[i].to_string(),
            ];
            nodes.push(LocalServer::start_with(free_port()?, args.to_vec()).await?);
        }
        let cluster = Self {
            nodes,
            monitors,
            cluster_ports,
            links,
            _nowhere: nowhere,
        };
        cluster.await_mesh(Duration::from_secs(20)).await?;
        Ok(cluster)
    }

    /// Node `name` (`n{i}`).
    pub(crate) fn node(&self, name: &str) -> Option<&LocalServer> {
        self.nodes.get(index_of(name)?)
    }

    pub(crate) async fn stop(&self) {
        for node in &self.nodes {
            node.stop().await;
        }
    }

    /// Cuts every link to and from node `k`: its routes drop, and no new one connects.
    pub(crate) fn isolate(&self, k: usize) {
        for ((from, to), link) in &self.links {
            if *from == k || *to == k {
                link.cut();
            }
        }
    }

    /// Restores the links [`LocalCluster::isolate`] cut; the routes reconnect by
    /// themselves (a configured route is retried every second).
    pub(crate) fn heal(&self, k: usize) {
        for ((from, to), link) in &self.links {
            if *from == k || *to == k {
                link.restore();
            }
        }
    }

    /// Waits up to `patience` for [`LocalCluster::routes_through_links`] to hold.
    pub(crate) async fn await_mesh(&self, patience: Duration) -> Result<()> {
        let deadline = Instant::now() + patience;
        loop {
            match self.routes_through_links().await {
                Ok(()) => return Ok(()),
                Err(error) if Instant::now() > deadline => return Err(error),
                Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
            }
        }
    }

    /// Whether the mesh is made of the links: each node has exactly one route to each
    /// other node, no route reaches a node's route port directly, and the one connection
    /// of each pair was opened through one of that pair's links (the node that opened it
    /// sees the link's port as its remote address; the other node sees the proxy's).
    pub(crate) async fn routes_through_links(&self) -> Result<()> {
        let mut ids = Vec::new();
        let mut routes = Vec::new();
        for i in 0..NODES {
            let routez = self.monitor(i, "/routez").await?;
            ids.push(text(&routez, "server_id")?);
            let mut found = Vec::new();
            for route in routez["routes"].as_array().into_iter().flatten() {
                let port = route["port"].as_u64().unwrap_or_default();
                found.push((text(route, "remote_id")?, port));
            }
            routes.push(found);
        }
        // routes_to[(i, j)]: the remote ports of node i's routes to node j.
        let mut routes_to: BTreeMap<(usize, usize), Vec<u64>> = BTreeMap::new();
        for (i, found) in routes.iter().enumerate() {
            for (remote, port) in found {
                let j = ids.iter().position(|id| id == remote).ok_or_else(|| {
                    Error::transport_permanent(format!("n{i} has a route to unknown {remote}"))
                })?;
                if self.cluster_ports.iter().any(|p| u64::from(*p) == *port) {
                    return Err(Error::transport_permanent(format!(
                        "n{i}'s route to n{j} reaches its route port {port} directly"
                    )));
                }
                routes_to.entry((i, j)).or_default().push(*port);
            }
        }
        for (i, j) in pairs() {
            let count = routes_to.get(&(i, j)).map_or(0, Vec::len);
            if count != 1 {
                return Err(Error::transport_permanent(format!(
                    "n{i} has {count} routes to n{j}, not one"
                )));
            }
        }
        for (i, j) in pairs().filter(|(i, j)| i < j) {
            let through = |from: usize, to: usize| {
                routes_to[&(from, to)] == [u64::from(self.links[&(from, to)].port())]
            };
            if !through(i, j) && !through(j, i) {
                return Err(Error::transport_permanent(format!(
                    "the route between n{i} and n{j} passed through neither of their links \
                     (remote ports {:?} and {:?})",
                    routes_to[&(i, j)],
                    routes_to[&(j, i)]
                )));
            }
        }
        Ok(())
    }

    /// How many routes node `i` has now.
    pub(crate) async fn route_count(&self, i: usize) -> Result<usize> {
        let routez = self.monitor(i, "/routez").await?;
        Ok(routez["routes"].as_array().map_or(0, Vec::len))
    }

    /// The last sequence of stream `name` in node `i`'s own copy, as the node itself
    /// reports it (`/jsz`); `None` while the node holds no copy.
    pub(crate) async fn last_sequence(&self, i: usize, name: &str) -> Result<Option<u64>> {
        let jsz = self.monitor(i, "/jsz?streams=true").await?;
        let streams = jsz["account_details"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|account| account["stream_detail"].as_array().into_iter().flatten());
        for stream in streams {
            if stream["name"].as_str() == Some(name) {
                return Ok(stream["state"]["last_seq"].as_u64());
            }
        }
        Ok(None)
    }

    /// GETs `path` from node `i`'s monitoring endpoint and parses the JSON answer.
    async fn monitor(&self, i: usize, path: &str) -> Result<Value> {
        let port = self.monitors[i];
        let failed =
            |what: String| Error::transport_transient(format!("GET {path} of n{i}: {what}"));
        let exchange = async {
            let mut stream = TcpStream::connect(("127.0.0.1", port)).await?;
            let request = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n");
            stream.write_all(request.as_bytes()).await?;
            let mut response = Vec::new();
            stream.read_to_end(&mut response).await?;
            Ok::<_, std::io::Error>(response)
        };
        let response = tokio::time::timeout(Duration::from_secs(5), exchange)
            .await
            .map_err(|_| failed("no answer in 5 s".into()))?
            .map_err(|error| failed(error.to_string()))?;
        let response = String::from_utf8_lossy(&response);
        let (head, body) = response
            .split_once("\r\n\r\n")
            .ok_or_else(|| failed("no HTTP response".into()))?;
        if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
            let status = head.lines().next().unwrap_or_default().to_owned();
            return Err(failed(status));
        }
        serde_json::from_str(body).map_err(|error| failed(error.to_string()))
    }
}

/// The index of node `name` (`n{i}`).
pub(crate) fn index_of(name: &str) -> Option<usize> {
    name.strip_prefix('n')?.parse().ok().filter(|i| *i < NODES)
}

/// Every ordered pair of distinct nodes.
fn pairs() -> impl Iterator<Item = (usize, usize)> {
    (0..NODES).flat_map(|from| {
        (0..NODES)
            .filter(move |to| *to != from)
            .map(move |to| (from, to))
    })
}

async fn proxy(target: String) -> Result<Proxy> {
    Proxy::start(target)
        .await
        .map_err(Error::transport_permanent)
}

fn text(value: &Value, field: &str) -> Result<String> {
    value[field]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| Error::transport_permanent(format!("no {field} in {value}")))
}

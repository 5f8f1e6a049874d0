//! A TCP proxy between a client and its database or broker that cuts, stalls and slows
//! the connections through it: the peer becomes unreachable, stops answering, or
//! answers late — for the clients behind this proxy and nobody else.
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! use std::time::Duration;
//! use oncebox_testkit::proxy::Proxy;
//!
//! let proxy = Proxy::start("127.0.0.1:5432").await?;
//! let url = format!("postgres://postgres@127.0.0.1:{}/postgres", proxy.port());
//! // ... a client connects to `url` ...
//! proxy.stall(); // its queries hang, its connections stay open
//! proxy.slow(Duration::from_millis(50)); // every chunk arrives 50 ms late
//! proxy.cut(); // its connections drop, new ones are closed at once
//! proxy.restore();
//! proxy.retarget("127.0.0.1:5433"); // the address moved to a promoted standby
//! # Ok(()) }
//! ```

use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::AbortHandle;

/// What happens to the bytes of the open connections.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Condition {
    /// Forwarded as they come.
    #[default]
    Flowing,
    /// Held (and, once the buffers are full, not read) until the proxy is restored.
    Stalled,
    /// Each chunk read, in either direction, forwarded after this delay.
    Slow(Duration),
}

/// A proxy listening on a free port of 127.0.0.1, forwarding to one target. Dropping it
/// drops every connection through it.
pub struct Proxy {
    address: SocketAddr,
    shared: Arc<Shared>,
    accept: AbortHandle,
}

struct Shared {
    target: Mutex<String>,
    /// Cut: new connections are closed as soon as they are accepted.
    refusing: AtomicBool,
    condition: watch::Sender<Condition>,
    connections: Mutex<Vec<AbortHandle>>,
}

impl Proxy {
    /// A proxy to `target` (`host:port`), flowing.
    ///
    /// # Errors
    ///
    /// When no port of 127.0.0.1 can be bound.
    pub async fn start(target: impl Into<String>) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target: Mutex::new(target.into()),
            refusing: AtomicBool::new(false),
            condition: watch::Sender::new(Condition::Flowing),
            connections: Mutex::new(Vec::new()),
        });
        let accept = tokio::spawn(accept(listener, Arc::clone(&shared))).abort_handle();
        Ok(Self {
            address,
            shared,
            accept,
        })
    }

    /// Where clients connect instead of the target.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// The port clients connect to on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.address.port()
    }

    /// The connections open through the proxy now.
    pub fn open_connections(&self) -> usize {
        let mut connections = self.shared.connections();
        connections.retain(|c| !c.is_finished());
        connections.len()
    }

    /// The condition of the open connections.
    pub fn condition(&self) -> Condition {
        *self.shared.condition.borrow()
    }

    /// Drops every open connection and closes new ones at once, until
    /// [`restore`](Self::restore): the target became unreachable.
    pub fn cut(&self) {
        self.shared.refusing.store(true, Ordering::SeqCst);
        for connection in self.shared.connections().drain(..) {
            connection.abort();
        }
    }

    /// Keeps the connections open but forwards nothing until [`restore`](Self::restore):
    /// the target stopped answering. New connections are accepted and stall too.
    pub fn stall(&self) {
        self.shared.condition.send_replace(Condition::Stalled);
    }

    /// Forwards each chunk `delay` late until [`restore`](Self::restore): a slow
    /// network, which also bounds the throughput of each connection.
    pub fn slow(&self, delay: Duration) {
        self.shared.condition.send_replace(Condition::Slow(delay));
    }

    /// Forwards new connections to `target` from now on and drops the open ones: the
    /// service's address moved (a virtual IP, a Kubernetes service, a failover
    /// proxy after a promotion), and what was connected to the old host is gone.
    pub fn retarget(&self, target: impl Into<String>) {
        // Under the list's lock, which `accept` holds from reading the target to
        // listing the connection: none to the old target escapes the drain.
        let mut connections = self.shared.connections();
        *self
            .shared
            .target
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = target.into();
        for connection in connections.drain(..) {
            connection.abort();
        }
    }

    /// Accepts and forwards as they come again; what a stall held is forwarded now.
    pub fn restore(&self) {
        self.shared.refusing.store(false, Ordering::SeqCst);
        self.shared.condition.send_replace(Condition::Flowing);
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        for connection in self.shared.connections().drain(..) {
            connection.abort();
        }
    }
}

impl Shared {
    fn connections(&self) -> std::sync::MutexGuard<'_, Vec<AbortHandle>> {
        // The list holds abort handles only: one left by a panicking holder is whole.
        self.connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

async fn accept(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let inbound = match listener.accept().await {
            Ok((inbound, _)) => inbound,
            // Out of file descriptors, say: try again shortly rather than stop serving.
            Err(error) => {
                tracing::warn!(%error, "proxy: accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        if shared.refusing.load(Ordering::SeqCst) {
            continue; // dropped: closed at once
        }
        let mut connections = shared.connections();
        let target = shared
            .target
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let connection = tokio::spawn(forward(inbound, target, shared.condition.subscribe()));
        connections.retain(|c| !c.is_finished());
        connections.push(connection.abort_handle());
    }
}

/// Connects to `target` and pumps both ways until both sides closed.
async fn forward(inbound: TcpStream, target: String, condition: watch::Receiver<Condition>) {
    let Ok(outbound) = TcpStream::connect(&target).await else {
        return; // the client sees its connection closed, as if the target refused it
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    let (in_read, in_write) = inbound.into_split();
    let (out_read, out_write) = outbound.into_split();
    tokio::join!(
        pump(in_read, out_write, condition.clone()),
        pump(out_read, in_write, condition)
    );
}

/// Copies `from` to `to` under the proxy's condition, then passes the end of the
/// stream on.
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut condition: watch::Receiver<Condition>,
) {
    let mut buffer = vec![0u8; 64 * 1024];
    loop {
        let read = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => break,
            Ok(read) => read,
        };
        loop {
            let now = *condition.borrow_and_update();
            match now {
                Condition::Flowing => break,
                Condition::Slow(delay) => {
                    tokio::time::sleep(delay).await;
                    break;
                }
                Condition::Stalled => {
                    if condition.changed().await.is_err() {
                        return; // the proxy is gone
                    }
                }
            }
        }
        if to.write_all(&buffer[..read]).await.is_err() {
            return;
        }
    }
    let _ = to.shutdown().await;
}

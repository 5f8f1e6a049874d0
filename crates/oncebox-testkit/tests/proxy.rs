//! The fault-injecting proxy against a real TCP echo server: it forwards, stalls without
//! losing a byte, slows, cuts and comes back.

use std::time::{Duration, Instant};

use oncebox_testkit::proxy::{Condition, Proxy};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};

/// A server that echoes every connection's bytes back; its address.
async fn echo_server() -> String {
    let listener = TcpListener::bind("127.0.0.1:0")
        .await
        .expect("the echo server listens");
    let address = listener.local_addr().expect("an address").to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let (mut read, mut write) = stream.split();
                let _ = tokio::io::copy(&mut read, &mut write).await;
            });
        }
    });
    address
}

async fn connect(proxy: &Proxy) -> TcpStream {
    TcpStream::connect(proxy.address())
        .await
        .expect("the proxy accepts")
}

/// Sends `text` and reads as many bytes back, or `None` if nothing whole came within
/// `wait`.
async fn echo(stream: &mut TcpStream, text: &[u8], wait: Duration) -> Option<Vec<u8>> {
    stream.write_all(text).await.ok()?;
    let mut back = vec![0; text.len()];
    tokio::time::timeout(wait, stream.read_exact(&mut back))
        .await
        .ok()?
        .ok()?;
    Some(back)
}

const WAIT: Duration = Duration::from_secs(5);

#[tokio::test]
async fn a_flowing_proxy_forwards_both_ways() {
    let proxy = Proxy::start(echo_server().await)
        .await
        .expect("the proxy starts");
    assert_eq!(proxy.condition(), Condition::Flowing);
    let mut stream = connect(&proxy).await;
    assert_eq!(
        echo(&mut stream, b"hello", WAIT).await.as_deref(),
        Some(&b"hello"[..])
    );
}

#[tokio::test]
async fn a_stall_holds_the_bytes_and_a_restore_delivers_them() {
    let proxy = Proxy::start(echo_server().await)
        .await
        .expect("the proxy starts");
    let mut stream = connect(&proxy).await;
    assert!(echo(&mut stream, b"warm", WAIT).await.is_some());

    proxy.stall();
    assert_eq!(proxy.condition(), Condition::Stalled);
    assert_eq!(
        echo(&mut stream, b"held", Duration::from_millis(300)).await,
        None,
        "nothing comes back while stalled"
    );
    proxy.restore();
    let mut back = [0; 4];
    tokio::time::timeout(WAIT, stream.read_exact(&mut back))
        .await
        .expect("the held bytes arrive after the restore")
        .expect("the connection stayed open");
    assert_eq!(&back, b"held", "not a byte lost");
}

#[tokio::test]
async fn a_slow_proxy_delays_each_chunk() {
    let proxy = Proxy::start(echo_server().await)
        .await
        .expect("the proxy starts");
    let mut stream = connect(&proxy).await;
    let delay = Duration::from_millis(150);
    proxy.slow(delay);
    let started = Instant::now();
    assert!(echo(&mut stream, b"late", WAIT).await.is_some());
    // One delay on the way there, one on the way back: a lower bound, never flaky.
    assert!(
        started.elapsed() >= delay * 2,
        "came back after {:?}",
        started.elapsed()
    );
}

#[tokio::test]
async fn a_cut_drops_connections_and_refuses_until_restored() {
    let proxy = Proxy::start(echo_server().await)
        .await
        .expect("the proxy starts");
    let mut before = connect(&proxy).await;
    assert!(echo(&mut before, b"one", WAIT).await.is_some());

    proxy.cut();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(WAIT, before.read_to_end(&mut rest))
        .await
        .expect("the cut connection ends at once");
    assert!(
        read.is_err() || rest.is_empty(),
        "nothing more came: {rest:?}"
    );
    let mut during = connect(&proxy).await;
    assert_eq!(
        echo(&mut during, b"two", Duration::from_millis(500)).await,
        None,
        "a new connection is closed while cut"
    );

    proxy.restore();
    let mut after = connect(&proxy).await;
    assert_eq!(
        echo(&mut after, b"three", WAIT).await.as_deref(),
        Some(&b"three"[..])
    );
}

#[tokio::test]
async fn dropping_the_proxy_drops_its_connections() {
    let proxy = Proxy::start(echo_server().await)
        .await
        .expect("the proxy starts");
    let mut stream = connect(&proxy).await;
    assert!(echo(&mut stream, b"x", WAIT).await.is_some());
    drop(proxy);
    let mut rest = Vec::new();
    let read = tokio::time::timeout(WAIT, stream.read_to_end(&mut rest))
        .await
        .expect("the connection ends with the proxy");
    assert!(read.is_err() || rest.is_empty());
}

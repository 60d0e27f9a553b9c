//! A TCP proxy on loopback, between a client and a real server, that can delay, black-hole,
//! refuse and cut connections on command: the network faults a store must survive.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What the proxy does with traffic.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward every byte at once.
    None,
    /// Forward every chunk after this delay (in order).
    Delay(Duration),
    /// Accept connections and bytes; forward nothing, answer nothing.
    BlackHole,
    /// Close the listening socket: new connections are refused. Open ones keep working.
    Refuse,
}

/// A running proxy; stops (closing every connection) on drop.
#[derive(Debug)]
pub struct Proxy {
    addr: SocketAddr,
    fault: watch::Sender<Fault>,
    /// Where new connections go.
    target: watch::Sender<SocketAddr>,
    /// Bumped to close every open connection.
    cuts: watch::Sender<u64>,
    task: tokio::task::JoinHandle<()>,
    connections: Arc<Mutex<u64>>,
}

impl Proxy {
    /// A proxy on a free loopback port, forwarding to `target`.
    ///
    /// # Panics
    ///
    /// When no loopback port can be bound.
    pub async fn start(target: SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind the proxy");
        let addr = listener.local_addr().expect("the proxy's address");
        let (fault, fault_rx) = watch::channel(Fault::None);
        let (cuts, cuts_rx) = watch::channel(0);
        let (target, target_rx) = watch::channel(target);
        let connections = Arc::new(Mutex::new(0));
        let task = tokio::spawn(accept(
            listener,
            addr,
            target_rx,
            fault_rx,
            cuts_rx,
            Arc::clone(&connections),
        ));
        Self {
            addr,
            fault,
            target,
            cuts,
            task,
            connections,
        }
    }

    /// Sends new connections to `target` from now on; open ones stay where they are, as when
    /// a DNS name or a virtual IP moves to another server.
    pub fn retarget(&self, target: SocketAddr) {
        self.target.send_replace(target);
    }

    /// `redis://127.0.0.1:PORT` of the proxy.
    #[must_use]
    pub fn url(&self) -> String {
        format!("redis://{}", self.addr)
    }

    /// Applies `fault` from now on (to open connections too).
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// Closes every open connection (both ends), as a network cut or a proxy restart would.
    pub fn cut(&self) {
        self.cuts.send_modify(|n| *n += 1);
    }

    /// How many connections the proxy has accepted so far.
    #[must_use]
    pub fn connections(&self) -> u64 {
        *self
            .connections
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(
    listener: TcpListener,
    addr: SocketAddr,
    target: watch::Receiver<SocketAddr>,
    mut fault: watch::Receiver<Fault>,
    cuts: watch::Receiver<u64>,
    connections: Arc<Mutex<u64>>,
) {
    // Aborting this task drops the set, which aborts every connection's task.
    let mut open = JoinSet::new();
    let mut listener = Some(listener);
    loop {
        let refusing = *fault.borrow() == Fault::Refuse;
        match (&listener, refusing) {
            (Some(_), true) => listener = None,
            (None, false) => match TcpListener::bind(addr).await {
                Ok(bound) => listener = Some(bound),
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
            _ => {}
        }
        let Some(bound) = &listener else {
            if fault.changed().await.is_err() {
                return;
            }
            continue;
        };
        tokio::select! {
            accepted = bound.accept() => {
                let Ok((client, _)) = accepted else { continue };
                *connections.lock().unwrap_or_else(PoisonError::into_inner) += 1;
                let target = *target.borrow();
                open.spawn(connection(client, target, fault.clone(), cuts.clone()));
            }
            changed = fault.changed() => if changed.is_err() { return },
            Some(_) = open.join_next(), if !open.is_empty() => {}
        }
    }
}

async fn connection(
    client: TcpStream,
    target: SocketAddr,
    fault: watch::Receiver<Fault>,
    mut cuts: watch::Receiver<u64>,
) {
    cuts.mark_unchanged();
    let Ok(server) = TcpStream::connect(target).await else {
        return; // the server is down: the client sees its connection closed
    };
    let (client_read, client_write) = client.into_split();
    let (server_read, server_write) = server.into_split();
    tokio::select! {
        () = pump(client_read, server_write, fault.clone()) => {}
        () = pump(server_read, client_write, fault) => {}
        _ = cuts.changed() => {}
    }
}

/// Copies `from` to `to` chunk by chunk, applying the fault current at each chunk.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    fault: watch::Receiver<Fault>,
) {
    let mut buffer = vec![0; 16 * 1024];
    loop {
        let n = match from.read(&mut buffer).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        let current = *fault.borrow();
        match current {
            Fault::BlackHole => continue,
            Fault::Delay(delay) => tokio::time::sleep(delay).await,
            Fault::None | Fault::Refuse => {}
        }
        if to.write_all(&buffer[..n]).await.is_err() {
            return;
        }
    }
}

//! A three-node NATS cluster of real `nats-server` processes on loopback, started from the
//! repository's own configs (`nats/cluster/n{1,2,3}.conf`) with every port overridden.
//!
//! Nodes are numbered 0, 1, 2 here (servers `n1`, `n2`, `n3` in the configs). The configs enable
//! JetStream; each node gets its own store directory (`-sd`) in a temporary directory removed
//! when the cluster is dropped.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::{nats_server_bin, repo_root, wait_for_port};

/// Nodes in the cluster.
pub const NODES: usize = 3;

/// One node of a [`NatsCluster`].
pub struct ClusterNode {
    child: Option<Child>,
    /// `server_name` from its config: `n1`, `n2` or `n3`.
    pub name: String,
    /// Client port on 127.0.0.1.
    pub port: u16,
    /// Monitoring (HTTP) port on 127.0.0.1.
    pub monitor_port: u16,
    /// Route (cluster) port on 127.0.0.1.
    pub route_port: u16,
}

impl ClusterNode {
    /// `nats://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Whether the process is still running (not [`NatsCluster::kill`]ed).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Three `nats-server` processes forming the cluster `embatch`, all killed when dropped.
pub struct NatsCluster {
    nodes: Vec<ClusterNode>,
    /// The nodes' JetStream stores (`<store>/n1`, ...), removed on drop.
    store: PathBuf,
}

impl NatsCluster {
    /// Starts the three nodes on free loopback ports and waits (at most 15 s) until every node
    /// accepts clients and has routes to both others.
    ///
    /// # Panics
    /// When a node does not start or the mesh does not form in time.
    pub fn start() -> NatsCluster {
        let ports = free_ports(NODES * 3);
        let store = std::env::temp_dir().join(format!(
            "embatch-cluster-{}-{}",
            std::process::id(),
            ports[0]
        ));
        let mut cluster = NatsCluster {
            nodes: Vec::with_capacity(NODES),
            store,
        };
        for i in 0..NODES {
            let (port, monitor_port, route_port) =
                (ports[i * 3], ports[i * 3 + 1], ports[i * 3 + 2]);
            let routes = (0..NODES)
                .filter(|&j| j != i)
                .map(|j| format!("nats://127.0.0.1:{}", ports[j * 3 + 2]))
                .collect::<Vec<_>>()
                .join(",");
            let config = repo_root()
                .join("nats")
                .join("cluster")
                .join(format!("n{}.conf", i + 1));
            let child = Command::new(nats_server_bin())
                .arg("-c")
                .arg(&config)
                .args(["-a", "127.0.0.1", "-p", &port.to_string()])
                .args(["-m", &monitor_port.to_string()])
                .args(["--cluster", &format!("nats://127.0.0.1:{route_port}")])
                .args(["--routes", &routes])
                .arg("-sd")
                .arg(cluster.store.join(format!("n{}", i + 1)))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("nats-server starts");
            cluster.nodes.push(ClusterNode {
                child: Some(child),
                name: format!("n{}", i + 1),
                port,
                monitor_port,
                route_port,
            });
        }
        let deadline = Instant::now() + Duration::from_secs(15);
        for i in 0..NODES {
            let node = &cluster.nodes[i];
            wait_for_port(
                SocketAddr::from(([127, 0, 0, 1], node.port)),
                deadline.saturating_duration_since(Instant::now()),
            );
            loop {
                let peers = cluster.route_peers(i);
                if peers.len() == NODES - 1 {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{} has routes to {peers:?} only after 15 s",
                    node.name
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        cluster
    }

    /// Node `i` (0, 1 or 2).
    pub fn node(&self, i: usize) -> &ClusterNode {
        &self.nodes[i]
    }

    /// Client URL of node `i`.
    pub fn url(&self, i: usize) -> String {
        self.nodes[i].url()
    }

    /// Every node's client URL, comma-separated, node `first` first and the others after it in
    /// order: what a client attached to node `first` with the rest as fallbacks is given.
    pub fn urls_preferring(&self, first: usize) -> String {
        std::iter::once(first)
            .chain((0..NODES).filter(|&j| j != first))
            .map(|j| self.url(j))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Kills node `i` now (SIGKILL, as a crash would); the others keep running.
    pub fn kill(&mut self, i: usize) {
        self.nodes[i].kill();
    }

    /// `GET http://127.0.0.1:<monitor port of node i><path>` as JSON, e.g. `/connz`.
    ///
    /// # Panics
    /// When the node does not answer with 200 and JSON (e.g. it was killed).
    pub fn monitor(&self, i: usize, path: &str) -> Value {
        let node = &self.nodes[i];
        let body = http_get(node.monitor_port, path)
            .unwrap_or_else(|err| panic!("GET {path} on {}: {err}", node.name));
        serde_json::from_str(&body)
            .unwrap_or_else(|err| panic!("GET {path} on {}: not JSON: {err}", node.name))
    }

    /// Names of the client connections on node `i` (from `/connz`; unnamed ones are `""`).
    pub fn connection_names(&self, i: usize) -> Vec<String> {
        self.monitor(i, "/connz")["connections"]
            .as_array()
            .map(|connections| {
                connections
                    .iter()
                    .map(|c| c["name"].as_str().unwrap_or_default().to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Names of the nodes node `i` has routes to (from `/routez`; nats-server 2.10 pools
    /// several route connections per peer, so this counts peers, not connections).
    pub fn route_peers(&self, i: usize) -> Vec<String> {
        let Ok(body) = http_get(self.nodes[i].monitor_port, "/routez") else {
            return Vec::new();
        };
        let routez: Value = serde_json::from_str(&body).unwrap_or_default();
        peers(&routez, |_| true)
    }

    /// Names of the nodes whose routes to node `i` carry interest in `subject` (a plain or
    /// queue subscription of some client of theirs), from `/routez?subs=1`: where node `i`
    /// can route a message published on `subject`.
    pub fn remote_interest(&self, i: usize, subject: &str) -> Vec<String> {
        let routez = self.monitor(i, "/routez?subs=1");
        peers(&routez, |route| {
            route["subscriptions_list"]
                .as_array()
                .is_some_and(|subs| subs.iter().any(|s| s.as_str() == Some(subject)))
        })
    }
}

/// The remote names of the routes in a `/routez` document that `keep` accepts, sorted, each
/// once.
fn peers(routez: &Value, keep: impl Fn(&Value) -> bool) -> Vec<String> {
    let mut peers: Vec<String> = routez["routes"]
        .as_array()
        .map(|routes| {
            routes
                .iter()
                .filter(|r| keep(r))
                .filter_map(|r| r["remote_name"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    peers.sort();
    peers.dedup();
    peers
}

impl Drop for NatsCluster {
    fn drop(&mut self) {
        for node in &mut self.nodes {
            node.kill();
        }
        let _ = std::fs::remove_dir_all(&self.store);
    }
}

/// `n` distinct free loopback ports: all bound at once, then released.
fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<TcpListener> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").expect("a free loopback port"))
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().expect("local addr").port())
        .collect()
}

/// A minimal HTTP/1.0 GET on 127.0.0.1 (nats-server's monitoring answers it and closes):
/// the body of a 200 response.
fn http_get(port: u16, path: &str) -> std::io::Result<String> {
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(1))?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response.split_once("\r\n\r\n").ok_or_else(|| {
        std::io::Error::new(std::io::ErrorKind::InvalidData, "no end of HTTP headers")
    })?;
    let status_ok = head
        .lines()
        .next()
        .is_some_and(|line| line.split_whitespace().nth(1) == Some("200"));
    if !status_ok {
        return Err(std::io::Error::other(format!(
            "HTTP {}",
            head.lines().next().unwrap_or_default()
        )));
    }
    Ok(body.to_owned())
}

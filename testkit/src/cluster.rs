//! A three-node NATS cluster of real `nats-server` processes on loopback, started from the
//! repository's own configs (`nats/cluster/n{1,2,3}.conf`) with every port overridden.
//!
//! Nodes are numbered 0, 1, 2 here (servers `n1`, `n2`, `n3` in the configs). The configs enable
//! JetStream; each node gets its own store directory (`-sd`) in a temporary directory removed
//! when the cluster is dropped. A node can be killed (`kill -9`), stopped (SIGTERM, nats-server's
//! clean shutdown) and restarted on the same ports and store, and the JetStream meta group read
//! from its monitoring port ([`NatsCluster::meta`]).

use std::ffi::OsString;
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
    /// The `nats-server` arguments it was started with (and is restarted with).
    args: Vec<OsString>,
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

    /// SIGTERM, then waits for the process to exit (SIGKILL after `grace`).
    fn stop(&mut self, grace: Duration) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        let sent = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .is_ok_and(|s| s.success());
        let deadline = Instant::now() + grace;
        while sent && Instant::now() < deadline {
            if let Ok(Some(_)) = child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }

    fn spawn(&mut self) {
        assert!(self.child.is_none(), "{} is running", self.name);
        let child = Command::new(nats_server_bin())
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("nats-server starts");
        self.child = Some(child);
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
    /// accepts clients and has routes to both others, and they agree on a JetStream meta
    /// leader (until then JetStream cannot create a stream).
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
            let mut args: Vec<OsString> = vec!["-c".into(), config.into()];
            for arg in [
                "-a",
                "127.0.0.1",
                "-p",
                &port.to_string(),
                "-m",
                &monitor_port.to_string(),
                "--cluster",
                &format!("nats://127.0.0.1:{route_port}"),
                "--routes",
                &routes,
                "-sd",
            ] {
                args.push(arg.into());
            }
            args.push(cluster.store.join(format!("n{}", i + 1)).into());
            let mut node = ClusterNode {
                child: None,
                args,
                name: format!("n{}", i + 1),
                port,
                monitor_port,
                route_port,
            };
            node.spawn();
            cluster.nodes.push(node);
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
        while cluster.meta_leader().is_none() {
            assert!(
                Instant::now() < deadline,
                "no JetStream meta leader after 15 s"
            );
            std::thread::sleep(Duration::from_millis(50));
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

    /// Stops node `i` as an operator would for a restart: SIGTERM (nats-server closes its
    /// clients and routes and flushes its store), waiting at most 10 s for it to exit.
    pub fn stop(&mut self, i: usize) {
        self.nodes[i].stop(Duration::from_secs(10));
    }

    /// Starts node `i` again, killed or stopped, on its ports and store directory, and waits
    /// (at most 15 s) until it accepts clients and has routes to both others.
    ///
    /// # Panics
    /// When node `i` is running, or does not come back in time.
    pub fn restart(&mut self, i: usize) {
        self.nodes[i].spawn();
        let deadline = Instant::now() + Duration::from_secs(15);
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], self.nodes[i].port)),
            Duration::from_secs(15),
        );
        while self.route_peers(i).len() < NODES - 1 {
            assert!(
                Instant::now() < deadline,
                "{} has no routes to both others 15 s after its restart",
                self.nodes[i].name
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The JetStream meta group as node `i` sees it (`/jsz`'s `meta_cluster`); `None` while the
    /// node does not answer.
    pub fn meta(&self, i: usize) -> Option<MetaGroup> {
        let body = http_get(self.nodes[i].monitor_port, "/jsz").ok()?;
        let jsz: Value = serde_json::from_str(&body).ok()?;
        let meta = &jsz["meta_cluster"];
        let replicas = meta["replicas"].as_array().map_or_else(Vec::new, |peers| {
            peers
                .iter()
                .map(|p| MetaPeer {
                    name: p["name"].as_str().unwrap_or_default().to_owned(),
                    current: p["current"].as_bool().unwrap_or(false),
                    offline: p["offline"].as_bool().unwrap_or(false),
                })
                .collect()
        });
        Some(MetaGroup {
            leader: meta["leader"].as_str().unwrap_or_default().to_owned(),
            cluster_size: meta["cluster_size"].as_u64().unwrap_or(0) as usize,
            replicas,
        })
    }

    /// The index of the node named `name` (`n1` is 0).
    pub fn index_of(&self, name: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.name == name)
    }

    /// The JetStream meta leader's index, as the running nodes agree on it; `None` while they
    /// do not (an election in progress), none runs, or the one they name is not running (they
    /// have not noticed yet).
    pub fn meta_leader(&self) -> Option<usize> {
        let mut leaders = (0..NODES)
            .filter(|&i| self.nodes[i].is_running())
            .map(|i| self.meta(i).map(|m| m.leader));
        let first = leaders.next()??;
        if first.is_empty() || !leaders.all(|l| l.as_deref() == Some(first.as_str())) {
            return None;
        }
        self.index_of(&first)
            .filter(|&i| self.nodes[i].is_running())
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

/// The JetStream meta group as one node sees it (`/jsz`'s `meta_cluster`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaGroup {
    /// The leader's server name; empty while there is none.
    pub leader: String,
    /// The nodes the group counts (`cluster_size`).
    pub cluster_size: usize,
    /// The other members as this node knows them (itself excluded).
    pub replicas: Vec<MetaPeer>,
}

/// A member of the meta group, as another node sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetaPeer {
    /// Its server name.
    pub name: String,
    /// Up to date with the leader's log.
    pub current: bool,
    /// Seen as gone.
    pub offline: bool,
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
pub(crate) fn free_ports(n: usize) -> Vec<u16> {
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
pub(crate) fn http_get(port: u16, path: &str) -> std::io::Result<String> {
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

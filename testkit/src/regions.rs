//! Two NATS regions joined by NATS gateways (a supercluster): one real `nats-server` per region
//! on loopback, started from the repository's own configs (`nats/regions/region-a.conf`,
//! `region-b.conf`) with every port rewritten to a free one; and on demand an edge site's server,
//! a leaf node of region A (`nats/regions/edge-leaf.conf`, [`Supercluster::start_edge`]).
//!
//! nats-server has no command-line flag for gateway ports, so the configs are copied into a
//! temporary directory (removed on drop) with each `127.0.0.1:<port>` of theirs replaced; nothing
//! else in them changes.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::cluster::{free_ports, http_get};
use crate::{nats_server_bin, repo_root, wait_for_port};

/// The ports the region configs name (client, monitoring, gateway, leaf nodes of A; client,
/// monitoring, gateway of B; client, monitoring of the edge), each rewritten to a free one.
const CONFIG_PORTS: [u16; 9] = [4231, 8231, 7231, 7431, 4232, 8232, 7232, 4233, 8233];

/// One region of a [`Supercluster`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Region {
    /// Gateway `A` (`nats/regions/region-a.conf`), which also takes leaf nodes.
    A,
    /// Gateway `B` (`nats/regions/region-b.conf`).
    B,
    /// The edge site: a leaf node of A (`nats/regions/edge-leaf.conf`), in no gateway.
    Edge,
}

impl Region {
    /// Its gateway (cluster) name: `A` or `B`; `edge` for the edge site.
    pub fn name(self) -> &'static str {
        match self {
            Region::A => "A",
            Region::B => "B",
            Region::Edge => "edge",
        }
    }

    /// The other region of the gateway pair (the edge's hub is A).
    pub fn other(self) -> Region {
        match self {
            Region::A => Region::B,
            Region::B | Region::Edge => Region::A,
        }
    }

    fn index(self) -> usize {
        match self {
            Region::A => 0,
            Region::B => 1,
            Region::Edge => 2,
        }
    }

    /// (config file, its client port, its monitoring port) in the repository.
    fn config(self) -> (&'static str, u16, u16) {
        match self {
            Region::A => ("region-a.conf", 4231, 8231),
            Region::B => ("region-b.conf", 4232, 8232),
            Region::Edge => ("edge-leaf.conf", 4233, 8233),
        }
    }
}

/// One region's server.
struct RegionServer {
    child: Child,
    /// Client port on 127.0.0.1.
    port: u16,
    /// Monitoring port on 127.0.0.1.
    monitor_port: u16,
}

/// The two regions' `nats-server` processes (and the edge's, once started), killed when dropped.
pub struct Supercluster {
    servers: Vec<RegionServer>,
    ports: HashMap<u16, u16>,
    dir: PathBuf,
}

impl Supercluster {
    /// Starts both regions on free loopback ports and waits (at most 15 s) until each accepts
    /// clients and has its outbound and inbound gateway connections to the other.
    ///
    /// # Panics
    /// When a server does not start or the gateways do not connect in time.
    pub fn start() -> Supercluster {
        let free = free_ports(CONFIG_PORTS.len());
        let ports: HashMap<u16, u16> = CONFIG_PORTS.iter().copied().zip(free).collect();
        let dir = std::env::temp_dir().join(format!(
            "embatch-regions-{}-{}",
            std::process::id(),
            ports[&CONFIG_PORTS[0]]
        ));
        std::fs::create_dir_all(&dir).expect("create the supercluster's config directory");
        let mut supercluster = Supercluster {
            servers: Vec::with_capacity(3),
            ports,
            dir,
        };
        supercluster.spawn(Region::A);
        supercluster.spawn(Region::B);
        let deadline = Instant::now() + Duration::from_secs(15);
        for region in [Region::A, Region::B] {
            wait_for_port(
                SocketAddr::from(([127, 0, 0, 1], supercluster.server(region).port)),
                Duration::from_secs(15),
            );
            while !supercluster.gateway_connected(region) {
                assert!(
                    Instant::now() < deadline,
                    "region {}: no gateway connections to {} after 15 s",
                    region.name(),
                    region.other().name()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        supercluster
    }

    /// Starts the edge site's server, a leaf node of region A, and waits (at most 15 s) until
    /// it accepts clients and A counts its leaf connection (`/leafz`).
    ///
    /// # Panics
    /// When it runs already, does not start, or does not connect in time.
    pub fn start_edge(&mut self) {
        assert_eq!(self.servers.len(), 2, "the edge runs already");
        self.spawn(Region::Edge);
        wait_for_port(
            SocketAddr::from(([127, 0, 0, 1], self.server(Region::Edge).port)),
            Duration::from_secs(15),
        );
        let deadline = Instant::now() + Duration::from_secs(15);
        while self
            .monitor(Region::A, "/leafz")
            .and_then(|leafz| leafz["leafnodes"].as_u64())
            .unwrap_or(0)
            == 0
        {
            assert!(
                Instant::now() < deadline,
                "the edge is no leaf node of A after 15 s"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Writes `region`'s config with the free ports and starts its server.
    fn spawn(&mut self, region: Region) {
        let (file, port, monitor_port) = region.config();
        let source = repo_root().join("nats").join("regions").join(file);
        let text = std::fs::read_to_string(&source)
            .unwrap_or_else(|err| panic!("read {}: {err}", source.display()));
        for named in [port, monitor_port] {
            assert!(
                text.contains(&format!("127.0.0.1:{named}")),
                "{file} no longer listens on 127.0.0.1:{named}: update CONFIG_PORTS"
            );
        }
        let config = self.dir.join(file);
        std::fs::write(&config, rewrite_ports(&text, &self.ports)).expect("write the config");
        let child = spawn(&config);
        self.servers.push(RegionServer {
            child,
            port: self.ports[&port],
            monitor_port: self.ports[&monitor_port],
        });
    }

    fn server(&self, region: Region) -> &RegionServer {
        self.servers
            .get(region.index())
            .unwrap_or_else(|| panic!("region {} is not started", region.name()))
    }

    /// `nats://127.0.0.1:<client port>` of `region`'s server.
    pub fn url(&self, region: Region) -> String {
        format!("nats://127.0.0.1:{}", self.server(region).port)
    }

    /// `GET <path>` on `region`'s monitoring port, as JSON; `None` while it does not answer.
    pub fn monitor(&self, region: Region, path: &str) -> Option<Value> {
        let body = http_get(self.server(region).monitor_port, path).ok()?;
        serde_json::from_str(&body).ok()
    }

    /// Whether `region`'s server has both an outbound and an inbound gateway connection to the
    /// other region (`/gatewayz`).
    pub fn gateway_connected(&self, region: Region) -> bool {
        let Some(gatewayz) = self.monitor(region, "/gatewayz") else {
            return false;
        };
        let other = region.other().name();
        gatewayz["outbound_gateways"].get(other).is_some()
            && gatewayz["inbound_gateways"]
                .get(other)
                .and_then(Value::as_array)
                .is_some_and(|connections| !connections.is_empty())
    }

    /// How many client connections called `name` on `region`'s server subscribe to `subject`
    /// (`/connz?subs=1`; a queue subscription counts).
    pub fn local_subscribers(&self, region: Region, name: &str, subject: &str) -> usize {
        let Some(connz) = self.monitor(region, "/connz?subs=1") else {
            return 0;
        };
        connz["connections"].as_array().map_or(0, |connections| {
            connections
                .iter()
                .filter(|c| c["name"].as_str() == Some(name))
                .filter(|c| {
                    c["subscriptions_list"]
                        .as_array()
                        .is_some_and(|subs| subs.iter().any(|s| s.as_str() == Some(subject)))
                })
                .count()
        })
    }
}

impl Drop for Supercluster {
    fn drop(&mut self) {
        for server in &mut self.servers {
            let _ = server.child.kill();
            let _ = server.child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn spawn(config: &Path) -> Child {
    Command::new(nats_server_bin())
        .arg("-c")
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("nats-server starts")
}

/// `text` with every `127.0.0.1:<port>` whose port is a key of `ports` given the mapped port
/// instead (one pass, so a new port is never rewritten again).
fn rewrite_ports(text: &str, ports: &HashMap<u16, u16>) -> String {
    const HOST: &str = "127.0.0.1:";
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(HOST) {
        let (before, after) = rest.split_at(at + HOST.len());
        out.push_str(before);
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        let (port, tail) = after.split_at(digits);
        match port.parse::<u16>().ok().and_then(|p| ports.get(&p)) {
            Some(new) => out.push_str(&new.to_string()),
            None => out.push_str(port),
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_each_port_once() {
        let ports = HashMap::from([(4231, 42310), (42310, 1)]);
        let text =
            "listen: 127.0.0.1:4231\nurls: [\"nats://127.0.0.1:42310\"]\nhttp: 127.0.0.1:9\n";
        assert_eq!(
            rewrite_ports(text, &ports),
            "listen: 127.0.0.1:42310\nurls: [\"nats://127.0.0.1:1\"]\nhttp: 127.0.0.1:9\n"
        );
    }
}

//! [`OptionalAddr`]: a socket address flag that an empty value turns off.

use std::net::SocketAddr;
use std::str::FromStr;

/// A listen address that may be turned off with an empty value (`--metrics-addr ""`), parsed by
/// clap at start-up so a typo fails there, naming the flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OptionalAddr(pub Option<SocketAddr>);

impl FromStr for OptionalAddr {
    type Err = std::net::AddrParseError;

    /// `""` (or only spaces) → off; else `HOST:PORT` with an IP host, e.g. `0.0.0.0:9091`.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        if s.is_empty() {
            return Ok(OptionalAddr(None));
        }
        s.parse().map(|addr| OptionalAddr(Some(addr)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn empty_is_off_and_a_bad_address_is_an_error() {
        assert_eq!("".parse(), Ok(OptionalAddr(None)));
        assert_eq!(" ".parse(), Ok(OptionalAddr(None)));
        let on: OptionalAddr = "127.0.0.1:9091".parse().expect("valid");
        assert_eq!(on.0.map(|a| a.port()), Some(9091));
        assert!("localhost:9091".parse::<OptionalAddr>().is_err());
        assert!("127.0.0.1".parse::<OptionalAddr>().is_err());
    }
}

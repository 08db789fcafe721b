//! The cache ([`embatch_cache`]: single-flight de-duplication, the in-process LRU and the shared
//! JetStream KV bucket). The intake plans each request through it; `serve` starts it with the
//! worker's connection, its [`CacheConfig`] (from [`crate::Config::cache`]) and the upstream's
//! `/info`.

pub use embatch_cache::CacheConfig;
pub(crate) use embatch_cache::{Answered, Cache, Plan, Stash, Usage};

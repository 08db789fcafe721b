//! The batcher: turns many small requests into few full upstream calls.

mod backend;
mod embedding;
mod load;
pub mod names;

pub use backend::{Backend, UpstreamError};
pub use embedding::{Embedding, ShapeError};
pub use load::{Load, STALL_CALLS, STALL_MIN};

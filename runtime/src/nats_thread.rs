//! A NATS connection whose socket is read and written on a thread of its own
//! ([`NatsArgs::connect_on_own_thread`]), for a process that must see each message as soon as it
//! is read: the worker, whose intake bounds the bytes it holds.
//!
//! Why: async-nats reads the socket in one task that parses every message it can (until the
//! socket would block, or until tokio's budget of 128 reads per poll is spent) and hands each to
//! its subscription's channel. The task it wakes, the worker's intake, is put in the waking
//! thread's LIFO slot, which other threads do not steal from: it runs only once the reader
//! yields. Under a burst of large requests the reader so takes in dozens of them before the
//! intake can refuse one, each pinning a read buffer of up to twice its size. With the
//! connection on its own thread, the wake crosses runtimes and the intake runs beside the
//! reader. Measured in docs/design/large-inputs.md.

use std::sync::{Arc, Mutex, PoisonError};

use async_nats::{ConnectOptions, Event};
use tokio::sync::oneshot;

use crate::{NatsArgs, NatsError};

impl NatsArgs {
    /// Connects as [`NatsArgs::connect`] does, with the connection's reader, writer, pings and
    /// reconnects run by a single-threaded tokio runtime on a thread of its own
    /// (`nats-connection`). The thread ends when the connection closes for good: once every
    /// handle of the client (and its subscribers) is dropped. `options`' event callback is
    /// replaced by the one that watches for that.
    ///
    /// # Errors
    /// As [`NatsArgs::connect`]; [`NatsError::Thread`] when the thread or its runtime cannot be
    /// started.
    pub async fn connect_on_own_thread(
        &self,
        name: &str,
        options: ConnectOptions,
    ) -> Result<async_nats::Client, NatsError> {
        let (closed_tx, closed_rx) = oneshot::channel::<()>();
        let closed_tx = Arc::new(Mutex::new(Some(closed_tx)));
        let options = options.event_callback(move |event| {
            let closed_tx = Arc::clone(&closed_tx);
            async move {
                tracing::debug!(%event, "NATS connection event");
                if matches!(event, Event::Closed) {
                    let sender = closed_tx
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .take();
                    if let Some(sender) = sender {
                        let _ = sender.send(());
                    }
                }
            }
        });
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(NatsError::Thread)?;
        let (connected_tx, connected_rx) = oneshot::channel();
        let (args, name) = (self.clone(), name.to_owned());
        std::thread::Builder::new()
            .name("nats-connection".into())
            .spawn(move || {
                runtime.block_on(async move {
                    let connected = args.connect(&name, options).await;
                    let ok = connected.is_ok();
                    if connected_tx.send(connected).is_ok() && ok {
                        // The connection's tasks run here until it is closed.
                        let _ = closed_rx.await;
                    }
                });
            })
            .map_err(NatsError::Thread)?;
        connected_rx.await.map_err(|_| {
            NatsError::Thread(std::io::Error::other(
                "the NATS connection's thread stopped before it connected",
            ))
        })?
    }
}

//! Loopback networking for tests: a free port, and a round-robin front
//! standing in for a Service in front of several replicas.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use anyhow::Result;

/// A loopback port nothing listens on now.
pub fn free_port() -> Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0")?;
    Ok(l.local_addr()?.port())
}

/// Forwards the connections `listener` accepts to the loopback ports
/// `backends` in turn (a Service in front of the replicas); returns the
/// count of connections each backend got.
pub fn round_robin(listener: tokio::net::TcpListener, backends: Vec<u16>) -> Arc<Vec<AtomicUsize>> {
    let counts = Arc::new(
        backends
            .iter()
            .map(|_| AtomicUsize::new(0))
            .collect::<Vec<_>>(),
    );
    let seen = counts.clone();
    tokio::spawn(async move {
        let mut next = 0usize;
        while let Ok((mut inbound, _)) = listener.accept().await {
            let i = next % backends.len();
            next += 1;
            seen[i].fetch_add(1, Ordering::SeqCst);
            let backend = backends[i];
            tokio::spawn(async move {
                if let Ok(mut outbound) =
                    tokio::net::TcpStream::connect(("127.0.0.1", backend)).await
                {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    counts
}

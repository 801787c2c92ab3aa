//! Captures the operator's log output in-process, at trace level for every
//! target (what `RUST_LOG=trace` prints), formatted as the operator's
//! text logs are, so a test can search it.
//!
//! The process-wide subscriber ([`init`]) always prints to the test
//! writer under `WASMOP_LOG` (default `wasmop=info`); while a
//! [`Capture`] is alive it also records every event of every level and
//! target. Tests of one binary share the process, so a capture also holds
//! what concurrently running tests logged.

use std::io::Write;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use tracing_subscriber::filter::{EnvFilter, FilterFn};
use tracing_subscriber::fmt::MakeWriter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

static CAPTURING: AtomicUsize = AtomicUsize::new(0);
static BUFFER: Mutex<Vec<u8>> = Mutex::new(Vec::new());

#[derive(Clone, Copy)]
struct BufferWriter;

impl Write for BufferWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        BUFFER.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> MakeWriter<'a> for BufferWriter {
    type Writer = BufferWriter;

    fn make_writer(&'a self) -> Self::Writer {
        *self
    }
}

/// Installs the process-wide subscriber once.
pub fn init() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let printed = fmt::layer().with_test_writer().with_filter(
            EnvFilter::try_from_env("WASMOP_LOG").unwrap_or_else(|_| "wasmop=info".into()),
        );
        let captured = fmt::layer()
            .with_writer(BufferWriter)
            .with_ansi(false)
            .with_filter(FilterFn::new(|_| CAPTURING.load(Ordering::SeqCst) > 0));
        let _ = tracing_subscriber::registry()
            .with(printed)
            .with(captured)
            .try_init();
    });
}

/// Records every log event at every level while alive.
#[derive(Debug)]
pub struct Capture {
    start: usize,
}

impl Capture {
    /// Starts recording.
    pub fn start() -> Self {
        init();
        let start = BUFFER.lock().expect("log buffer").len();
        CAPTURING.fetch_add(1, Ordering::SeqCst);
        Self { start }
    }

    /// Everything logged since [`Capture::start`].
    pub fn text(&self) -> String {
        let buf = BUFFER.lock().expect("log buffer");
        String::from_utf8_lossy(&buf[self.start.min(buf.len())..]).into_owned()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        CAPTURING.fetch_sub(1, Ordering::SeqCst);
    }
}

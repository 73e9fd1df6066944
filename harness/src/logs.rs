//! Captures the JSON log lines a test produces, in the production format.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// A `MakeWriter` that keeps every log line in memory.
#[derive(Clone, Default)]
pub struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    /// Installs a JSON subscriber writing here for the current thread (tests run on a
    /// current-thread runtime); logging returns to normal when the guard drops.
    pub fn install(&self) -> tracing::subscriber::DefaultGuard {
        let subscriber = tracing_subscriber::fmt()
            .json()
            .with_current_span(true)
            .with_span_list(false)
            // Debug lines too: a secret must not hide below the production level.
            .with_max_level(tracing::Level::DEBUG)
            .with_writer(self.clone())
            .finish();
        // While only one subscriber is registered in the process, tracing asks the
        // *current thread's* default whether a new callsite is of interest
        // (tracing-core's `Rebuilder::JustOne`) and caches the answer for every
        // thread: a callsite first reached by a test that captures nothing would then
        // stay disabled for this one. A second subscriber, registered once and kept,
        // makes tracing ask every live subscriber instead.
        static SECOND: std::sync::OnceLock<tracing::Dispatch> = std::sync::OnceLock::new();
        SECOND.get_or_init(|| tracing::Dispatch::new(tracing::subscriber::NoSubscriber::default()));
        tracing::subscriber::set_default(subscriber)
    }

    pub fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Captured {
    type Writer = Captured;
    fn make_writer(&'a self) -> Self::Writer {
        self.clone()
    }
}

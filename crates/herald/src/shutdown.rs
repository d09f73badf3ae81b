//! Ordered shutdown: the first SIGTERM or Ctrl-C cancels the token every loop watches; a
//! second one exits at once.

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGTERM/SIGINT. The second signal exits the process.
pub fn on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let (Ok(mut term), Ok(mut int)) = (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) else {
            tracing::error!("cannot install signal handlers");
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
            _ = int.recv() => tracing::info!("SIGINT: shutting down"),
        }
        cancel.cancel();
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::warn!("second signal: exiting at once");
        std::process::exit(130);
    });
    token
}

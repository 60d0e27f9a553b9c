//! [`watch`]: reloads a policy file into a [`PolicyHandle`] when it changes.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use notify::{EventKind, RecursiveMode, Watcher};

use super::file::{LoadError, load_file};
use super::handle::PolicyHandle;

/// How long the watcher waits for a file's events to settle before reading it.
const SETTLE: Duration = Duration::from_millis(50);
/// The longest it lets a stream of events postpone a read.
const MAX_SETTLE: Duration = Duration::from_millis(500);

enum Message {
    Changed,
    Stop,
}

/// Stops its watcher when dropped (see [`watch`]).
///
/// See the example on [`watch`].
#[must_use = "the watcher stops when its guard is dropped"]
pub struct WatchGuard {
    stop: Sender<Message>,
    thread: Option<JoinHandle<()>>,
    // Dropped after the thread stopped: no event arrives for a gone handle.
    _watcher: notify::RecommendedWatcher,
}

impl Drop for WatchGuard {
    fn drop(&mut self) {
        let _ = self.stop.send(Message::Stop);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl fmt::Debug for WatchGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WatchGuard").finish_non_exhaustive()
    }
}

/// Reloads the policy file at `path` into `handle` whenever it changes, until the returned
/// guard is dropped.
///
/// The watcher ([`notify`](https://docs.rs/notify): inotify, FSEvents, ...) watches the
/// file's directory, so that it follows the three ways files are replaced: a write in
/// place, a write to a temporary file renamed over it, and a Kubernetes ConfigMap's swap of
/// its `..data` symlink to a new directory. Any event naming the file or `..data` reads the
/// file again, once its events have settled for 50 ms. A file that does not parse, or
/// that the handle refuses, leaves the running policy in place, is counted in
/// [`PolicyHandle::reloads`] (and with `metrics` as
/// `ratewarden_policy_reloads_total{result="error"}`) and, with `tracing`, logged with the
/// reason. A file read unchanged is not stored again.
///
/// The watcher waits on a thread of its own, which sleeps until an event arrives.
///
/// # Errors
///
/// A [`LoadError::Read`] when the directory cannot be watched.
///
/// ```no_run
/// use ratewarden_tower::policy::{PolicyHandle, load_file, watch};
///
/// let handle = PolicyHandle::new(load_file("policy.toml")?)?;
/// let _watching = watch("policy.toml", handle.clone())?; // reloads until dropped
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn watch(path: impl AsRef<Path>, handle: PolicyHandle) -> Result<WatchGuard, LoadError> {
    let path = path.as_ref().to_path_buf();
    let shown = path.display().to_string();
    let read_error = |source: std::io::Error| LoadError::Read {
        file: shown.clone(),
        source,
    };
    let name = path
        .file_name()
        .map(OsString::from)
        .ok_or_else(|| read_error(std::io::Error::other("the path names no file")))?;
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let (send, receive) = mpsc::channel();
    let events = send.clone();
    let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        let Ok(event) = event else {
            return;
        };
        // Reads (our own among them) change nothing.
        if matches!(event.kind, EventKind::Access(_)) {
            return;
        }
        let touches = event.paths.is_empty()
            || event.paths.iter().any(|p| {
                p.file_name()
                    .is_some_and(|n| n == name.as_os_str() || n == "..data")
            });
        if touches {
            let _ = events.send(Message::Changed);
        }
    })
    .map_err(|err| read_error(std::io::Error::other(err)))?;
    watcher
        .watch(&dir, RecursiveMode::NonRecursive)
        .map_err(|err| read_error(std::io::Error::other(err)))?;
    let last = std::fs::read(&path).ok();
    let thread = std::thread::Builder::new()
        .name("ratewarden-policy-watch".into())
        .spawn(move || run(&path, &handle, &receive, last))
        .map_err(read_error)?;
    Ok(WatchGuard {
        stop: send,
        thread: Some(thread),
        _watcher: watcher,
    })
}

/// Waits for changes, lets them settle, and reloads; returns when told to stop.
fn run(
    path: &Path,
    handle: &PolicyHandle,
    receive: &mpsc::Receiver<Message>,
    mut last: Option<Vec<u8>>,
) {
    loop {
        match receive.recv() {
            Ok(Message::Changed) => {}
            Ok(Message::Stop) | Err(_) => return,
        }
        let started = Instant::now();
        loop {
            let left = MAX_SETTLE.saturating_sub(started.elapsed());
            match receive.recv_timeout(SETTLE.min(left)) {
                Ok(Message::Changed) if !left.is_zero() => {}
                Ok(Message::Changed) | Err(RecvTimeoutError::Timeout) => break,
                Ok(Message::Stop) | Err(RecvTimeoutError::Disconnected) => return,
            }
        }
        let Ok(bytes) = std::fs::read(path) else {
            // Gone for a moment (a swap in progress): its next event reads it again.
            continue;
        };
        if last.as_deref() == Some(bytes.as_slice()) {
            continue;
        }
        last = Some(bytes);
        let result = load_file(path).inspect_err(|_| handle.refused());
        let result = result.and_then(|policy| handle.store(policy).map_err(LoadError::Invalid));
        match result {
            Ok(()) => {
                #[cfg(feature = "tracing")]
                tracing::info!(file = %path.display(), version = handle.version(), "policy reloaded");
            }
            Err(err) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(file = %path.display(), error = %err, "policy reload refused; the running policy stays");
                #[cfg(not(feature = "tracing"))]
                let _ = err;
            }
        }
    }
}

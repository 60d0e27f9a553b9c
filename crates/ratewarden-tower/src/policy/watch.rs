//! [`watch`]: reloads a policy file into a [`PolicyHandle`] when it changes.

use std::ffi::OsString;
use std::fmt;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};

use super::definition::Policy;
use super::error::{Location, PolicyError, Problem};
use super::file::{LoadError, parse};
use super::handle::PolicyHandle;

/// How long the watcher waits for a file's events to settle before reading it, and between
/// the two reads that must agree.
const SETTLE: Duration = Duration::from_millis(50);
/// The longest it lets a stream of events postpone a read.
const MAX_SETTLE: Duration = Duration::from_millis(500);

enum Message {
    /// The paths a filesystem event names; none: anything may have changed.
    Event(Vec<PathBuf>),
    Stop,
}

/// Stops its watcher when dropped (see [`watch`]).
///
/// See the example on [`watch`].
#[must_use = "the watcher stops when its guard is dropped"]
pub struct WatchGuard {
    stop: Sender<Message>,
    /// Owns the filesystem watcher, and drops it as it returns.
    thread: Option<JoinHandle<()>>,
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
/// its `..data` symlink to a new directory. It also watches the directory above, so that a
/// directory replaced by a new one (renamed over, or removed and made again) is watched
/// again, and, when the file is a symlink into another directory, that directory, found
/// again after every change. Any event naming the file reads it again, once its events have
/// settled for 50 ms, and only once two reads 50 ms apart agree.
///
/// The first read happens when the watcher starts, so that a change made after the file was
/// loaded is not missed; a policy equal to the running one is not stored again, nor is a
/// file read unchanged.
///
/// A file that is empty (or blank), that does not parse, or that the handle refuses leaves
/// the running policy in place, is counted in [`PolicyHandle::reloads`] (and with `metrics`
/// as `ratewarden_policy_reloads_total{result="error"}`) and, with `tracing`, logged with the
/// reason.
///
/// **Write the whole file at once, or write another file and rename it over this one.** A
/// write in place that pauses longer than the reads' 50 ms is read in between: an empty file
/// is refused, but a file cut at a rule boundary is a valid, smaller policy, and is loaded.
///
/// The watcher waits on a thread of its own, which sleeps until an event arrives.
///
/// # Errors
///
/// A [`LoadError::Read`] when the file's directory cannot be watched.
///
/// ```no_run
/// use ratewarden_tower::policy::{PolicyHandle, load_file, watch};
///
/// let handle = PolicyHandle::new(load_file("policy.toml")?)?;
/// let _watching = watch("policy.toml", handle.clone())?; // reloads until dropped
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub fn watch(path: impl AsRef<Path>, handle: PolicyHandle) -> Result<WatchGuard, LoadError> {
    let given = path.as_ref();
    let shown = given.display().to_string();
    let read_error = |source: std::io::Error| LoadError::Read {
        file: shown.clone(),
        source,
    };
    let path = std::path::absolute(given).map_err(read_error)?;
    let (Some(name), Some(dir)) = (path.file_name(), path.parent()) else {
        return Err(read_error(std::io::Error::other("the path names no file")));
    };
    let (name, dir) = (name.to_owned(), dir.to_path_buf());
    let (send, receive) = mpsc::channel();
    let events = send.clone();
    let watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
        match event {
            // Reads (our own among them) change nothing.
            Ok(event) if matches!(event.kind, EventKind::Access(_)) => {}
            Ok(event) => {
                let _ = events.send(Message::Event(event.paths));
            }
            Err(_err) => {
                #[cfg(feature = "tracing")]
                tracing::warn!(error = %_err, "policy file watcher error");
            }
        }
    })
    .map_err(|err| read_error(std::io::Error::other(err)))?;
    let mut watched = Watched {
        watcher,
        path,
        parent: dir.parent().map(Path::to_path_buf),
        names: vec![name, OsString::from("..data")],
        dir,
        target_dir: None,
    };
    watched
        .watcher
        .watch(&watched.dir, RecursiveMode::NonRecursive)
        .map_err(|err| read_error(std::io::Error::other(err)))?;
    if let Some(parent) = &watched.parent {
        // Without it, a replaced directory goes unnoticed; the file is still watched.
        if let Err(_err) = watched.watcher.watch(parent, RecursiveMode::NonRecursive) {
            #[cfg(feature = "tracing")]
            tracing::debug!(dir = %parent.display(), error = %_err, "cannot watch the policy file's parent directory");
        }
    }
    watched.resolve(false);
    let file: Arc<str> = Arc::from(shown.as_str());
    let thread = std::thread::Builder::new()
        .name("ratewarden-policy-watch".into())
        .spawn(move || run(watched, &file, &handle, &receive))
        .map_err(read_error)?;
    Ok(WatchGuard {
        stop: send,
        thread: Some(thread),
    })
}

/// The directories watched for one policy file, and which of their events concern it.
struct Watched {
    watcher: RecommendedWatcher,
    /// The file, absolute (symlinks not resolved).
    path: PathBuf,
    /// Its directory.
    dir: PathBuf,
    /// The directory above, watched to see `dir` replaced.
    parent: Option<PathBuf>,
    /// The directory the file resolves into, when neither `dir` nor `parent` is it.
    target_dir: Option<PathBuf>,
    /// Names whose events concern the file: its own, `..data`, its target's.
    names: Vec<OsString>,
}

/// What the events since the last read said.
#[derive(Default)]
struct Batch {
    /// The file may have changed.
    changed: bool,
    /// `dir` was moved, removed or made: watch it again.
    dir_moved: bool,
    /// The target's directory was moved or removed: find it again.
    target_moved: bool,
    /// Events were lost: watch everything again.
    rescan: bool,
}

impl Watched {
    /// Notes in `batch` what the event naming `paths` says; whether it concerns the file.
    fn note(&self, paths: &[PathBuf], batch: &mut Batch) -> bool {
        if paths.is_empty() {
            batch.rescan = true;
        }
        let mut concerns = paths.is_empty();
        for path in paths {
            if *path == self.dir {
                batch.dir_moved = true;
            } else if self.target_dir.as_ref() == Some(path) {
                batch.target_moved = true;
            } else if !path
                .file_name()
                .is_some_and(|name| self.names.iter().any(|n| n == name))
            {
                continue;
            }
            concerns = true;
        }
        batch.changed |= concerns;
        concerns
    }

    /// Watches again what `batch` says was replaced, and finds the file's target again.
    fn refresh(&mut self, batch: &Batch) {
        if batch.dir_moved || batch.rescan {
            // The old watch may be gone with the old directory.
            let _ = self.watcher.unwatch(&self.dir);
            if let Err(_err) = self.watcher.watch(&self.dir, RecursiveMode::NonRecursive) {
                // Not there yet: its parent's event for the new one comes back here.
                #[cfg(feature = "tracing")]
                tracing::debug!(dir = %self.dir.display(), error = %_err, "cannot watch the policy file's directory yet");
            }
        }
        self.resolve(batch.target_moved || batch.rescan);
    }

    /// Resolves the file's symlinks, and watches the directory it resolves into when that is
    /// another one (or, with `again`, the same one again). A file that does not resolve
    /// (gone for a moment) keeps what is watched.
    fn resolve(&mut self, again: bool) {
        let Ok(target) = std::fs::canonicalize(&self.path) else {
            return;
        };
        let (Some(target_dir), Some(target_name)) = (target.parent(), target.file_name()) else {
            return;
        };
        self.names.truncate(2);
        if self.names[0] != target_name {
            self.names.push(target_name.to_owned());
        }
        let seen = [Some(&self.dir), self.parent.as_ref()]
            .into_iter()
            .flatten()
            .any(|dir| std::fs::canonicalize(dir).is_ok_and(|dir| dir == target_dir));
        let wanted = (!seen).then(|| target_dir.to_path_buf());
        if wanted == self.target_dir && !again {
            return;
        }
        if let Some(old) = self.target_dir.take() {
            let _ = self.watcher.unwatch(&old);
        }
        if let Some(wanted) = wanted {
            match self.watcher.watch(&wanted, RecursiveMode::NonRecursive) {
                Ok(()) => self.target_dir = Some(wanted),
                Err(_err) => {
                    #[cfg(feature = "tracing")]
                    tracing::warn!(dir = %wanted.display(), error = %_err, "cannot watch the directory the policy file links into");
                }
            }
        }
    }
}

/// Reads the file once, then waits for changes, lets them settle, and reloads; returns when
/// told to stop, dropping the watcher.
fn run(mut watched: Watched, file: &str, handle: &PolicyHandle, receive: &Receiver<Message>) {
    // `None` until the first read, which compares the policy with the running one.
    let mut last: Option<Vec<u8>> = None;
    let mut batch = Batch {
        changed: true,
        ..Batch::default()
    };
    loop {
        while !batch.changed {
            match receive.recv() {
                Ok(Message::Event(paths)) => {
                    watched.note(&paths, &mut batch);
                }
                Ok(Message::Stop) | Err(_) => return,
            }
        }
        if settle(receive, &watched, &mut batch).is_break() {
            return;
        }
        watched.refresh(&batch);
        batch = Batch::default();
        // Events during the reads are kept in `batch` for the next round.
        let bytes = match read_stable(&watched, receive, &mut batch) {
            ControlFlow::Break(()) => return,
            // Gone for a moment (a swap in progress): its next event reads it again.
            ControlFlow::Continue(None) => continue,
            ControlFlow::Continue(Some(bytes)) => bytes,
        };
        if last.as_deref() == Some(bytes.as_slice()) {
            continue;
        }
        let first = last.is_none();
        reload(file, &bytes, handle, first);
        last = Some(bytes);
    }
}

/// Waits until no event concerning the file came for [`SETTLE`], or [`MAX_SETTLE`] passed.
fn settle(receive: &Receiver<Message>, watched: &Watched, batch: &mut Batch) -> ControlFlow<()> {
    let started = Instant::now();
    let mut quiet_since = started;
    loop {
        let until = (quiet_since + SETTLE).min(started + MAX_SETTLE);
        let Some(wait) = until.checked_duration_since(Instant::now()) else {
            return ControlFlow::Continue(());
        };
        match receive.recv_timeout(wait) {
            Ok(Message::Event(paths)) => {
                if watched.note(&paths, batch) {
                    quiet_since = Instant::now();
                }
            }
            Err(RecvTimeoutError::Timeout) => return ControlFlow::Continue(()),
            Ok(Message::Stop) | Err(RecvTimeoutError::Disconnected) => {
                return ControlFlow::Break(());
            }
        }
    }
}

/// The file's contents once two reads [`SETTLE`] apart agree; `None` when it cannot be read.
fn read_stable(
    watched: &Watched,
    receive: &Receiver<Message>,
    batch: &mut Batch,
) -> ControlFlow<(), Option<Vec<u8>>> {
    let Ok(mut bytes) = std::fs::read(&watched.path) else {
        return ControlFlow::Continue(None);
    };
    loop {
        let until = Instant::now() + SETTLE;
        while let Some(wait) = until.checked_duration_since(Instant::now()) {
            match receive.recv_timeout(wait) {
                Ok(Message::Event(paths)) => {
                    watched.note(&paths, batch);
                }
                Err(RecvTimeoutError::Timeout) => break,
                Ok(Message::Stop) | Err(RecvTimeoutError::Disconnected) => {
                    return ControlFlow::Break(());
                }
            }
        }
        let Ok(again) = std::fs::read(&watched.path) else {
            return ControlFlow::Continue(None);
        };
        if again == bytes {
            return ControlFlow::Continue(Some(bytes));
        }
        bytes = again;
    }
}

/// Why a file read was not stored.
enum Refused {
    /// Empty or blank: a file truncated by a write still in progress, most likely.
    Empty,
    Load(LoadError),
}

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Empty => f.write_str("the file is empty (a write in progress?)"),
            Self::Load(err) => err.fmt(f),
        }
    }
}

/// Parses `bytes` and stores the policy in `handle`, or counts and logs why not. `first`:
/// the handle's policy may not be `bytes`' (the file changed since it was loaded, or not),
/// so an equal policy is not stored again.
fn reload(file: &str, bytes: &[u8], handle: &PolicyHandle, first: bool) {
    let result = read_policy(file, bytes)
        .inspect_err(|_| handle.refused())
        .and_then(|policy| {
            if first && same_policy(&policy, &handle.policy()) {
                return Ok(false);
            }
            handle
                .store(policy)
                .map(|()| true)
                .map_err(|err| Refused::Load(LoadError::Invalid(err)))
        });
    #[cfg(feature = "tracing")]
    match result {
        Ok(true) => tracing::info!(file, version = handle.version(), "policy reloaded"),
        Ok(false) => tracing::debug!(file, "policy file read: the same policy as the running one"),
        Err(refused) => {
            tracing::warn!(file, error = %refused, "policy reload refused; the running policy stays");
        }
    }
    #[cfg(not(feature = "tracing"))]
    let _ = result;
}

/// The policy in `bytes`, the contents of `file`.
fn read_policy(file: &str, bytes: &[u8]) -> Result<Policy, Refused> {
    let content = bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes);
    if content.iter().all(u8::is_ascii_whitespace) {
        return Err(Refused::Empty);
    }
    let text = std::str::from_utf8(bytes).map_err(|err| {
        // The line of the first byte that is not UTF-8, as `load_file` names it.
        let before = &bytes[..err.valid_up_to()];
        let line = 1 + before.iter().filter(|&&b| b == b'\n').count();
        Refused::Load(LoadError::Invalid(PolicyError {
            field: String::new(),
            problem: Problem::Syntax {
                message: "the file is not UTF-8".to_owned(),
            },
            location: Some(Location {
                file: Arc::from(file),
                line,
                column: None,
            }),
        }))
    })?;
    parse(file, text).map_err(Refused::Load)
}

/// Whether two policies mean the same: equal but for where their fields were read from and
/// what their rules have cached.
fn same_policy(a: &Policy, b: &Policy) -> bool {
    let meaning = |policy: &Policy| {
        let mut policy = policy.clone();
        policy.origins = None;
        // Filled by the first request a rule decides; filled in both, it says nothing.
        for rule in policy.rules().iter().chain([policy.default_rule()]) {
            let _ = rule.policy_header();
        }
        format!("{policy:?}")
    };
    meaning(a) == meaning(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_or_blank_file_is_refused() {
        for bytes in [&b""[..], b" \n\t\r\n", b"\xEF\xBB\xBF\n"] {
            assert!(matches!(
                read_policy("policy.toml", bytes),
                Err(Refused::Empty)
            ));
        }
        assert!(read_policy("policy.toml", b"# nothing limited\n").is_ok());
    }

    #[test]
    fn a_file_that_is_not_utf8_names_its_line() {
        let Err(Refused::Load(err)) = read_policy("policy.toml", b"# a\n# \xFF\n") else {
            panic!("not refused");
        };
        let location = err.policy_error().unwrap().location().unwrap();
        assert_eq!((location.file(), location.line()), ("policy.toml", 2));
    }

    #[test]
    fn policies_compare_by_meaning() {
        let text = "[default]\nlimits = [{ name = \"per-ip\", key = \"ip\", quota = \"5/min\" }]\n";
        let read = parse("policy.toml", text).unwrap();
        let moved = parse("policy.toml", &format!("\n\n# moved down\n{text}")).unwrap();
        let _ = read.default_rule().policy_header();
        assert!(same_policy(&read, &moved));
        let other = parse("policy.toml", &text.replace("5/min", "6/min")).unwrap();
        assert!(!same_policy(&read, &other));
    }
}

//! The prepared revisions the cache keeps: listed for `Status` and `kubectl pko fleet` (each one's size measured once:
//! a ready entry does not change), and evicted least recently used first past the cache's budget.

use std::path::Path;
use std::time::SystemTime;

use super::{READY, SourceCache};

/// One cached source (for `Status`).
#[derive(Debug, Clone)]
pub struct CachedEntry {
    /// Cache key.
    pub key: String,
    /// Size on disk in bytes.
    pub size_bytes: u64,
    /// Last use.
    pub last_used: SystemTime,
}

impl SourceCache {
    /// The cached entries, most recently used first.
    pub fn entries(&self) -> Vec<CachedEntry> {
        let mut v: Vec<CachedEntry> = std::fs::read_dir(&self.cfg.root)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.path().join(READY).exists())
            .map(|e| CachedEntry {
                key: e.file_name().to_string_lossy().into_owned(),
                size_bytes: self.size_of(&e.file_name().to_string_lossy(), &e.path()),
                last_used: std::fs::metadata(e.path().join(READY))
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH),
            })
            .collect();
        v.sort_by_key(|e| std::cmp::Reverse(e.last_used));
        v
    }

    /// The size of entry `key` at `path`, measured the first time it is asked for.
    pub(super) fn size_of(&self, key: &str, path: &Path) -> u64 {
        let known = self.sizes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).get(key).copied();
        known.unwrap_or_else(|| {
            let n = dir_size(path);
            self.sizes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(key.to_string(), n);
            n
        })
    }

    /// Forgets the measured size of entry `key` (it is being removed).
    pub(super) fn forget_size(&self, key: &str) {
        self.sizes.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(key);
    }

    /// Removes the least recently used entries not in use until the cache is within its budget.
    pub(super) fn evict(&self) {
        let entries = self.entries();
        let mut total: u64 = entries.iter().map(|e| e.size_bytes).sum();
        for e in entries.iter().rev() {
            if total <= self.cfg.max_bytes {
                break;
            }
            let lock = self.lock_of(&e.key);
            let Ok(_guard) = lock.try_lock() else { continue };
            if self.is_in_use(&e.key) {
                continue;
            }
            self.forget_size(&e.key);
            if crate::trees::remove_tree(&self.cfg.root.join(&e.key)).is_ok() {
                tracing::info!(key = %e.key, bytes = e.size_bytes, "evicted cached source");
                total -= e.size_bytes;
            }
        }
    }
}

/// The bytes of the files under `p` (links not followed).
fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![p.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(t) if t.is_file() => total += e.metadata().map(|m| m.len()).unwrap_or(0),
                _ => {}
            }
        }
    }
    total
}

//! A fresh directory for a test, removed when dropped.

use std::path::PathBuf;

/// A fresh directory under the system's temporary one (not yet created), removed when dropped.
pub(crate) struct Dir(pub PathBuf);

impl Dir {
    /// A directory named after `name`, the process and the time.
    pub(crate) fn new(name: &str) -> Self {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        Dir(std::env::temp_dir().join(format!("reverb-{name}-{}-{nanos}", std::process::id())))
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

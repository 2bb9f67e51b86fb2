//! glibc's malloc, set for buffers of a few MiB that come and go many times a second (the
//! batches a dataset or sampler fills, the chunks a writer or server holds).
//!
//! glibc serves such a buffer from `mmap` until the first one is freed, then from its arenas,
//! and gives the free top of an arena back to the kernel once it exceeds a trim threshold
//! (twice the largest buffer freed so far). A threaded reader fills batches on several
//! threads, so a thread's arena regularly ends with a few batches' worth of free space: the
//! arena was trimmed (`MADV_DONTNEED`) and its next batch faulted fresh zeroed pages back in,
//! page by page. Measured on `TrajectoryDataset` of 84x84x10 frames in batches of 32
//! (2.2 MiB): 78k page faults/s, and 1.4 against 2.6 GB/s with the thresholds below.
//!
//! So the thresholds are fixed where glibc's own rule would end up for the biggest buffers it
//! still serves from arenas (32 MiB; the trim threshold twice that): an arena keeps at most
//! 64 MiB free at its top. Left alone when the user chose (`GLIBC_TUNABLES` naming malloc,
//! `MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_THRESHOLD_`) or `REVERB_MALLOC_TUNING=0`.

/// Buffers at least this big come from `mmap` (and go back to the kernel when freed).
pub const MMAP_THRESHOLD: usize = 32 << 20;
/// Free space an arena keeps at its top before giving it back.
pub const TRIM_THRESHOLD: usize = 64 << 20;

/// Whether the environment leaves malloc's thresholds to us.
pub fn ours_to_set(var: impl Fn(&str) -> Option<String>) -> bool {
    if var("REVERB_MALLOC_TUNING").is_some_and(|v| v.trim() == "0") {
        return false;
    }
    if var("GLIBC_TUNABLES").is_some_and(|v| v.contains("glibc.malloc.")) {
        return false;
    }
    var("MALLOC_TRIM_THRESHOLD_").is_none() && var("MALLOC_MMAP_THRESHOLD_").is_none()
}

/// Sets the thresholds once per process (a no-op off glibc). Returns whether they were set.
pub fn tune() -> bool {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DONE.get_or_init(|| ours_to_set(|name| std::env::var(name).ok()) && set())
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set() -> bool {
    // SAFETY: `mallopt` only changes glibc's allocation parameters (it takes the arena lock);
    // it is safe to call at any time from any thread.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) == 1
            && libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int) == 1
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set() -> bool {
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn the_users_choice_wins() {
        assert!(ours_to_set(env(&[])));
        assert!(ours_to_set(env(&[("REVERB_MALLOC_TUNING", "1")])));
        assert!(ours_to_set(env(&[("GLIBC_TUNABLES", "glibc.rtld.nns=2")])));
        assert!(!ours_to_set(env(&[("REVERB_MALLOC_TUNING", "0")])));
        assert!(!ours_to_set(env(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.trim_threshold=1"
        )])));
        assert!(!ours_to_set(env(&[("MALLOC_TRIM_THRESHOLD_", "1")])));
        assert!(!ours_to_set(env(&[("MALLOC_MMAP_THRESHOLD_", "1")])));
    }
}

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
//! still serves from arenas (32 MiB, its maximum on 64-bit; the trim threshold twice that):
//! an arena keeps at most 64 MiB free at its top, so a process may hold up to 64 MiB per
//! malloc arena (glibc makes up to 8 per core) more than it uses. Left alone off 64-bit
//! glibc, when the user set either threshold (`GLIBC_TUNABLES` with
//! `glibc.malloc.mmap_threshold` or `glibc.malloc.trim_threshold`, `MALLOC_TRIM_THRESHOLD_`,
//! `MALLOC_MMAP_THRESHOLD_`), or with `REVERB_MALLOC_TUNING` set to `0`, `false`, `off` or
//! `no`.

/// Buffers at least this big come from `mmap` (and go back to the kernel when freed).
pub const MMAP_THRESHOLD: usize = 32 << 20;
/// Free space an arena keeps at its top before giving it back.
pub const TRIM_THRESHOLD: usize = 64 << 20;

/// Whether the environment (`var` reads a variable) leaves malloc's thresholds to us.
pub fn ours_to_set(var: impl Fn(&str) -> Option<String>) -> bool {
    let off = ["0", "false", "off", "no"];
    if var("REVERB_MALLOC_TUNING").is_some_and(|v| off.contains(&v.trim().to_lowercase().as_str()))
    {
        return false;
    }
    let tunables = var("GLIBC_TUNABLES").unwrap_or_default();
    if ["glibc.malloc.mmap_threshold", "glibc.malloc.trim_threshold"]
        .iter()
        .any(|t| tunables.contains(t))
    {
        return false;
    }
    var("MALLOC_TRIM_THRESHOLD_").is_none() && var("MALLOC_MMAP_THRESHOLD_").is_none()
}

/// Sets the thresholds once per process (a no-op off 64-bit glibc). Returns whether both
/// were set.
pub fn tune() -> bool {
    static DONE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *DONE.get_or_init(|| {
        let var = |name: &str| std::env::var_os(name).map(|v| v.to_string_lossy().into_owned());
        ours_to_set(var) && set()
    })
}

#[cfg(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64"))]
fn set() -> bool {
    // SAFETY: `mallopt` only changes glibc's allocation parameters; glibc allows calling it at
    // any time from any thread (it takes the main arena's lock; the thresholds are plain
    // globals other arenas read).
    let mmap = unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, MMAP_THRESHOLD as libc::c_int) };
    // SAFETY: as above.
    let trim = unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, TRIM_THRESHOLD as libc::c_int) };
    mmap == 1 && trim == 1
}

#[cfg(not(all(target_os = "linux", target_env = "gnu", target_pointer_width = "64")))]
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
        assert!(!ours_to_set(env(&[("REVERB_MALLOC_TUNING", " Off")])));
        assert!(ours_to_set(env(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.arena_max=2"
        )])));
        assert!(!ours_to_set(env(&[(
            "GLIBC_TUNABLES",
            "glibc.malloc.trim_threshold=1"
        )])));
        assert!(!ours_to_set(env(&[("MALLOC_TRIM_THRESHOLD_", "1")])));
        assert!(!ours_to_set(env(&[("MALLOC_MMAP_THRESHOLD_", "1")])));
    }
}

//! The process's allocator settings.

/// Keeps freed memory in the heap instead of giving it back at once. Every
/// gossip message is compressed or expanded by zstd with a context of its
/// own, a few hundred kB allocated and freed each time: with glibc's
/// defaults that grew and trimmed the heap (or mapped and unmapped the
/// block) over a hundred times a second at rest, each time faulting fresh
/// pages in. A fixed mmap threshold (glibc otherwise raises it after such a
/// free) and a trim threshold above the contexts' size keep them in the
/// heap, at the cost of up to that much memory held.
///
/// One arena for every thread: glibc gives each new thread an arena of its
/// own, and on a node holding a thousand VIPs those of the kernel worker
/// and the blocking writers held 2.3-3.1 MiB that the main heap could have
/// reused (the heap grew by 0.7-1.3 MiB instead). The agent's few threads
/// rarely allocate at the same moment, so sharing costs no waiting.
#[allow(unsafe_code)]
pub fn keep_freed() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters; it is called before
    // any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 1 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

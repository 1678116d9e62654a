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

/// Gives the heap's free pages back to the kernel, wherever they lie in
/// it: once start-up is over, what it parsed and wrote (the first lists
/// of every watched kind, a thousand Events) is freed but kept by the
/// heap, above [`keep_freed`]'s threshold only at its top. Returns whether
/// any memory was given back.
#[allow(unsafe_code)]
pub fn give_back() -> bool {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes the allocator's own locks; any thread may
    // call it.
    unsafe {
        libc::malloc_trim(0) == 1
    }
    #[cfg(not(target_env = "gnu"))]
    false
}

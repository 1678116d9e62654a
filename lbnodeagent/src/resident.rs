//! The agent's own code pages in its resident memory.
//!
//! An agent runs most of its code once, at start: the Kubernetes client's
//! config and TLS set-up, the first lists of every watched kind, the first
//! reconcile, a thousand Events and annotation writes on a busy node. Each
//! page of code it ran (and of constants it read) stays mapped, and so
//! counted in its RSS, for as long as it runs, though it may never run
//! again. [`drop_code_pages`] unmaps them once start-up is over: the pages themselves stay where they were,
//! in the page cache (shared, clean, reclaimable under pressure, exactly as
//! before), and each page the agent runs again is mapped back by a minor
//! fault, with no read from disk while the page cache keeps it. From then
//! on the RSS counts the code the agent runs, not the code it once ran.
//!
//! Only the program's own segments that nothing writes are touched, its
//! code and its constants (found by its program headers): for those
//! `MADV_DONTNEED` only drops the page table entries. Never a writable or
//! once-written segment (data, or data the loader relocated before making
//! it read-only), whose contents would be lost; and nothing at all in a
//! program whose code the loader relocated (none that Rust's linkers
//! make). A breakpoint a debugger or a uprobe put in the code goes with
//! its page.

/// A loadable segment of the program, as its header says: where it lies
/// from the load address, and whether it may be written.
#[derive(Clone, Copy, Debug)]
struct Load {
    vaddr: usize,
    memsz: usize,
    writable: bool,
}

/// The whole pages of the program's segments that nothing writes: not
/// writable, and outside the range the loader writes before it makes it
/// read-only (`PT_GNU_RELRO`), as addresses from the load address `bias`.
/// A page a segment shares with another is left alone.
fn read_only_pages(
    loads: &[Load],
    relro: Option<(usize, usize)>,
    bias: usize,
    page: usize,
) -> Vec<(usize, usize)> {
    loads
        .iter()
        .filter(|l| !l.writable)
        .filter(|l| relro.is_none_or(|(at, len)| l.vaddr + l.memsz <= at || at + len <= l.vaddr))
        .filter_map(|l| {
            let start = (bias + l.vaddr).div_ceil(page) * page;
            let end = (bias + l.vaddr + l.memsz) / page * page;
            (end > start).then_some((start, end))
        })
        .collect()
}

/// The program's read-only pages (see [`read_only_pages`]), from its
/// program headers as the loader has them.
#[allow(unsafe_code)]
fn program_read_only() -> Vec<(usize, usize)> {
    #[derive(Default)]
    struct Found {
        loads: Vec<Load>,
        relro: Option<(usize, usize)>,
        bias: usize,
        /// The loader wrote into code to relocate it (`DT_TEXTREL`): those
        /// pages are copies, not the file's.
        text_relocated: bool,
    }
    unsafe extern "C" fn each(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut libc::c_void,
    ) -> libc::c_int {
        // SAFETY: the loader hands a valid `dl_phdr_info` for the call;
        // `data` is the `Found` given below, borrowed for the iteration.
        let (info, found) = unsafe { (&*info, &mut *data.cast::<Found>()) };
        // The first object is the program itself.
        let headers: &[libc::Elf64_Phdr] = if info.dlpi_phdr.is_null() {
            &[]
        } else {
            // SAFETY: `dlpi_phnum` headers start at `dlpi_phdr`.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
        };
        found.bias = info.dlpi_addr as usize;
        for h in headers {
            match h.p_type {
                libc::PT_LOAD => found.loads.push(Load {
                    vaddr: h.p_vaddr as usize,
                    memsz: h.p_memsz as usize,
                    writable: h.p_flags & libc::PF_W != 0,
                }),
                libc::PT_GNU_RELRO => found.relro = Some((h.p_vaddr as usize, h.p_memsz as usize)),
                libc::PT_DYNAMIC => {
                    let mut d = (found.bias + h.p_vaddr as usize) as *const Dyn;
                    // SAFETY: the dynamic section, as loaded, ends with
                    // its DT_NULL entry.
                    unsafe {
                        while (*d).tag != DT_NULL {
                            let textrel = (*d).tag == DT_TEXTREL
                                || ((*d).tag == DT_FLAGS && (*d).val & DF_TEXTREL != 0);
                            found.text_relocated |= textrel;
                            d = d.add(1);
                        }
                    }
                }
                _ => {}
            }
        }
        1
    }
    /// An entry of the dynamic section (`Elf64_Dyn`).
    #[repr(C)]
    struct Dyn {
        tag: i64,
        val: u64,
    }
    const DT_NULL: i64 = 0;
    const DT_TEXTREL: i64 = 22;
    const DT_FLAGS: i64 = 30;
    const DF_TEXTREL: u64 = 0x4;
    let mut found = Found::default();
    // SAFETY: `each` only reads what the loader passes and writes `found`,
    // which outlives the call; it stops after the first object.
    unsafe { libc::dl_iterate_phdr(Some(each), (&raw mut found).cast()) };
    if found.text_relocated {
        return Vec::new();
    }
    // SAFETY: sysconf has no preconditions.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    read_only_pages(&found.loads, found.relro, found.bias, page)
}

/// Unmaps the pages of the program's code and read-only data from this
/// process (see the module docs). Returns how many bytes of mappings were
/// dropped.
#[allow(unsafe_code)]
pub fn drop_code_pages() -> std::io::Result<usize> {
    let mut dropped = 0;
    for (start, end) in program_read_only() {
        // SAFETY: the range is whole pages of a segment of the program that
        // is mapped read-only from its file and that nothing writes (not
        // the loader's relocations either): MADV_DONTNEED drops their page
        // table entries only, and every later access maps the same file
        // page back. No Rust object is made or kept in them.
        let r =
            unsafe { libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED) };
        if r != 0 {
            return Err(std::io::Error::last_os_error());
        }
        dropped += end - start;
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_whole_pages_of_segments_nothing_writes_are_read_only() {
        // As the agent's release build lays itself out: read-only data,
        // code, relocated data made read-only (RELRO), data.
        let loads = [
            Load {
                vaddr: 0,
                memsz: 0x3394f0,
                writable: false,
            },
            Load {
                vaddr: 0x33a500,
                memsz: 0xc71100,
                writable: false,
            },
            Load {
                vaddr: 0xfac600,
                memsz: 0x08fa00,
                writable: true,
            },
            Load {
                vaddr: 0x103cf50,
                memsz: 0x32d0,
                writable: true,
            },
        ];
        let relro = Some((0xfac600, 0x08fa00));
        let bias = 0x55fa_44fc_1000;
        assert_eq!(
            read_only_pages(&loads, relro, bias, 0x1000),
            vec![(bias, bias + 0x339000), (bias + 0x33b000, bias + 0xfab000),],
            "the pages the read-only segments share with others are left"
        );
        // A read-only segment the loader writes first is never touched.
        let written = [Load {
            vaddr: 0xfac600,
            memsz: 0x08fa00,
            writable: false,
        }];
        assert!(read_only_pages(&written, relro, bias, 0x1000).is_empty());
        // Nor a segment smaller than a page between two others.
        let small = [Load {
            vaddr: 0x1800,
            memsz: 0x400,
            writable: false,
        }];
        assert!(read_only_pages(&small, None, 0, 0x1000).is_empty());
    }

    #[test]
    fn the_program_runs_on_after_its_pages_are_dropped() {
        // The test binary drops its own code's and constants' mappings and
        // goes on running: every page comes back as it is used.
        let dropped = drop_code_pages().expect("madvise");
        assert!(dropped > 0, "the test binary has read-only segments");
        let v: Vec<u64> = (0..1000).map(|i| i * 3).collect();
        assert_eq!(v.iter().sum::<u64>(), 1_498_500);
        assert_eq!(format!("{:?}", Some("still")), "Some(\"still\")");
        assert!(drop_code_pages().is_ok());
    }
}

#!/usr/bin/env python3
"""How much of hot.ld a built agent still matches.

    matched.py BINARY [HOT_LD] [--min PERCENT]

Counts the functions the link laid in `.text.hot` against the functions
the list names, and fails (exit 1) when fewer than PERCENT (default 90)
of them are there: a list that has gone stale (code moved, functions
renamed) matches less and less, and each function it misses maps its
64 KiB neighbourhood again. `refresh.sh` writes a new list.

The shipped binary is stripped, so the functions are counted by their
unwind entries: `.eh_frame_hdr` holds a sorted table with the start of
every function that has one (all of Rust's code on x86-64), read here
without tools. A pattern may match more than one function (one per crate
that instantiates a generic the same way), so the figure can pass 100%;
what it guards is the fall.
"""

import struct
import sys

# DW_EH_PE encodings used by .eh_frame_hdr.
ENCODING_SIZE = {0x02: 2, 0x03: 4, 0x04: 8, 0x0A: 2, 0x0B: 4, 0x0C: 8}


def sections(data: bytes) -> dict[str, tuple[int, int, int]]:
    """Name -> (address, file offset, size), for a 64-bit little-endian ELF."""
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        sys.exit("not a 64-bit little-endian ELF file")
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = []
    for i in range(shnum):
        name, _type, _flags, addr, offset, size = struct.unpack_from(
            "<IIQQQQ", data, shoff + i * shentsize
        )
        headers.append((name, addr, offset, size))
    strtab = headers[shstrndx]
    out = {}
    for name, addr, offset, size in headers:
        start = strtab[2] + name
        end = data.index(b"\0", start)
        out[data[start:end].decode()] = (addr, offset, size)
    return out


def read_encoded(data: bytes, pos: int, enc: int, section_addr: int, hdr_addr: int):
    """One value of DW_EH_PE encoding `enc` at `pos`; (value, next pos)."""
    fmt = enc & 0x0F
    size = ENCODING_SIZE.get(fmt)
    if size is None:
        sys.exit(f".eh_frame_hdr: encoding {enc:#x} not handled")
    signed = fmt >= 0x09
    value = int.from_bytes(data[pos : pos + size], "little", signed=signed)
    base = enc & 0x70
    if base == 0x10:  # pcrel
        value += section_addr + (pos - section_addr)
    elif base == 0x30:  # datarel: from the start of .eh_frame_hdr
        value += hdr_addr
    return value, pos + size


def function_starts(data: bytes, secs) -> list[int]:
    addr, offset, _size = secs[".eh_frame_hdr"]
    version, ptr_enc, count_enc, table_enc = data[offset : offset + 4]
    if version != 1:
        sys.exit(f".eh_frame_hdr version {version}")
    pos = offset + 4
    # Positions are file offsets; pc-relative values need addresses.
    to_addr = addr - offset
    _, pos = read_encoded(data, pos, ptr_enc, to_addr, addr)
    count, pos = read_encoded(data, pos, count_enc, to_addr, addr)
    starts = []
    for _ in range(count):
        start, pos = read_encoded(data, pos, table_enc, to_addr, addr)
        _, pos = read_encoded(data, pos, table_enc, to_addr, addr)
        starts.append(start)
    return starts


def listed(hot_ld: str) -> int:
    """The functions hot.ld names (each as a `.text.` and a
    `.text.unlikely.` pattern)."""
    with open(hot_ld, encoding="utf-8") as f:
        lines = (line.strip() for line in f)
        return sum(
            1 for x in lines if x.startswith(".text.") and not x.startswith(".text.unlikely.")
        )


def main() -> None:
    args = sys.argv[1:]
    minimum = 90.0
    if "--min" in args:
        i = args.index("--min")
        minimum = float(args[i + 1])
        del args[i : i + 2]
    if not args:
        sys.exit(__doc__)
    binary = args[0]
    hot_ld = args[1] if len(args) > 1 else __file__.rsplit("/", 1)[0] + "/hot.ld"
    with open(binary, "rb") as f:
        data = f.read()
    secs = sections(data)
    if ".text.hot" not in secs:
        print(f"{binary} has no .text.hot: the link did not apply hot.ld")
        sys.exit(1)
    hot_addr, _, hot_size = secs[".text.hot"]
    starts = function_starts(data, secs)
    inside = sum(1 for s in starts if hot_addr <= s < hot_addr + hot_size)
    names = listed(hot_ld)
    percent = 100.0 * inside / names if names else 0.0
    print(
        f"{inside} functions in .text.hot ({hot_size // 1024} KiB) of the {names} "
        f"hot.ld lists: {percent:.1f}% (at least {minimum:g}% wanted)"
    )
    if percent < minimum:
        sys.exit(1)


if __name__ == "__main__":
    main()

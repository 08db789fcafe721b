#!/usr/bin/env python3
"""Prints the section names of a 64-bit little-endian ELF file, one per line (Python 3 stdlib
only; readelf -S without binutils). scripts/compose-e2e.sh uses it to show that the images'
binaries carry no .debug_* sections and no .symtab.

Usage: elf_sections.py FILE
"""
import struct
import sys


def sections(data):
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise ValueError("not a 64-bit little-endian ELF file")
    shoff, = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    strtab_off, strtab_size = headers[shstrndx][4], headers[shstrndx][5]
    strtab = data[strtab_off:strtab_off + strtab_size]
    for h in headers:
        name = strtab[h[0]:strtab.index(b"\0", h[0])].decode()
        if name:
            yield name


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1], "rb") as f:
        for name in sections(f.read()):
            print(name)

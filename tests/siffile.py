"""Small SIF files for unit tests, in the format of github.com/apptainer/sif."""

import struct

#: rawDescriptor of pkg/sif/sif.go: datatype, used, id, group, link, offset,
#: size, size with padding, created, modified, uid, gid, name, extra.
DESCRIPTOR = struct.Struct("<iBIIIqqqqqqq128s384s")
PARTITION, JSON = 0x4004, 0x4006
SQUASHFS, EXT3 = 1, 2
SYSTEM, OVERLAY = 2, 4


def write_sif(path, objects):
    """
    Write a SIF of `objects`: (datatype, data bytes, fstype, parttype, name).

    Returns the offsets of the objects' data, in order.
    """
    table_offset = 128
    data_offset = table_offset + DESCRIPTOR.size * len(objects)
    header = b"#!/usr/bin/env run-singularity\n".ljust(32) + b"SIF_MAGIC\0" + b"01\0"
    header += b"02\0" + bytes(16)
    header += struct.pack("<8q", 0, 0, 0, len(objects), table_offset, 0, 0, 0)
    table, data, offsets = b"", b"", []
    for number, (datatype, blob, fstype, parttype, name) in enumerate(objects, 1):
        offsets.append(data_offset + len(data))
        extra = struct.pack("<ii3s", fstype, parttype, b"02\0") if fstype else b""
        table += DESCRIPTOR.pack(
            datatype, 1, number, 0xF0000001, 0, offsets[-1], len(blob), len(blob),
            0, 0, 0, 0, name.encode(), extra,
        )  # fmt: skip
        data += blob
    with open(path, "wb") as f:
        f.write(header.ljust(table_offset, b"\0") + table + data)
    return offsets

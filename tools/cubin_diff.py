"""Which kernels two cubins compile differently: each kernel's machine code
(its ELF `.text.<kernel>` section) compared byte for byte, the anonymous
namespace's per-compilation hash taken out of the names. A change meant
for some kernels alone shows there with no GPU: every other kernel is the
code that already ran.

usage: python -m tools.cubin_diff A.cubin[,A2.cubin...] B.cubin[,...]
  (a comma-separated list: the kernels of several sources taken together,
  for code moved from one source to another); make each with the build's
  device flags, e.g.
  nvcc -cubin -gencode=arch=compute_90a,code=sm_90a -O3 -std=c++17 \\
      -Iinclude -Icsrc -DGEMSOPS_HAVE_SM90A=1 -DGEMSOPS_HAVE_PDL=1 \\
      -o A.cubin csrc/cuda/layer_norm_fwd.cu
"""

import re
import struct
import sys

# an anonymous namespace's mangled name: its length, then the name
ANON = re.compile(r"(\d+)_GLOBAL__N__")


def without_anon(name):
    """name without its anonymous namespaces, each cut by its mangled
    length (the name holds the source's name and a per-build hash)."""
    out, at = [], 0
    for m in ANON.finditer(name):
        if m.start() < at:  # inside a namespace name already cut
            continue
        out.append(name[at : m.start()])
        at = m.start(1) + len(m.group(1)) + int(m.group(1))
    return "".join(out) + name[at:]


def kernels(path):
    """{kernel name: machine code} of an ELF64 little-endian cubin."""
    data = open(path, "rb").read()
    if data[:4] != b"\x7fELF" or data[4] != 2:
        sys.exit(f"{path}: not a 64-bit ELF cubin")
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", data, 0x3A)
    headers = [
        struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize)
        for i in range(shnum)
    ]
    names_at = headers[shstrndx][4]
    out = {}
    for name_off, _, _, _, offset, size, *_ in headers:
        start = names_at + name_off
        name = data[start : data.index(b"\0", start)].decode()
        if name.startswith(".text."):
            key = without_anon(name[len(".text.") :])
            if key in out:
                sys.exit(
                    f"{path}: two kernels named {key} once the "
                    "anonymous namespace is cut"
                )
            out[key] = data[offset : offset + size]
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    a, b = {}, {}
    for side, paths in ((a, sys.argv[1]), (b, sys.argv[2])):
        for path in paths.split(","):
            more = kernels(path)
            if side.keys() & more.keys():
                sys.exit(f"{path}: a kernel of it is in another cubin too")
            side.update(more)
    differ = sorted(k for k in a.keys() & b.keys() if a[k] != b[k])
    print(
        f"{len(a.keys() & b.keys()) - len(differ)} kernels the same, "
        f"{len(differ)} differ, {len(a.keys() - b.keys())} only in A, "
        f"{len(b.keys() - a.keys())} only in B"
    )
    for tag, names in (
        ("differs", differ),
        ("only in A", sorted(a.keys() - b.keys())),
        ("only in B", sorted(b.keys() - a.keys())),
    ):
        for k in names:
            print(f"  {tag}: {k}")


if __name__ == "__main__":
    main()

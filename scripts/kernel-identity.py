#!/usr/bin/env python3
"""Whether a change left the existing sm80 forward kernels' code alone: compiles each sm80 forward
translation unit (and combine.cu) from two source trees to PTX and to an sm_80 cubin, and compares
every kernel of the first tree with the same kernel of the second: its PTX after normalisation
(comments, .loc/.file debug lines, the function's own name and the index in its block labels;
then, separately, virtual-register numbering) and its machine code byte for byte (the cubin's
.text.<kernel> section; no cuobjdump needed). Kernels only the second tree has are counted.

  scripts/kernel-identity.py OLD_TREE NEW_TREE [--work DIR] [--tu fwd_hdim64 ...]
  scripts/kernel-identity.py OLD_TREE NEW_TREE --family sm90   # the sm90 forward TUs, sm_90a
                                                               # (16-bit, fp8, exp2-fma)

e.g. `git worktree add /tmp/base main` and run it with /tmp/base and the working tree. No GPU is
needed; each TU takes 1-3 minutes per tree (ptxas dominates). Exit status 1 if any kernel of the
old tree is missing or differs in machine code.
"""
import argparse
import os
import re
import struct
import subprocess
import sys
import time

TUS = {"sm80": ["fwd_hdim64", "fwd_hdim128", "fwd_hdim256", "combine"],
       # Every TU that includes sm90/fwd_kernel.h (through launch_template.h).
       "sm90": ["fwd_hdim64", "fwd_hdim128", "fwd_hdim256", "fwd_fp8_hdim64", "fwd_fp8_hdim128",
                "fwd_fp8_hdim256", "fwd_hdim64_exp2_fma", "fwd_fp8_exp2_fma"]}
ARCH = {"sm80": "-gencode=arch=compute_80,code=sm_80",
        "sm90": "-gencode=arch=compute_90a,code=sm_90a"}
FLAGS = ["--expt-relaxed-constexpr", "-std=c++20", "-O3", "-DNDEBUG", "-DFLASHSERVE_WITH_CUDA=1"]
FAMILY = "sm80"


def compile_tu(root, tu, out_dir):
    src = os.path.join(root, "src/attention", FAMILY, tu + ".cu")
    inc = ["-I", os.path.join(root, "include"), "-I", os.path.join(root, "src")]
    times = {}
    for kind in ("ptx", "cubin"):
        out = os.path.join(out_dir, f"{tu}.{kind}")
        start = time.time()
        subprocess.run(["nvcc", "-" + kind, ARCH[FAMILY], *FLAGS, *inc, src, "-o", out],
                       check=True)
        times[kind] = time.time() - start
    return times


def ptx_entries(path):
    entries = {}
    for part in re.split(r"(?m)^(?=(?:\.visible |\.weak )?\.entry)", open(path).read()):
        m = re.match(r"(?:\.visible |\.weak )?\.entry\s+(\S+)\(", part)
        if not m:
            continue
        name, lines = m.group(1), []
        for ln in part.splitlines():
            ln = re.sub(r"//.*", "", ln).strip()
            if not ln or ln.startswith(".loc") or ln.startswith(".file"):
                continue
            ln = ln.replace(name, "<NAME>")
            ln = re.sub(r"\$L__BB\d+_", "$L__BB_", ln)  # block labels carry the function's index
            ln = re.sub(r"__local_depot\d+", "__local_depot", ln)
            lines.append(ln)
        entries[name] = lines
    return entries


def renumbered(lines):
    """Virtual registers renumbered by first appearance, per class."""
    seen, count = {}, {}

    def sub(m):
        if m.group(0) not in seen:
            count[m.group(1)] = count.get(m.group(1), 0) + 1
            seen[m.group(0)] = f"%{m.group(1)}#{count[m.group(1)]}"
        return seen[m.group(0)]
    return [re.sub(r"%(rd|rs|r|fd|f|p|hh|h)(\d+)", sub, ln) for ln in lines]


def text_sections(path):
    """{.text.<kernel>: bytes} of an ELF64 cubin."""
    d = open(path, "rb").read()
    shoff, = struct.unpack_from("<Q", d, 0x28)
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", d, 0x3A)
    hdrs = [struct.unpack_from("<IIQQQQIIQQ", d, shoff + i * shentsize) for i in range(shnum)]
    strtab = hdrs[shstrndx][4]

    def name(off):
        return d[strtab + off:d.index(b"\0", strtab + off)].decode()
    return {name(h[0]): d[h[4]:h[4] + h[5]] for h in hdrs if name(h[0]).startswith(".text.")}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--work", default="/tmp/kernel-identity")
    ap.add_argument("--family", choices=sorted(TUS), default="sm80")
    ap.add_argument("--tu", nargs="*")
    args = ap.parse_args()
    global FAMILY
    FAMILY = args.family
    args.tu = args.tu or TUS[FAMILY]
    bad = 0
    totals = [0, 0, 0]  # kernels, identical machine code, identical PTX (up to renumbering)
    for tu in args.tu:
        dirs = {}
        for side, root in (("old", args.old), ("new", args.new)):
            dirs[side] = os.path.join(args.work, side)
            os.makedirs(dirs[side], exist_ok=True)
            t = compile_tu(root, tu, dirs[side])
            print(f"{tu} {side}: ptx {t['ptx']:.0f} s, cubin {t['cubin']:.0f} s")
        old_ptx = ptx_entries(os.path.join(dirs["old"], tu + ".ptx"))
        new_ptx = ptx_entries(os.path.join(dirs["new"], tu + ".ptx"))
        old_sass = text_sections(os.path.join(dirs["old"], tu + ".cubin"))
        new_sass = text_sections(os.path.join(dirs["new"], tu + ".cubin"))
        same_ptx = same_renumbered = same_sass = 0
        for name, body in old_ptx.items():
            other = new_ptx.get(name)
            if other == body:
                same_ptx += 1
            elif other is not None and renumbered(other) == renumbered(body):
                same_renumbered += 1
            if new_sass.get(".text." + name) == old_sass.get(".text." + name):
                same_sass += 1
            else:
                bad += 1
                print(f"  machine code differs or missing: {name}")
        added = len([n for n in new_ptx if n not in old_ptx])
        print(f"{tu}: {len(old_ptx)} kernels; PTX identical {same_ptx}, identical up to register "
              f"numbering {same_renumbered}; machine code identical {same_sass}; {added} new")
        totals[0] += len(old_ptx)
        totals[1] += same_sass
        totals[2] += same_ptx + same_renumbered
    print(f"total: {totals[0]} kernels of the old tree; machine code identical {totals[1]}, "
          f"PTX identical (up to register numbering) {totals[2]}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

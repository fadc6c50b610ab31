#!/usr/bin/env python3
"""Where a Hopper attention launch's warps wait, from Nsight Compute's per-instruction table.

Input: the CSV of `ncu -i REPORT.ncu-rep --page source --csv --print-source sass` for one launch of
hopper_attention_kernel at d = 128, B = 128 (the barrier offsets below are that shape's), profiled with `--section SourceCounters` (warp-stall sampling per SASS
instruction). Prints, per file:
  - the share of stall samples at each kind of mbarrier wait (the wait's address says which
    barrier: src/cuda/hopper/shared_storage.cuh), its out-of-line retry loop included;
  - the samples at the first wgmma (HGMMA) of each S = QK^T and O += PV batch of the main loop, and
    the part of them the table gives no listed reason for (Nsight's warpgroup-arrive / gmma waits:
    the warpgroup's warps waiting for each other at the warpgroup-wide instruction);
  - the instructions executed outside the consumers' code (producer, retry loops) and their share.
Usage: bench/ncu_stalls.py A.csv [B.csv ...]
"""
import csv
import re
import sys

# Barrier slots after the ring (shared_storage.cuh): q, K full x3, V full x3, K empty x3, V empty x3,
# q empty, then the loader warps' item ring. NOTE: the offsets and slot names are those of d = 128,
# B = 128 (three stages, base 0x38000, TileShape); other shapes need their own (the waits of other
# kernels would be mislabelled, or not found).
NAMES = ["q_full"] + ["k_full"] * 3 + ["v_full"] * 3 + ["k_empty"] * 3 + ["v_empty"] * 3 + ["q_empty"]


def load(path):
    rows = list(csv.reader(open(path)))
    head, data = rows[1], rows[2:]
    src, samples, executed = head.index("Source"), head.index("Warp Stall Sampling (All Samples)"), head.index(
        "Instructions Executed")
    reasons = [i for i, h in enumerate(head) if h.startswith("stall_") and "Not Issued" not in h]
    return [(r[src].strip(), int(r[samples] or 0), int(r[executed] or 0), sum(int(r[i] or 0) for i in reasons))
            for r in data]


def summary(path):
    ins = load(path)
    total = sum(x[1] for x in ins)
    first = next(i for i, x in enumerate(ins) if "WARPGROUP.ARRIVE" in x[0])
    end = next(i for i, x in enumerate(ins) if x[0].startswith("EXIT") and i > first)
    waits = {}
    for i, x in enumerate(ins):
        m = re.search(r"SYNCS\.PHASECHK\.TRANS64(?:\.TRYWAIT)? P\d, \[[^\]]*0x38([0-9a-f]{3})\]", x[0])
        if not m:
            continue
        slot = int(m.group(1), 16) // 8
        name = NAMES[slot] if slot < len(NAMES) else "item_ring"
        block = [x] + [y for y in ins[max(0, i - 1):i] if "YIELD" in y[0]]
        block += [y for y in ins[i + 1:i + 4] if re.search(r"NANOSLEEP|BRA|SYNCS\.PHASECHK\.TRANS64 ", y[0])]
        waits[name] = waits.get(name, 0) + sum(y[1] for y in block)
    print(f"{path}: {total} stall samples")
    for name in sorted(waits):
        print(f"  waits at {name:9s} {1000 * waits[name] / total:6.1f} per mille of samples")
    # The main loop's batches (their instructions executed most often: once per tile); a batch's
    # first HGMMA is the first after its WARPGROUP.ARRIVE.
    most = max(x[2] for x in ins if "HGMMA" in x[0])
    batch_heads, after_arrive = [], False
    for x in ins:
        if "WARPGROUP.ARRIVE" in x[0]:
            after_arrive = True
        elif "HGMMA" in x[0] and after_arrive:
            after_arrive = False
            if x[2] == most:
                batch_heads.append(x)
    for x in batch_heads:
        kind = "O += PV " if "tnspB" in x[0] else "S = QK^T"
        print(f"  first HGMMA of {kind}: {1000 * x[1] / total:6.1f} per mille, unlisted reason "
              f"{1000 * (x[1] - x[3]) / total:6.1f}")
    outside = sum(x[2] for x in ins[:first] + ins[end + 1:])
    executed = sum(x[2] for x in ins)
    print(f"  instructions executed outside the consumers' code: {outside:.3e} of {executed:.3e} "
          f"({100 * outside / executed:.1f}%)")


for p in sys.argv[1:]:
    summary(p)

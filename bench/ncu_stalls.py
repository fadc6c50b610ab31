#!/usr/bin/env python3
"""Where a Hopper attention launch's warps wait, from Nsight Compute's per-instruction table.

Input: the CSV of `ncu -i REPORT.ncu-rep --page source --csv --print-source sass` for one launch of
hopper_attention_kernel, profiled with `--section SourceCounters` (warp-stall sampling per SASS
instruction). Prints, per file:
  - the share of stall samples at each kind of mbarrier wait (the wait's address says which
    barrier: src/cuda/hopper/shared_storage.cuh), its out-of-line retry loop included;
  - the samples at the first wgmma (HGMMA) of each S = QK^T and O += PV batch of the main loop, and
    the part of them the table gives no listed reason for (Nsight's warpgroup-arrive / gmma waits:
    the warpgroup's warps waiting for each other at the warpgroup-wide instruction);
  - the instructions executed outside the consumers' code (producer, retry loops) and their share.
Usage: bench/ncu_stalls.py [--barrier-base 0x38000] [--stages 3] A.csv [B.csv ...]
(the defaults are d = 128, B = 128: TileShape's kBarrierOffset and kStages, src/cuda/hopper/tile_shape.h)
"""
import argparse
import csv
import re


def barrier_names(stages):
    """The mbarrier slots from the kernel's barrier base (shared_storage.cuh): q, K full, V full, K
    empty, V empty (one per ring stage each), q empty; the loader warps' item ring after them."""
    return ["q_full"] + ["k_full"] * stages + ["v_full"] * stages + ["k_empty"] * stages + \
        ["v_empty"] * stages + ["q_empty"]


def load(path):
    rows = list(csv.reader(open(path)))
    head, data = rows[1], rows[2:]
    src, samples, executed = head.index("Source"), head.index("Warp Stall Sampling (All Samples)"), head.index(
        "Instructions Executed")
    reasons = [i for i, h in enumerate(head) if h.startswith("stall_") and "Not Issued" not in h]
    return [(r[src].strip(), int(r[samples] or 0), int(r[executed] or 0), sum(int(r[i] or 0) for i in reasons))
            for r in data]


def summary(path, base, stages):
    names = barrier_names(stages)
    ins = load(path)
    total = sum(x[1] for x in ins)
    first = next(i for i, x in enumerate(ins) if "WARPGROUP.ARRIVE" in x[0])
    end = next(i for i, x in enumerate(ins) if x[0].startswith("EXIT") and i > first)
    waits = {}
    for i, x in enumerate(ins):
        m = re.search(r"SYNCS\.PHASECHK\.TRANS64(?:\.TRYWAIT)? P\d, \[[^\]]*\+(0x[0-9a-f]+)\]", x[0])
        if not m or int(m.group(1), 16) < base:
            continue
        slot = (int(m.group(1), 16) - base) // 8
        name = names[slot] if slot < len(names) else "item_ring"
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


parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
parser.add_argument("--barrier-base", type=lambda v: int(v, 0), default=0x38000,
                    help="shared-memory offset of the first mbarrier (TileShape::kBarrierOffset) [0x38000]")
parser.add_argument("--stages", type=int, default=3, help="K/V ring stages (TileShape::kStages) [3]")
parser.add_argument("csv", nargs="+", help="ncu --page source --csv --print-source sass output of one launch")
args = parser.parse_args()
for p in args.csv:
    summary(p, args.barrier_base, args.stages)

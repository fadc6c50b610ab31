#!/usr/bin/env python3
"""Sums the kernel durations of an `ncu --csv --metrics gpu__time_duration.sum` log by kernel name.

Used by scripts/gpu.sh (CRISP_GPU_PLAN_PROFILE=1). The first plan of the run is the crisp
preset's plan_async; the random layout's upload adds one work-order build (work_key + sort), which
is listed separately because it comes after the planner's last kernel.
Usage: plan_profile_table.py LOG.csv
"""
import csv
import io
import sys
from collections import OrderedDict


def main(path):
    text = open(path, encoding="utf-8", errors="replace").read()
    start = text.find('"ID"')
    if start < 0:
        print("no ncu table in", path)
        return 1
    rows = [r for r in csv.DictReader(io.StringIO(text[start:])) if r.get("Metric Name") == "gpu__time_duration.sum"]
    totals, counts = OrderedDict(), {}
    for r in rows:
        name = r["Kernel Name"].replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
        name = name.split("(")[0].split("<")[0].strip().split("::")[-1]
        value = float(r["Metric Value"].replace(",", ""))
        scale = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3}.get(r["Metric Unit"], 1.0)
        totals[name] = totals.get(name, 0.0) + value * scale
        counts[name] = counts.get(name, 0) + 1
    total = sum(totals.values())
    print(f"{'kernel':48s} {'launches':>8s} {'us':>10s} {'share':>7s}")
    for name, us in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"{name[:48]:48s} {counts[name]:8d} {us:10.1f} {100 * us / total:6.1f}%")
    print(f"{'total':48s} {len(rows):8d} {total:10.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

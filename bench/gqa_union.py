#!/usr/bin/env python3
"""bench/gqa_union.py — what GQA packing would compute: per GQA group, the union of its query heads'
block layouts (spec §10), against the layouts themselves.

Reads the JSON of `crisp plan` (one sequence) and prints, per group, the routes and densities of
its heads and the density of their union, then the mean density per head against the density the
kernel would compute if every group ran its union for all of its heads.

    crisp gen --seq 131072 --heads-q 32 --heads-kv 8 --out-dir w128
    crisp plan --q w128/q.npy --k w128/k.npy --json w128/plan.json
    python3 bench/gqa_union.py w128/plan.json
"""
import json
import sys


def main() -> None:
    if len(sys.argv) != 2:
        sys.exit("usage: gqa_union.py PLAN.json (the output of `crisp plan --json`)")
    plan = json.load(open(sys.argv[1]))
    num_q, num_kv, num_blocks = plan["num_q_heads"], plan["num_kv_heads"], plan["num_blocks"]
    group = num_q // num_kv
    causal = num_blocks * (num_blocks + 1) // 2
    heads = plan["heads"]

    def rows(head):
        row_ptr, col = head["row_ptr"], head["col"]
        return [set(col[row_ptr[r]:row_ptr[r + 1]]) for r in range(num_blocks)]

    own_blocks = sum(len(h["col"]) for h in heads)
    packed_blocks = 0
    for g in range(num_kv):
        members = heads[g * group:(g + 1) * group]
        member_rows = [rows(h) for h in members]
        union = sum(len(set().union(*[r[i] for r in member_rows])) for i in range(num_blocks))
        routes = "".join("V" if h["route"] == "vs" else "P" if h["route"] == "pe" else "D" for h in members)
        densities = ", ".join(f"{len(h['col']) / causal:.3f}" for h in members)
        print(f"group {g}: routes {routes}  member density {densities}  union {union / causal:.3f}")
        packed_blocks += union * group
    print(f"n={plan['n']} Hq={num_q} Hkv={num_kv}: mean density {own_blocks / (num_q * causal):.4f}; "
          f"packed (each group's union for all {group} heads) {packed_blocks / (num_q * causal):.4f}; "
          f"{packed_blocks / own_blocks:.2f}x the blocks")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# scripts/dump_plans.sh — writes `crisp plan` JSON for a fixed set of generated workloads, presets,
# block sizes, precisions and ablations, so that a refactor can be checked to leave every plan
# byte-identical: dump with the binary before and after the change, then `diff -r` the folders.
#   scripts/dump_plans.sh BIN OUT [WORKLOADS]    (WORKLOADS: where the generated inputs are cached,
#                                                 default OUT/workloads)
# Note: a Config key added later appears in every dump's "config"; strip such lines before diffing
# dumps made across that change.
set -euo pipefail
BIN=${1:?usage: $0 BIN OUT [WORKLOADS]}
OUT=${2:?usage: $0 BIN OUT [WORKLOADS]}
W=${3:-$OUT/workloads}
mkdir -p "$OUT" "$W"
gen() { [ -f "$W/$1/k.npy" ] || "$BIN" gen --seq "$2" --heads-q "$3" --heads-kv "$4" --dim "$5" --seed "$6" --out-dir "$W/$1" >/dev/null; }
gen w1 4096 8 2 64 1     # GQA 4, d 64
gen w2 6000 4 4 128 2    # MHA, d 128, a partial last block
gen w3 2500 8 1 64 3     # GQA 8, short
run() {  # NAME ARGS...: one dump per workload and precision
  local name=$1 w p
  shift
  for w in w1 w2 w3; do
    for p in f32 f64; do
      "$BIN" plan --q "$W/$w/q.npy" --k "$W/$w/k.npy" --json "$OUT/$w.$p.$name.json" --precision "$p" --threads 2 "$@" >/dev/null
    done
  done
}
for preset in crisp flexprefill minference dense; do
  for b in 64 128; do run "$preset.b$b" --policy "$preset" --block "$b"; done
done
run jsd --set routing=jsd
run cstruct --set routing=cstruct
run none --set routing=none
run nf_minmax --set vs_budget=noise_floor --set min_budget=1024 --set max_budget=2048
run nf_minmax64 --block 64 --set min_budget=300 --set max_budget=700
run single --set slash_cover=single
run flex_nf --policy flexprefill --set vs_budget=noise_floor
run cum_max --set vs_budget=cumulative --set max_budget=1024 --set gamma=0.7
run topk_small --set vs_budget=topk --set vertical_tokens=200 --set slash_tokens=500
run alpha_pe --set alpha=2 --set pe_gamma=0.5
run minf_min --policy minference --set min_budget=512 --block 64
run flex_jsd_single --policy flexprefill --set slash_cover=single --set tau=0.3
run dense_below --set dense_below=3000
run minf_small --policy minference --set vertical_tokens=300 --set slash_tokens=800
run minf_small64 --policy minference --block 64 --set vertical_tokens=100 --set slash_tokens=1500 --set max_budget=1000
run uniform_floor --set vs_floor=uniform --set uniform_alpha=0.5
run pe_floor --set pe_rule=floor --set pe_alpha=2
echo "dump_plans: $(ls "$OUT"/*.json | wc -l) plans in $OUT"

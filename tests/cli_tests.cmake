# tests/cli_tests.cmake — the `crisp` command, end to end (included from tests/CMakeLists.txt).
#
# Every bad input must end with exit status 2 and a "crisp: error: <message>" naming what was
# wrong; tests/run_expect.cmake checks both, so a crash (134/139) fails the test. The happy path
# generates a small workload with `crisp gen` and runs `crisp plan` and `crisp attend` on it.
set(CLI_DIR "${CMAKE_CURRENT_BINARY_DIR}/cli")
file(MAKE_DIRECTORY "${CLI_DIR}")
# A file that is not a .npy at all, and an empty one, for the corrupt-input checks.
file(WRITE "${CLI_DIR}/corrupt.npy" "this is not a NumPy file, just some text\n")
file(WRITE "${CLI_DIR}/empty.npy" "")

set(CLI_RUNNER "${CMAKE_CURRENT_SOURCE_DIR}/run_expect.cmake")

# crisp_cli_test(<name> ARGS <a|b|c> [RC <code>] [STDERR <regex>] [STDOUT <regex>]
#                [FILES <f|g>] [JSON <file> HEADS <n>] [SETUP <fixture>] [REQUIRES <fixtures>]
#                [ENV <VAR=value>...])
function(crisp_cli_test name)
  cmake_parse_arguments(T "" "ARGS;RC;STDERR;STDOUT;FILES;JSON;HEADS;SETUP" "REQUIRES;ENV" ${ARGN})
  set(defs "-DEXE=$<TARGET_FILE:crisp_cli>" "-DARGS=${T_ARGS}")
  if(DEFINED T_RC)
    list(APPEND defs "-DEXPECT_RC=${T_RC}")
  endif()
  if(DEFINED T_STDERR)
    list(APPEND defs "-DEXPECT_STDERR=${T_STDERR}")
  endif()
  if(DEFINED T_STDOUT)
    list(APPEND defs "-DEXPECT_STDOUT=${T_STDOUT}")
  endif()
  if(DEFINED T_FILES)
    list(APPEND defs "-DEXPECT_FILES=${T_FILES}")
  endif()
  if(DEFINED T_JSON)
    list(APPEND defs "-DJSON_FILE=${T_JSON}" "-DJSON_HEADS=${T_HEADS}")
  endif()
  add_test(NAME cli.${name} COMMAND ${CMAKE_COMMAND} ${defs} -P "${CLI_RUNNER}")
  set_tests_properties(cli.${name} PROPERTIES LABELS "cpu" TIMEOUT 300)
  if(DEFINED T_SETUP)
    set_tests_properties(cli.${name} PROPERTIES FIXTURES_SETUP "${T_SETUP}")
  endif()
  if(T_REQUIRES)
    set_tests_properties(cli.${name} PROPERTIES FIXTURES_REQUIRED "${T_REQUIRES}")
  endif()
  if(T_ENV)
    set_tests_properties(cli.${name} PROPERTIES ENVIRONMENT "${T_ENV}")
  endif()
endfunction()

set(ERR "crisp: error: ")

# ---------------------------------------------------------------- --help of every command
crisp_cli_test(help ARGS "--help" RC 0 STDOUT "demo.*plan.*attend.*gen")
crisp_cli_test(help.demo ARGS "demo|--help" RC 0 STDOUT "--seq.*--backend.*--threads.*--json")
crisp_cli_test(help.plan ARGS "plan|--help" RC 0 STDOUT "--q.*--k.*--json.*--policy.*--set.*--block")
crisp_cli_test(help.attend ARGS "attend|--help" RC 0 STDOUT "--v.*--out.*--lse.*--policy")
crisp_cli_test(help.gen ARGS "gen|--help" RC 0 STDOUT "--seq.*--out-dir")
crisp_cli_test(help.bench ARGS "bench|--help" RC 0 STDOUT "bench")
# --dim takes the CUDA kernels' head dims only (checked before the GPU is looked for).
crisp_cli_test(bench.dim_refused ARGS "bench|--dim|96" RC 2 STDERR "${ERR}--dim: '96' is not 64, 128 or 256")
crisp_cli_test(help.bench_dims ARGS "bench|--help" RC 0 STDOUT "--dim.*64, 128 or 256")
# The chunked bench's options need --chunks (checked before the GPU is looked for).
crisp_cli_test(bench.page_sizes_need_chunks ARGS "bench|--page-sizes|16" RC 2
               STDERR "${ERR}--page-sizes: is given without --chunks")
crisp_cli_test(bench.kv_token_major_needs_chunks ARGS "bench|--kv-token-major" RC 2
               STDERR "${ERR}--kv-token-major: is given without --chunks")
crisp_cli_test(bench.split_times_needs_chunks ARGS "bench|--split-times" RC 2
               STDERR "${ERR}--split-times: is given without --chunks")
crisp_cli_test(bench.page_order_needs_page_sizes ARGS "bench|--chunks|4096|--page-order|in_order" RC 2
               STDERR "${ERR}--page-order: is given without --page-sizes")
crisp_cli_test(bench.page_order_names_its_values ARGS "bench|--chunks|4096|--page-sizes|16|--page-order|random" RC 2
               STDERR "--page-order: random not in {shuffled,in_order}")
# The evaluation commands (tools/cmd_eval.cpp, cmd_fidelity.cpp, cmd_pareto.cpp).
crisp_cli_test(help.eval ARGS "eval|--help" RC 0 STDOUT "Usage: crisp eval")
# The retired runner's commands are gone; the real-model ones are crisp-llama-eval's.
crisp_cli_test(retired.run ARGS "run|--prompt|hi" STDERR "${ERR}unknown command 'run'")
crisp_cli_test(retired.capture ARGS "capture|--qa-index|0" STDERR "${ERR}unknown command 'capture'")
crisp_cli_test(eval_niah.needs_score ARGS "eval|niah" STDERR "${ERR}.*--score")
crisp_cli_test(eval_pareto.needs_a_source ARGS "eval|pareto|--sweep|crisp:alpha=1|--json|${CLI_DIR}/p.json"
  STDERR "${ERR}--captures: missing.*--structured.*crisp-llama-eval pareto")

# ---------------------------------------------------------------- command-line errors
crisp_cli_test(no_command ARGS "" STDERR "${ERR}.*subcommand")
crisp_cli_test(unknown_command ARGS "frobnicate" STDERR "${ERR}unknown command 'frobnicate'.*plan")
crisp_cli_test(unknown_option ARGS "plan|--q|a.npy|--k|b.npy|--json|x.json|--bogus" STDERR "${ERR}.*--bogus")
crisp_cli_test(missing_required ARGS "plan|--q|a.npy" STDERR "${ERR}.*--k")
crisp_cli_test(bad_precision ARGS "plan|--q|a.npy|--k|b.npy|--json|x.json|--precision|f16" STDERR "${ERR}.*precision")
crisp_cli_test(negative_seq ARGS "demo|--seq|-5" STDERR "${ERR}.*seq")
# Thread counts far beyond any machine crashed the OpenMP runtime: every --threads is bounded.
crisp_cli_test(huge_threads.demo ARGS "demo|--seq|512|--threads|100000" STDERR "${ERR}--threads.*1024")
crisp_cli_test(huge_threads.plan ARGS "plan|--q|a.npy|--k|b.npy|--threads|100000" STDERR "${ERR}--threads.*1024")
crisp_cli_test(huge_threads.pareto ARGS "eval|pareto|--structured|--json|x.json|--threads|100000" STDERR "${ERR}--threads.*1024")
# Numbers are decimal: CLI11 alone read '0x100' as 256, '010' as 8 and '0x1p3' as 8.0.
crisp_cli_test(hex_number.seq ARGS "demo|--seq|0x100|--threads|1" STDERR "${ERR}--seq: '0x100' is not a")
crisp_cli_test(hex_number.seed ARGS "eval|pareto|--structured|--json|x.json|--seed|0x5" STDERR "${ERR}--seed: '0x5' is not a decimal number")
crisp_cli_test(hex_number.float ARGS "eval|pareto|--captures|c|--json|x.json|--top-mass-share|0x1p-1"
  STDERR "${ERR}--top-mass-share: '0x1p-1' is not a decimal number")

# ---------------------------------------------------------------- unreadable inputs
crisp_cli_test(missing_npy
  ARGS "plan|--q|${CLI_DIR}/no_such_q.npy|--k|${CLI_DIR}/no_such_k.npy|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}.*no_such_q\\.npy")
crisp_cli_test(corrupt_npy
  ARGS "plan|--q|${CLI_DIR}/corrupt.npy|--k|${CLI_DIR}/corrupt.npy|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}.*corrupt\\.npy")
crisp_cli_test(empty_npy
  ARGS "attend|--q|${CLI_DIR}/empty.npy|--k|${CLI_DIR}/empty.npy|--v|${CLI_DIR}/empty.npy|--out|${CLI_DIR}/o.npy|--lse|${CLI_DIR}/l.npy"
  STDERR "${ERR}.*empty\\.npy")

# A named pipe: opening it for reading blocked forever without a writer; refused before the open.
set(FIFO_NPY "${CLI_DIR}/fifo.npy")
add_test(NAME cli.fifo_npy_setup COMMAND sh -c [=[rm -f "$0" && mkfifo "$0"]=] "${FIFO_NPY}")
set_tests_properties(cli.fifo_npy_setup PROPERTIES LABELS "cpu" FIXTURES_SETUP cli_fifo)
crisp_cli_test(fifo_npy
  ARGS "plan|--q|${FIFO_NPY}|--k|${FIFO_NPY}|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}--q [^ ]*fifo\\.npy: is not a regular file" REQUIRES cli_fifo)
# Empty paths: named by their option (an empty --json meant "no plan" without a word). ARGS cannot
# carry an empty argument (CMake drops empty list elements), so these run through sh.
foreach(option out lse json)
  add_test(NAME cli.empty_path.${option} COMMAND sh -c
    [=[o=o.npy; l=l.npy; [ "$1" = out ] && o=; [ "$1" = lse ] && l=
if [ "$1" = json ]; then out=$("$0" attend --q a.npy --k b.npy --v c.npy --out o.npy --lse l.npy --json "" 2>&1)
else out=$("$0" attend --q a.npy --k b.npy --v c.npy --out "$o" --lse "$l" 2>&1); fi
rc=$?; echo "$out"; echo "rc=$rc"]=]
    "$<TARGET_FILE:crisp_cli>" "${option}")
  set_tests_properties(cli.empty_path.${option} PROPERTIES LABELS "cpu"
    PASS_REGULAR_EXPRESSION "crisp: error: --${option}: is an empty path[^\n]*\nrc=2")
endforeach()

# eval niah --score: records of their kind (a density of 2.5 was averaged into the table, one id's
# lines of different tasks were scored against each other).
file(WRITE "${CLI_DIR}/score_density.jsonl"
  [=[{"id": "a", "policy": "dense", "output": "7", "task": "passkey", "expected": "7", "length": 1024}
{"id": "a", "policy": "crisp", "output": "7", "task": "passkey", "expected": "7", "length": 1024, "density": 2.5}
]=])
crisp_cli_test(score_density_range ARGS "eval|niah|--score|${CLI_DIR}/score_density.jsonl"
  STDERR "${ERR}--score: [^ ]*score_density.jsonl:2 has density 2.5; expected density in \\[0, 1\\]")
file(WRITE "${CLI_DIR}/score_task.jsonl"
  [=[{"id": "a", "policy": "dense", "output": "7", "task": "passkey", "expected": "7", "length": 1024}
{"id": "a", "policy": "crisp", "output": "7", "task": "niah_single", "expected": "7", "length": 1024}
]=])
crisp_cli_test(score_one_task_per_id ARGS "eval|niah|--score|${CLI_DIR}/score_task.jsonl"
  STDERR "${ERR}--score: [^ ]*score_task.jsonl:2 gives sample 'a' task niah_single, length 1024 where an earlier line gave passkey")
file(WRITE "${CLI_DIR}/score_ok.jsonl"
  [=[{"id": "a", "policy": "dense", "output": "7", "task": "passkey", "expected": "7", "length": 1024}
{"id": "a", "policy": "crisp", "output": "7", "task": "passkey", "expected": "7", "length": 1024, "density": 0.25, "ttft_s": 0.5}
]=])
crisp_cli_test(score_ok ARGS "eval|niah|--score|${CLI_DIR}/score_ok.jsonl" RC 0 STDOUT "crisp")

# A directory where a JSON input is read: named (it was "internal error: basic_filebuf::underflow").
crisp_cli_test(json_input_is_a_directory
  ARGS "eval|pareto|--threads|1|--quiet|--structured|--lengths|512|--sweep|crisp:alpha=1|--json|${CLI_DIR}/x.json|--sweep-file|${CLI_DIR}"
  STDERR "${ERR}--sweep-file: '[^']*' is a directory")
# A sweep of more points than any frontier, refused before it fills memory (10^8 points grew to 15 GB).
file(WRITE "${CLI_DIR}/big_sweep.json" [=[[{"policy": "crisp", "knobs": {"alpha": [1,2,3,4,5,6,7,8,9,10,11],
  "rho": [1,2,3,4,5,6,7,8,9,10], "tau_proxy": [0.1,0.2,0.3,0.4,0.5,0.6,0.7,0.8,0.9,0.95],
  "min_budget": [1,2,3,4,5,6,7,8,9,10], "max_budget": [100,200,300,400,500,600,700,800,900,1000]}}]]=])
crisp_cli_test(sweep_too_large
  ARGS "eval|pareto|--threads|1|--quiet|--structured|--lengths|512|--json|${CLI_DIR}/big.json|--sweep-file|${CLI_DIR}/big_sweep.json"
  STDERR "${ERR}--sweep-file: sweeps 110000 points; expected at most 100000")
# gen writes its four files all or none: a k.npy that is a directory left a new q.npy beside it.
add_test(NAME cli.gen_all_or_none COMMAND sh -c
  [=[rm -rf "$1" && mkdir -p "$1/k.npy" && "$0" gen --seq 64 --out-dir "$1" 2>&1; echo "rc=$? q=$(ls "$1" | tr '
' ' ')"]=]
  "$<TARGET_FILE:crisp_cli>" "${CLI_DIR}/gen_partial")
set_tests_properties(cli.gen_all_or_none PROPERTIES LABELS "cpu"
  PASS_REGULAR_EXPRESSION "--out-dir [^ ]*k\\.npy: cannot open file for writing[^\n]*\nrc=2 q=k\\.npy \n")
# A failed write of the table on standard output is a failure (it exited 0).
add_test(NAME cli.stdout_full COMMAND sh -c [=["$0" demo --seq 64 --threads 1 --quiet > /dev/full 2>&1; echo "rc=$?"]=]
  "$<TARGET_FILE:crisp_cli>")
set_tests_properties(cli.stdout_full PROPERTIES LABELS "cpu" PASS_REGULAR_EXPRESSION "rc=2")

# ---------------------------------------------------------------- happy path (small workload)
set(GEN_A "${CLI_DIR}/gen_a")  # n = 640 (5 blocks of 128, 10 of 64), 8/2 heads, d = 64
set(GEN_B "${CLI_DIR}/gen_b")  # n = 384: a different length, for the shape checks
set(GEN_C "${CLI_DIR}/gen_c")  # 3 KV heads: 8 query heads are not a multiple of it
crisp_cli_test(gen_a ARGS "gen|--seq|640|--dim|64|--seed|7|--out-dir|${GEN_A}" RC 0
  FILES "${GEN_A}/q.npy|${GEN_A}/k.npy|${GEN_A}/v.npy|${GEN_A}/workload.json" SETUP cli_gen_a)
crisp_cli_test(gen_b ARGS "gen|--seq|384|--dim|64|--out-dir|${GEN_B}" RC 0
  FILES "${GEN_B}/k.npy" SETUP cli_gen_b)
crisp_cli_test(gen_c ARGS "gen|--seq|640|--dim|64|--heads-q|3|--heads-kv|3|--out-dir|${GEN_C}" RC 0
  FILES "${GEN_C}/k.npy" SETUP cli_gen_c)

set(QK_A "--q|${GEN_A}/q.npy|--k|${GEN_A}/k.npy")
foreach(policy crisp flexprefill minference dense)
  crisp_cli_test(plan.${policy} ARGS "plan|${QK_A}|--policy|${policy}|--json|${CLI_DIR}/plan_${policy}.json"
    RC 0 STDOUT "density" FILES "${CLI_DIR}/plan_${policy}.json"
    JSON "${CLI_DIR}/plan_${policy}.json" HEADS 8 REQUIRES cli_gen_a)
endforeach()
crisp_cli_test(plan.sets
  ARGS "plan|${QK_A}|--set|routing=jsd|--set|vs_budget=noise_floor|--set|alpha=2|--block|64|--precision|f64|--threads|1|--json|${CLI_DIR}/plan_sets.json"
  RC 0 FILES "${CLI_DIR}/plan_sets.json" JSON "${CLI_DIR}/plan_sets.json" HEADS 8 REQUIRES cli_gen_a)
# Short prompts at finer blocks: 640 keys below the threshold plan at B = 64; a negative one is refused.
crisp_cli_test(plan.fine_blocks_below
  ARGS "plan|${QK_A}|--set|fine_blocks_below=1000|--threads|1|--json|${CLI_DIR}/plan_fine.json"
  RC 0 STDOUT "n_q = 640 of n_k = 640, B = 64:" JSON "${CLI_DIR}/plan_fine.json" HEADS 8 REQUIRES cli_gen_a)
crisp_cli_test(plan.fine_blocks_below_negative
  ARGS "plan|${QK_A}|--set|fine_blocks_below=-5|--json|${CLI_DIR}/plan_fine_bad.json"
  RC 2 STDERR "${ERR}fine_blocks_below: value -5 is out of range; expected an integer in" REQUIRES cli_gen_a)
# A chunk: 384 queries (gen_b) as the last positions of gen_a's 640 keys; and the reverse, refused.
crisp_cli_test(attend.chunk
  ARGS "attend|--q|${GEN_B}/q.npy|--k|${GEN_A}/k.npy|--v|${GEN_A}/v.npy|--out|${CLI_DIR}/o_chunk.npy|--lse|${CLI_DIR}/lse_chunk.npy"
  RC 0 STDOUT "n_q = 384 of n_k = 640" FILES "${CLI_DIR}/o_chunk.npy|${CLI_DIR}/lse_chunk.npy"
  REQUIRES "cli_gen_a;cli_gen_b")
crisp_cli_test(attend.more_queries_than_keys
  ARGS "attend|--q|${GEN_A}/q.npy|--k|${GEN_B}/k.npy|--v|${GEN_B}/v.npy|--out|${CLI_DIR}/o_bad.npy|--lse|${CLI_DIR}/lse_bad.npy"
  RC 2 STDERR "--q.*640 positions but --k only 384" REQUIRES "cli_gen_a;cli_gen_b")
crisp_cli_test(attend.flexprefill
  ARGS "attend|${QK_A}|--v|${GEN_A}/v.npy|--policy|flexprefill|--set|slash_cover=exact|--out|${CLI_DIR}/o.npy|--lse|${CLI_DIR}/lse.npy|--json|${CLI_DIR}/attend_plan.json"
  RC 0 FILES "${CLI_DIR}/o.npy|${CLI_DIR}/lse.npy|${CLI_DIR}/attend_plan.json"
  JSON "${CLI_DIR}/attend_plan.json" HEADS 8 REQUIRES cli_gen_a SETUP cli_attend)
crisp_cli_test(demo.small ARGS "demo|--seq|1024|--heads-q|4|--heads-kv|2|--dim|64|--quiet|--json|${CLI_DIR}/demo.json"
  RC 0 STDOUT "dense.*crisp.*flexprefill.*minference" FILES "${CLI_DIR}/demo.json")

# ---------------------------------------------------------------- bad policies and parameters
crisp_cli_test(unknown_policy ARGS "plan|${QK_A}|--policy|bogus_preset|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}--policy: unknown preset .bogus_preset.; expected one of crisp" REQUIRES cli_gen_a)
crisp_cli_test(unknown_set_key ARGS "plan|${QK_A}|--set|no_such_key=1|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}.*no_such_key" REQUIRES cli_gen_a)
crisp_cli_test(set_without_value ARGS "plan|${QK_A}|--set|alpha|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}.*alpha" REQUIRES cli_gen_a)
crisp_cli_test(bad_value ARGS "plan|${QK_A}|--set|alpha=abc|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}.*alpha" REQUIRES cli_gen_a)
crisp_cli_test(out_of_range_value ARGS "plan|${QK_A}|--set|gamma=1.5|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}.*gamma" REQUIRES cli_gen_a)
crisp_cli_test(bad_enum_value ARGS "plan|${QK_A}|--set|routing=sometimes|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}.*routing" REQUIRES cli_gen_a)
crisp_cli_test(bad_vs_floor ARGS "plan|${QK_A}|--set|vs_floor=median|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}.*vs_floor.*mean, uniform, max" REQUIRES cli_gen_a)
crisp_cli_test(bad_pe_alpha ARGS "plan|${QK_A}|--set|pe_rule=floor|--set|pe_alpha=0|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}.*pe_alpha.*> 0" REQUIRES cli_gen_a)
# Named by the option typed (--block, --policy), not by the Config field behind it.
crisp_cli_test(bad_block ARGS "plan|${QK_A}|--block|96|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}--block: value 96 is out of range; expected 64 or 128" REQUIRES cli_gen_a)

# ---------------------------------------------------------------- inputs that do not fit together
crisp_cli_test(length_mismatch ARGS "plan|--q|${GEN_A}/q.npy|--k|${GEN_B}/k.npy|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}" REQUIRES "cli_gen_a;cli_gen_b")
crisp_cli_test(heads_not_multiple ARGS "plan|--q|${GEN_A}/q.npy|--k|${GEN_C}/k.npy|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}--k [^ ]*k\\.npy: has 3 heads, which does not divide q's 8" REQUIRES "cli_gen_a;cli_gen_c")
crisp_cli_test(rank2_input ARGS "plan|--q|${GEN_A}/q.npy|--k|${CLI_DIR}/lse.npy|--json|${CLI_DIR}/x.json"
  STDERR "${ERR}--k [^ ]*lse\\.npy: has rank 2" REQUIRES "cli_gen_a;cli_attend")
crisp_cli_test(unwritable_json ARGS "plan|${QK_A}|--json|${CLI_DIR}/no_such_dir/plan.json"
  STDERR "${ERR}.*--json" REQUIRES cli_gen_a)
# Output paths are checked before the work: a missing input is not reached.
crisp_cli_test(unwritable_json_first ARGS "plan|--q|${CLI_DIR}/no_such_q.npy|--k|${CLI_DIR}/no_such_k.npy|--json|${CLI_DIR}/no_such_dir/plan.json"
  STDERR "${ERR}--json")
crisp_cli_test(attend_same_output ARGS "attend|${QK_A}|--v|${GEN_A}/v.npy|--out|${CLI_DIR}/same.npy|--lse|${CLI_DIR}/same.npy"
  STDERR "${ERR}--lse: .*--out" REQUIRES cli_gen_a)
crisp_cli_test(attend_same_output_json ARGS "attend|${QK_A}|--v|${GEN_A}/v.npy|--out|${CLI_DIR}/o2.npy|--lse|${CLI_DIR}/l2.npy|--json|${CLI_DIR}/./o2.npy"
  STDERR "${ERR}--json: .*--out" REQUIRES cli_gen_a)
# `--json -` writes the plan to stdout, the summary to stderr: stdout is one JSON document.
crisp_cli_test(plan_json_stdout ARGS "plan|${QK_A}|--json|-" RC 0 STDOUT "^[{].*heads.*[}][^a-z]*$" STDERR "density"
  REQUIRES cli_gen_a)
crisp_cli_test(negative_seed ARGS "gen|--seed|-1|--out-dir|${CLI_DIR}/seed" STDERR "${ERR}--seed")

# ---------------------------------------------------------------- seeds are uint64: 0 .. 2^64 - 1
# -1 was read as 2^64 - 1 by eval pareto and bench; 2^64 - 1 itself was refused by gen and demo.
crisp_cli_test(negative_seed.pareto
  ARGS "eval|pareto|--structured|--seed|-1|--sweep|crisp:alpha=1|--lengths|64|--json|${CLI_DIR}/seed_pareto.json"
  STDERR "${ERR}--seed: '-1' is not a non-negative integer")
crisp_cli_test(negative_seed.bench ARGS "bench|--seed|-1" STDERR "${ERR}--seed: '-1' is not a non-negative integer")
crisp_cli_test(seed_too_large.gen ARGS "gen|--seed|18446744073709551616|--out-dir|${CLI_DIR}/seed"
  STDERR "${ERR}--seed: '18446744073709551616' is out of range \\(beyond 2\\^64 - 1\\)")
# Numbers are decimal with leading zeros read as such (CLI11 alone read '010' as octal eight: the
# zero-stripping was attached as a check, whose changes CLI11 discards), and integers beyond 64 bits
# are refused (CLI11 clamped them to 2^63 - 1).
crisp_cli_test(leading_zeros.demo ARGS "demo|--seq|0600|--threads|010|--quiet" RC 0
  STDOUT "n = 600, Hq = 8.*backend cpu \\(10 threads")
crisp_cli_test(too_large.bench ARGS "bench|--heads|2|--kv-heads|1|--seq|18446744073709551616"
  STDERR "${ERR}--seq: '18446744073709551616' is out of range \\(beyond 64-bit integers\\)")
crisp_cli_test(too_large.float ARGS "bench|--densities|1e400" STDERR "${ERR}--densities: '1e400' is out of range")
# bench: an option the chosen run does not read is refused, not dropped; lengths hold the workload.
crisp_cli_test(bench.gpus_with_chunks ARGS "bench|--gpus|2|--chunks|1024"
  STDERR "${ERR}--gpus: 2 is given with --chunks")
crisp_cli_test(bench.partition_one_gpu ARGS "bench|--partition|zigzag" STDERR "${ERR}--partition: is given without --gpus above 1")
crisp_cli_test(bench.densities_with_chunks ARGS "bench|--chunks|1024|--densities|0.1"
  STDERR "${ERR}--densities: is given with --chunks")
crisp_cli_test(bench.seq_below_needles ARGS "bench|--seq|4" STDERR "${ERR}--seq: has 4; expected lengths of more than the 4")
crisp_cli_test(bench.seq_short_message ARGS "bench|--seq|0" STDERR "${ERR}--seq: '0' is not a positive integer \\(see")
crisp_cli_test(seed_wraps.pareto
  ARGS "eval|pareto|--structured|--seed|18446744073709551615|--seeds|2|--sweep|crisp:alpha=1|--lengths|64|--json|${CLI_DIR}/seed_wrap.json"
  STDERR "${ERR}--seed: 18446744073709551615 with --seeds 2 runs past the largest seed")
# The largest seed is a seed; this small workload (gen_d) is also the input of the overwrite checks.
set(GEN_D "${CLI_DIR}/gen_d")
crisp_cli_test(gen_d ARGS "gen|--seq|64|--dim|8|--heads-q|2|--heads-kv|1|--seed|18446744073709551615|--out-dir|${GEN_D}"
  RC 0 FILES "${GEN_D}/q.npy|${GEN_D}/k.npy|${GEN_D}/v.npy" SETUP cli_gen_d)

# ---------------------------------------------------------------- workload options (gen, demo)
# Errors name the option, not the workload field it fills (workload.needles, workload.head_dim).
crisp_cli_test(workload_seq_below_needles.gen ARGS "gen|--seq|4|--out-dir|${CLI_DIR}/seq4"
  STDERR "${ERR}--seq: 4 needles in sequence 0 of 4 tokens; expected fewer needles than tokens")
crisp_cli_test(workload_seq_below_needles.demo ARGS "demo|--seq|1"
  STDERR "${ERR}--seq: 4 needles in sequence 0 of 1 tokens")
crisp_cli_test(workload_seq_smallest.gen ARGS "gen|--seq|5|--dim|8|--heads-q|1|--heads-kv|1|--out-dir|${CLI_DIR}/seq5"
  RC 0 FILES "${CLI_DIR}/seq5/q.npy")
crisp_cli_test(workload_dim_small.gen ARGS "gen|--dim|7|--out-dir|${CLI_DIR}/dim7"
  STDERR "${ERR}--dim: 7 is out of range; expected an integer in \\[8, 256\\]")
crisp_cli_test(workload_dim_large.demo ARGS "demo|--dim|257" STDERR "${ERR}--dim: 257 is out of range; expected an integer in \\[8, 256\\]")
crisp_cli_test(help.gen_dim ARGS "gen|--help" RC 0 STDOUT "--dim[^\n]*8 to 256")
crisp_cli_test(workload_gqa.gen ARGS "gen|--seq|64|--heads-q|8|--heads-kv|3|--out-dir|${CLI_DIR}/gqa"
  STDERR "${ERR}--heads-q: 8 is not a multiple of num_kv_heads = 3")
crisp_cli_test(workload_too_large.gen ARGS "gen|--seq|1099511627776|--out-dir|${CLI_DIR}/huge"
  STDERR "${ERR}--seq: workload too large \\(heads x tokens x head_dim exceeds 2\\^40 elements\\)")

# ---------------------------------------------------------------- attend: shapes before the outputs
# A Q of shape (2^30, 1024, 0) holds no bytes: it was reported as "out of memory" (O was allocated
# from its extents before they were checked). The .npy is written here with printf: CMake's strings
# cannot hold its NUL bytes.
set(ZERO_NPY "${CLI_DIR}/zero_extent.npy")
add_test(NAME cli.zero_extent_npy COMMAND sh -c
  [=[printf '\223NUMPY\001\000\166\000{"descr": "<f4", "fortran_order": False, "shape": (1073741824, 1024, 0)}                                             \n' > "$0"]=]
  "${ZERO_NPY}")
set_tests_properties(cli.zero_extent_npy PROPERTIES LABELS "cpu" FIXTURES_SETUP cli_zero_npy)
crisp_cli_test(attend.zero_extent
  ARGS "attend|--q|${ZERO_NPY}|--k|${GEN_A}/k.npy|--v|${GEN_A}/v.npy|--out|${CLI_DIR}/o_zero.npy|--lse|${CLI_DIR}/l_zero.npy"
  STDERR "${ERR}--q [^ ]*zero_extent\\.npy: has shape \\[1073741824, 1024, 0\\] with zero head dim"
  REQUIRES "cli_gen_a;cli_zero_npy")
crisp_cli_test(attend.v_length_mismatch
  ARGS "attend|${QK_A}|--v|${GEN_B}/v.npy|--out|${CLI_DIR}/o_v.npy|--lse|${CLI_DIR}/l_v.npy"
  STDERR "${ERR}--v [^ ]*v\\.npy: has 384 tokens but k has 640" REQUIRES "cli_gen_a;cli_gen_b")

# ---------------------------------------------------------------- JSON on standard output
# `--json -`: the JSON alone on stdout, the human summary on stderr (as `crisp plan`).
crisp_cli_test(attend_json_stdout
  ARGS "attend|${QK_A}|--v|${GEN_A}/v.npy|--out|${CLI_DIR}/o_js.npy|--lse|${CLI_DIR}/l_js.npy|--json|-"
  RC 0 STDOUT "^[{].*heads.*[}][^a-z]*$" STDERR "attend: policy" REQUIRES cli_gen_a)
crisp_cli_test(demo_json_stdout ARGS "demo|--seq|512|--heads-q|2|--heads-kv|1|--dim|32|--quiet|--json|-"
  RC 0 STDOUT "^[{].*rows.*[}][^a-z]*$" STDERR "crisp demo: structured workload")

# ---------------------------------------------------------------- .npy outputs are files
# `--out -` made a file named '-'; binary outputs are refused on standard output.
crisp_cli_test(attend_out_stdout ARGS "attend|${QK_A}|--v|${GEN_A}/v.npy|--out|-|--lse|${CLI_DIR}/l_so.npy"
  STDERR "${ERR}--out: '-' \\(standard output\\) is not supported for the \\.npy output O" REQUIRES cli_gen_a)
crisp_cli_test(attend_lse_stdout ARGS "attend|${QK_A}|--v|${GEN_A}/v.npy|--out|${CLI_DIR}/o_so.npy|--lse|/dev/stdout"
  STDERR "${ERR}--lse: '/dev/stdout' \\(standard output\\) is not supported" REQUIRES cli_gen_a)
crisp_cli_test(gen_out_dir_stdout ARGS "gen|--seq|64|--out-dir|-"
  STDERR "${ERR}--out-dir: '-' \\(standard output\\) is not supported")

# ---------------------------------------------------------------- an output is not an input
crisp_cli_test(plan_json_is_input ARGS "plan|--q|${GEN_D}/q.npy|--k|${GEN_D}/k.npy|--json|${GEN_D}/q.npy"
  STDERR "${ERR}--json: '[^']*q\\.npy' is the --q input file" REQUIRES cli_gen_d)
crisp_cli_test(attend_out_is_input
  ARGS "attend|--q|${GEN_D}/q.npy|--k|${GEN_D}/k.npy|--v|${GEN_D}/v.npy|--out|${GEN_D}/./q.npy|--lse|${CLI_DIR}/l_in.npy"
  STDERR "${ERR}--out: '[^']*q\\.npy' is the --q input file" REQUIRES cli_gen_d)
crisp_cli_test(attend_lse_is_input
  ARGS "attend|--q|${GEN_D}/q.npy|--k|${GEN_D}/k.npy|--v|${GEN_D}/v.npy|--out|${CLI_DIR}/o_in.npy|--lse|${GEN_D}/../gen_d/v.npy"
  STDERR "${ERR}--lse: '[^']*v\\.npy' is the --v input file" REQUIRES cli_gen_d)
crisp_cli_test(attend_json_is_input
  ARGS "attend|--q|${GEN_D}/q.npy|--k|${GEN_D}/k.npy|--v|${GEN_D}/v.npy|--out|${CLI_DIR}/o_in.npy|--lse|${CLI_DIR}/l_in.npy|--json|${GEN_D}/k.npy"
  STDERR "${ERR}--json: '[^']*k\\.npy' is the --k input file" REQUIRES cli_gen_d)

# ---------------------------------------------------------------- bench: checked before the GPU is looked for
# --json was first written after a whole measurement; the quartered heads were not checked at all.
crisp_cli_test(bench.json_unwritable ARGS "bench|--json|${CLI_DIR}/no_such_dir/bench.json"
  STDERR "${ERR}--json: directory .*no_such_dir.* does not exist")
crisp_cli_test(bench.json_unwritable_chunks ARGS "bench|--chunks|4096|--json|${CLI_DIR}/no_such_dir/bench.json"
  STDERR "${ERR}--json: directory .*no_such_dir.* does not exist")
crisp_cli_test(bench.json_stdout ARGS "bench|--json|-" STDERR "${ERR}--json: '-' \\(standard output\\) is not supported")
crisp_cli_test(bench.quarter_heads_none ARGS "bench|--heads|2|--kv-heads|1|--seq|1024|--quarter-heads-from|1024"
  STDERR "${ERR}--quarter-heads-from: 1024 quarters --heads 2 / --kv-heads 1 to 0 query / 1 kv heads.*no query head")
crisp_cli_test(bench.quarter_heads_not_multiple
  ARGS "bench|--heads|20|--kv-heads|10|--seq|1024,4096|--quarter-heads-from|2048"
  STDERR "${ERR}--quarter-heads-from: 2048 quarters --heads 20 / --kv-heads 10 to 5 query / 2 kv heads at --seq 4096, not a multiple")
crisp_cli_test(bench.quarter_heads_negative ARGS "bench|--quarter-heads-from|-5"
  STDERR "${ERR}--quarter-heads-from: '-5' is not a non-negative integer")

# ---------------------------------------------------------------- builds without the CUDA backend
if(NOT CRISP_HAVE_CUDA)
  crisp_cli_test(demo_cuda_unavailable ARGS "demo|--backend|cuda|--seq|512" STDERR "${ERR}.*--backend")
  crisp_cli_test(bench_unavailable ARGS "bench" STDERR "${ERR}.*CUDA")
endif()

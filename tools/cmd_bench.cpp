// tools/cmd_bench.cpp — `crisp bench`: the CUDA backend on the GPU, plan and attention timed
// separately for every preset on the structured workload, plus random block layouts at fixed
// densities for the kernel's efficiency.
//
// Timing: CUDA events around each call on one stream, after warm-up; the median of --reps runs.
// Effective TFLOP/s counts computed blocks only:
//   FLOP = 4 * B * B * d * sum over heads of (nnz - N / 2)
// (QK^T and PV: 2 * 2 * B * B * d per computed block pair; the masked half of each of the N
// diagonal blocks is not counted; a partial last block is counted as full).
// Recall per query: exp(LSE_sparse - LSE_dense) against the dense path of the same run (LSE read
// back from the GPU), mean and minimum over all queries and heads.
// Kernels (--kernels): every layout is timed with each listed attention kernel (crisp::CudaOptions
// per run: portable, hopper or auto; default portable and, on an sm_90 device, hopper); the layout
// column then reads "<layout>/<kernel>" and speedups are against the dense path of the same kernel.
// The Hopper kernel's scheduling variants are kernels of their own here: hopper-persistent-pp,
// hopper-persistent-nopp, hopper-grid-pp, hopper-grid-nopp (Schedule x PingPong, crisp/options.h);
// "hopper" is the default variant. hopper-gqa-pack packs each GQA group into the kernel's tiles
// (GqaPacking::pack): it computes the union of the group's layouts, so its rows report the
// density, TFLOP/s and recall of crisp::gqa_union(plan), what it computed.
#include "commands.h"

#if defined(CRISP_WITH_CUDA)
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/half.h"
#include "common/shape_rules.h"
#include "crisp/cuda.h"
#include "crisp/workload.h"
#include "bench_chunked.h"
#include "bench_context_parallel.h"
#include "gpu_timing.h"
#include "io_util.h"
#include "progress.h"
#include "validators.h"

namespace {

// Every --kernels name and the kernel options it runs with.
struct KernelVariant {
  const char* name;
  crisp::CudaOptions options;
};
const KernelVariant kKernelVariants[] = {
    {"portable", {crisp::Kernel::portable}},
    {"hopper", {crisp::Kernel::hopper}},
    {"auto", {crisp::Kernel::automatic}},
    {"hopper-persistent-pp", {crisp::Kernel::hopper, crisp::Schedule::persistent, crisp::PingPong::on}},
    {"hopper-persistent-nopp", {crisp::Kernel::hopper, crisp::Schedule::persistent, crisp::PingPong::off}},
    {"hopper-grid-pp", {crisp::Kernel::hopper, crisp::Schedule::grid, crisp::PingPong::on}},
    {"hopper-grid-nopp", {crisp::Kernel::hopper, crisp::Schedule::grid, crisp::PingPong::off}},
    {"hopper-gqa-pack",
     {crisp::Kernel::hopper, crisp::Schedule::automatic, crisp::PingPong::automatic, crisp::GqaPacking::pack}}};

const crisp::CudaOptions& kernel_options(const std::string& kernel) {
  for (const KernelVariant& v : kKernelVariants)
    if (kernel == v.name) return v.options;
  throw crisp::Error("--kernels", "has \"" + kernel + "\"", "a kernel name listed by --help");
}

std::vector<std::string> kernel_names() {
  std::vector<std::string> names;
  for (const KernelVariant& v : kKernelVariants) names.push_back(v.name);
  return names;
}

struct BenchArgs {
  std::vector<int64_t> seq = {8192, 32768, 131072, 524288};
  std::vector<std::string> presets = {"dense", "crisp", "flexprefill", "minference"};
  std::vector<double> densities = {0.05, 0.10, 0.20};
  int64_t heads = 32, kv_heads = 8, dim = 128;
  int block = 128;
  int reps = 5, warmup = 2;
  // NOTE: from this length on the run uses a quarter of the heads (memory of the plan capacity
  // and the CPU workload generation time); said in the output.
  int64_t quarter_heads_from = 524288;
  uint64_t seed = 0;
  double diffuse_share = crisp::WorkloadSpec{}.diffuse_head_share;
  std::string json_path;
  bool quiet = false;
  // --gpus N > 1: context-parallel prefill over N GPUs against one (tools/bench_context_parallel.cpp).
  int gpus = 1;
  std::vector<std::string> partitions = {"zigzag"};
  std::vector<std::string> kernels;  // empty: portable, plus hopper where it can run
  // --chunks: chunked prefill against one shot (tools/bench_chunked.cpp), over --page-sizes too.
  std::vector<int64_t> chunks;
  std::vector<int64_t> page_sizes;
  bool kv_token_major = false;
  bool split_times = false;
  std::vector<std::string> page_orders = {"shuffled"};
};

#if defined(CRISP_WITH_CUDA)

using crisp_cli::gpu::check;
using crisp_cli::gpu::DeviceBuffer;
using crisp_cli::gpu::median;
using crisp_cli::gpu::time_ms;

// Sum over heads of (nnz - N/2): the computed block pairs, diagonal blocks counted as half.
double computed_block_pairs(const crisp::Plan& plan) {
  double pairs = 0.0;
  for (const auto& s : plan.sequences)
    for (const auto& h : s.heads) pairs += static_cast<double>(h.col.size()) - 0.5 * s.num_blocks;
  return pairs;
}

// A random layout at about `density` of the causal blocks: diagonal and column 0 always, every
// other c < r with one probability.
crisp::Plan random_plan(int64_t H, int64_t Hkv, int64_t d, int64_t n, int B, double density, uint64_t seed) {
  crisp::Plan plan = crisp::dense_plan(H, Hkv, d, {0, n}, B);
  // Slash 0 then reaches only the diagonal (a random row need not hold r - 1).
  plan.config.slash_cover = crisp::SlashCover::single;
  const int32_t N = plan.sequences[0].num_blocks;
  const double total = static_cast<double>(N) * (N + 1) / 2;
  const double forced = 2.0 * N - 1;
  const double free_pairs = total - forced;
  const double p = free_pairs > 0 ? std::clamp((density * total - forced) / free_pairs, 0.0, 1.0) : 0.0;
  std::mt19937_64 rng(seed);
  std::bernoulli_distribution pick(p);
  for (auto& head : plan.sequences[0].heads) {
    head.route = crisp::Route::vs;
    head.vertical = {0};
    head.slash = {0};
    head.col.clear();
    head.row_ptr.assign(1, 0);
    for (int32_t r = 0; r < N; ++r) {
      for (int32_t c = 0; c <= r; ++c)
        if (c == 0 || c == r || pick(rng)) head.col.push_back(c);
      head.row_ptr.push_back(static_cast<int32_t>(head.col.size()));
    }
    head.density = static_cast<double>(head.col.size()) / total;
  }
  return plan;
}

void run_bench(const BenchArgs& a) {
  if (!crisp::cuda::available()) throw crisp_cli::CommandFailure("crisp bench: no CUDA device is visible");
  crisp_cli::Progress progress(!a.quiet);
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  std::vector<std::string> kernels = a.kernels;
  if (kernels.empty()) {
    kernels = {"portable"};
    if (crisp::cuda::hopper_kernel_available()) kernels.push_back("hopper");
  }

  nlohmann::json out;
  out["device"] = prop.name;
  out["l2_bytes"] = prop.l2CacheSize;
  out["block_size"] = a.block;
  out["head_dim"] = a.dim;
  out["reps"] = a.reps;
  out["warmup"] = a.warmup;
  out["dtype"] = "bf16";
  out["diffuse_head_share"] = a.diffuse_share;
  out["flop_formula"] = "4*B*B*d*sum_heads(nnz - N/2)";
  out["runs"] = nlohmann::json::array();
  const auto write_json = [&] {
    if (!a.json_path.empty()) crisp_cli::write_text_file("--json", a.json_path, out.dump(2) + "\n");
  };

  std::printf("device: %s, bf16, d=%lld, B=%d, median of %d runs after %d warm-up, diffuse head share %.3g\n",
              prop.name, static_cast<long long>(a.dim), a.block, a.reps, a.warmup, a.diffuse_share);
  std::printf("TFLOP/s = 4*B*B*d*sum_heads(nnz - N/2) / attention time (computed blocks only)\n");
  std::printf("%-8s %-5s %-22s %9s %9s %8s %9s %8s %8s %10s %10s\n", "n", "heads", "layout", "plan_ms", "attn_ms",
              "density", "TFLOP/s", "vs_share", "speedup", "recall_mean", "recall_min");
  std::fflush(stdout);

  for (const int64_t n : a.seq) {
    const BenchHeads heads = bench_heads(n, a.heads, a.kv_heads, a.quarter_heads_from);
    const bool quarter = heads.quartered;
    const int64_t H = heads.q, Hkv = heads.kv;
    if (quarter)
      std::printf("note: n=%lld runs %lld query / %lld kv heads (a quarter of the heads)\n", static_cast<long long>(n),
                  static_cast<long long>(H), static_cast<long long>(Hkv));
    progress.begin("workload n=" + std::to_string(n) + " (" + std::to_string(H) + " heads, CPU)");
    std::vector<uint16_t> qb, kb, vb;
    {
      crisp_cli::gpu::Bf16Workload w = crisp_cli::gpu::bf16_workload(H, Hkv, a.dim, n, a.seed, a.diffuse_share);
      qb = std::move(w.q);
      kb = std::move(w.k);
      vb = std::move(w.v);
    }
    const double gen_ms = progress.done();
    DeviceBuffer qd(qb.size() * 2), kd(kb.size() * 2), vd(vb.size() * 2), od(qb.size() * 2);
    DeviceBuffer lse_dense(static_cast<std::size_t>(H * n) * 4), lse_sparse(static_cast<std::size_t>(H * n) * 4);
    check(cudaMemcpy(qd.ptr, qb.data(), qb.size() * 2, cudaMemcpyHostToDevice), "copy q");
    check(cudaMemcpy(kd.ptr, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice), "copy k");
    check(cudaMemcpy(vd.ptr, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice), "copy v");
    const auto dev = crisp::Device::cuda;
    const auto q = crisp::TensorView::contiguous(qd.ptr, crisp::DType::bf16, H, n, a.dim, dev);
    const auto k = crisp::TensorView::contiguous(kd.ptr, crisp::DType::bf16, Hkv, n, a.dim, dev);
    const auto v = crisp::TensorView::contiguous(vd.ptr, crisp::DType::bf16, Hkv, n, a.dim, dev);
    const auto o = crisp::TensorView::contiguous(od.ptr, crisp::DType::bf16, H, n, a.dim, dev);
    const auto ld = crisp::TensorView::contiguous2d(lse_dense.ptr, crisp::DType::f32, H, n, dev);
    const auto ls = crisp::TensorView::contiguous2d(lse_sparse.ptr, crisp::DType::f32, H, n, dev);
    std::vector<float> lse_dense_host(static_cast<std::size_t>(H * n)), lse_host(lse_dense_host.size());

    std::map<std::string, double> dense_ms_by_kernel;
    const auto report = [&](const std::string& layout_name, const std::string& kernel, double plan_ms, double attn_ms,
                            const crisp::Plan& planned, bool with_recall) {
      // What the kernel computed: the plan, or with GQA packing the union of each group's layouts.
      // The plan's block size: a Config may resolve another than --block (fine_blocks_below).
      const int B = planned.block_size;
      const bool packed = kernel_options(kernel).gqa_packing == crisp::GqaPacking::pack &&
                          crisp::cuda::gqa_packing_applies(B, H / Hkv);
      const crisp::Plan computed = packed ? crisp::gqa_union(planned) : crisp::Plan{};
      const crisp::Plan& plan = packed ? computed : planned;
      const std::string layout = kernels.size() > 1 ? layout_name + "/" + kernel : layout_name;
      const bool have_dense = dense_ms_by_kernel.count(kernel) > 0;
      const double dense_attn_ms = have_dense ? dense_ms_by_kernel.at(kernel) : 0.0;
      const int32_t N = plan.sequences[0].num_blocks;
      const double pairs = computed_block_pairs(plan);
      const double tflops = 4.0 * B * B * a.dim * pairs / (attn_ms * 1e-3) / 1e12;
      nlohmann::json r;
      r["n"] = n;
      r["q_heads"] = H;
      r["kv_heads"] = Hkv;
      r["layout"] = layout_name;
      r["kernel"] = kernel;
      r["num_blocks"] = N;
      r["plan_block_size"] = B;
      r["plan_ms"] = plan_ms;
      r["attention_ms"] = attn_ms;
      r["density"] = plan.density();
      r["planned_density"] = planned.density();
      r["computed_layout"] = packed ? "gqa_union" : "plan";
      r["effective_tflops"] = tflops;
      r["vs_share"] = plan.vs_share();
      r["workload_ms"] = gen_ms;
      double speed = std::nan(""), speed_e2e = std::nan("");
      if (have_dense) {
        speed = dense_attn_ms / attn_ms;
        speed_e2e = dense_attn_ms / (attn_ms + plan_ms);
        r["speedup_attention"] = speed;
        r["speedup_end_to_end"] = speed_e2e;
      }
      double rmean = std::nan(""), rmin = std::nan("");
      if (with_recall && have_dense) {
        check(cudaMemcpy(lse_host.data(), ls.data, lse_host.size() * 4, cudaMemcpyDeviceToHost), "copy lse");
        const crisp_cli::gpu::Recall recall = crisp_cli::gpu::recall_against_dense(lse_host, lse_dense_host);
        rmean = recall.mean;
        rmin = recall.min;
        r["recall_mean"] = rmean;
        r["recall_min"] = rmin;
      }
      out["runs"].push_back(r);
      char sp[32];
      if (std::isnan(speed)) std::snprintf(sp, sizeof sp, "-");
      else std::snprintf(sp, sizeof sp, "%.2fx/%.2fx", speed, speed_e2e);
      std::printf("%-8lld %-5lld %-22s %9.3f %9.3f %8.4f %9.1f %8.3f %8s", static_cast<long long>(n),
                  static_cast<long long>(H), layout.c_str(), plan_ms, attn_ms, plan.density(), tflops, plan.vs_share(), sp);
      if (std::isnan(rmean)) std::printf(" %10s %10s\n", "-", "-");
      else std::printf(" %10.4f %10.4f\n", rmean, rmin);
      std::fflush(stdout);
      write_json();
    };

    std::vector<std::string> presets = a.presets;
    // The dense path first: it is every other row's baseline.
    std::stable_partition(presets.begin(), presets.end(), [](const std::string& p) { return p == "dense"; });
    for (const std::string& preset : presets) {
      crisp::Config cfg = crisp_cli::config_of_policy_spec(preset, "--presets");
      cfg.block_size = a.block;
      progress.begin("n=" + std::to_string(n) + " " + preset);
      crisp::cuda::DevicePlan dplan(H, Hkv, a.dim, {0, n}, cfg);
      const double plan_ms =
          time_ms(stream, a.warmup, a.reps, [&] { crisp::cuda::plan_async(q, k, cfg, dplan, stream); });
      const bool is_dense = cfg.dense;
      const auto& lse = is_dense ? ld : ls;
      const crisp::Plan host = dplan.to_host(stream);
      progress.done();
      for (const std::string& kernel : kernels) {
        const crisp::CudaOptions& options = kernel_options(kernel);
        const double attn_ms = time_ms(stream, a.warmup, a.reps,
                                       [&] { crisp::cuda::attend_async(q, k, v, dplan, o, lse, stream, options); });
        if (is_dense) {
          dense_ms_by_kernel[kernel] = attn_ms;
          check(cudaMemcpy(lse_dense_host.data(), ld.data, lse_dense_host.size() * 4, cudaMemcpyDeviceToHost),
                "copy dense lse");
        }
        report(preset, kernel, plan_ms, attn_ms, host, !is_dense);
      }
    }
    for (const double density : a.densities) {
      char name[64];
      std::snprintf(name, sizeof name, "random_%.0f%%", density * 100);
      progress.begin(std::string("n=") + std::to_string(n) + " " + name);
      crisp::Plan layout = random_plan(H, Hkv, a.dim, n, a.block, density, a.seed + 17);
      crisp::cuda::DevicePlan dplan(layout, stream);
      progress.done();
      for (const std::string& kernel : kernels) {
        const crisp::CudaOptions& options = kernel_options(kernel);
        const double attn_ms = time_ms(stream, a.warmup, a.reps,
                                       [&] { crisp::cuda::attend_async(q, k, v, dplan, o, ls, stream, options); });
        report(name, kernel, 0.0, attn_ms, layout, false);
      }
    }
  }
  cudaStreamDestroy(stream);
  write_json();
}

#endif  // CRISP_WITH_CUDA

}  // namespace

const crisp::CudaOptions& bench_kernel_options(const std::string& kernel) { return kernel_options(kernel); }

namespace {

// Options whose presence (not value) the checks below read.
struct BenchOptionsGiven {
  const CLI::Option* densities;
  const CLI::Option* quarter_heads_from;
  const CLI::Option* diffuse_share;
  const CLI::Option* kernels;
  const CLI::Option* partition;
};

// One run is chunked (--chunks), context-parallel (--gpus > 1) or the plain one: an option that the
// chosen run does not read is refused, not dropped without a word; and every --seq must hold the
// structured workload (more positions than its planted needles).
void check_option_combinations(const BenchArgs& args, const BenchOptionsGiven& given) {
  const int64_t needles = crisp::WorkloadSpec{}.needles;
  for (const int64_t n : args.seq)
    if (n <= needles)
      throw crisp::Error("--seq", "has " + std::to_string(n),
                         "lengths of more than the " + std::to_string(needles) + " planted needles of the workload");
  const bool chunked = !args.chunks.empty(), parallel = args.gpus > 1;
  if (chunked && parallel)
    throw crisp::Error("--gpus", std::to_string(args.gpus) + " is given with --chunks",
                       "one of them (the chunked bench runs on one GPU)");
  if (given.partition->count() > 0 && !parallel)
    throw crisp::Error("--partition", "is given without --gpus above 1", "--gpus 2 or more (the partitions it compares)");
  if (given.densities->count() > 0 && (chunked || parallel))
    throw crisp::Error("--densities", std::string("is given with ") + (chunked ? "--chunks" : "--gpus above 1"),
                       "random layouts only in the plain bench (no --chunks, one GPU)");
  if (given.quarter_heads_from->count() > 0 && chunked)
    throw crisp::Error("--quarter-heads-from", "is given with --chunks",
                       "no --quarter-heads-from (the chunked bench runs every length with all heads)");
  if (parallel && (given.kernels->count() > 0 || given.diffuse_share->count() > 0))
    throw crisp::Error(given.kernels->count() > 0 ? "--kernels" : "--diffuse-share", "is given with --gpus above 1",
                       "the one-GPU bench (the context-parallel bench runs its own kernel choice and workload)");
}

}  // namespace

void register_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  CLI::App* sub = app.add_subcommand(
      "bench", "GPU benchmark: plan and attention time, density, effective TFLOP/s, speedup over dense, recall");
  sub->add_option("--seq", args->seq, "Sequence lengths (comma separated)")->delimiter(',')->check(crisp_cli::kPositiveInteger);
  sub->add_option("--presets", args->presets,
                  "Presets to run (comma separated), each PRESET or PRESET:key=value[:key=value...] (e.g. "
                  "crisp:proxy_last_rows=16); dense is the baseline")
      ->delimiter(',')
      ->check(CLI::Validator(
          [](std::string& spec) -> std::string {
            try {
              (void)crisp_cli::config_of_policy_spec(spec, "--presets");
            } catch (const crisp::Error& e) {
              return e.reason();  // CLI11 names the option
            }
            return "";
          },
          "PRESET[:key=value...]"));
  CLI::Option* densities_option = sub->add_option("--densities", args->densities, "Random block layouts at these densities (comma separated)")
      ->delimiter(',')
      ->check(CLI::Range(0.0, 1.0));
  sub->add_option("--heads", args->heads, "Query heads")->check(crisp_cli::kPositiveInteger);
  sub->add_option("--kv-heads", args->kv_heads, "Key/value heads (divides --heads)")->check(crisp_cli::kPositiveInteger);
  sub->add_option("--dim", args->dim, std::string("Head dimension (") + crisp::shape_rules::kCudaHeadDimExpected + ")")
      ->check(CLI::Validator(
          [](std::string& input) -> std::string {
            std::size_t used = 0;
            try {
              if (crisp::cuda::head_dim_supported(std::stoll(input, &used)) && used == input.size()) return "";
            } catch (const std::exception&) {
            }
            return "'" + input + "' is not " + crisp::shape_rules::kCudaHeadDimExpected;
          },
          "HEAD_DIM"));
  sub->add_option("--block", args->block, "Block size (64 or 128)")->check(CLI::IsMember({64, 128}));
  sub->add_option("--reps", args->reps, "Timed runs per measurement (median reported)")->check(CLI::Range(1, 1000));
  sub->add_option("--warmup", args->warmup, "Untimed runs before timing")->check(CLI::Range(0, 100));
  CLI::Option* quarter_option = sub->add_option("--quarter-heads-from", args->quarter_heads_from,
                  "Use a quarter of the heads from this sequence length on (memory / generation time); the "
                  "quartered --heads / --kv-heads (kv at least 1) must stay >= 1 and a multiple")
      ->capture_default_str()
      ->check(crisp_cli::kNonNegativeInteger);
  sub->add_option("--seed", args->seed, "Workload seed")
      ->capture_default_str();  // uint64_t: require_decimal_numbers refuses -1, which CLI11 would wrap
  CLI::Option* diffuse_option = sub->add_option("--diffuse-share", args->diffuse_share,
                  "Share of the workload's query heads that are diffuse (routed PE by crisp; docs/workload.md)")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  sub->add_option("--json", args->json_path,
                  "Write every measurement as JSON to this file (rewritten after each one; not standard output)");
  sub->add_flag("--quiet", args->quiet, "No progress lines on stderr");
  CLI::Option* kernels_option = sub->add_option("--kernels", args->kernels,
                  "Attention kernels to time each layout with (comma separated: portable, hopper, auto, or a "
                  "Hopper variant hopper-{persistent,grid}-{pp,nopp} or hopper-gqa-pack; default portable plus hopper on sm_90)")
      ->delimiter(',')
      ->check(CLI::IsMember(kernel_names()));
  sub->add_option("--gpus", args->gpus,
                  "GPUs: above 1, context-parallel prefill over that many GPUs (NCCL) against one GPU, "
                  "for --presets (random layouts are not run)")
      ->check(CLI::Range(1, 64));
  CLI::Option* partition_option = sub->add_option("--partition", args->partitions,
                  "Query-block partitions of --gpus > 1 (comma separated): contiguous, zigzag")
      ->delimiter(',')
      ->check(CLI::IsMember({"contiguous", "zigzag"}));
  sub->add_option("--chunks", args->chunks,
                  "Chunked prefill: prefill each --seq prompt in chunks of these sizes (comma separated) over its "
                  "growing KV cache, against the one-shot prefill (total time, density, recall); random layouts "
                  "are not run")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 31));
  sub->add_option("--page-sizes", args->page_sizes,
                  "With --chunks: also run over a paged K/V (vLLM layout, shuffled pages) of these page sizes "
                  "(multiples of 16), against contiguous K/V")
      ->delimiter(',')
      ->check(CLI::Range(int64_t{16}, int64_t{1} << 20));
  sub->add_flag("--kv-token-major", args->kv_token_major,
                "With --chunks: also run contiguous K/V laid out token-major [n, Hkv, d] (the paged pool's memory "
                "order without pages) beside [Hkv, n, d], in the same interleaved rounds; paged runs are also "
                "reported against it (vs_token_major)");
  CLI::Option* page_order_option = sub->add_option("--page-order", args->page_orders,
                  "With --page-sizes: the pool's pages in a shuffled order (a long-running engine's free list), "
                  "in order (a fresh pool), or both (comma separated, each page size once per order): shuffled, "
                  "in_order")
      ->delimiter(',')
      ->check(CLI::IsMember({"shuffled", "in_order"}));
  sub->add_flag("--split-times", args->split_times,
                "With --chunks: also time every chunk's plans alone and every chunk's attention alone (the "
                "plans made), so a difference in the total shows its side");
  const BenchOptionsGiven given{densities_option, quarter_option, diffuse_option, kernels_option, partition_option};
  sub->callback([args, page_order_option, given] {
    // Every check here comes before the GPU is looked for (run_*bench), so bad input is reported as
    // such on any machine, and before any measurement.
    if (args->heads % args->kv_heads != 0)
      throw crisp::Error("--kv-heads", "does not divide --heads", "a divisor of the query head count");
    // --json is rewritten after every measurement (a checkpoint of a long run): a file, checked now
    // rather than at the first write after a whole measurement.
    crisp_cli::require_file_output("--json", args->json_path, "the measurements' JSON (rewritten after each one)");
    crisp_cli::require_writable("--json", args->json_path);
    if (args->chunks.empty()) {  // the chunked bench runs every length with all heads
      for (const int64_t n : args->seq) {
        const BenchHeads h = bench_heads(n, args->heads, args->kv_heads, args->quarter_heads_from);
        if (!h.quartered) continue;
        if (h.q < 1 || h.q % h.kv != 0)
          throw crisp::Error(
              "--quarter-heads-from",
              std::to_string(args->quarter_heads_from) + " quarters --heads " + std::to_string(args->heads) +
                  " / --kv-heads " + std::to_string(args->kv_heads) + " to " + std::to_string(h.q) + " query / " +
                  std::to_string(h.kv) + " kv heads at --seq " + std::to_string(n) +
                  (h.q < 1 ? ": no query head" : ", not a multiple"),
              "--heads of at least 4 whose quarter is a multiple of the quarter of --kv-heads (at least 1), or a "
              "--quarter-heads-from above every --seq length");
      }
    }
    for (const int64_t p : args->page_sizes)
      if (p % 16 != 0) throw crisp::Error("--page-sizes", "has " + std::to_string(p), "multiples of 16");
    if (args->kv_token_major && args->chunks.empty())
      throw crisp::Error("--kv-token-major", "is given without --chunks", "--chunks (the layout of the chunked runs)");
    if (args->split_times && args->chunks.empty())
      throw crisp::Error("--split-times", "is given without --chunks", "--chunks (the split is of the chunked runs)");
    if (page_order_option->count() > 0 && args->page_sizes.empty())
      throw crisp::Error("--page-order", "is given without --page-sizes", "--page-sizes (the paged runs it orders)");
    if (!args->page_sizes.empty() && args->chunks.empty())
      throw crisp::Error("--page-sizes", "is given without --chunks", "--chunks (paged K/V is measured on chunked runs)");
    check_option_combinations(*args, given);
    if (!args->chunks.empty()) {
      ChunkedBenchArgs c;
      c.seq = args->seq;
      c.chunks = args->chunks;
      c.page_sizes = args->page_sizes;
      c.kv_token_major = args->kv_token_major;
      c.split_times = args->split_times;
      c.page_orders_shuffled.clear();
      for (const std::string& order : args->page_orders) c.page_orders_shuffled.push_back(order == "shuffled");
      c.presets = args->presets;
      c.kernels = args->kernels;
      c.heads = args->heads;
      c.kv_heads = args->kv_heads;
      c.dim = args->dim;
      c.block = args->block;
      c.reps = args->reps;
      c.warmup = args->warmup;
      c.seed = args->seed;
      c.diffuse_share = args->diffuse_share;
      c.json_path = args->json_path;
      c.quiet = args->quiet;
      run_chunked_bench(c);
      return;
    }
    if (args->gpus > 1) {
      ContextParallelBenchArgs cp;
      cp.gpus = args->gpus;
      cp.partitions = args->partitions;
      cp.seq = args->seq;
      cp.presets = args->presets;
      cp.heads = args->heads;
      cp.kv_heads = args->kv_heads;
      cp.dim = args->dim;
      cp.block = args->block;
      cp.reps = args->reps;
      cp.warmup = args->warmup;
      cp.quarter_heads_from = args->quarter_heads_from;
      cp.seed = args->seed;
      cp.json_path = args->json_path;
      cp.quiet = args->quiet;
      run_context_parallel_bench(cp);
      return;
    }
#if defined(CRISP_WITH_CUDA)
    run_bench(*args);
#else
    throw crisp_cli::CommandFailure("crisp bench needs the CUDA backend; this build has none (CRISP_CUDA=OFF)");
#endif
  });
}

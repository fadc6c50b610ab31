// tools/bench_context_parallel.cpp — `crisp bench --gpus N`: context-parallel prefill
// (crisp/context_parallel.h) on N GPUs against one GPU, on the structured workload.
//
// Per sequence length and preset:
//  - one GPU (device 0): plan_async and attend_async on the whole sequence, timed apart and
//    together (one layer = plan + attention);
//  - N GPUs, per partition: one thread per GPU holding only its slices of Q/K/V; one layer =
//    ContextParallelPrefill::run (local staging, NCCL all-gather of Q/K/V, assembly, the same
//    planner on every rank, attention of the rank's own query blocks). The layer time is the
//    slowest rank's median (CUDA events on each rank's stream);
//  - equality: every rank's O / LSE slice against the single-GPU output (max |diff| and the count
//    of differing elements; the same kernel on the same data gives 0);
//  - balance: the plan's computed blocks of the busiest rank over the mean per rank.
#include "bench_context_parallel.h"

#include "commands.h"

#if defined(CRISP_WITH_CUDA)
#include <cuda_runtime.h>
#endif
#if defined(CRISP_WITH_NCCL)
#include <nccl.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/half.h"
#include "crisp/context_parallel.h"
#include "crisp/cuda.h"
#include "crisp/workload.h"
#include "gpu_timing.h"
#include "io_util.h"
#include "plan/shard_copy.h"
#include "progress.h"

using crisp::partition::copy_shard_tokens;

#if defined(CRISP_WITH_NCCL)

namespace {

using crisp_cli::gpu::check;
using crisp_cli::gpu::DeviceBuffer;
using crisp_cli::gpu::median;
using crisp_cli::gpu::time_ms;

struct RankRun {
  double layer_ms = 0.0;
  std::vector<uint16_t> out;  // [Hq, local_tokens, d] bf16
  std::vector<float> lse;     // [Hq, local_tokens]
  std::string error;
};

}  // namespace

void run_context_parallel_bench(const ContextParallelBenchArgs& a) {
  if (!crisp::cuda::available()) throw crisp_cli::CommandFailure("crisp bench: no CUDA device is visible");
  int count = 0;
  check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (count < a.gpus)
    throw crisp::Error("--gpus", "is " + std::to_string(a.gpus) + " but " + std::to_string(count) +
                                     " CUDA devices are visible", "at most the visible device count");
  const int world = a.gpus;
  std::vector<crisp::CpPartition> partitions;
  for (const std::string& p : a.partitions) partitions.push_back(crisp::cp_partition_from_string(p));

  crisp_cli::Progress progress(!a.quiet);
  std::vector<int> devices(static_cast<std::size_t>(world));
  for (int i = 0; i < world; ++i) devices[static_cast<std::size_t>(i)] = i;
  std::vector<ncclComm_t> comms(static_cast<std::size_t>(world));
  progress.begin("ncclCommInitAll over " + std::to_string(world) + " GPUs");
  {
    const ncclResult_t status = ncclCommInitAll(comms.data(), world, devices.data());
    if (status != ncclSuccess)
      throw crisp_cli::CommandFailure(std::string("ncclCommInitAll failed: ") + ncclGetErrorString(status));
  }
  progress.done();
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");

  nlohmann::json out;
  out["device"] = prop.name;
  out["gpus"] = world;
  out["block_size"] = a.block;
  out["head_dim"] = a.dim;
  out["reps"] = a.reps;
  out["warmup"] = a.warmup;
  out["dtype"] = "bf16";
  out["runs"] = nlohmann::json::array();
  const auto write_json = [&] {
    if (!a.json_path.empty()) crisp_cli::write_text_file("--json", a.json_path, out.dump(2) + "\n");
  };

  std::printf("context-parallel prefill: %d x %s, bf16, d=%lld, B=%d, median of %d runs after %d warm-up\n", world,
              prop.name, static_cast<long long>(a.dim), a.block, a.reps, a.warmup);
  std::printf("1gpu_*: one GPU (plan, attention, plan+attention); cp_ms: one layer on %d GPUs (all-gather of Q/K/V,\n"
              "the same plan on every rank, attention of the rank's own query blocks), the slowest rank\n",
              world);
  std::printf("%-8s %-5s %-12s %-10s %9s %9s %9s %9s %8s %10s %10s %9s %8s\n", "n", "heads", "preset", "partition",
              "1gpu_plan", "1gpu_attn", "1gpu_ms", "cp_ms", "speedup", "max|dO|", "max|dLSE|", "differing", "balance");
  std::fflush(stdout);

  for (const int64_t n : a.seq) {
    const BenchHeads heads = bench_heads(n, a.heads, a.kv_heads, a.quarter_heads_from);
    const bool quarter = heads.quartered;
    const int64_t H = heads.q, Hkv = heads.kv;
    const int64_t d = a.dim;
    if (quarter)
      std::printf("note: n=%lld runs %lld query / %lld kv heads (a quarter of the heads)\n", static_cast<long long>(n),
                  static_cast<long long>(H), static_cast<long long>(Hkv));
    progress.begin("workload n=" + std::to_string(n) + " (CPU)");
    std::vector<uint16_t> qb, kb, vb;
    {
      crisp_cli::gpu::Bf16Workload w =
          crisp_cli::gpu::bf16_workload(H, Hkv, d, n, a.seed, crisp::WorkloadSpec{}.diffuse_head_share);
      qb = std::move(w.q);
      kb = std::move(w.k);
      vb = std::move(w.v);
    }
    progress.done();

    for (const std::string& preset : a.presets) {
      crisp::Config cfg = crisp_cli::config_of_policy_spec(preset, "--presets");
      cfg.block_size = a.block;

      // ---- one GPU (device 0)
      progress.begin("n=" + std::to_string(n) + " " + preset + " on one GPU");
      std::vector<uint16_t> out_ref(qb.size());
      std::vector<float> lse_ref(static_cast<std::size_t>(H * n));
      double plan_ms = 0, attn_ms = 0, layer_ms = 0;
      crisp::Plan plan_host;
      {
        check(cudaSetDevice(0), "cudaSetDevice");
        cudaStream_t stream;
        check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
        DeviceBuffer q(qb.size() * 2), k(kb.size() * 2), v(vb.size() * 2), o(qb.size() * 2), l(lse_ref.size() * 4);
        check(cudaMemcpy(q.ptr, qb.data(), qb.size() * 2, cudaMemcpyHostToDevice), "copy q");
        check(cudaMemcpy(k.ptr, kb.data(), kb.size() * 2, cudaMemcpyHostToDevice), "copy k");
        check(cudaMemcpy(v.ptr, vb.data(), vb.size() * 2, cudaMemcpyHostToDevice), "copy v");
        const auto dev = crisp::Device::cuda;
        const auto qv = crisp::TensorView::contiguous(q.ptr, crisp::DType::bf16, H, n, d, dev);
        const auto kv = crisp::TensorView::contiguous(k.ptr, crisp::DType::bf16, Hkv, n, d, dev);
        const auto vv = crisp::TensorView::contiguous(v.ptr, crisp::DType::bf16, Hkv, n, d, dev);
        const auto ov = crisp::TensorView::contiguous(o.ptr, crisp::DType::bf16, H, n, d, dev);
        const auto lv = crisp::TensorView::contiguous2d(l.ptr, crisp::DType::f32, H, n, dev);
        crisp::cuda::DevicePlan dplan(H, Hkv, d, {0, n}, cfg);
        plan_ms = time_ms(stream, a.warmup, a.reps, [&] { crisp::cuda::plan_async(qv, kv, cfg, dplan, stream); });
        attn_ms = time_ms(stream, a.warmup, a.reps, [&] { crisp::cuda::attend_async(qv, kv, vv, dplan, ov, lv, stream); });
        layer_ms = time_ms(stream, a.warmup, a.reps, [&] {
          crisp::cuda::plan_async(qv, kv, cfg, dplan, stream);
          crisp::cuda::attend_async(qv, kv, vv, dplan, ov, lv, stream);
        });
        plan_host = dplan.to_host(stream);
        check(cudaMemcpy(out_ref.data(), o.ptr, out_ref.size() * 2, cudaMemcpyDeviceToHost), "copy out");
        check(cudaMemcpy(lse_ref.data(), l.ptr, lse_ref.size() * 4, cudaMemcpyDeviceToHost), "copy lse");
        cudaStreamDestroy(stream);
      }
      progress.done();

      // ---- N GPUs
      for (const crisp::CpPartition partition : partitions) {
        progress.begin("n=" + std::to_string(n) + " " + preset + " on " + std::to_string(world) + " GPUs (" +
                       crisp::to_string(partition) + ")");
        std::vector<RankRun> runs(static_cast<std::size_t>(world));
        std::vector<std::thread> threads;
        for (int rank = 0; rank < world; ++rank)
          threads.emplace_back([&, rank] {
            RankRun& run = runs[static_cast<std::size_t>(rank)];
            try {
              check(cudaSetDevice(devices[static_cast<std::size_t>(rank)]), "cudaSetDevice");
              const crisp::CpShard shard = crisp::cp_shard(n, a.block, partition, rank, world);
              const int64_t lt = shard.local_tokens;
              const auto ql = copy_shard_tokens(qb, H, n, d, shard), kl = copy_shard_tokens(kb, Hkv, n, d, shard),
                         vl = copy_shard_tokens(vb, Hkv, n, d, shard);
              DeviceBuffer q(ql.size() * 2), k(kl.size() * 2), v(vl.size() * 2), o(ql.size() * 2),
                  l(static_cast<std::size_t>(H * lt) * 4);
              check(cudaMemcpy(q.ptr, ql.data(), ql.size() * 2, cudaMemcpyHostToDevice), "copy q");
              check(cudaMemcpy(k.ptr, kl.data(), kl.size() * 2, cudaMemcpyHostToDevice), "copy k");
              check(cudaMemcpy(v.ptr, vl.data(), vl.size() * 2, cudaMemcpyHostToDevice), "copy v");
              cudaStream_t stream;
              check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
              const auto dev = crisp::Device::cuda;
              const auto qv = crisp::TensorView::contiguous(q.ptr, crisp::DType::bf16, H, lt, d, dev);
              const auto kv = crisp::TensorView::contiguous(k.ptr, crisp::DType::bf16, Hkv, lt, d, dev);
              const auto vv = crisp::TensorView::contiguous(v.ptr, crisp::DType::bf16, Hkv, lt, d, dev);
              const auto ov = crisp::TensorView::contiguous(o.ptr, crisp::DType::bf16, H, lt, d, dev);
              const auto lv = crisp::TensorView::contiguous2d(l.ptr, crisp::DType::f32, H, lt, dev);
              crisp::cuda::ContextParallelPrefill cp(H, Hkv, d, n, crisp::DType::bf16, cfg, partition, rank, world,
                                                     comms[static_cast<std::size_t>(rank)]);
              run.layer_ms = time_ms(stream, a.warmup, a.reps, [&] { cp.run(qv, kv, vv, ov, lv, stream); });
              run.out.resize(ql.size());
              run.lse.resize(static_cast<std::size_t>(H * lt));
              check(cudaMemcpy(run.out.data(), o.ptr, run.out.size() * 2, cudaMemcpyDeviceToHost), "copy out");
              check(cudaMemcpy(run.lse.data(), l.ptr, run.lse.size() * 4, cudaMemcpyDeviceToHost), "copy lse");
              cudaStreamDestroy(stream);
            } catch (const std::exception& e) {
              run.error = e.what();
            }
          });
        for (auto& t : threads) t.join();
        progress.done();
        for (int rank = 0; rank < world; ++rank)
          if (!runs[static_cast<std::size_t>(rank)].error.empty())
            throw crisp_cli::CommandFailure("rank " + std::to_string(rank) + ": " + runs[static_cast<std::size_t>(rank)].error);

        double cp_ms = 0.0, max_do = 0.0, max_dlse = 0.0;
        int64_t differing = 0;
        nlohmann::json rank_ms = nlohmann::json::array();
        for (int rank = 0; rank < world; ++rank) {
          const RankRun& run = runs[static_cast<std::size_t>(rank)];
          cp_ms = std::max(cp_ms, run.layer_ms);
          rank_ms.push_back(run.layer_ms);
          const crisp::CpShard shard = crisp::cp_shard(n, a.block, partition, rank, world);
          const auto want_out = copy_shard_tokens(out_ref, H, n, d, shard);
          const auto want_lse = copy_shard_tokens(lse_ref, H, n, 1, shard);
          for (std::size_t i = 0; i < want_out.size(); ++i) {
            if (want_out[i] == run.out[i]) continue;
            ++differing;
            max_do = std::max(max_do, std::fabs(static_cast<double>(crisp::half::bf16_to_float(want_out[i])) -
                                                crisp::half::bf16_to_float(run.out[i])));
          }
          for (std::size_t i = 0; i < want_lse.size(); ++i) {
            if (std::memcmp(&want_lse[i], &run.lse[i], sizeof(float)) == 0) continue;
            ++differing;
            max_dlse = std::max(max_dlse, std::fabs(static_cast<double>(want_lse[i]) - run.lse[i]));
          }
        }
        const auto nnz = crisp::cp_plan_nnz_per_rank(plan_host, partition, world);
        double mean_nnz = 0.0;
        for (const int64_t x : nnz) mean_nnz += static_cast<double>(x) / world;
        const double balance = static_cast<double>(*std::max_element(nnz.begin(), nnz.end())) / mean_nnz;

        nlohmann::json r;
        r["n"] = n;
        r["q_heads"] = H;
        r["kv_heads"] = Hkv;
        r["preset"] = preset;
        r["partition"] = crisp::to_string(partition);
        r["one_gpu_plan_ms"] = plan_ms;
        r["one_gpu_attention_ms"] = attn_ms;
        r["one_gpu_layer_ms"] = layer_ms;
        r["cp_layer_ms"] = cp_ms;
        r["cp_rank_layer_ms"] = rank_ms;
        r["speedup"] = layer_ms / cp_ms;
        r["max_abs_diff_out"] = max_do;
        r["max_abs_diff_lse"] = max_dlse;
        r["differing_elements"] = differing;
        r["density"] = plan_host.density();
        r["plan_nnz_per_rank"] = nnz;
        r["nnz_balance_max_over_mean"] = balance;
        out["runs"].push_back(r);
        std::printf("%-8lld %-5lld %-12s %-10s %9.3f %9.3f %9.3f %9.3f %7.2fx %10.3g %10.3g %9lld %8.3f\n",
                    static_cast<long long>(n), static_cast<long long>(H), preset.c_str(), crisp::to_string(partition),
                    plan_ms, attn_ms, layer_ms, cp_ms, layer_ms / cp_ms, max_do, max_dlse,
                    static_cast<long long>(differing), balance);
        std::fflush(stdout);
        write_json();
      }
    }
  }
  for (ncclComm_t comm : comms) ncclCommDestroy(comm);
  write_json();
}

#else  // !CRISP_WITH_NCCL

void run_context_parallel_bench(const ContextParallelBenchArgs&) {
  throw crisp_cli::CommandFailure(
      "crisp bench --gpus N (N > 1) needs the CUDA backend built with NCCL; this build has none (CRISP_NCCL)");
}

#endif  // CRISP_WITH_NCCL

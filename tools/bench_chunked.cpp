// tools/bench_chunked.cpp — `crisp bench --chunks`: see bench_chunked.h.
//
// For each length n, preset and chunk size C: the prompt's queries are cut into chunks of C
// (the last one shorter); chunk i plans and attends its queries [iC, min((i+1)C, n)) over the
// keys [0, min((i+1)C, n)) (a crisp::Batch with cu_seqlens_q {0, n_q}, cu_seqlens_k {0, n_k}).
// One DevicePlan per chunk is made before timing (an engine keeps its workspaces); the time is
// the whole prefill (every chunk's plan_async + attend_async, CUDA events, median of --reps after
// --warmup). Density: the computed blocks of every chunk over the prompt's causal blocks (a block
// row that a chunk boundary cuts is computed by both chunks, and counted twice: what it costs).
// Recall: exp(LSE - LSE_dense) per query against the one-shot dense run, mean and minimum.
// Paged runs copy K/V into a page pool in vLLM's layout [pages, P, Hkv, d] with the pages shuffled
// (--page-order: shuffled, in_order, or both in one run), and run the same chunks (plans and
// attention read K/V through the block table).
// --kv-token-major adds contiguous K/V laid out [n, Hkv, d], the pool's order without pages.
// Every K/V layout of one (preset, kernel, chunk size) is timed in the same rounds, interleaved
// rep by rep (time_interleaved_ms), so the ratios against contiguous K/V (vs_contiguous,
// vs_token_major) compare runs made under the same clocks, not runs minutes apart.
// --split-times also times every chunk's plan_async alone, then every chunk's attend_async alone
// over the plans just made (plan_ms, attend_ms).
#include "bench_chunked.h"

#include "commands.h"

#if defined(CRISP_WITH_CUDA)
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <memory>
#include <numeric>
#include <random>

#include <nlohmann/json.hpp>

#include "common/half.h"
#include "crisp/cuda.h"
#include "crisp/workload.h"
#include "gpu_timing.h"
#include "io_util.h"
#include "progress.h"
#endif

#if defined(CRISP_WITH_CUDA)
namespace {

using crisp_cli::gpu::check;
using crisp_cli::gpu::DeviceBuffer;
using crisp_cli::gpu::time_interleaved_ms;

// K or V of [Hkv, n, d] in a pool of `pages` pages of P tokens, vLLM's [pages, P, Hkv, d], logical
// page i of the sequence at pool page table[i].
std::vector<uint16_t> to_pages(const std::vector<uint16_t>& x, int64_t Hkv, int64_t n, int64_t d, int64_t P,
                               const std::vector<int32_t>& table, int64_t pages) {
  std::vector<uint16_t> pool(static_cast<std::size_t>(pages * P * Hkv * d), 0);
  for (int64_t g = 0; g < Hkv; ++g)
    for (int64_t t = 0; t < n; ++t) {
      const int64_t row = static_cast<int64_t>(table[t / P]) * P + t % P;
      std::copy_n(&x[(g * n + t) * d], d, &pool[(row * Hkv + g) * d]);
    }
  return pool;
}

// A device copy of `x` (a failed copy names `what`).
std::unique_ptr<DeviceBuffer> to_device(const std::vector<uint16_t>& x, const char* what) {
  auto buffer = std::make_unique<DeviceBuffer>(x.size() * 2);
  check(cudaMemcpy(buffer->ptr, x.data(), x.size() * 2, cudaMemcpyHostToDevice), what);
  return buffer;
}

struct Chunk {
  int64_t q_begin, n_q, n_k;
};

std::vector<Chunk> chunks_of(int64_t n, int64_t C) {
  std::vector<Chunk> out;
  for (int64_t b = 0; b < n; b += C) out.push_back({b, std::min(C, n - b), std::min(b + C, n)});
  return out;
}

// One K/V layout the runs read: head-major contiguous (the input buffers; nothing owned here),
// token-major contiguous, or a page pool and its block table.
struct KvLayout {
  int64_t page_size = 0;     // 0: contiguous
  bool shuffled = false;     // paged: the pool's pages in a shuffled order
  bool token_major = false;  // contiguous: [n, Hkv, d]
  std::unique_ptr<DeviceBuffer> k, v, table;
  int64_t pool_tokens = 0;   // paged: the pool's rows
};

}  // namespace
#endif

void run_chunked_bench(const ChunkedBenchArgs& a) {
#if !defined(CRISP_WITH_CUDA)
  (void)a;
  throw crisp_cli::CommandFailure("crisp bench needs the CUDA backend; this build has none (CRISP_CUDA=OFF)");
#else
  if (!crisp::cuda::available()) throw crisp_cli::CommandFailure("crisp bench: no CUDA device is visible");
  crisp_cli::Progress progress(!a.quiet);
  cudaDeviceProp prop{};
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
  cudaStream_t stream;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  const std::vector<std::string> kernels = a.kernels.empty() ? std::vector<std::string>{"auto"} : a.kernels;

  nlohmann::json out;
  out["device"] = prop.name;
  out["dtype"] = "bf16";
  out["head_dim"] = a.dim;
  out["block_size"] = a.block;
  out["reps"] = a.reps;
  out["warmup"] = a.warmup;
  out["runs"] = nlohmann::json::array();
  const auto write_json = [&] {
    if (!a.json_path.empty()) crisp_cli::write_text_file("--json", a.json_path, out.dump(2) + "\n");
  };
  std::printf("device: %s, bf16, d=%lld, B=%d, Hq %lld / Hkv %lld, median of %d runs after %d warm-up\n", prop.name,
              static_cast<long long>(a.dim), a.block, static_cast<long long>(a.heads),
              static_cast<long long>(a.kv_heads), a.reps, a.warmup);
  std::printf("%-8s %-12s %-10s %7s %6s %-8s %10s %10s %10s %8s %8s %10s %10s\n", "n", "preset", "kernel", "chunk",
              "page", "order", "total_ms", "vs_oneshot", "vs_contig", "density", "chunks", "recall_mean", "recall_min");

  for (const int64_t n : a.seq) {
    const int64_t H = a.heads, Hkv = a.kv_heads, d = a.dim;
    progress.begin("workload n=" + std::to_string(n));
    const crisp_cli::gpu::Bf16Workload w = crisp_cli::gpu::bf16_workload(H, Hkv, d, n, a.seed, a.diffuse_share);
    const std::vector<uint16_t>&qh = w.q, &kh = w.k, &vh = w.v;
    progress.done();
    DeviceBuffer qd(qh.size() * 2), kd(kh.size() * 2), vd(vh.size() * 2), od(qh.size() * 2);
    DeviceBuffer lse_dense(static_cast<std::size_t>(H * n) * 4), lse_run(static_cast<std::size_t>(H * n) * 4);
    check(cudaMemcpy(qd.ptr, qh.data(), qh.size() * 2, cudaMemcpyHostToDevice), "copy q");
    check(cudaMemcpy(kd.ptr, kh.data(), kh.size() * 2, cudaMemcpyHostToDevice), "copy k");
    check(cudaMemcpy(vd.ptr, vh.data(), vh.size() * 2, cudaMemcpyHostToDevice), "copy v");
    const auto dev = crisp::Device::cuda;
    using crisp::TensorView;
    // Views of rows [begin, begin + count) of a [heads, n, d] (or [heads, n]) tensor.
    const auto rows3 = [&](void* base, int64_t heads, int64_t begin, int64_t count) {
      TensorView t = TensorView::contiguous(static_cast<uint16_t*>(base) + begin * d, crisp::DType::bf16, heads, count, d, dev);
      t.stride = {n * d, d, 1};
      return t;
    };
    const auto rows2 = [&](void* base, int64_t begin, int64_t count) {
      TensorView t = TensorView::contiguous2d(static_cast<float*>(base) + begin, crisp::DType::f32, H, count, dev);
      t.stride = {n, 1, 0};
      return t;
    };

    // The dense one-shot LSE: every recall's reference.
    {
      crisp::Config dense = crisp::Config::from_preset("dense");
      dense.block_size = a.block;
      crisp::cuda::DevicePlan plan(H, Hkv, d, crisp::SeqLens{0, n}, dense);
      crisp::cuda::plan_async(rows3(qd.ptr, H, 0, n), rows3(kd.ptr, Hkv, 0, n), dense, plan, stream);
      crisp::cuda::attend_async(rows3(qd.ptr, H, 0, n), rows3(kd.ptr, Hkv, 0, n), rows3(vd.ptr, Hkv, 0, n), plan,
                                rows3(od.ptr, H, 0, n), rows2(lse_dense.ptr, 0, n), stream);
      check(cudaStreamSynchronize(stream), "dense reference");
    }
    std::vector<float> lse_dense_host(static_cast<std::size_t>(H * n)), lse_host(lse_dense_host.size());
    check(cudaMemcpy(lse_dense_host.data(), lse_dense.ptr, lse_dense_host.size() * 4, cudaMemcpyDeviceToHost), "lse");

    // Every K/V layout of the run, made before any timing: head-major contiguous [Hkv, n, d] (the
    // reference of every ratio), with --kv-token-major a token-major copy [n, Hkv, d] (the pool's
    // order without pages), then each page size in each page order (a pool with two spare pages,
    // vLLM's layout). All are held at once (interleaved timing needs them), and so are every
    // layout's plans of one chunk size: at 1M tokens, run fewer page sizes at a time.
    std::vector<KvLayout> layouts(1);
    if (a.kv_token_major) {
      KvLayout t;
      t.token_major = true;
      t.k = to_device(to_pages(kh, Hkv, n, d, n, {0}, 1), "copy k token-major");  // one page of n tokens
      t.v = to_device(to_pages(vh, Hkv, n, d, n, {0}, 1), "copy v token-major");
      layouts.push_back(std::move(t));
    }
    for (const int64_t P : a.page_sizes) {
      if (P <= 0) continue;
      for (const bool shuffled : a.page_orders_shuffled) {
        KvLayout l;
        l.page_size = P;
        l.shuffled = shuffled;
        const int64_t used = (n + P - 1) / P, pages = used + 2;
        std::vector<int32_t> order(static_cast<std::size_t>(pages));
        std::iota(order.begin(), order.end(), 0);
        std::mt19937 rng(static_cast<unsigned>(a.seed + 7));
        if (shuffled) std::shuffle(order.begin(), order.end(), rng);
        order.resize(static_cast<std::size_t>(used));
        l.k = to_device(to_pages(kh, Hkv, n, d, P, order, pages), "copy k pages");
        l.v = to_device(to_pages(vh, Hkv, n, d, P, order, pages), "copy v pages");
        l.table = std::make_unique<DeviceBuffer>(order.size() * 4);
        check(cudaMemcpy(l.table->ptr, order.data(), order.size() * 4, cudaMemcpyHostToDevice), "copy table");
        l.pool_tokens = pages * P;
        layouts.push_back(std::move(l));
      }
    }
    // K or V of `layout` for a chunk over keys [0, n_k): views of the layout's memory.
    const auto kv_view = [&](const KvLayout& layout, bool value, int64_t n_k) {
      if (layout.page_size == 0 && !layout.token_major) return rows3(value ? vd.ptr : kd.ptr, Hkv, 0, n_k);
      const DeviceBuffer& buffer = value ? *layout.v : *layout.k;
      TensorView t = TensorView::contiguous(buffer.ptr, crisp::DType::bf16, Hkv,
                                            layout.page_size == 0 ? n_k : layout.pool_tokens, d, dev);
      t.stride = {d, Hkv * d, 1};
      return t;
    };
    const auto table_of = [&](const KvLayout& layout) {
      crisp::BlockTable table;
      if (layout.page_size == 0) return table;
      table.data = static_cast<const int32_t*>(layout.table->ptr);
      table.device = dev;
      table.max_pages_per_sequence = (n + layout.page_size - 1) / layout.page_size;
      table.page_size = layout.page_size;
      return table;
    };

    for (const std::string& preset : a.presets) {
      crisp::Config cfg = crisp_cli::config_of_policy_spec(preset, "--presets");
      cfg.block_size = a.block;
      for (const std::string& kernel : kernels) {
        const crisp::CudaOptions& options = bench_kernel_options(kernel);
        std::vector<double> oneshot_ms(layouts.size(), 0.0);
        std::vector<int64_t> sizes = a.chunks;
        sizes.insert(sizes.begin(), n);  // the one-shot prefill first
        for (const int64_t C : sizes) {
          progress.begin("n=" + std::to_string(n) + " " + preset + " chunk " + std::to_string(C) + ", " +
                         std::to_string(layouts.size()) + " K/V layouts");
          const std::vector<Chunk> chunks = chunks_of(n, C);
          struct Step {
            TensorView q, k, v, o, lse;
            crisp::BlockTable table;
            std::unique_ptr<crisp::cuda::DevicePlan> plan;
          };
          // steps[i]: the chunks over layout i, each with its own plan (made before timing).
          std::vector<std::vector<Step>> steps(layouts.size());
          for (std::size_t i = 0; i < layouts.size(); ++i)
            for (const Chunk& c : chunks) {
              Step s;
              s.q = rows3(qd.ptr, H, c.q_begin, c.n_q);
              s.o = rows3(od.ptr, H, c.q_begin, c.n_q);
              s.lse = rows2(lse_run.ptr, c.q_begin, c.n_q);
              s.k = kv_view(layouts[i], false, c.n_k);
              s.v = kv_view(layouts[i], true, c.n_k);
              s.table = table_of(layouts[i]);
              s.plan = std::make_unique<crisp::cuda::DevicePlan>(H, Hkv, d, crisp::Batch({0, c.n_q}, {0, c.n_k}, s.table),
                                                                cfg);
              steps[i].push_back(std::move(s));
            }
          // What is timed, per layout: the whole prefill, and with --split-times the plans alone and
          // the attention alone. The layouts run interleaved, rep by rep (time_interleaved_ms), so
          // a drift of the clocks over the run reaches every layout alike.
          const auto prefill = [&](std::vector<Step>& layout_steps, bool plans, bool attention) {
            for (Step& s : layout_steps) {
              if (plans) crisp::cuda::plan_async(s.q, s.k, cfg, *s.plan, stream, s.table);
              if (attention) crisp::cuda::attend_async(s.q, s.k, s.v, *s.plan, s.o, s.lse, stream, options, s.table);
            }
          };
          const auto timed = [&](bool plans, bool attention) {
            std::vector<std::function<void()>> runs;
            for (std::vector<Step>& layout_steps : steps)
              runs.push_back([&prefill, &layout_steps, plans, attention] { prefill(layout_steps, plans, attention); });
            return time_interleaved_ms(stream, a.warmup, a.reps, runs);
          };
          const std::vector<double> total_ms = timed(true, true);
          std::vector<double> plan_ms(layouts.size(), 0.0), attend_ms(layouts.size(), 0.0);
          if (a.split_times) {
            plan_ms = timed(true, false);
            attend_ms = timed(false, true);
          }
          progress.done();
          const int64_t N = (n + a.block - 1) / a.block;
          const double causal = static_cast<double>(H) * static_cast<double>(N) * static_cast<double>(N + 1) / 2.0;
          for (std::size_t i = 0; i < layouts.size(); ++i) {
            const KvLayout& layout = layouts[i];
            // This layout's outputs (the timing left the last layout's): one more prefill.
            prefill(steps[i], true, true);
            // The stream is non-blocking: cudaMemcpy (the legacy stream) would not wait for it.
            check(cudaStreamSynchronize(stream), "prefill");
            check(cudaMemcpy(lse_host.data(), lse_run.ptr, lse_host.size() * 4, cudaMemcpyDeviceToHost), "lse");
            double computed = 0.0;
            for (Step& s : steps[i]) {
              const crisp::Plan host = s.plan->to_host(stream);
              for (const crisp::SequencePlan& sp : host.sequences)
                for (const crisp::HeadPlan& hp : sp.heads) computed += static_cast<double>(hp.col.size());
            }
            const crisp_cli::gpu::Recall recall = crisp_cli::gpu::recall_against_dense(lse_host, lse_dense_host);
            if (C == n) oneshot_ms[i] = total_ms[i];
            const char* order_name = layout.page_size == 0 ? "-" : layout.shuffled ? "shuffled" : "in_order";
            nlohmann::json r;
            r["n"] = n;
            r["preset"] = preset;
            r["kernel"] = kernel;
            r["chunk"] = C;
            r["page_size"] = layout.page_size;
            if (layout.page_size > 0) r["page_order"] = order_name;
            if (layout.page_size == 0) r["kv_layout"] = layout.token_major ? "token_major" : "head_major";
            r["chunks"] = chunks.size();
            r["total_ms"] = total_ms[i];
            r["vs_one_shot"] = total_ms[i] / oneshot_ms[i];
            r["interleaved_with"] = layouts.size();
            r["density"] = computed / causal;
            r["recall_mean"] = recall.mean;
            r["recall_min"] = recall.min;
            if (a.split_times) {
              r["plan_ms"] = plan_ms[i];
              r["attend_ms"] = attend_ms[i];
            }
            // Against head-major contiguous (layout 0), and with --kv-token-major against the
            // token-major copy too (layout 1), both timed in the same interleaved rounds.
            char vs_contiguous[32] = "-";
            if (i > 0) {
              std::snprintf(vs_contiguous, sizeof vs_contiguous, "%.3fx", total_ms[i] / total_ms[0]);
              r["vs_contiguous"] = total_ms[i] / total_ms[0];
            }
            if (a.kv_token_major && layout.page_size > 0) r["vs_token_major"] = total_ms[i] / total_ms[1];
            out["runs"].push_back(r);
            std::printf("%-8lld %-12s %-10s %7lld %6s %-8s %10.3f %9.3fx %10s %8.4f %8zu %10.4f %10.4f\n",
                        static_cast<long long>(n), preset.c_str(), kernel.c_str(), static_cast<long long>(C),
                        layout.page_size > 0 ? std::to_string(layout.page_size).c_str()
                                             : layout.token_major ? "tokmaj" : "0",
                        order_name, total_ms[i], total_ms[i] / oneshot_ms[i], vs_contiguous, computed / causal,
                        chunks.size(), recall.mean, recall.min);
            if (a.split_times)
              std::printf("%-8s plans alone %.3f ms, attention alone %.3f ms\n", "", plan_ms[i], attend_ms[i]);
          }
          std::fflush(stdout);
          write_json();
        }
      }
    }
  }
  cudaStreamDestroy(stream);
  write_json();
#endif
}

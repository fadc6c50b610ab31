// python/src/crisp_module.cpp — the native module `crisp._C`.
//
// It takes tensors as plain integers (data pointer, shape, strides in elements, dtype and device
// names, a cudaStream_t as an int) and calls the C++ library. It includes no PyTorch header and
// links no libtorch: the module works with any torch build (or none: the numpy tests drive it
// directly), and the Python layer (python/crisp/ops.py) turns torch tensors into these integers.
//
// Errors: every crisp::Error becomes `crisp._C.Error`, a subclass of ValueError whose message is
// the library's "<argument>: <problem>; expected <...>".
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <utility>
#include <vector>

#include "crisp/crisp.h"
#include "crisp/cuda.h"
#include "crisp/workload.h"

namespace nb = nanobind;

namespace {

using crisp::DType;
using crisp::Device;
using crisp::Error;
using crisp::TensorView;

DType parse_dtype(const std::string& name) {
  if (name == "float32") return DType::f32;
  if (name == "float16") return DType::f16;
  if (name == "bfloat16") return DType::bf16;
  if (name == "float64") return DType::f64;
  throw Error("dtype", "is '" + name + "'", "float32, float16, bfloat16 or float64");
}

Device parse_device(const std::string& name) {
  if (name == "cpu") return Device::cpu;
  if (name == "cuda") return Device::cuda;
  throw Error("device", "is '" + name + "'", "cpu or cuda");
}

// A TensorView from plain integers. `name` only labels errors.
TensorView make_view(const std::string& name, uintptr_t data, const std::string& dtype, const std::string& device,
                     const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
  if (shape.size() != stride.size())
    throw Error(name, "has " + std::to_string(shape.size()) + " sizes but " + std::to_string(stride.size()) + " strides",
                "one stride per dimension");
  if (shape.size() != 2 && shape.size() != 3)
    throw Error(name, "has rank " + std::to_string(shape.size()), "rank 3 [heads, tokens, dim] or rank 2 [heads, tokens]");
  TensorView v;
  v.data = reinterpret_cast<void*>(data);
  v.dtype = parse_dtype(dtype);
  v.device = parse_device(device);
  v.rank = static_cast<int>(shape.size());
  for (size_t i = 0; i < shape.size(); ++i) {
    v.shape[i] = shape[i];
    v.stride[i] = stride[i];
  }
  return v;
}

// Builds a Config from a preset and "key=value" strings (Config::set validates each).
crisp::Config make_config(const std::string& preset, const std::vector<std::string>& settings) {
  crisp::Config config = crisp::Config::from_preset(preset);
  for (const std::string& kv : settings) config.set(kv);
  config.validate();
  return config;
}

crisp::Options make_options(int num_threads, const std::string& precision, uintptr_t stream) {
  crisp::Options o;
  o.num_threads = num_threads;
  if (precision == "f32") {
    o.precision = crisp::Precision::f32;
  } else if (precision == "f64") {
    o.precision = crisp::Precision::f64;
  } else {
    throw Error("precision", "is '" + precision + "'", "'f32' or 'f64'");
  }
  o.stream = reinterpret_cast<void*>(stream);
  return o;
}

// The enumerator of `E` whose to_string is `name` ("auto", "portable", ...); `argument` names the
// option in the error for any other name.
template <typename E>
E parse_choice(const std::string& argument, const std::string& name, std::initializer_list<E> choices) {
  std::string expected;
  for (const E choice : choices) {
    if (name == crisp::to_string(choice)) return choice;
    expected += (expected.empty() ? "'" : ", '") + std::string(crisp::to_string(choice)) + "'";
  }
  throw Error(argument, "is '" + name + "'", "one of " + expected);
}

crisp::CudaOptions make_cuda_options(const std::string& kernel, const std::string& schedule,
                                     const std::string& ping_pong, const std::string& gqa_packing) {
  using crisp::GqaPacking;
  using crisp::Kernel;
  using crisp::PingPong;
  using crisp::Schedule;
  crisp::CudaOptions o;
  o.kernel = parse_choice("kernel", kernel, {Kernel::automatic, Kernel::portable, Kernel::hopper});
  o.schedule = parse_choice("schedule", schedule, {Schedule::automatic, Schedule::persistent, Schedule::grid});
  o.ping_pong = parse_choice("ping_pong", ping_pong, {PingPong::automatic, PingPong::on, PingPong::off});
  o.gqa_packing =
      parse_choice("gqa_packing", gqa_packing, {GqaPacking::automatic, GqaPacking::separate, GqaPacking::pack});
  return o;
}

// A numpy array that owns a moved-in std::vector (no copy).
template <typename T>
nb::ndarray<nb::numpy, T> to_numpy(std::vector<T>&& values, std::vector<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(values));
  if (heap->empty()) heap->reserve(1);  // a non-null data pointer for empty arrays
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), shape.size(), shape.data(), owner);
}

// One sequence of a plan as numpy arrays:
//   route [H] int8 (0 vs, 1 pe, 2 dense), c_struct / jsd / density [H] float64,
//   row_ptr [H, N+1] int32, col [sum nnz] int32 with col_offsets [H+1] int64 (head h's columns are
//   col[col_offsets[h] .. col_offsets[h+1]), indexed by row_ptr[h]), vertical / slash: lists of
//   int32 arrays (kept blocks of VS heads, anchors included).
nb::dict sequence_to_dict(const crisp::SequencePlan& sp) {
  const size_t H = sp.heads.size();
  const size_t N = static_cast<size_t>(sp.num_blocks);
  std::vector<int8_t> route(H);
  std::vector<double> c_struct(H), jsd(H), density(H);
  std::vector<int32_t> row_ptr;
  row_ptr.reserve(H * (N + 1));
  std::vector<int32_t> col;
  std::vector<int64_t> col_offsets(H + 1, 0);
  nb::list vertical, slash;
  for (size_t h = 0; h < H; ++h) {
    const crisp::HeadPlan& hp = sp.heads[h];
    route[h] = static_cast<int8_t>(hp.route);
    c_struct[h] = hp.c_struct;
    jsd[h] = hp.jsd;
    density[h] = hp.density;
    if (hp.row_ptr.size() != N + 1)
      throw Error("plan", "head " + std::to_string(h) + " has " + std::to_string(hp.row_ptr.size()) + " row pointers",
                  "num_blocks + 1");
    row_ptr.insert(row_ptr.end(), hp.row_ptr.begin(), hp.row_ptr.end());
    col.insert(col.end(), hp.col.begin(), hp.col.end());
    col_offsets[h + 1] = static_cast<int64_t>(col.size());
    vertical.append(to_numpy(std::vector<int32_t>(hp.vertical), {hp.vertical.size()}));
    slash.append(to_numpy(std::vector<int32_t>(hp.slash), {hp.slash.size()}));
  }
  nb::dict d;
  d["q_offset"] = sp.q_offset;
  d["n_q"] = sp.n_q;
  d["kv_offset"] = sp.kv_offset;
  d["n_k"] = sp.n_k;
  d["first_row"] = sp.first_row;
  d["num_blocks"] = sp.num_blocks;
  d["route"] = to_numpy(std::move(route), {H});
  d["c_struct"] = to_numpy(std::move(c_struct), {H});
  d["jsd"] = to_numpy(std::move(jsd), {H});
  d["density"] = to_numpy(std::move(density), {H});
  d["row_ptr"] = to_numpy(std::move(row_ptr), {H, N + 1});
  const size_t nnz = col.size();
  d["col"] = to_numpy(std::move(col), {nnz});
  d["col_offsets"] = to_numpy(std::move(col_offsets), {H + 1});
  d["vertical"] = vertical;
  d["slash"] = slash;
  return d;
}

}  // namespace

NB_MODULE(_C, m) {
  m.doc() = "crisp native module: the C++ library called with raw pointers, shapes and strides";

  nb::exception<Error>(m, "Error", PyExc_ValueError);

#ifdef CRISP_WITH_CUDA
  m.attr("built_with_cuda") = true;
#else
  m.attr("built_with_cuda") = false;
#endif
  m.def("cuda_available", &crisp::cuda::available,
        "True when the library was built with the CUDA backend and a CUDA device is visible.");
  // The bounds of one call (crisp/limits.h), for checks made before the outputs are allocated.
  m.attr("MAX_TOKENS") = crisp::kMaxTokens;
  m.attr("MAX_HEAD_DIM") = crisp::kMaxHeadDim;
  m.def("cuda_head_dim_supported", &crisp::cuda::head_dim_supported, nb::arg("head_dim"),
        "Whether the CUDA attention kernels are built for this head dim (answered in every build).");

  // ------------------------------------------------------------------ views and configs
  nb::class_<TensorView>(m, "View", "A strided [heads, tokens, dim] (or [heads, tokens]) view of memory it does not own.")
      .def(
          "__init__",
          [](TensorView* self, const std::string& name, uintptr_t data, const std::string& dtype,
             const std::string& device, const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
            new (self) TensorView(make_view(name, data, dtype, device, shape, stride));
          },
          nb::arg("name"), nb::arg("data"), nb::arg("dtype"), nb::arg("device"), nb::arg("shape"), nb::arg("stride"))
      .def_prop_ro("shape", [](const TensorView& v) { return std::vector<int64_t>(v.shape.begin(), v.shape.begin() + v.rank); })
      .def_prop_ro("stride", [](const TensorView& v) { return std::vector<int64_t>(v.stride.begin(), v.stride.begin() + v.rank); })
      .def_prop_ro("dtype", [](const TensorView& v) { return std::string(crisp::to_string(v.dtype)); })
      .def_prop_ro("device", [](const TensorView& v) { return std::string(crisp::to_string(v.device)); });

  nb::class_<crisp::Config>(m, "Config", "A validated set of CRISP parameters (a preset plus key=value overrides).")
      .def(
          "__init__",
          [](crisp::Config* self, const std::string& preset, const std::vector<std::string>& settings) {
            new (self) crisp::Config(make_config(preset, settings));
          },
          nb::arg("preset") = "crisp", nb::arg("settings") = std::vector<std::string>{})
      .def("set", nb::overload_cast<const std::string&, const std::string&>(&crisp::Config::set), nb::arg("key"),
           nb::arg("value"))
      .def("items", &crisp::Config::to_key_values)
      .def_prop_ro("preset", [](const crisp::Config& c) { return c.preset; })
      .def_prop_ro("block_size", [](const crisp::Config& c) { return c.block_size; })
      .def("for_keys", &crisp::Config::for_keys, nb::arg("longest_keys"),
           "The Config a call whose longest sequence has this many keys runs with (short prompts: blocks of 64).")
      .def_static("preset_names", &crisp::Config::preset_names)
      .def_static("parameter_names", &crisp::Config::parameter_names);

  nb::class_<crisp::BlockTable>(m, "BlockTable",
                                "Paged K/V (crisp::BlockTable): int32 page ids [num_sequences, max_pages_per_sequence], "
                                "row-major, on the device of the tensors; page_size 0 means contiguous K/V.")
      .def(nb::init<>())
      .def(
          "__init__",
          [](crisp::BlockTable* self, uintptr_t data, const std::string& device, int64_t max_pages_per_sequence,
             int64_t page_size) {
            crisp::BlockTable t;
            t.data = reinterpret_cast<const int32_t*>(data);
            t.device = parse_device(device);
            t.max_pages_per_sequence = max_pages_per_sequence;
            t.page_size = page_size;
            new (self) crisp::BlockTable(t);
          },
          nb::arg("data"), nb::arg("device"), nb::arg("max_pages_per_sequence"), nb::arg("page_size"))
      .def_ro("max_pages_per_sequence", &crisp::BlockTable::max_pages_per_sequence)
      .def_ro("page_size", &crisp::BlockTable::page_size)
      .def_prop_ro("empty", &crisp::BlockTable::empty);

  // ------------------------------------------------------------------ plans
  nb::class_<crisp::Plan>(m, "Plan", "A host plan: per (sequence, query head) route, statistics and block CSR.")
      .def_ro("config", &crisp::Plan::config)
      .def_ro("block_size", &crisp::Plan::block_size)
      .def_ro("num_q_heads", &crisp::Plan::num_q_heads)
      .def_ro("num_kv_heads", &crisp::Plan::num_kv_heads)
      .def_ro("head_dim", &crisp::Plan::head_dim)
      .def_ro("softmax_scale", &crisp::Plan::softmax_scale)
      .def_ro("page_size", &crisp::Plan::page_size)
      .def_prop_ro("num_sequences", [](const crisp::Plan& p) { return p.sequences.size(); })
      .def("density", &crisp::Plan::density)
      .def("vs_share", &crisp::Plan::vs_share)
      .def("check_well_formed", &crisp::Plan::check_well_formed)
      .def(
          "sequence",
          [](const crisp::Plan& p, int64_t index) {
            if (index < 0 || index >= static_cast<int64_t>(p.sequences.size()))
              throw Error("index", "is " + std::to_string(index),
                          "0 <= index < " + std::to_string(p.sequences.size()) + " (the number of sequences)");
            return sequence_to_dict(p.sequences[static_cast<size_t>(index)]);
          },
          nb::arg("index"), "One sequence as numpy arrays (see crisp.plan).");

  // ------------------------------------------------------------------ synchronous API (crisp.h)
  m.def(
      "plan",
      [](const TensorView& q, const TensorView& k, const crisp::Config& config, const std::vector<int64_t>& cu_seqlens_q,
         const std::vector<int64_t>& cu_seqlens_k, const crisp::BlockTable& block_table, int num_threads,
         const std::string& precision, uintptr_t stream) {
        const crisp::Options o = make_options(num_threads, precision, stream);
        const crisp::Batch batch(cu_seqlens_q, cu_seqlens_k, block_table);
        nb::gil_scoped_release release;
        return crisp::plan(q, k, config, batch, o);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("config"), nb::arg("cu_seqlens_q"),
      nb::arg("cu_seqlens_k") = std::vector<int64_t>{}, nb::arg("block_table") = crisp::BlockTable{},
      nb::arg("num_threads") = 0, nb::arg("precision") = "f32", nb::arg("stream") = 0);

  m.def(
      "attend",
      [](const TensorView& q, const TensorView& k, const TensorView& v, const crisp::Plan& plan, const TensorView& out,
         const TensorView& lse, const crisp::BlockTable& block_table, int num_threads, const std::string& precision,
         uintptr_t stream) {
        const crisp::Options o = make_options(num_threads, precision, stream);
        nb::gil_scoped_release release;
        crisp::attend(q, k, v, plan, out, lse, o, block_table);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("plan"), nb::arg("out"), nb::arg("lse"),
      nb::arg("block_table") = crisp::BlockTable{}, nb::arg("num_threads") = 0, nb::arg("precision") = "f32",
      nb::arg("stream") = 0);

  m.def(
      "prefill",
      [](const TensorView& q, const TensorView& k, const TensorView& v, const crisp::Config& config,
         const TensorView& out, const TensorView& lse, const std::vector<int64_t>& cu_seqlens_q,
         const std::vector<int64_t>& cu_seqlens_k, const crisp::BlockTable& block_table, int num_threads,
         const std::string& precision, uintptr_t stream) {
        const crisp::Options o = make_options(num_threads, precision, stream);
        const crisp::Batch batch(cu_seqlens_q, cu_seqlens_k, block_table);
        nb::gil_scoped_release release;
        return crisp::prefill(q, k, v, config, out, lse, batch, o);
      },
      nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("config"), nb::arg("out"), nb::arg("lse"),
      nb::arg("cu_seqlens_q"), nb::arg("cu_seqlens_k") = std::vector<int64_t>{},
      nb::arg("block_table") = crisp::BlockTable{}, nb::arg("num_threads") = 0, nb::arg("precision") = "f32",
      nb::arg("stream") = 0);

  // ------------------------------------------------------------------ plan once, run many times
  nb::class_<crisp::Attention>(m, "Attention",
                               "crisp::Attention: a Config and typed options; plan(q, k, cu_seqlens_q, cu_seqlens_k, block_table) once, then "
                               "run(q, k, v, out, lse) any number of times, on the CPU or the GPU.")
      .def(
          "__init__",
          [](crisp::Attention* self, const crisp::Config& config, const std::string& backend, const std::string& kernel,
             const std::string& schedule, const std::string& ping_pong, const std::string& gqa_packing,
             int num_threads, const std::string& precision, uintptr_t stream) {
            crisp::Options o = make_options(num_threads, precision, stream);
            o.backend = parse_choice("backend", backend,
                                     {crisp::Backend::automatic, crisp::Backend::cpu, crisp::Backend::cuda});
            o.cuda = make_cuda_options(kernel, schedule, ping_pong, gqa_packing);
            new (self) crisp::Attention(config, o);
          },
          nb::arg("config"), nb::arg("backend") = "auto", nb::arg("kernel") = "auto", nb::arg("schedule") = "auto",
          nb::arg("ping_pong") = "auto", nb::arg("gqa_packing") = "auto", nb::arg("num_threads") = 0,
          nb::arg("precision") = "f32", nb::arg("stream") = 0)
      .def(
          "plan",
          [](crisp::Attention& self, const TensorView& q, const TensorView& k, const std::vector<int64_t>& cu_seqlens_q,
             const std::vector<int64_t>& cu_seqlens_k, const crisp::BlockTable& block_table) {
            const crisp::Batch batch(cu_seqlens_q, cu_seqlens_k, block_table);
            nb::gil_scoped_release release;
            self.plan(q, k, batch);
          },
          nb::arg("q"), nb::arg("k"), nb::arg("cu_seqlens_q") = std::vector<int64_t>{},
          nb::arg("cu_seqlens_k") = std::vector<int64_t>{}, nb::arg("block_table") = crisp::BlockTable{})
      .def(
          "run",
          [](const crisp::Attention& self, const TensorView& q, const TensorView& k, const TensorView& v,
             const TensorView& out, const TensorView& lse) {
            nb::gil_scoped_release release;
            self.run(q, k, v, out, lse);
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"))
      .def(
          "host_plan",
          [](const crisp::Attention& self) {
            nb::gil_scoped_release release;
            return self.host_plan();
          },
          "The last plan as a host Plan (CUDA: copied back, synchronising the stream).")
      .def_prop_ro("planned", &crisp::Attention::planned)
      .def_prop_ro("backend", [](const crisp::Attention& self) { return std::string(crisp::to_string(self.backend())); });

  m.def("dense_plan", &crisp::dense_plan, nb::arg("num_q_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim"),
        nb::arg("cu_seqlens"), nb::arg("block_size") = 128, nb::arg("softmax_scale") = 0.0);
  m.def("gqa_union", &crisp::gqa_union, nb::arg("plan"));

  // ------------------------------------------------------------------ CUDA: device plans (cuda.h)
#ifdef CRISP_WITH_CUDA
  nb::class_<crisp::cuda::DevicePlan>(m, "DevicePlan",
                                      "A batch plan kept on the device (crisp::cuda::DevicePlan). With a workspace "
                                      "pointer it allocates nothing; the workspace must outlive it.")
      .def(
          "__init__",
          [](crisp::cuda::DevicePlan* self, int64_t hq, int64_t hkv, int64_t d, const std::vector<int64_t>& cu_seqlens,
             const crisp::Config& config, uintptr_t workspace, std::size_t workspace_bytes) {
            if (workspace == 0) {
              new (self) crisp::cuda::DevicePlan(hq, hkv, d, cu_seqlens, config);
            } else {
              new (self) crisp::cuda::DevicePlan(hq, hkv, d, cu_seqlens, config, reinterpret_cast<void*>(workspace),
                                                 workspace_bytes);
            }
          },
          nb::arg("num_q_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("cu_seqlens"),
          nb::arg("config"), nb::arg("workspace") = 0, nb::arg("workspace_bytes") = 0)
      .def_static("bytes_required",
                  nb::overload_cast<int64_t, const crisp::SeqLens&, int>(&crisp::cuda::DevicePlan::bytes_required),
                  nb::arg("num_q_heads"),
                  nb::arg("cu_seqlens"), nb::arg("block_size"))
      .def(
          "plan_async",
          [](crisp::cuda::DevicePlan& self, const TensorView& q, const TensorView& k, const crisp::Config& config,
             uintptr_t stream) {
            nb::gil_scoped_release release;
            crisp::cuda::plan_async(q, k, config, self, reinterpret_cast<void*>(stream));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("config"), nb::arg("stream") = 0)
      .def(
          "attend_async",
          [](const crisp::cuda::DevicePlan& self, const TensorView& q, const TensorView& k, const TensorView& v,
             const TensorView& out, const TensorView& lse, uintptr_t stream, const std::string& kernel,
             const std::string& schedule, const std::string& ping_pong, const std::string& gqa_packing) {
            nb::gil_scoped_release release;
            crisp::cuda::attend_async(q, k, v, self, out, lse, reinterpret_cast<void*>(stream),
                                      make_cuda_options(kernel, schedule, ping_pong, gqa_packing));
          },
          nb::arg("q"), nb::arg("k"), nb::arg("v"), nb::arg("out"), nb::arg("lse"), nb::arg("stream") = 0,
          nb::arg("kernel") = "auto", nb::arg("schedule") = "auto", nb::arg("ping_pong") = "auto",
          nb::arg("gqa_packing") = "auto")
      .def(
          "upload",
          [](crisp::cuda::DevicePlan& self, const crisp::Plan& plan, uintptr_t stream) {
            self.upload(plan, reinterpret_cast<void*>(stream));
          },
          nb::arg("plan"), nb::arg("stream") = 0)
      .def(
          "to_host",
          [](const crisp::cuda::DevicePlan& self, uintptr_t stream) {
            nb::gil_scoped_release release;
            return self.to_host(reinterpret_cast<void*>(stream));
          },
          nb::arg("stream") = 0)
      .def_prop_ro("bytes", &crisp::cuda::DevicePlan::bytes)
      .def_prop_ro("block_size", &crisp::cuda::DevicePlan::block_size)
      .def_prop_ro("page_size", &crisp::cuda::DevicePlan::page_size);
#endif

  // ------------------------------------------------------------------ the structured workload
  m.def(
      "make_workload",
      [](int64_t num_q_heads, int64_t num_kv_heads, int64_t head_dim, const std::vector<int64_t>& seq_lens,
         uint64_t seed, double diffuse_head_share) {
        crisp::WorkloadSpec spec;
        spec.num_q_heads = num_q_heads;
        spec.num_kv_heads = num_kv_heads;
        spec.head_dim = head_dim;
        spec.seq_lens = seq_lens;
        spec.seed = seed;
        spec.diffuse_head_share = diffuse_head_share;
        crisp::Workload w;
        {
          nb::gil_scoped_release release;
          w = crisp::make_workload(spec);
        }
        const size_t T = static_cast<size_t>(w.total_tokens), d = static_cast<size_t>(head_dim);
        nb::dict out;
        out["q"] = to_numpy(std::move(w.q), {static_cast<size_t>(num_q_heads), T, d});
        out["k"] = to_numpy(std::move(w.k), {static_cast<size_t>(num_kv_heads), T, d});
        out["v"] = to_numpy(std::move(w.v), {static_cast<size_t>(num_kv_heads), T, d});
        out["cu_seqlens"] = w.cu_seqlens;
        out["needle_positions"] = w.needle_positions;
        out["head_is_diffuse"] = std::vector<bool>(w.head_is_diffuse);
        return out;
      },
      nb::arg("num_q_heads"), nb::arg("num_kv_heads"), nb::arg("head_dim"), nb::arg("seq_lens"), nb::arg("seed") = 0,
      nb::arg("diffuse_head_share") = 0.25,
      "The seeded structured synthetic workload (crisp::make_workload): q [Hq, T, d], k/v [Hkv, T, d] float32.");
}

// src/cuda/device_plan_internal.h — access from the CUDA sources to the device view held by a
// crisp::cuda::DevicePlan (the public header keeps it opaque).
#pragma once
#include <vector>

#include "crisp/cuda.h"
#include "cuda/device_plan.h"
#include "plan/plan_layout.h"

namespace crisp {
namespace cuda_detail {

// The view with its device pointers (valid while the DevicePlan lives). Throws crisp::Error
// naming "plan" for an empty DevicePlan.
inline const DevicePlanView& view_of(const cuda::DevicePlan& plan) {
  if (plan.empty()) throw Error("plan", "the DevicePlan is empty", "a DevicePlan made for a batch shape");
  return *static_cast<const DevicePlanView*>(plan.raw_view());
}

// The same view, writable: for the code that fills the plan (plan_async, which also rebuilds the
// attention work order in it).
inline DevicePlanView& mutable_view_of(cuda::DevicePlan& plan) {
  return const_cast<DevicePlanView&>(view_of(plan));
}

// The key of a live DevicePlan's planning workspace: the address of its view, which lives in the
// DevicePlan's own host object. Not the device buffer's address: a caller that reuses a buffer
// (llama.cpp's hook) may make a new DevicePlan in it while a copy of the old one still lives.
inline const void* workspace_key(const DevicePlanView& view) { return &view; }

// Releases the planning workspace plan_async keeps for the DevicePlan whose view is `key`
// (workspace_key): kept as a spare for a later DevicePlan of its device, or freed. Called when
// that DevicePlan is destroyed. Never throws.
void release_planner_workspace(const void* key) noexcept;

// Which kernel runs the fused tensor-core proxy pass of bf16 / fp16 planning (plan_device.cu).
// automatic: wgmma (hopper/plan_proxy_wgmma.cuh) where the device runs the binary's sm_90a code,
// mma.sync (plan_proxy_mma.cuh) elsewhere; mma_sync: the mma.sync kernel everywhere, so the GPU
// tests check the sm_80 kernel on a Hopper device too. Process-wide; set it between plans.
enum class ProxyMmaKernel { automatic, mma_sync };
void set_proxy_mma_kernel(ProxyMmaKernel kernel);

// Whether a radix selection above kSelectChunk entries per slot lists the entries of its stop
// bucket once they are few (plan_select.cuh's compaction; on by default). Off, the passes after
// the grid passes read every entry, so the GPU tests check both paths. Process-wide.
void set_select_compaction(bool on);

// The batch shape with both lists filled (an empty cu_seqlens_k: whole prompts) and the block
// table dropped, after checking the offsets. Throws crisp::Error naming the list.
Batch normalized_shape(const Batch& batch);
// Host-side per-sequence bases of a batch shape (also copied to view.seqs on the device).
std::vector<layout::SequenceBases> sequence_bases(const Batch& batch, int block_size);

}  // namespace cuda_detail
}  // namespace crisp

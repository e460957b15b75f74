#include "msinfer/runtime/cuda_runner.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "msinfer/kernels/cpu/moe.h"  // route_rows

namespace msinfer::runtime {

namespace cu = kernels::cuda;

namespace {

std::string layer_prefix(int i) { return "model.layers." + std::to_string(i) + "."; }

// Uploads bf16 tensors (row-wise concatenated) into one device matrix.
Status upload_bf16(const model::Checkpoint& ck,
                   const std::vector<std::pair<std::string, std::vector<int64_t>>>& parts,
                   cu::DeviceBuffer* out, size_t* total) {
  std::vector<bf16> all;
  for (const auto& [name, shape] : parts) {
    MSI_ASSIGN_OR_RETURN(std::vector<bf16> v, model::read_bf16(ck, name, shape));
    all.insert(all.end(), v.begin(), v.end());
  }
  MSI_RETURN_IF_ERROR(out->upload(all.data(), all.size() * sizeof(bf16)));
  *total += all.size() * sizeof(bf16);
  return ok_status();
}

// A norm weight as fp32 on the device (the bf16 values, as the CPU loader holds them).
Status upload_norm(const model::Checkpoint& ck, const std::string& name, int64_t n,
                   cu::DeviceBuffer* out, size_t* total) {
  MSI_ASSIGN_OR_RETURN(std::vector<bf16> v, model::read_bf16(ck, name, {n}));
  std::vector<float> f(v.size());
  for (size_t i = 0; i < v.size(); ++i) f[i] = bf16_to_float(v[i]);
  MSI_RETURN_IF_ERROR(out->upload(f.data(), f.size() * sizeof(float)));
  *total += f.size() * sizeof(float);
  return ok_status();
}

Status copy_in(cu::DeviceBuffer* d, const void* host, size_t bytes, cudaStream_t s) {
  MSI_RETURN_IF_ERROR(d->reserve(bytes));
  if (bytes == 0) return ok_status();
  if (cudaMemcpyAsync(d->as<void>(), host, bytes, cudaMemcpyHostToDevice, s) != cudaSuccess) {
    return cu::check("host-to-device copy");
  }
  return ok_status();
}

Status copy_out(void* host, const cu::DeviceBuffer& d, size_t bytes, cudaStream_t s) {
  if (bytes == 0) return ok_status();
  if (cudaMemcpyAsync(host, d.as<void>(), bytes, cudaMemcpyDeviceToHost, s) != cudaSuccess) {
    return cu::check("device-to-host copy");
  }
  return ok_status();
}

cu::DeviceMatrix matrix(const cu::DeviceBuffer& b, int64_t n, int64_t k) {
  return {b.as<bf16>(), n, k};
}

}  // namespace

// ---- context ----

CudaContext::~CudaContext() {
  blas.reset();
  if (stream) cudaStreamDestroy(stream);
}

StatusOr<std::unique_ptr<CudaContext>> CudaContext::create(const std::string& device) {
  MSI_ASSIGN_OR_RETURN(int index, cu::parse_device(device));
  auto c = std::make_unique<CudaContext>();
  MSI_ASSIGN_OR_RETURN(c->device, cu::open_device(index));
  if (cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking) != cudaSuccess) {
    return cu::check("cudaStreamCreate");
  }
  MSI_ASSIGN_OR_RETURN(c->blas, cu::Blas::create(c->stream));
  return c;
}

Status CudaContext::sync(const char* what) {
  if (cudaStreamSynchronize(stream) != cudaSuccess) return cu::check(what);
  return cu::check(what);
}

// ---- attention side ----

StatusOr<std::unique_ptr<CudaAttentionRunner>> CudaAttentionRunner::create(
    const std::string& device, const model::ModelWeights& w, const KvCache& kv) {
  const ModelConfig& c = w.config();
  std::unique_ptr<CudaAttentionRunner> r(new CudaAttentionRunner(c));
  MSI_ASSIGN_OR_RETURN(r->ctx_, CudaContext::create(device));
  MSI_ASSIGN_OR_RETURN(model::Checkpoint ck, model::Checkpoint::open(w.dir()));
  const int64_t h = c.hidden, hd = c.head_dim, H = c.heads, KV = c.kv_heads, V = c.vocab;
  size_t& total = r->device_bytes_;
  MSI_RETURN_IF_ERROR(upload_bf16(ck, {{"model.embed_tokens.weight", {V, h}}}, &r->embed_, &total));
  MSI_RETURN_IF_ERROR(upload_norm(ck, "model.norm.weight", h, &r->final_norm_, &total));
  r->tied_ = c.tied_embeddings;
  if (!r->tied_) {
    MSI_RETURN_IF_ERROR(upload_bf16(ck, {{"lm_head.weight", {V, h}}}, &r->lm_head_, &total));
  }
  r->layers_.resize(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    Layer& L = r->layers_[i];
    const std::string p = layer_prefix(i);
    MSI_RETURN_IF_ERROR(upload_norm(ck, p + "input_layernorm.weight", h, &L.input_norm, &total));
    MSI_RETURN_IF_ERROR(
        upload_norm(ck, p + "post_attention_layernorm.weight", h, &L.post_norm, &total));
    MSI_RETURN_IF_ERROR(upload_bf16(ck,
                                    {{p + "self_attn.q_proj.weight", {H * hd, h}},
                                     {p + "self_attn.k_proj.weight", {KV * hd, h}},
                                     {p + "self_attn.v_proj.weight", {KV * hd, h}}},
                                    &L.qkv, &total));
    MSI_RETURN_IF_ERROR(upload_bf16(ck, {{p + "self_attn.o_proj.weight", {h, H * hd}}}, &L.o, &total));
    if (c.qk_norm) {
      MSI_RETURN_IF_ERROR(upload_norm(ck, p + "self_attn.q_norm.weight", hd, &L.q_norm, &total));
      MSI_RETURN_IF_ERROR(upload_norm(ck, p + "self_attn.k_norm.weight", hd, &L.k_norm, &total));
    }
    MSI_RETURN_IF_ERROR(
        upload_bf16(ck, {{model::router_tensor_name(c, i), {c.experts, h}}}, &L.router, &total));
  }
  // KV pools: the host cache's geometry, one K and one V pool per layer.
  r->block_size_ = kv.block_size();
  const size_t pool = static_cast<size_t>(kv.total_blocks() * kv.block_size() * KV * hd) * 2;
  r->kpool_.resize(c.layers);
  r->vpool_.resize(c.layers);
  for (int i = 0; i < c.layers; ++i) {
    MSI_RETURN_IF_ERROR(r->kpool_[i].reserve(pool).with_context("KV cache on " + device));
    MSI_RETURN_IF_ERROR(r->vpool_[i].reserve(pool).with_context("KV cache on " + device));
    total += 2 * pool;
  }
  MSI_RETURN_IF_ERROR(r->ctx_->sync("loading the attention weights"));
  return r;
}

Status CudaAttentionRunner::embed(const TokenBatch& b, float* x) {
  const int64_t T = b.size(), h = c_.hidden;
  if (T == 0) return ok_status();
  cudaStream_t s = ctx_->stream;
  MSI_RETURN_IF_ERROR(copy_in(&ids_, b.ids.data(), T * 4, s));
  MSI_RETURN_IF_ERROR(x_.reserve(T * h * 4));
  cu::embed(embed_.as<bf16>(), ids_.as<int32_t>(), T, h, x_.as<float>(), s);
  MSI_RETURN_IF_ERROR(copy_out(x, x_, T * h * 4, s));
  return ctx_->sync("embed");
}

Status CudaAttentionRunner::attention_and_gate(int l, const TokenBatch& b, KvCache& kv, float* x,
                                               kernels::cpu::RoutedBatch* routed,
                                               const int32_t* expert_dest, int64_t destinations) {
  const ModelConfig& c = c_;
  const Layer& L = layers_[l];
  const int64_t T = b.size(), h = c.hidden, hd = c.head_dim, H = c.heads, KV = c.kv_heads;
  const int64_t qn = H * hd, kn = KV * hd, K = c.top_k, E = c.experts;
  const float eps = static_cast<float>(c.rms_norm_eps);
  routed->topk_expert.assign(T * K, 0);
  routed->topk_weight.assign(T * K, 0.f);
  if (T == 0) {
    kernels::cpu::route_rows(0, E, K, expert_dest, destinations, nullptr, h, routed);
    return ok_status();
  }
  cudaStream_t s = ctx_->stream;
  cu::Blas& blas = *ctx_->blas;
  // Positions and each token's block table (its first pos / block_size + 1 entries).
  int64_t max_pos = 0;
  for (int32_t p : b.positions) max_pos = std::max<int64_t>(max_pos, p);
  const int64_t max_blocks = max_pos / block_size_ + 1;
  host_tables_.assign(T * max_blocks, 0);
  for (int64_t t = 0; t < T; ++t) {
    std::copy(b.tables(0)[t], b.tables(0)[t] + b.positions[t] / block_size_ + 1,
              host_tables_.begin() + t * max_blocks);
  }
  MSI_RETURN_IF_ERROR(copy_in(&x_, x, T * h * 4, s));
  MSI_RETURN_IF_ERROR(copy_in(&pos_, b.positions.data(), T * 4, s));
  MSI_RETURN_IF_ERROR(copy_in(&tables_, host_tables_.data(), host_tables_.size() * 4, s));
  MSI_RETURN_IF_ERROR(h_.reserve(T * h * 4));
  MSI_RETURN_IF_ERROR(qkv_.reserve(T * (qn + 2 * kn) * 4));
  MSI_RETURN_IF_ERROR(q_.reserve(T * qn * 4));
  MSI_RETURN_IF_ERROR(k_.reserve(T * kn * 4));
  MSI_RETURN_IF_ERROR(v_.reserve(T * kn * 4));
  MSI_RETURN_IF_ERROR(attn_.reserve(T * qn * 4));
  MSI_RETURN_IF_ERROR(o_.reserve(T * h * 4));
  MSI_RETURN_IF_ERROR(router_.reserve(T * E * 4));
  MSI_RETURN_IF_ERROR(topk_id_.reserve(T * K * 4));
  MSI_RETURN_IF_ERROR(topk_w_.reserve(T * K * 4));
  MSI_RETURN_IF_ERROR(
      ws_.reserve(cu::attention_workspace_floats(T, H, hd, max_pos + 1) * sizeof(float)));

  cu::rms_norm(x_.as<float>(), L.input_norm.as<float>(), T, h, eps, h_.as<float>(), s);
  MSI_RETURN_IF_ERROR(blas.linear(h_.as<float>(), T, matrix(L.qkv, qn + 2 * kn, h), qkv_.as<float>()));
  cu::split_qkv(qkv_.as<float>(), T, qn, kn, q_.as<float>(), k_.as<float>(), v_.as<float>(), s);
  if (c.qk_norm) {
    cu::rms_norm(q_.as<float>(), L.q_norm.as<float>(), T * H, hd, eps, q_.as<float>(), s);
    cu::rms_norm(k_.as<float>(), L.k_norm.as<float>(), T * KV, hd, eps, k_.as<float>(), s);
  }
  cu::rope(q_.as<float>(), pos_.as<int32_t>(), T, H, hd, c.rope_theta, s);
  cu::rope(k_.as<float>(), pos_.as<int32_t>(), T, KV, hd, c.rope_theta, s);
  const cu::PagedKvLayer layer{kpool_[l].as<bf16>(), vpool_[l].as<bf16>(), block_size_, KV, hd};
  cu::write_kv(layer, k_.as<float>(), v_.as<float>(), T, pos_.as<int32_t>(), tables_.as<int32_t>(),
               max_blocks, s);
  cu::paged_attention(q_.as<float>(), T, H, layer, pos_.as<int32_t>(), tables_.as<int32_t>(),
                      max_blocks, max_pos + 1, 1.0f / std::sqrt(static_cast<float>(hd)),
                      ws_.as<float>(), attn_.as<float>(), s);
  MSI_RETURN_IF_ERROR(blas.linear(attn_.as<float>(), T, matrix(L.o, h, qn), o_.as<float>()));
  cu::add_inplace(x_.as<float>(), o_.as<float>(), T * h, s);
  cu::rms_norm(x_.as<float>(), L.post_norm.as<float>(), T, h, eps, h_.as<float>(), s);
  MSI_RETURN_IF_ERROR(blas.linear(h_.as<float>(), T, matrix(L.router, E, h), router_.as<float>()));
  cu::gate_topk(router_.as<float>(), T, E, K, c.norm_topk_prob, topk_id_.as<int32_t>(),
                topk_w_.as<float>(), s);
  // The residual and the routing back to the host, where the send buffer is
  // built (it is the M2N library's registered memory when the experts are remote).
  host_h_.resize(T * h);
  MSI_RETURN_IF_ERROR(copy_out(x, x_, T * h * 4, s));
  MSI_RETURN_IF_ERROR(copy_out(host_h_.data(), h_, T * h * 4, s));
  MSI_RETURN_IF_ERROR(copy_out(routed->topk_expert.data(), topk_id_, T * K * 4, s));
  MSI_RETURN_IF_ERROR(copy_out(routed->topk_weight.data(), topk_w_, T * K * 4, s));
  MSI_RETURN_IF_ERROR(ctx_->sync("attention_and_gate"));
  kernels::cpu::route_rows(T, E, K, expert_dest, destinations, host_h_.data(), h, routed);
  return ok_status();
}

Status CudaAttentionRunner::logits(const std::vector<const float*>& rows, float* out) {
  const int64_t n = static_cast<int64_t>(rows.size()), h = c_.hidden, V = c_.vocab;
  if (n == 0) return ok_status();
  cudaStream_t s = ctx_->stream;
  host_h_.resize(n * h);
  for (int64_t i = 0; i < n; ++i) std::memcpy(host_h_.data() + i * h, rows[i], h * 4);
  MSI_RETURN_IF_ERROR(copy_in(&rows_, host_h_.data(), n * h * 4, s));
  cu::rms_norm(rows_.as<float>(), final_norm_.as<float>(), n, h,
               static_cast<float>(c_.rms_norm_eps), rows_.as<float>(), s);
  MSI_RETURN_IF_ERROR(logits_.reserve(n * V * 4));
  const cu::DeviceBuffer& head = tied_ ? embed_ : lm_head_;
  MSI_RETURN_IF_ERROR(ctx_->blas->linear(rows_.as<float>(), n, matrix(head, V, h), logits_.as<float>()));
  MSI_RETURN_IF_ERROR(copy_out(out, logits_, n * V * 4, s));
  return ctx_->sync("logits");
}

// ---- expert side ----

StatusOr<std::unique_ptr<CudaExpertRunner>> CudaExpertRunner::create(
    const std::string& device, const model::ModelWeights& w, const std::vector<int>& experts) {
  const ModelConfig& c = w.config();
  std::unique_ptr<CudaExpertRunner> r(new CudaExpertRunner(c));
  MSI_ASSIGN_OR_RETURN(r->ctx_, CudaContext::create(device));
  MSI_ASSIGN_OR_RETURN(model::Checkpoint ck, model::Checkpoint::open(w.dir()));
  std::vector<int> which = experts;
  if (which.empty()) {
    for (int e = 0; e < c.experts; ++e) which.push_back(e);
  }
  const int64_t h = c.hidden, F = c.expert_ffn;
  r->w13_.resize(c.layers);
  r->w2_.resize(c.layers);
  for (int l = 0; l < c.layers; ++l) {
    r->w13_[l].resize(c.experts);
    r->w2_[l].resize(c.experts);
    for (int e : which) {
      if (e < 0 || e >= c.experts) return invalid_argument("expert " + std::to_string(e) + " out of range");
      const model::ExpertTensorNames n = model::expert_tensor_names(c, l, e);
      MSI_RETURN_IF_ERROR(
          upload_bf16(ck, {{n.w1, {F, h}}, {n.w3, {F, h}}}, &r->w13_[l][e], &r->device_bytes_));
      MSI_RETURN_IF_ERROR(upload_bf16(ck, {{n.w2, {h, F}}}, &r->w2_[l][e], &r->device_bytes_));
    }
  }
  MSI_RETURN_IF_ERROR(r->ctx_->sync("loading the expert weights"));
  return r;
}

Status CudaExpertRunner::forward_group(int l, const std::vector<int>& experts,
                                       const std::vector<int64_t>& offset, const float* rows,
                                       float* out) {
  const int64_t h = c_.hidden, F = c_.expert_ffn, n = offset.back();
  if (n == 0) return ok_status();
  std::vector<cu::ExpertMatrices> mats(experts.size());
  for (size_t i = 0; i < experts.size(); ++i) {
    const int e = experts[i];
    if (offset[i + 1] == offset[i]) {
      mats[i] = {};
      continue;
    }
    if (w13_[l][e].bytes() == 0) {
      return internal_error("expert " + std::to_string(e) + " of layer " + std::to_string(l) +
                            " is not loaded on this GPU");
    }
    mats[i] = {matrix(w13_[l][e], 2 * F, h), matrix(w2_[l][e], h, F)};
  }
  cudaStream_t s = ctx_->stream;
  MSI_RETURN_IF_ERROR(copy_in(&in_, rows, n * h * 4, s));
  MSI_RETURN_IF_ERROR(out_.reserve(n * h * 4));
  MSI_RETURN_IF_ERROR(ctx_->blas->expert_ffn(mats, offset, in_.as<float>(), out_.as<float>()));
  MSI_RETURN_IF_ERROR(copy_out(out, out_, n * h * 4, s));
  return ctx_->sync("expert FFN");
}

}  // namespace msinfer::runtime

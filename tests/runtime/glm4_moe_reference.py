#!/usr/bin/python3
"""Independent PyTorch implementation of the GLM-4.5 forward pass
(Glm4MoeForCausalLM), written from the equations of HF's modelling code
(transformers/models/glm4_moe/modeling_glm4_moe.py), used to check the C++
engine. It shares no code with the engine or with torch_reference.py.

The model: per layer, RMSNorm -> GQA attention (q/k/v projections with biases
when attention_bias, RMSNorm of each q and k head over head_dim when
use_qk_norm, RoPE with HF's rotate_half on the first
int(head_dim * partial_rotary_factor) dims of each head only, inverse
frequencies over that rotary dim, softmax(q.k / sqrt(head_dim)) with a causal
mask, o_proj without bias) -> residual -> RMSNorm -> a dense SwiGLU MLP for
layers below first_k_dense_replace, else the MoE: router logits in float32,
sigmoid scores, scores + e_score_correction_bias for the choice only, groups
ranked by the sum of their two best choice scores, the topk_group best kept
(the others' choice scores set to 0.0, as HF's masked_fill does), the top-K
experts of the choice scores, their weights the unbiased sigmoid scores
(/ (sum + 1e-20) when norm_topk_prob) times routed_scaling_factor, the
experts' SwiGLU outputs weighted and added, plus the shared experts' SwiGLU
(width n_shared_experts * moe_intermediate_size) -> residual. Final RMSNorm,
lm_head (the embedding when tie_word_embeddings). MTP layers
(num_nextn_predict_layers) are stored after the decoder layers and not run.

Usage: glm4_moe_reference.py MODEL_DIR PROMPT_IDS(comma-separated) STEPS
           [--dtype engine|float32] [--bf16-qk]
--dtype engine (default): float32 with the engine's bf16 roundings (docs/
ENGINE.md, "Numerics"): every Linear's input rounded to bf16 (fp32
accumulation, the bias added in fp32 after), K and V rounded to bf16 (the KV
cache). --dtype float32: no roundings but the weights' (bf16 values, as the
engine holds them). --bf16-qk: q rounded to bf16 before the scores (the CPU
levels whose attention takes q.K as bf16 dot products:
kernels::cpu::attention_bf16_qk).
Prints JSON {"tokens": [greedy tokens], "logits": [[vocab floats] per step]}:
step 0 is the logits after the prompt, step i after feeding token i-1 (each
step runs the whole sequence again: no cache, the same values as one).
Exits 77 (a ctest skip) when numpy or torch cannot be imported.
"""
import json
import os
import struct
import sys

try:
    import numpy as np
    import torch
except ImportError as e:  # pragma: no cover
    print(f"glm4_moe_reference.py: {e}", file=sys.stderr)
    sys.exit(77)

ENGINE = True
BF16_QK = False


def read_checkpoint(model_dir):
    """Every tensor of the directory's safetensors as float32 (BF16, F16, F32)."""
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            names = sorted(set(json.load(f)["weight_map"].values()))
    else:
        names = sorted(n for n in os.listdir(model_dir) if n.endswith(".safetensors"))
    out = {}
    for name in names:
        with open(os.path.join(model_dir, name), "rb") as f:
            blob = f.read()
        (hlen,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8 : 8 + hlen])
        start = 8 + hlen
        for key, meta in header.items():
            if key == "__metadata__":
                continue
            lo, hi = meta["data_offsets"]
            raw = blob[start + lo : start + hi]
            if meta["dtype"] == "BF16":
                vals = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
            elif meta["dtype"] == "F16":
                vals = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
            elif meta["dtype"] == "F32":
                vals = np.frombuffer(raw, dtype=np.float32)
            else:
                sys.exit(f"glm4_moe_reference.py: {key}: dtype {meta['dtype']} not supported")
            out[key] = torch.from_numpy(vals.reshape(meta["shape"]).copy())
    return out


def to_bf16(t):
    return t.to(torch.bfloat16).to(torch.float32)


def gemm_input(t):
    return to_bf16(t) if ENGINE else t


def dense(t, weight, bias=None):
    """nn.Linear: t @ weight^T (+ bias)."""
    y = torch.matmul(gemm_input(t), weight.t())
    return y if bias is None else y + bias


def rmsnorm(t, weight, eps):
    if ENGINE:  # the engine sums the squares in double: kernels/cpu/ops.h rms_norm
        inv = torch.rsqrt(t.double().pow(2).mean(dim=-1, keepdim=True) + eps).float()
        return t * inv * weight
    return t * torch.rsqrt(t.pow(2).mean(dim=-1, keepdim=True) + eps) * weight


def swiglu(t, W, prefix):
    gate = dense(t, W[prefix + "gate_proj.weight"])
    up = dense(t, W[prefix + "up_proj.weight"])
    return dense(torch.nn.functional.silu(gate) * up, W[prefix + "down_proj.weight"])


def rotate_half(t):
    n = t.shape[-1] // 2
    return torch.cat((-t[..., n:], t[..., :n]), dim=-1)


class Glm4Moe:
    def __init__(self, cfg, W):
        self.cfg, self.W = cfg, W
        self.hidden = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.kv_heads = cfg.get("num_key_value_heads", self.heads)
        self.head_dim = cfg.get("head_dim") or self.hidden // self.heads
        self.eps = cfg.get("rms_norm_eps", 1e-5)
        rope = cfg.get("rope_parameters") or {}
        theta = cfg.get("rope_theta", rope.get("rope_theta", 10000.0))
        factor = cfg.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.5))
        self.rotary = int(self.head_dim * factor)
        steps = torch.arange(0, self.rotary, 2, dtype=torch.int64).float()
        self.inv_freq = 1.0 / (theta ** (steps / self.rotary))
        self.bias = cfg.get("attention_bias", False)
        self.qk_norm = cfg.get("use_qk_norm", False)
        self.experts = cfg["n_routed_experts"]
        self.top_k = cfg["num_experts_per_tok"]
        self.groups = cfg.get("n_group", 1)
        self.topk_group = cfg.get("topk_group", 1)
        self.norm_topk = cfg.get("norm_topk_prob", True)
        self.scaling = cfg.get("routed_scaling_factor", 1.0)
        self.first_dense = cfg.get("first_k_dense_replace", 1)
        if cfg.get("rope_scaling"):
            sys.exit("glm4_moe_reference.py: rope_scaling is not modelled")

    def rotary_embed(self, t, cos, sin):
        rot, keep = t[..., : self.rotary], t[..., self.rotary :]
        return torch.cat((rot * cos + rotate_half(rot) * sin, keep), dim=-1)

    def attention(self, prefix, t, cos, sin, mask):
        W, n = self.W, t.shape[0]
        a = prefix + "self_attn."
        b = (lambda name: W[a + name + ".bias"]) if self.bias else (lambda name: None)
        q = dense(t, W[a + "q_proj.weight"], b("q_proj")).view(n, self.heads, self.head_dim)
        k = dense(t, W[a + "k_proj.weight"], b("k_proj")).view(n, self.kv_heads, self.head_dim)
        v = dense(t, W[a + "v_proj.weight"], b("v_proj")).view(n, self.kv_heads, self.head_dim)
        if self.qk_norm:
            q = rmsnorm(q, W[a + "q_norm.weight"], self.eps)
            k = rmsnorm(k, W[a + "k_norm.weight"], self.eps)
        q, k, v = q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1)  # [heads, n, d]
        q = self.rotary_embed(q, cos, sin)
        k = self.rotary_embed(k, cos, sin)
        if BF16_QK:
            q = to_bf16(q)
        if ENGINE:  # the KV cache holds bf16
            k, v = to_bf16(k), to_bf16(v)
        group = self.heads // self.kv_heads
        k = k[:, None].expand(self.kv_heads, group, n, self.head_dim).reshape(self.heads, n, -1)
        v = v[:, None].expand(self.kv_heads, group, n, self.head_dim).reshape(self.heads, n, -1)
        scores = torch.matmul(q, k.transpose(1, 2)) * self.head_dim ** -0.5 + mask
        out = torch.matmul(torch.softmax(scores, dim=-1, dtype=torch.float32), v)
        out = out.transpose(0, 1).reshape(n, self.heads * self.head_dim)
        return dense(out, W[a + "o_proj.weight"])

    def moe(self, prefix, t):
        W, n = self.W, t.shape[0]
        m = prefix + "mlp."
        logits = dense(t, W[m + "gate.weight"])
        scores = logits.sigmoid()
        choice = scores + W[m + "gate.e_score_correction_bias"]
        per_group = self.experts // self.groups
        group_scores = choice.view(n, self.groups, per_group).topk(2, dim=-1)[0].sum(dim=-1)
        kept = torch.topk(group_scores, k=self.topk_group, dim=-1)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, kept, 1.0)
        expert_mask = group_mask[:, :, None].expand(n, self.groups, per_group).reshape(n, -1)
        choice = choice.masked_fill(expert_mask == 0, 0.0)
        chosen = torch.topk(choice, k=self.top_k, dim=-1)[1]
        weights = scores.gather(1, chosen)
        if self.norm_topk:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + 1e-20)
        weights = weights * self.scaling
        routed = torch.zeros_like(t)
        for e in range(self.experts):
            rows, slot = torch.where(chosen == e)
            if rows.numel() == 0:
                continue
            y = swiglu(t[rows], W, m + f"experts.{e}.")
            routed.index_add_(0, rows, y * weights[rows, slot][:, None])
        if self.cfg.get("n_shared_experts", 1) == 0:
            return routed
        return routed + swiglu(t, W, m + "shared_experts.")

    def logits(self, ids):
        W, n = self.W, len(ids)
        x = W["model.embed_tokens.weight"][torch.tensor(ids)]
        freqs = torch.arange(n).float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        mask = torch.full((n, n), float("-inf")).triu(1)
        for i in range(self.cfg["num_hidden_layers"]):
            p = f"model.layers.{i}."
            x = x + self.attention(p, rmsnorm(x, W[p + "input_layernorm.weight"], self.eps),
                                   cos, sin, mask)
            t = rmsnorm(x, W[p + "post_attention_layernorm.weight"], self.eps)
            x = x + (swiglu(t, W, p + "mlp.") if i < self.first_dense else self.moe(p, t))
        x = rmsnorm(x[-1:], W["model.norm.weight"], self.eps)
        head = W.get("lm_head.weight")
        if head is None or self.cfg.get("tie_word_embeddings", False):
            head = W["model.embed_tokens.weight"]
        return dense(x, head)[0]


def main():
    global ENGINE, BF16_QK
    args = sys.argv[1:]
    if args == ["--check"]:  # exit 0: it can run here (77 and why: it cannot)
        return
    if len(args) < 3:
        sys.exit(__doc__)
    model_dir, ids, steps = args[0], [int(t) for t in args[1].split(",")], int(args[2])
    rest = args[3:]
    BF16_QK = "--bf16-qk" in rest
    if "--dtype" in rest:
        mode = rest[rest.index("--dtype") + 1]
        if mode not in ("engine", "float32"):
            sys.exit(f"glm4_moe_reference.py: --dtype {mode}: expected engine or float32")
        ENGINE = mode == "engine"
    torch.set_num_threads(1)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    if cfg["architectures"][0] != "Glm4MoeForCausalLM":
        sys.exit("glm4_moe_reference.py: not a Glm4MoeForCausalLM checkpoint")
    # The engine holds every weight as bf16 values; e_score_correction_bias stays float32.
    W = {k: (v if k.endswith("e_score_correction_bias") else to_bf16(v))
         for k, v in read_checkpoint(model_dir).items()}
    model = Glm4Moe(cfg, W)
    tokens, logits = [], []
    with torch.no_grad():
        for _ in range(steps):
            step = model.logits(ids)
            logits.append([float(v) for v in step])
            tokens.append(int(torch.argmax(step)))
            ids.append(tokens[-1])
    print(json.dumps({"tokens": tokens, "logits": logits}))


if __name__ == "__main__":
    main()

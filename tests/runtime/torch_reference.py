#!/usr/bin/python3
"""Independent PyTorch implementation of the Mixtral and Qwen3-MoE forward pass,
written from the equations of the HF modelling code (modeling_mixtral.py,
modeling_qwen3_moe.py), used to check the C++ engine.

It loads the same safetensors (parsed here with NumPy) and computes in float32
with the engine's documented numerics (docs/ENGINE.md): every GEMM input is
rounded to bf16 (fp32 accumulation), K and V are rounded to bf16 (the KV
cache), everything else is fp32.

With --bf16-qk, q is rounded to bf16 before the scores q.K (the engine does
this where its CPU level computes them as bf16 dot products:
kernels::cpu::attention_bf16_qk; an HF bf16 model's q is bf16 too).

Usage: torch_reference.py MODEL_DIR PROMPT_IDS(comma-separated) STEPS [--bf16-qk]
Prints JSON {"tokens": [greedy tokens], "logits": [[vocab floats] per step]}:
step 0 is the logits after the prompt, step i after feeding token i-1.
"""
import json
import os
import struct
import sys

import numpy as np
import torch


def load_safetensors(model_dir):
    files = []
    index = os.path.join(model_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    else:
        files = ["model.safetensors"]
    tensors = {}
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            data = f.read()
        (n,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + n])
        base = 8 + n
        for key, v in header.items():
            if key == "__metadata__":
                continue
            b, e = v["data_offsets"]
            raw = data[base + b : base + e]
            if v["dtype"] == "BF16":
                u = np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16
                arr = u.view(np.float32)
            elif v["dtype"] == "F16":
                arr = np.frombuffer(raw, dtype=np.float16).astype(np.float32)
            else:
                arr = np.frombuffer(raw, dtype=np.float32).copy()
            tensors[key] = torch.from_numpy(arr.reshape(v["shape"]).copy())
    return tensors


BF16_QK = False  # --bf16-qk


def bf(x):
    """Round to bf16 and back (what a bf16 GEMM input sees)."""
    return x.to(torch.bfloat16).to(torch.float32)


def linear(x, w):
    # Weights are bf16 values already (the engine converts f32/f16 checkpoints to bf16).
    return bf(x) @ bf(w).T


def rms_norm(x, w, eps):
    var = x.pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(var + eps) * w


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rope(x, pos, theta):
    # x: [heads, T, d]; HF: inv_freq = 1 / theta^(arange(0, d, 2) / d), angle = pos * inv_freq.
    d = x.shape[-1]
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    freqs = pos.float()[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return x * emb.cos() + rotate_half(x) * emb.sin()


def forward(cfg, W, ids):
    arch = cfg["architectures"][0]
    qwen = arch == "Qwen3MoeForCausalLM"
    h = cfg["hidden_size"]
    H = cfg["num_attention_heads"]
    KV = cfg.get("num_key_value_heads", H)
    hd = cfg.get("head_dim", h // H)
    E = cfg["num_experts"] if qwen else cfg["num_local_experts"]
    K = cfg["num_experts_per_tok"]
    eps = cfg.get("rms_norm_eps", 1e-6 if qwen else 1e-5)
    theta = cfg.get("rope_theta", 1e6)
    normalize = cfg.get("norm_topk_prob", False) if qwen else True
    T = len(ids)
    pos = torch.arange(T)
    x = W["model.embed_tokens.weight"][torch.tensor(ids)].clone()
    causal = torch.full((T, T), float("-inf")).triu(1)
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        r = rms_norm(x, W[p + "input_layernorm.weight"], eps)
        q = linear(r, W[p + "self_attn.q_proj.weight"]).view(T, H, hd).transpose(0, 1)
        k = linear(r, W[p + "self_attn.k_proj.weight"]).view(T, KV, hd).transpose(0, 1)
        v = linear(r, W[p + "self_attn.v_proj.weight"]).view(T, KV, hd).transpose(0, 1)
        if qwen:
            q = rms_norm(q, W[p + "self_attn.q_norm.weight"], eps)
            k = rms_norm(k, W[p + "self_attn.k_norm.weight"], eps)
        q = rope(q, pos, theta)
        if BF16_QK:
            q = bf(q)
        k = bf(rope(k, pos, theta))  # the KV cache holds bf16
        v = bf(v)
        k = k.repeat_interleave(H // KV, dim=0)
        v = v.repeat_interleave(H // KV, dim=0)
        s = q @ k.transpose(1, 2) / (hd ** 0.5) + causal
        a = torch.softmax(s, dim=-1) @ v
        a = a.transpose(0, 1).reshape(T, H * hd)
        x = x + linear(a, W[p + "self_attn.o_proj.weight"])

        r = rms_norm(x, W[p + "post_attention_layernorm.weight"], eps)
        moe = p + ("mlp." if qwen else "block_sparse_moe.")
        logits = linear(r, W[moe + "gate.weight"])
        probs = torch.softmax(logits, dim=-1)
        wts, sel = torch.topk(probs, K, dim=-1)
        if normalize:
            wts = wts / wts.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e in range(E):
            ex = moe + f"experts.{e}."
            w1, w2, w3 = (
                (ex + "gate_proj.weight", ex + "down_proj.weight", ex + "up_proj.weight")
                if qwen
                else (ex + "w1.weight", ex + "w2.weight", ex + "w3.weight")
            )
            rows, slot = torch.where(sel == e)
            if rows.numel() == 0:
                continue
            xe = r[rows]
            g = linear(xe, W[w1])
            u = linear(xe, W[w3])
            y = linear(torch.nn.functional.silu(g) * u, W[w2])
            out.index_add_(0, rows, y * wts[rows, slot][:, None])
        x = x + out
    x = rms_norm(x, W["model.norm.weight"], eps)
    return linear(x[-1:], W["lm_head.weight"])[0]


def main():
    model_dir, prompt, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    global BF16_QK
    BF16_QK = "--bf16-qk" in sys.argv[4:]
    torch.set_num_threads(1)
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    W = load_safetensors(model_dir)
    # The engine rounds checkpoint weights to bf16 once.
    W = {k: bf(v) for k, v in W.items()}
    ids = [int(t) for t in prompt.split(",")]
    tokens, all_logits = [], []
    with torch.no_grad():
        for _ in range(steps):
            logits = forward(cfg, W, ids)
            all_logits.append([float(v) for v in logits])
            t = int(torch.argmax(logits))
            tokens.append(t)
            ids.append(t)
    print(json.dumps({"tokens": tokens, "logits": all_logits}))


if __name__ == "__main__":
    main()

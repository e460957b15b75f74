#!/usr/bin/python3
"""Independent PyTorch implementation of the sampler's definitions, to check
src/runtime/sampling.cc on the same logits.

The penalties as vLLM applies them (vllm/model_executor/layers/utils.py,
apply_penalties): the repetition penalty over every token seen in the prompt
or the output (logits > 0 divided by it, the others multiplied), then
logits -= frequency_penalty * output counts and presence_penalty * (count > 0).
The distribution as vLLM's v1 sampler draws from it: softmax(logits / T);
min_p (tokens with probability below min_p times the largest dropped); top_k;
top_p (the most likely tokens whose renormalised mass, counted before each
token, is below top_p); renormalised.

Reads JSON from stdin: {"logits": [floats], "cases": [{"temperature", "top_k",
"top_p", "min_p", "repetition_penalty", "frequency_penalty",
"presence_penalty", "prompt": [ids], "output": [ids]}]}. Prints JSON
{"cases": [{"penalised": [floats], "probs": [floats]}]}.
"""
import json
import sys

import torch


def penalise(logits, prompt, output, rep, freq, pres):
    vocab = logits.shape[0]
    prompt_mask = torch.zeros(vocab, dtype=torch.bool)
    if prompt:
        prompt_mask[torch.tensor(prompt)] = True
    counts = torch.zeros(vocab, dtype=torch.float32)
    if output:
        counts = torch.bincount(torch.tensor(output), minlength=vocab).to(torch.float32)
    output_mask = counts > 0
    seen = prompt_mask | output_mask
    rep_t = torch.where(seen, torch.tensor(rep, dtype=torch.float32), torch.tensor(1.0))
    logits = torch.where(logits > 0, logits / rep_t, logits * rep_t)
    logits = logits - torch.tensor(freq, dtype=torch.float32) * counts
    logits = logits - torch.tensor(pres, dtype=torch.float32) * output_mask.to(torch.float32)
    return logits


def distribution(logits, temperature, top_k, top_p, min_p):
    logits = logits.to(torch.float64) / temperature
    probs = torch.softmax(logits, dim=0)
    if min_p > 0:
        logits = logits.masked_fill(probs < min_p * probs.max(), float("-inf"))
    if top_k > 0 and top_k < logits.shape[0]:
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=0)
    if top_p < 1:
        sorted_probs, order = torch.sort(probs, descending=True, stable=True)
        before = torch.cumsum(sorted_probs, dim=0) - sorted_probs
        drop = before >= top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(0, order, sorted_probs)
        probs = probs / probs.sum()
    return probs


def main():
    doc = json.load(sys.stdin)
    logits = torch.tensor(doc["logits"], dtype=torch.float32)
    out = []
    for c in doc["cases"]:
        pen = penalise(logits, c["prompt"], c["output"], c["repetition_penalty"],
                       c["frequency_penalty"], c["presence_penalty"])
        probs = distribution(pen, c["temperature"], c["top_k"], c["top_p"], c["min_p"])
        out.append({"penalised": pen.tolist(), "probs": probs.tolist()})
    json.dump({"cases": out}, sys.stdout)


if __name__ == "__main__":
    main()

"""Reference computations for engine/analyze/analyze_test.cc, written from the definitions in
algorithms.md: LAPE identification as RUCAIBox/Language-Specific-Neurons identify.py does it
with torch (in float64 here), and activation-gap expert selection as
moe-routing-adaptation's build_selected_experts_json describes it.

usage: analyze_golden.py lape IN.json OUT.json
       analyze_golden.py select IN.json OUT.json
"""
import json
import sys

import torch


def lape(spec):
    # over_zero [K, L, I] -> probabilities [L, I, K]
    over_zero = torch.tensor(spec["over_zero"], dtype=torch.float64)
    tokens = torch.tensor(spec["tokens"], dtype=torch.float64)
    probs = (over_zero / tokens[:, None, None]).permute(1, 2, 0)
    num_layers, inter, _ = probs.shape
    normed = probs / probs.sum(dim=-1, keepdim=True)
    normed[torch.isnan(normed)] = 0
    log_prob = torch.where(normed > 0, normed.log(), torch.zeros_like(normed))
    entropy = -(normed * log_prob).sum(dim=-1)
    flat = probs.flatten()
    tau = flat.kthvalue(round(len(flat) * spec["filter_rate"])).values.item()
    entropy[(probs > tau).sum(dim=-1) == 0] = float("inf")
    flat_entropy = entropy.flatten()
    count = round(len(flat_entropy) * spec["top_rate"])
    _, index = flat_entropy.topk(count, largest=False)
    rows, cols = index // inter, index % inter
    bar = flat.kthvalue(round(len(flat) * spec["activation_bar_ratio"])).values.item()
    selected = probs[rows, cols]  # [count, K]
    finite = torch.isfinite(flat_entropy[index])
    out = {}
    for k, lang in enumerate(spec["languages"]):
        layers = [[] for _ in range(num_layers)]
        for i in torch.where((selected[:, k] > bar) & finite)[0].tolist():
            layers[rows[i].item()].append(cols[i].item())
        out[lang] = [sorted(x) for x in layers]
    return {"languages": out, "tau": tau, "bar": bar}


def select(spec):
    counts = spec["counts"]  # lang -> layer (str) -> [count per expert]
    hr = spec["high_resource"]
    out = {"seft": {lang: {} for lang in hr}, "shared": {}}
    for layer in spec["layers"]:
        act = {}
        for lang in hr:
            c = counts[lang][layer]
            total = sum(c) or 1
            act[lang] = [x / total for x in c]
        experts = sorted({e for lang in hr for e, x in enumerate(counts[lang][layer]) if x > 0})
        for lang in hr:
            out["seft"][lang][layer] = []
        for e in experts:
            ranked = sorted(hr, key=lambda lang: act[lang][e], reverse=True)
            gap = act[ranked[0]][e] - act[ranked[1]][e]
            if gap >= spec["alpha"]:
                out["seft"][ranked[0]][layer].append(e)
        num_experts = len(counts[hr[0]][layer])
        mean = [sum(act[lang][e] for lang in hr) / len(hr) for e in range(num_experts)]
        order = sorted(range(num_experts), key=lambda e: mean[e], reverse=True)
        for k in spec["shared_k"]:
            out["shared"].setdefault(f"k{k}", {})[layer] = order[:k]
    return out


def main():
    mode, src, dst = sys.argv[1:4]
    with open(src) as f:
        spec = json.load(f)
    result = lape(spec) if mode == "lape" else select(spec)
    with open(dst, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Figures of the fidelity evaluation (docs/evaluation.md, "Fidelity and calibration").

Reads the JSON of `crisp eval fidelity` (and optionally of `crisp demo --json` at several lengths)
and writes PNGs:
  fidelity_length.png       density and kept signal against sequence length, per policy
                            (real captures: recall; synthetic workload: planted needle blocks kept)
  fidelity_calibration.png  agreement with the JSD decisions against tau_proxy and rho, per length
  fidelity_routing.png      C_struct against the JS distance of every head, by length
  fidelity_heads.png        for a few real heads: the block-level attention mass of the dense run
                            (computed here from the captured Q/K with numpy) beside the layouts
                            the policies chose (the `layouts` entries of the JSON)

Usage: scripts/plot_fidelity.py --fidelity F.json [--calibration C.json] [--demo D1.json ...] --out docs/
"""
import argparse
import json
import math
import os

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

COLORS = {"dense": "black", "crisp": "tab:red", "flexprefill": "tab:blue", "minference": "tab:green"}
MARKERS = {"dense": "s", "crisp": "o", "flexprefill": "^", "minference": "v"}


def common_layers(captures):
    """Layers evaluated in every capture (lengths are compared on the same layers only)."""
    sets = [{layer["layer"] for layer in c["layers"]} for c in captures]
    return set.intersection(*sets) if sets else set()


def by_length(captures, policy, key, layers):
    """(tokens, mean over the heads of `layers` in every capture of that length) of one metric."""
    acc = {}
    for c in captures:
        for layer in c["layers"]:
            if layer["layer"] not in layers:
                continue
            for h in layer["heads"]:
                m = h["policies"].get(policy)
                if m is not None:
                    acc.setdefault(c["tokens"], []).append(m[key])
    xs = sorted(acc)
    return xs, [float(np.mean(acc[x])) for x in xs]


def plot_length(fid, demos, out):
    policies = [p["name"] for p in fid["policies"]]
    caps = fid["captures"]
    layers = common_layers(caps)
    nl = len(layers)
    ncols = 3
    nrows = 2 if demos else 1
    fig, axes = plt.subplots(nrows, ncols, figsize=(15, 4.3 * nrows), squeeze=False)
    ax_d, ax_r, ax_e = axes[0]
    for p in policies:
        kw = dict(color=COLORS.get(p), marker=MARKERS.get(p, "o"), label=p)
        xs, ys = by_length(caps, p, "density", layers)
        ax_d.plot(xs, ys, **kw)
        xs, ys = by_length(caps, p, "recall_mean", layers)
        ax_r.plot(xs, ys, **kw)
        xs, ys = by_length(caps, p, "rel_error", layers)
        if p != "dense":
            ax_e.plot(xs, ys, **kw)
    lens = sorted({c["tokens"] for c in caps})
    ax_d.set_title(f"SmolLM2-135M: density (mean over {nl} common layers x heads)", fontsize=10)
    ax_r.set_title("real model: recall (share of the softmax mass kept)")
    ax_e.set_title("real model: relative output error")
    for ax in (ax_d, ax_r, ax_e):
        ax.set_xscale("log", base=2)
        ax.set_xticks(lens)
        ax.set_xticklabels([str(x) for x in lens])
        ax.set_xlabel("tokens")
        ax.grid(alpha=0.3)
    ax_d.set_yscale("log")
    ax_d.legend()
    if demos:
        rows = {}
        for d in demos:
            n = d["workload"]["n"]
            for r in d["rows"]:
                rows.setdefault(r["preset"], []).append((n, r))
        ax_sd, ax_sk, ax_sr = axes[1]
        ns = sorted({d["workload"]["n"] for d in demos})
        for p, items in rows.items():
            items.sort(key=lambda t: t[0])
            xs = [t[0] for t in items]
            kw = dict(color=COLORS.get(p), marker=MARKERS.get(p, "o"), label=p)
            ax_sd.plot(xs, [t[1]["density"] for t in items], **kw)
            ax_sk.plot(xs, [t[1]["needle_blocks_kept"] for t in items], **kw)
            ax_sr.plot(xs, [t[1]["recall_mean"] for t in items], **kw)
        # Reference slopes through the first crisp point: O(1) blocks per row -> density ~ 1/n,
        # a fixed share of the row (the cumulative budget's noise blocks) -> density ~ const.
        if "crisp" in rows:
            n0, r0 = rows["crisp"][0][0], rows["crisp"][0][1]["density"]
            ax_sd.plot(ns, [r0 * n0 / n for n in ns], ":", color="gray", label="~ 1/n (O(1) blocks per row)")
        ax_sd.set_title("synthetic workload: density")
        ax_sk.set_title("synthetic workload: planted needle blocks kept")
        ax_sr.set_title("synthetic workload: recall")
        for ax in (ax_sd, ax_sk, ax_sr):
            ax.set_xscale("log", base=2)
            ax.set_xticks(ns)
            ax.set_xticklabels([str(x) for x in ns])
            ax.set_xlabel("tokens")
            ax.grid(alpha=0.3)
        ax_sd.set_yscale("log")
        ax_sd.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def plot_calibration(fid, out):
    cal = fid["calibration"]
    if "by_length" not in cal:
        return False
    fig, (ax_a, ax_r) = plt.subplots(1, 2, figsize=(13, 4.5))
    cmap = plt.get_cmap("viridis")
    groups = cal["by_length"]
    for i, g in enumerate(groups):
        color = cmap(i / max(1, len(groups) - 1))
        label = f"{g['tokens']} tokens ({g['heads']} heads)"
        a = np.array(g["absolute"]["grid"])
        r = np.array(g["relative"]["grid"])
        ax_a.plot(a[:, 0], 100 * a[:, 1], color=color, label=label)
        ax_r.plot(r[:, 0], 100 * r[:, 1], color=color, label=label)
    pa = cal["pooled"]["absolute"]
    pr = cal["pooled"]["relative"]
    a = np.array(pa["grid"])
    r = np.array(pr["grid"])
    ax_a.plot(a[:, 0], 100 * a[:, 1], "k--", label="all lengths pooled")
    ax_r.plot(r[:, 0], 100 * r[:, 1], "k--", label="all lengths pooled")
    ax_a.axvline(pa["best_threshold"], color="red", lw=1,
                 label=f"best pooled tau_proxy {pa['best_threshold']:.3g} ({100 * pa['best_agreement']:.1f}%)")
    ax_r.axvline(pr["best_threshold"], color="red", lw=1,
                 label=f"best pooled rho {pr['best_threshold']:.3g} ({100 * pr['best_agreement']:.1f}%)")
    ax_a.axvline(cal["config_tau_proxy"], color="gray", lw=1, ls=":", label=f"config tau_proxy {cal['config_tau_proxy']:.3g}")
    ax_r.axvline(cal["config_rho"], color="gray", lw=1, ls=":", label=f"config rho {cal['config_rho']:.3g}")
    ax_a.set_xlabel("tau_proxy (route VS iff C_struct >= tau_proxy)")
    ax_r.set_xlabel("rho (route VS iff C_struct * n / (w_sink + w_local) >= rho)")
    ax_r.set_xscale("log", base=2)
    for ax in (ax_a, ax_r):
        ax.set_ylabel(f"agreement with JSD routing (tau {cal['jsd_tau']:.3g}), %")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        ax.set_ylim(0, 100)
    ax_a.set_title("absolute C_struct (cstruct)")
    ax_r.set_title("relative C_rel (cstruct_rel)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return True


def plot_routing(fid, out):
    cal = fid["calibration"]
    fig, ax = plt.subplots(1, 1, figsize=(7, 5))
    lens = sorted({c["tokens"] for c in fid["captures"]})
    cmap = plt.get_cmap("viridis")
    for i, n in enumerate(lens):
        xs, ys = [], []
        for c in fid["captures"]:
            if c["tokens"] != n:
                continue
            for layer in c["layers"]:
                for h in layer["heads"]:
                    if h.get("c_struct") is not None and h.get("jsd") is not None:
                        xs.append(h["c_struct"])
                        ys.append(h["jsd"])
        ax.scatter(xs, ys, s=8, alpha=0.6, color=cmap(i / max(1, len(lens) - 1)), label=f"{n} tokens")
    ax.axhline(cal["jsd_tau"], color="black", lw=1, ls="--", label=f"JSD tau {cal['jsd_tau']:.3g} (below: PE)")
    if "pooled" in cal:
        t = cal["pooled"]["absolute"]["best_threshold"]
        ax.axvline(t, color="red", lw=1, label=f"calibrated tau_proxy {t:.3g} (left: PE)")
    ax.axvline(cal["config_tau_proxy"], color="gray", lw=1, ls=":", label=f"config tau_proxy {cal['config_tau_proxy']:.3g}")
    ax.set_xlabel("C_struct (sink + local mass of the last query block)")
    ax.set_ylabel("JS distance (pooled estimate vs proxy)")
    ax.set_title("routing statistics of every real head")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def block_attention_mass(q, k, block):
    """Mean over the queries of block r of the softmax mass on key block c (causal), float64."""
    n, d = q.shape
    nb = (n + block - 1) // block
    scale = 1.0 / math.sqrt(d)
    out = np.full((nb, nb), np.nan)
    for r in range(nb):
        qs = q[r * block:min(n, (r + 1) * block)].astype(np.float64)
        pos = np.arange(r * block, r * block + qs.shape[0])
        kk = k[:pos[-1] + 1].astype(np.float64)
        s = scale * qs @ kk.T
        s[np.arange(kk.shape[0])[None, :] > pos[:, None]] = -np.inf
        s -= s.max(axis=1, keepdims=True)
        p = np.exp(s)
        p /= p.sum(axis=1, keepdims=True)
        cols = np.zeros((qs.shape[0], r + 1))
        for c in range(r + 1):
            cols[:, c] = p[:, c * block:min(kk.shape[0], (c + 1) * block)].sum(axis=1)
        out[r, :r + 1] = cols.mean(axis=0)
    return out


def plot_heads(fid, out, max_heads):
    entries = fid.get("layouts", [])
    if not entries:
        return False
    # The heads of one capture: the first one closest to 4096 tokens (a readable block grid).
    target = min((e["tokens"] for e in entries), key=lambda n: (abs(n - 4096), n))
    capture = next(e["capture"] for e in entries if e["tokens"] == target)
    entries = [e for e in entries if e["capture"] == capture][:max_heads]
    policies = [p for p in ("crisp", "flexprefill", "minference") if p in entries[0]["policies"]]
    fig, axes = plt.subplots(len(entries), 1 + len(policies), figsize=(3.6 * (1 + len(policies)), 3.5 * len(entries)),
                             squeeze=False)
    for row, e in enumerate(entries):
        meta = json.load(open(os.path.join(e["capture"], "meta.json")))
        f = next(x for x in meta["files"] if x["layer"] == e["layer"])
        q = np.load(os.path.join(e["capture"], f["q"]))
        k = np.load(os.path.join(e["capture"], f["k"]))
        h = e["head"]
        g = h // (q.shape[0] // k.shape[0])
        mass = block_attention_mass(q[h], k[g], e["block_size"])
        ax = axes[row][0]
        im = ax.imshow(np.log10(np.maximum(mass, 1e-6)), cmap="magma", vmin=-6, vmax=0)
        cs = e.get("c_struct")
        jd = e.get("jsd")
        stats = (f"C_struct {cs:.3f}, JSD {jd:.3f}" if cs is not None and jd is not None else "short sequence")
        ax.set_title(f"layer {e['layer']} head {h} ({e['tokens']} tok)\n"
                     f"dense block mass, log10; {stats}", fontsize=8)
        fig.colorbar(im, ax=ax, fraction=0.046)
        nb = mass.shape[0]
        for col, p in enumerate(policies, start=1):
            lay = e["policies"][p]
            m = np.full((nb, nb), np.nan)
            for r, cols in enumerate(lay["rows"]):
                m[r, :r + 1] = 0.0
                m[r, cols] = 1.0
            kept = np.nansum(np.where(m == 1.0, mass, 0.0)) / np.nansum(mass)
            ax = axes[row][col]
            ax.imshow(m, cmap="Greys", vmin=-0.3, vmax=1.0)
            ax.set_title(f"{p}: route {lay['route']}, density {lay['density']:.3f}\n"
                         f"block mass kept {100 * kept:.1f}%", fontsize=8)
        for ax in axes[row]:
            ax.set_xlabel("key block")
            ax.set_ylabel("query block")
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return True


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fidelity", required=True, nargs="+",
                    help="JSON(s) of crisp eval fidelity (captures and layouts are merged)")
    ap.add_argument("--calibration", help="JSON of crisp eval fidelity --routing-only over more lengths "
                    "(default: the calibration of --fidelity)")
    ap.add_argument("--demo", nargs="*", default=[], help="JSONs of crisp demo --json at several lengths")
    ap.add_argument("--out", default="docs", help="output directory")
    ap.add_argument("--heads", type=int, default=4, help="most heads in fidelity_heads.png")
    args = ap.parse_args()
    docs = [json.load(open(p)) for p in args.fidelity]
    fid = docs[0]
    for extra in docs[1:]:
        fid["captures"] += extra["captures"]
        fid["layouts"] += extra.get("layouts", [])
    cal = json.load(open(args.calibration)) if args.calibration else docs[0]
    demos = [json.load(open(p)) for p in args.demo]
    os.makedirs(args.out, exist_ok=True)
    written = []
    p = os.path.join(args.out, "fidelity_length.png")
    plot_length(fid, demos, p)
    written.append(p)
    p = os.path.join(args.out, "fidelity_calibration.png")
    if plot_calibration(cal, p):
        written.append(p)
    p = os.path.join(args.out, "fidelity_routing.png")
    plot_routing(cal, p)
    written.append(p)
    p = os.path.join(args.out, "fidelity_heads.png")
    if plot_heads(fid, p, args.heads):
        written.append(p)
    for p in written:
        print("wrote", p)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Selection-rule research on captured real attention (issue 14).

Two stages, so the expensive dense pass runs once per head:

  prep   CAPTURE_DIR... --layers 0,3,... --cache DIR
         For every (capture, layer, query head): the proxy statistics of the spec (section 1:
         pv, ps, v, u from the last B queries; C_struct; the JSD inputs; the PE block map P) and
         the exact dense block-mass map M[r, c] = mean over the queries of block r of the
         softmax mass they put on key block c (each row sums to 1). Written as one .npz per head.

  sweep  --cache DIR --json OUT
         Applies every rule of RULES at every knob value to every cached head and reports per
         head: density (kept causal blocks / all causal blocks), mass recall (mean over ALL
         queries of the covered share of each query's true softmax mass; exactly
         sum_{r,c in layout} M[r,c] * rows(r) / n), top-block recall (of the non-anchor blocks
         that hold the top 50% of the non-anchor mass, the share kept), and min row recall.

  outerr CAPTURE_DIR --layers ... --rules name:knob,...  relative output error of chosen
         rule points (recomputes the dense attention; slow, so only for final candidates).

Requirements: eval/research/requirements.txt (numpy, matplotlib; pinned). docs/rule_research.md has the results.

Layouts follow spec section 5 exactly: row r keeps {0, r} + verticals <= r + slash cover + PE row.
`check` compares this file's crisp/flexprefill layouts with `crisp plan --json` on a capture.
Numbers: proxy statistics in float64, the dense pass in float32 (ample for block masses); the C++
planner estimates in fp32, so a block exactly at a threshold could differ.

  summarize --json F    the frontiers of a sweep against the flexprefill preset (markdown rows)
  plot --json F --png P  the frontiers as a figure
"""
import argparse
import glob
import json
import os
import subprocess
import sys

import numpy as np

B = 128
W_SINK = W_LOCAL = 128


# ----------------------------------------------------------------------------- stage 1: prep
def softmax_rows(x):
    m = x.max(axis=-1, keepdims=True)
    e = np.exp(x - m)
    return e / e.sum(axis=-1, keepdims=True)


def block_means(x, n):
    N = (n + B - 1) // B
    out = np.zeros((N, x.shape[1]))
    for b in range(N):
        out[b] = x[b * B:min((b + 1) * B, n)].mean(axis=0)
    return out


def head_stats(q, k, scale, dense=True):
    """q, k: [n, d] float64. Proxy stats (spec 1-2, 4) and the dense block-mass map."""
    n, d = q.shape
    N = (n + B - 1) // B
    L = min(B, n)
    pos = np.arange(n - L, n)
    logits = scale * q[pos] @ k.T  # [L, n]
    logits[np.arange(n)[None, :] > pos[:, None]] = -np.inf
    A = softmax_rows(logits)
    v = A.mean(axis=0)
    u = np.zeros(n)
    for i, p in enumerate(pos):
        u[:p + 1] += A[i, p::-1]
    u /= L
    pv = np.add.reduceat(v, np.arange(0, n, B))
    ps = np.add.reduceat(u, np.arange(0, n, B))
    j = np.arange(n)[None, :]
    struct = (j < W_SINK) | ((pos[:, None] - j >= 0) & (pos[:, None] - j < W_LOCAL))
    c_struct = (A * struct).sum(axis=1).mean()
    kbar = block_means(k, n)
    qbar = block_means(q, n)
    abar = softmax_rows(scale * q[pos].mean(axis=0) @ kbar.T)
    mid = 0.5 * (abar + pv)

    def kl(x, m):
        x_pos = x > 0
        return float((x[x_pos] * np.log(x[x_pos] / m[x_pos])).sum())

    jsd = np.sqrt(max(0.0, 0.5 * kl(abar, mid) + 0.5 * kl(pv, mid)))
    pl = scale * qbar @ kbar.T
    pl[np.tril(np.ones((N, N), bool)) == 0] = -np.inf
    P = softmax_rows(pl)
    # Dense block-mass map, query chunks of one block.
    M = np.zeros((N, N))
    Mmin_row = np.zeros(N)  # per query block: the min over its queries is computed later per layout
    Qb = np.zeros((n, N))  # per-query block masses (kept for min recall), float32 to save space
    # float32 is ample for block masses and halves the cost of the n^2 pass.
    q32, k32 = (scale * q).astype(np.float32), k.astype(np.float32)
    for r in range(N if dense else 0):
        lo, hi = r * B, min((r + 1) * B, n)
        s = q32[lo:hi] @ k32[:hi].T
        s[np.arange(hi)[None, :] > np.arange(lo, hi)[:, None]] = -np.inf
        a = softmax_rows(s)
        bm = np.add.reduceat(a, np.arange(0, hi, B), axis=1)
        Qb[lo:hi, :r + 1] = bm
        M[r, :r + 1] = bm.mean(axis=0)
    return dict(n=n, pv=pv, ps=ps, v=v, u=u, c_struct=c_struct, jsd=jsd, P=P, M=M,
                Qb=Qb.astype(np.float32))


def prep(args):
    os.makedirs(args.cache, exist_ok=True)
    for cap in args.captures:
        meta = json.load(open(os.path.join(cap, "meta.json")))
        tag = os.path.basename(os.path.normpath(cap))
        layers = [int(x) for x in args.layers.split(",")] if args.layers else meta["layers"]
        for layer in layers:
            qf = os.path.join(cap, f"layer_{layer:02d}_q.npy")
            if not os.path.exists(qf):
                continue
            Q = np.load(qf)
            K = np.load(os.path.join(cap, f"layer_{layer:02d}_k.npy"))
            hq, hk = Q.shape[0], K.shape[0]
            for h in range(hq):
                out = os.path.join(args.cache, f"{tag}_L{layer:02d}_H{h}.npz")
                if os.path.exists(out):
                    continue
                q = Q[h].astype(np.float64)
                k = K[h // (hq // hk)].astype(np.float64)
                st = head_stats(q, k, 1.0 / np.sqrt(q.shape[1]))
                np.savez(out, capture=tag, layer=layer, head=h, **st)
                print(f"prep {out} cstruct={st['c_struct']:.3f} jsd={st['jsd']:.3f}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- rules
def tie_order(x):
    """Descending, ties by smaller index (spec 5 'Ties')."""
    return np.lexsort((np.arange(len(x)), -x))


def layout(N, vert, slash, pe=None, cover="exact"):
    """Spec 5: boolean [N, N] (lower triangle) of computed blocks."""
    r = np.arange(N)[:, None]
    c = np.arange(N)[None, :]
    causal = c <= r
    lay = (c == 0) | (c == r) | vert[None, :].repeat(N, 0)
    dist = r - c
    dist_c = np.clip(dist, 0, N - 1)
    lay |= slash[dist_c]
    if cover == "exact":
        lay |= (dist >= 1) & slash[np.clip(dist - 1, 0, N - 1)]
    if pe is not None:
        lay |= pe
    return lay & causal


def floor_mean(x):
    N = len(x)
    return x[1:N - 1].mean()


def keep_above(x, thr):
    keep = x > thr
    keep[0] = True
    return keep


def cumulative_count(x, gamma):
    s = np.cumsum(np.sort(x)[::-1])
    return int((s <= gamma).sum()) + 1


def add_until(flags, x, target):
    for b in tie_order(x):
        if flags.sum() >= target:
            break
        flags[b] = True
    return flags


def pe_global(P, gamma):
    N = P.shape[0]
    rr, cc = np.tril_indices(N)
    vals = P[rr, cc]
    order = np.lexsort((rr * N + cc, -vals))
    before = np.concatenate([[0.0], np.cumsum(vals[order])[:-1]])
    kept = order[before < gamma * N]
    pe = np.zeros((N, N), bool)
    pe[rr[kept], cc[kept]] = True
    return pe


def pe_row_floor(P, beta):
    """Noise floor on the PE path: keep P[r, c] > beta / (r + 1) (the row's uniform level)."""
    N = P.shape[0]
    lvl = beta / (np.arange(N)[:, None] + 1.0)
    return (P > lvl) & np.tril(np.ones((N, N), bool))


def robust_floor(x, kind, trim=0.1):
    core = x[1:len(x) - 1]
    if kind == "median":
        return np.median(core)
    if kind == "trimmed":  # mean without the top `trim` share (signal blocks out of the floor)
        kdrop = int(np.ceil(trim * len(core)))
        return np.sort(core)[:len(core) - kdrop].mean() if len(core) > kdrop else core.mean()
    raise ValueError(kind)


def select_vs(h, rule, k):
    """Returns (vert, slash) flags for a VS head under `rule` with knob dict k."""
    pv, ps = h["pv"], h["ps"]
    N = len(pv)
    if rule == "floor_mean":
        return keep_above(pv, k["alpha"] * floor_mean(pv)), keep_above(ps, k["alpha"] * floor_mean(ps))
    if rule in ("floor_median", "floor_trimmed"):
        kind = rule.split("_")[1]
        return (keep_above(pv, k["alpha"] * robust_floor(pv, kind)),
                keep_above(ps, k["alpha"] * robust_floor(ps, kind)))
    if rule == "log_mad":  # keep iff log x > median(log x) + z * 1.4826 * MAD(log x)
        out = []
        for x in (pv, ps):
            lx = np.log(np.maximum(x[1:N - 1], 1e-30))
            med = np.median(lx)
            mad = 1.4826 * np.median(np.abs(lx - med))
            out.append(keep_above(x, np.exp(med + k["z"] * mad)))
        return tuple(out)
    if rule == "cliff":
        # Sort the non-anchor masses descending; among the top `top` find the largest ratio
        # x[i] / x[i+1]; if it is >= `ratio`, keep everything above the gap; else fall back.
        out = []
        for x in (pv, ps):
            core = x[1:].copy()
            order = tie_order(core)
            srt = np.maximum(core[order], 1e-30)
            K = min(k["top"], len(srt) - 1)
            ratios = srt[:K] / srt[1:K + 1]
            i = int(np.argmax(ratios)) if K > 0 else 0
            keep = np.zeros(N, bool)
            keep[0] = True
            if K > 0 and ratios[i] >= k["ratio"]:
                keep[1 + order[:i + 1]] = True
            elif k.get("fallback_alpha"):
                keep = keep_above(x, k["fallback_alpha"] * floor_mean(x))
            out.append(keep)
        return tuple(out)
    if rule == "abs_uniform":  # keep iff x > alpha / N (the uniform per-block level)
        return keep_above(pv, k["alpha"] / N), keep_above(ps, k["alpha"] / N)
    if rule == "abs_or_mean":  # keep iff x > min(alpha / N, beta * mean non-anchor mass)
        return (keep_above(pv, min(k["alpha"] / N, k["beta"] * floor_mean(pv))),
                keep_above(ps, min(k["alpha"] / N, k["beta"] * floor_mean(ps))))
    if rule == "abs_and_mean":  # keep iff x > max(alpha / N, beta * mean non-anchor mass)
        return (keep_above(pv, max(k["alpha"] / N, k["beta"] * floor_mean(pv))),
                keep_above(ps, max(k["alpha"] / N, k["beta"] * floor_mean(ps))))
    if rule == "cumulative":
        min_blocks = min(-(-k.get("min_budget", 0) // B), N)
        vert = np.zeros(N, bool)
        vert[0] = True
        slash = vert.copy()
        n_v = min(max(cumulative_count(h["v"], k["gamma"]) // B + 1, min_blocks), N)
        n_s = min(max(cumulative_count(h["u"], k["gamma"]) // B + 1, min_blocks), N)
        return add_until(vert, pv, n_v), add_until(slash, ps, n_s)
    raise ValueError(rule)


def plan_head(h, policy):
    """policy: dict(route=..., vs=..., pe=..., cover=..., knobs...). Returns (layout, route)."""
    n = int(h["n"])
    N = len(h["pv"])
    mb = policy.get("min_budget", 0)
    if N <= 2 or n <= mb:
        return np.tril(np.ones((N, N), bool)), "dense"
    route = policy["route"]
    if route == "oracle":  # upper bound: the true block map thresholded at theta / N per row
        lay = (h["M"] > policy["theta"] / N) | np.eye(N, dtype=bool)
        lay[:, 0] = True
        return lay & np.tril(np.ones((N, N), bool)), "oracle"
    if route == "cstruct_rel":
        is_vs = h["c_struct"] * n / (W_SINK + W_LOCAL) >= policy.get("rho", 2.2)
    elif route == "jsd":
        is_vs = not (h["jsd"] < policy.get("tau", 0.1))
    elif route == "none":
        is_vs = True
    elif route == "cvs":  # C_struct at VS-compatible positions: last row's mass under the VS pick
        vert, slash = select_vs(h, policy["vs"], policy)
        lay = layout(N, vert, slash, cover=policy.get("cover", "exact"))
        is_vs = (h["pv"] * lay[N - 1]).sum() >= policy["theta"]
    else:
        raise ValueError(route)
    if is_vs:
        vert, slash = select_vs(h, policy["vs"], policy)
        pe = None
    else:
        vert = np.zeros(N, bool)
        vert[0] = True
        slash = vert.copy()
        if policy["pe"] == "global":
            pe = pe_global(h["P"], policy.get("pe_gamma", 0.95))
        elif policy["pe"] == "row_floor":
            pe = pe_row_floor(h["P"], policy["beta"])
        elif policy["pe"] == "vs":  # a PE head selected with the VS rule as well
            vert, slash = select_vs(h, policy["vs"], policy)
            pe = None
        else:
            raise ValueError(policy["pe"])
    if mb:
        mbk = min(-(-mb // B), N)
        vert = add_until(vert, h["pv"], mbk)
        slash = add_until(slash, h["ps"], mbk)
    return layout(N, vert, slash, pe, policy.get("cover", "exact")), "vs" if is_vs else "pe"


def metrics(h, lay):
    N = lay.shape[0]
    n = int(h["n"])
    rows = np.array([min((r + 1) * B, n) - r * B for r in range(N)], float)
    M = h["M"]
    density = lay.sum() / (N * (N + 1) / 2)
    recall = float(((M * lay).sum(axis=1) * rows).sum() / n)
    # per-query recall minimum
    Qb = h["Qb"]
    rq = np.repeat(np.arange(N), rows.astype(int))
    per_q = (Qb * lay[rq]).sum(axis=1)
    # top-block recall: non-anchor causal blocks holding the top 50% of the non-anchor mass
    r = np.arange(N)[:, None]
    c = np.arange(N)[None, :]
    nonanchor = (c <= r) & (c != 0) & (c != r)
    w = (M * rows[:, None])[nonanchor]
    kept = lay[nonanchor]
    if w.sum() > 0:
        order = np.argsort(-w, kind="stable")
        cs = np.cumsum(w[order])
        top = order[:int(np.searchsorted(cs, 0.5 * cs[-1])) + 1]
        top_recall = float(kept[top].mean())
    else:
        top_recall = 1.0
    return dict(density=float(density), recall=recall, recall_min=float(per_q.min()),
                top_recall=top_recall)


# ----------------------------------------------------------------------------- sweeps
def crisp_base(**kw):
    d = dict(route="cstruct_rel", rho=2.2, vs="floor_mean", pe="global", pe_gamma=0.95, cover="exact")
    d.update(kw)
    return d


def flex_base(**kw):
    d = dict(route="jsd", tau=0.1, vs="cumulative", gamma=0.95, pe="global", pe_gamma=0.95, cover="single",
             min_budget=1024)
    d.update(kw)
    return d


def candidate_policies():
    """name -> list of (knob label, policy). The frontier of each name is its knob sweep."""
    P = {}
    P["flexprefill(gamma)"] = [(f"gamma={g}", flex_base(gamma=g, pe_gamma=g))
                               for g in (0.6, 0.7, 0.8, 0.85, 0.9, 0.93, 0.95, 0.97, 0.99)]
    P["flexprefill(gamma,tau=0.2)"] = [(f"gamma={g}", flex_base(gamma=g, pe_gamma=g, tau=0.2))
                                       for g in (0.7, 0.8, 0.9, 0.95, 0.97, 0.99)]
    P["crisp(alpha)"] = [(f"alpha={a}", crisp_base(alpha=a)) for a in (0.5, 0.75, 1, 1.5, 2, 3, 4, 6)]
    P["crisp(alpha,single)"] = [(f"alpha={a}", crisp_base(alpha=a, cover="single"))
                                for a in (0.5, 0.75, 1, 1.5, 2, 3, 4)]
    P["median(alpha)"] = [(f"alpha={a}", crisp_base(vs="floor_median", alpha=a))
                          for a in (0.75, 1, 1.5, 2, 3, 4, 6, 8)]
    P["trimmed(alpha)"] = [(f"alpha={a}", crisp_base(vs="floor_trimmed", alpha=a))
                           for a in (1, 1.5, 2, 3, 4, 6)]
    P["log_mad(z)"] = [(f"z={z}", crisp_base(vs="log_mad", z=z)) for z in (0, 0.5, 1, 1.5, 2, 3)]
    P["cliff(ratio)"] = [(f"ratio={r}", crisp_base(vs="cliff", top=16, ratio=r, fallback_alpha=None))
                         for r in (1.02, 1.05, 1.1, 1.2, 1.5, 2, 3)]
    P["median(alpha),single"] = [(f"alpha={a}", crisp_base(vs="floor_median", alpha=a, cover="single"))
                                 for a in (1, 1.5, 2, 3, 4, 6)]
    P["median(alpha),pe_floor"] = [(f"alpha={a}", crisp_base(vs="floor_median", alpha=a, pe="row_floor", beta=2.0))
                                   for a in (1, 1.5, 2, 3, 4, 6)]
    P["median(alpha),routing=none"] = [(f"alpha={a}", crisp_base(vs="floor_median", alpha=a, route="none"))
                                       for a in (1, 1.5, 2, 3, 4, 6)]
    P["abs_uniform(alpha),none"] = [(f"alpha={a}", crisp_base(vs="abs_uniform", alpha=a, route="none"))
                                    for a in (0.3, 0.4, 0.5, 0.6, 0.75, 1, 1.5, 2)]
    P["abs_uniform(alpha)"] = [(f"alpha={a}", crisp_base(vs="abs_uniform", alpha=a))
                               for a in (0.3, 0.4, 0.5, 0.6, 0.75, 0.9, 1, 1.25, 1.5, 2, 3, 4)]
    P["abs_uniform(alpha),single"] = [(f"alpha={a}", crisp_base(vs="abs_uniform", alpha=a, cover="single"))
                                      for a in (0.25, 0.35, 0.5, 0.6, 0.75, 1, 1.5, 2)]
    for beta in (1.0, 1.5, 2.0):
        P[f"abs_and_mean(alpha,beta={beta})"] = [(f"alpha={a}", crisp_base(vs="abs_and_mean", alpha=a, beta=beta))
                                                 for a in (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.75, 1, 1.5)]
    for beta in (1.5, 2.0, 3.0):
        P[f"abs_or_mean(alpha,beta={beta})"] = [(f"alpha={a}", crisp_base(vs="abs_or_mean", alpha=a, beta=beta))
                                                for a in (0.3, 0.5, 0.75, 1, 1.5, 2)]
    P["oracle(theta*N)"] = [(f"theta={t}", dict(route="oracle", theta=t))
                            for t in (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 1.5, 2, 3)]
    P["abs_uniform(alpha),pe_floor"] = [(f"alpha={a}", crisp_base(vs="abs_uniform", alpha=a, pe="row_floor", beta=a))
                                        for a in (0.3, 0.4, 0.5, 0.6, 0.75, 1, 1.5, 2)]
    P["crisp(alpha),pe_floor"] = [(f"alpha={a}", crisp_base(alpha=a, pe="row_floor", beta=a))
                                  for a in (0.5, 0.75, 1, 1.5, 2, 3, 4)]
    P["median(alpha),cvs=0.9"] = [(f"alpha={a}", crisp_base(vs="floor_median", alpha=a, route="cvs", theta=0.9,
                                                             pe="row_floor", beta=a))
                                  for a in (1, 1.5, 2, 3, 4, 6)]
    P["cliff(ratio),fallback=mean*2"] = [(f"ratio={r}", crisp_base(vs="cliff", top=16, ratio=r, fallback_alpha=2.0))
                                          for r in (1.5, 2, 3, 5)]
    return P


def load_heads(cache):
    heads = []
    for f in sorted(glob.glob(os.path.join(cache, "*.npz"))):
        z = np.load(f)
        heads.append({key: z[key] for key in z.files})
    return heads


def sweep(args):
    heads = load_heads(args.cache)
    if args.captures_filter:
        heads = [h for h in heads if str(h["capture"]) in args.captures_filter.split(",")]
    if args.layers:
        heads = [h for h in heads if int(h["layer"]) in [int(x) for x in args.layers.split(",")]]
    print(f"{len(heads)} heads", file=sys.stderr)
    out = {"heads": len(heads), "layers": sorted({int(h["layer"]) for h in heads}), "captures": sorted({str(h["capture"]) for h in heads}), "frontiers": {}}
    for name, points in candidate_policies().items():
        if args.only and not any(s in name for s in args.only.split(";")):
            continue
        rows = []
        for label, pol in points:
            per = []
            routes = []
            for h in heads:
                lay, route = plan_head(h, pol)
                m = metrics(h, lay)
                per.append(m)
                routes.append(route)
            agg = {key: float(np.mean([m[key] for m in per])) for key in per[0]}
            agg["recall_min_worst_head"] = float(np.min([m["recall_min"] for m in per]))
            agg["top_recall_worst_head"] = float(np.min([m["top_recall"] for m in per]))
            agg["vs_share"] = float(np.mean([r == "vs" for r in routes]))
            rows.append(dict(knob=label, policy={k: v for k, v in pol.items()}, **agg))
            print(f"{name:32s} {label:12s} dens={agg['density']:.3f} rec={agg['recall']:.4f} "
                  f"top={agg['top_recall']:.3f} vs={agg['vs_share']:.2f}", file=sys.stderr, flush=True)
        out["frontiers"][name] = rows
    json.dump(out, open(args.json, "w"), indent=1)


# ----------------------------------------------------------------------------- check vs crisp plan
def check(args):
    """Compares layouts with `crisp plan --json` on one capture layer."""
    Q = np.load(os.path.join(args.capture, f"layer_{args.layer:02d}_q.npy"))
    K = np.load(os.path.join(args.capture, f"layer_{args.layer:02d}_k.npy"))
    hq, hk = Q.shape[0], K.shape[0]
    bad = 0
    tmp = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"rule_frontier_check_{os.getpid()}.json")
    for name, pol in (("crisp", crisp_base(alpha=1.0)), ("flexprefill", flex_base())):
        res = subprocess.run([args.crisp, "plan", "--q", os.path.join(args.capture, f"layer_{args.layer:02d}_q.npy"),
                              "--k", os.path.join(args.capture, f"layer_{args.layer:02d}_k.npy"),
                              "--policy", name, "--json", tmp], capture_output=True, text=True)
        if res.returncode != 0:
            print(res.stderr)
            return 2
        plan = json.load(open(tmp))
        for h in range(hq):
            st = head_stats(Q[h].astype(np.float64), K[h // (hq // hk)].astype(np.float64),
                            1 / np.sqrt(Q.shape[2]), dense=False)
            lay, route = plan_head(st, pol)
            ph = plan["heads"][h]
            N = lay.shape[0]
            mine = [list(np.nonzero(lay[r, :r + 1])[0]) for r in range(N)]
            rp, col = ph["row_ptr"], ph["col"]
            theirs = [col[rp[r]:rp[r + 1]] for r in range(N)]
            same = all(list(map(int, a)) == list(b) for a, b in zip(mine, theirs))
            bad += not same
            print(f"{name} head {h}: route {route}/{ph.get('route')} density {lay.sum() / (N * (N + 1) / 2):.4f}"
                  f"/{ph.get('density'):.4f} layout {'same' if same else 'DIFFERENT'}")
    return 1 if bad else 0


def named_points(spec):
    """'name@knob;name@knob' -> [(label, policy)] from candidate_policies()."""
    cands = candidate_policies()
    out = []
    for item in spec.split(";"):
        name, knob = item.rsplit("@", 1)
        pol = dict(cands[name])[knob]
        out.append((item, pol))
    return out


def outerr(args):
    """Relative output error ||O_sparse - O_dense||_F / ||O_dense||_F per head for chosen points."""
    points = named_points(args.points)
    cache = {os.path.basename(f)[:-4]: f for f in glob.glob(os.path.join(args.cache, "*.npz"))}
    tag = os.path.basename(os.path.normpath(args.capture))
    res = {label: [] for label, _ in points}
    for layer in [int(x) for x in args.layers.split(",")]:
        Q = np.load(os.path.join(args.capture, f"layer_{layer:02d}_q.npy"))
        K = np.load(os.path.join(args.capture, f"layer_{layer:02d}_k.npy"))
        V = np.load(os.path.join(args.capture, f"layer_{layer:02d}_v.npy"))
        hq, hk = Q.shape[0], K.shape[0]
        for h in range(hq):
            z = np.load(cache[f"{tag}_L{layer:02d}_H{h}"])
            st = {key: z[key] for key in z.files}
            lays = [plan_head(st, pol)[0] for _, pol in points]
            n, d = Q.shape[1], Q.shape[2]
            q = Q[h] / np.float32(np.sqrt(d))
            k, v = K[h // (hq // hk)], V[h // (hq // hk)]
            N = (n + B - 1) // B
            num = np.zeros(len(points))
            den = 0.0
            for r in range(N):
                lo, hi = r * B, min((r + 1) * B, n)
                s_ = q[lo:hi] @ k[:hi].T
                s_[np.arange(hi)[None, :] > np.arange(lo, hi)[:, None]] = -np.inf
                e = np.exp(s_ - s_.max(axis=1, keepdims=True))
                od = (e @ v[:hi]) / e.sum(axis=1, keepdims=True)
                den += float((od.astype(np.float64) ** 2).sum())
                blk = np.arange(hi) // B
                for i, lay in enumerate(lays):
                    es = e * lay[r, blk][None, :]
                    os_ = (es @ v[:hi]) / es.sum(axis=1, keepdims=True)
                    num[i] += float(((os_ - od).astype(np.float64) ** 2).sum())
            for i, (label, _) in enumerate(points):
                res[label].append(float(np.sqrt(num[i] / den)))
            print(f"outerr L{layer} H{h} " + " ".join(f"{x:.4f}" for x in np.sqrt(num / den)), file=sys.stderr, flush=True)
    out = {label: dict(mean=float(np.mean(v)), max=float(np.max(v)), heads=len(v)) for label, v in res.items()}
    json.dump(dict(capture=tag, layers=args.layers, points=out), open(args.json, "w"), indent=1)
    for label, m in out.items():
        print(f"{label:50s} rel_err mean {m['mean']:.4f} max {m['max']:.4f} ({m['heads']} heads)")


def summarize(args):
    """Markdown rows: each frontier against the flexprefill preset point (gamma = 0.95).

    'density at equal recall': the density at which the frontier (linear between its knob points,
    sorted by density) reaches the preset's mass recall, and its ratio to the preset's density;
    'recall at 0.75x': the frontier's recall at 0.75 times the preset's density (the acceptance
    bar of issue 14)."""
    data = json.load(open(args.json))
    ref = next(r for r in data["frontiers"]["flexprefill(gamma)"] if r["knob"] == "gamma=0.95")

    def interp(xs, ys, x):
        order = np.argsort(xs)
        xs, ys = np.asarray(xs)[order], np.asarray(ys)[order]
        if x < xs[0] or x > xs[-1]:
            return float("nan")
        return float(np.interp(x, xs, ys))

    print(f"flexprefill gamma=0.95: density {ref['density']:.3f}, recall {ref['recall']:.4f}, "
          f"top-block recall {ref['top_recall']:.3f} ({data['heads']} heads: {', '.join(data['captures'])})")
    print("| rule (knob swept) | density at flexprefill's recall | ratio | recall at 0.75x density | "
          "top-block recall at 0.75x |")
    print("|---|---|---|---|---|")
    for name, rows in data["frontiers"].items():
        d = [r["density"] for r in rows]
        rec = [r["recall"] for r in rows]
        top = [r["top_recall"] for r in rows]
        # recall rises with density along every sweep here; invert by interpolation
        d_eq = interp(rec, d, ref["recall"])
        x = 0.75 * ref["density"]
        print(f"| {name} | {d_eq:.3f} | {d_eq / ref['density']:.2f} | {interp(d, rec, x):.4f} | "
              f"{interp(d, top, x):.3f} |")


def plot(args):
    """PNG of every frontier in the sweep JSON: mass recall and top-block recall against density."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    data = json.load(open(args.json))
    fig, axes = plt.subplots(1, 2, figsize=(13, 5.5))
    names = [nm for nm in data["frontiers"] if not args.only or nm in args.only.split(";")]  # exact names
    colors = plt.get_cmap("tab10").colors
    for i, name in enumerate(names):
        rows = data["frontiers"][name]
        style = dict(marker="o", ms=3, lw=2.5 if name.startswith("flexprefill") else 1.2,
                     color="k" if name == "flexprefill(gamma)" else colors[i % 10],
                     ls="--" if name.startswith("oracle") else "-")
        dens = [r["density"] for r in rows]
        for ax, key in zip(axes, ("recall", "top_recall")):
            ax.plot(dens, [r[key] for r in rows], label=name, **style)
    for ax, key in zip(axes, ("mass recall (mean over queries)", "top-block recall (top 50% non-anchor mass)")):
        ax.set_xlabel("density")
        ax.set_ylabel(key)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle(f"{args.title} ({data['heads']} heads: {', '.join(data['captures'])})")
    fig.tight_layout()
    fig.savefig(args.png, dpi=110)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prep")
    p.add_argument("captures", nargs="+")
    p.add_argument("--layers", default="")
    p.add_argument("--cache", required=True)
    s = sub.add_parser("sweep")
    s.add_argument("--cache", required=True)
    s.add_argument("--json", required=True)
    s.add_argument("--only", default="")
    s.add_argument("--captures-filter", default="")
    s.add_argument("--layers", default="", help="only these layers (default: every cached one)")
    c = sub.add_parser("check")
    c.add_argument("capture")
    c.add_argument("--layer", type=int, default=0)
    c.add_argument("--crisp", default="build/crisp")
    m = sub.add_parser("summarize")
    m.add_argument("--json", required=True)
    o = sub.add_parser("outerr")
    o.add_argument("capture")
    o.add_argument("--layers", required=True)
    o.add_argument("--cache", required=True)
    o.add_argument("--points", required=True, help="'name@knob;...' from the sweep's names")
    o.add_argument("--json", required=True)
    g = sub.add_parser("plot")
    g.add_argument("--json", required=True)
    g.add_argument("--png", required=True)
    g.add_argument("--only", default="")
    g.add_argument("--title", default="rule frontiers")
    a = ap.parse_args()
    if a.cmd == "prep":
        prep(a)
    elif a.cmd == "sweep":
        sweep(a)
    elif a.cmd == "summarize":
        summarize(a)
    elif a.cmd == "outerr":
        outerr(a)
    elif a.cmd == "plot":
        plot(a)
    else:
        sys.exit(check(a))


if __name__ == "__main__":
    main()

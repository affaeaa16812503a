"""Where a kernel's warps wait, from ncu's per-instruction source page (the `profile` step of scripts/gpu_check.sh
writes it as ncu_sass.csv). Instructions are grouped by how often they ran: in a tiled kernel the per-step code, the
per-tile code and the once-per-CTA code each have their own count, so comparing two shapes (causal and not) shows
whether the time went to the steps or to the tiles.

    python3 bench/ncu_stalls.py ncu_sass.csv "sm90::fwd_kernel" [--top 20]
"""
import argparse
import collections
import csv


def load(path, kernel):
    rows, name, header = [], None, None
    with open(path) as f:
        for rec in csv.reader(f):
            if not rec:
                continue
            if rec[0] == "Kernel Name":
                name, header = rec[1], None
            elif rec[0] == "Address":
                header = rec
            elif name and kernel in name and header:
                rows.append(dict(zip(header, rec)))
    return rows


def num(x):
    try:
        return float(x)
    except ValueError:
        return 0.0


def reasons(row):
    return collections.Counter({k[6:]: num(v) for k, v in row.items() if k.startswith("stall_") and "(Not" not in k})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("kernel", help="substring of the kernel's name")
    ap.add_argument("--top", type=int, default=12, help="instructions listed per class")
    args = ap.parse_args()
    rows = load(args.csv, args.kernel)
    if not rows:
        raise SystemExit(f"no kernel matching {args.kernel!r} in {args.csv}")
    total = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in rows)
    classes = collections.defaultdict(list)
    for r in rows:
        classes[int(num(r["Instructions Executed"]))].append(r)
    print(f"{len(rows)} instructions, {total:.0f} stall samples")
    ranked = sorted(classes.items(), key=lambda kv: -sum(num(r["Warp Stall Sampling (All Samples)"]) for r in kv[1]))
    for count, members in ranked[:6]:
        samples = sum(num(r["Warp Stall Sampling (All Samples)"]) for r in members)
        why = sum((reasons(r) for r in members), collections.Counter())
        print(f"\nexecuted {count} times: {len(members)} instructions, {samples:.0f} samples "
              f"({100 * samples / total:.1f} %, {samples / max(count, 1):.4f} per execution); "
              + ", ".join(f"{k} {v:.0f}" for k, v in why.most_common(4)))
        op = collections.Counter(r["Source"].split()[1 if r["Source"].strip().startswith("@") else 0].split(".")[0]
                                 for r in members)
        print("  opcodes: " + ", ".join(f"{k} {v}" for k, v in op.most_common(10)))
        base = int(rows[0]["Address"], 16)
        for r in sorted(members, key=lambda r: -num(r["Warp Stall Sampling (All Samples)"]))[:args.top]:
            top = reasons(r).most_common(1)
            print(f"  {int(r['Address'], 16) - base:6x} {num(r['Warp Stall Sampling (All Samples)']):7.0f}  "
                  f"{r['Source'].strip()[:64]:64s} {top[0][0] if top else ''}")


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Profiles the library's attention kernels with Nsight Compute on the GPU machine, one kernel at a time:
#   bash kernels/dev/ncu.sh OUTDIR KERNEL_REGEX "B S" ["B S" …]
# Builds the lab (kernels/dev/lab.sh, LAB_NORUN=1), runs `attention_lab profile B S` (fp16, 16 heads of
# 64, dropout 0.1, deterministic backward) under ncu for the first launch whose name matches KERNEL_REGEX,
# and writes OUTDIR/ncu-B-S.txt: the speed-of-light, occupancy, scheduler, warp-state and memory
# sections, the stall samples of the whole kernel by reason, then the 40 SASS instructions with the most
# stall samples.
# ncu runs with --clock-control none (the device's own clocks, as the timings elsewhere).
# LAB_BIN=PATH profiles an attention_lab already built (by lab.sh in the same call) instead of building one.
# LAB_ARGS="p0 version NAME" is appended to `attention_lab profile B S`; NCU_SKIP=N skips the first N
# matching launches (a forward version's launch is the third forward: NCU_SKIP=2, after the setup's and
# the production one; a backward version's the second: NCU_SKIP=1); NCU_TAG names the output
# (OUTDIR/ncu-B-S-TAG.txt). Every report also lists the pipes' utilisation (the raw metrics).
set -u -o pipefail
out=${1:?OUTDIR}
regex=${2:?KERNEL_REGEX}
shift 2
mkdir -p "$out"
lab=${LAB_BIN:-}
if [ -z "$lab" ]; then
    LAB_NORUN=1 LAB_TAG=ncu bash kernels/dev/lab.sh "$out" >/dev/null || { echo "lab build failed"; exit 1; }
    lab=/tmp/dst-lab-ncu/attention_lab
fi
for shape in "$@"; do
    read -r B S <<<"$shape"
    tag=$B-$S${NCU_TAG:+-$NCU_TAG}
    rep=/tmp/ncu-$tag
    txt=$out/ncu-$tag.txt
    # shellcheck disable=SC2086  # LAB_ARGS is a word list
    ncu --clock-control none -k "regex:$regex" --launch-skip "${NCU_SKIP:-0}" --launch-count 1 --set full \
        --import-source no -f -o "$rep" "$lab" profile "$B" "$S" ${LAB_ARGS:-} >"$txt.log" 2>&1 || { cat "$txt.log"; continue; }
    {
        echo "== pipes (raw metrics) =="
        ncu -i "$rep.ncu-rep" --page raw 2>&1 | grep -E "gpu__time_duration.sum|sm__inst_executed_pipe_[a-z_]+\.avg\.pct_of_peak_sustained_active|sm__pipe_[a-z_]+_cycles_active\.avg\.pct_of_peak_sustained_active|sm__instruction_throughput.avg.pct|smsp__issue_active.avg.pct" | sed 's/  */ /g'
        ncu -i "$rep.ncu-rep" --page details --section SpeedOfLight --section Occupancy --section LaunchStats \
            --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis \
            --section ComputeWorkloadAnalysis 2>&1
        echo "== hottest SASS (stall samples) =="
        ncu -i "$rep.ncu-rep" --page source --csv --print-source sass 2>&1 | python3 -c '
import csv, sys
rows = list(csv.reader(sys.stdin))
head = next((i for i, r in enumerate(rows) if "Source" in r), None)
if head is None:
    print("\n".join(",".join(r) for r in rows[:20])); sys.exit()
h = rows[head]
col = next((i for i, n in enumerate(h) if n.startswith("Warp Stall Sampling (All")), None)
src = h.index("Source")
stall_cols = [i for i, n in enumerate(h) if n.startswith("stall_") or "Stall" in n and i != col]
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return 0.0
body = [r for r in rows[head + 1:] if len(r) == len(h)]
total = sum(num(r[col]) for r in body) or 1.0
sums = {h[i]: sum(num(r[i]) for r in body) for i in stall_cols if "Not Issued" in h[i]}
tot = sum(sums.values()) or 1.0
print("stall samples by reason (not issued, whole kernel):",
      ", ".join("%s %.1f%%" % (k.replace(" (Not Issued)", ""), 100 * v / tot)
                for k, v in sorted(sums.items(), key=lambda kv: -kv[1]) if v > 0))
for r in sorted(body, key=lambda r: -num(r[col]))[:40]:
    print("%6.2f%%  %s" % (100 * num(r[col]) / total, r[src]))
'
    } >"$txt" 2>&1
done

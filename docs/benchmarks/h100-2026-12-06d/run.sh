#!/bin/bash
# One device call (2026-12-06d): checks, the decode sweep (DECODE_S 0: none), bench runs of several families, then
# rank-sweep families, each cut to what is left of LIMIT_S; results tarred to $OUT/r.tgz after each step, so a call cut
# off still returns what it made. Usage: run.sh LIMIT_S TOPOLOGY DECODE_S RANK_FAMS:RANK_S MODEL:S ...
# (06c's run.sh, plus what shows where a bench run spends its time: the bench's progress lines, one per
# batch, each stamped with the time; Triton's line per autotuned kernel (TRITON_PRINT_AUTOTUNING); and at a
# time limit SIGABRT to the rank processes, 8 s before it, on which they print their stacks (PYTHONFAULTHANDLER).
# Triton's autotune results (*.autotune.json, fla caches them) come back as $OUT/autotune.tgz; a carried
# .gpu34/autotune.tgz is unpacked first (WARM=0 skips it). R, SITE, CHECK_DEV and BACKEND override
# /tmp/r, /tmp/site, cuda and nccl for a try without a GPU; CHECK_S the check's limit, 120 s: it compiles the
# window, indexer and sparse kernels; BENCH_ARGS more bench options, e.g. "--timing host-ahead".)
LIMIT=$1; TOPO=$2; DEC=$3; RANK=$4; shift 4
R=${R:-/tmp/r}; SITE=${SITE:-/tmp/site}; mkdir -p $R
W=$PWD/.gpu34
export PYTHONPATH=$SITE:$W/src TRITON_CACHE_DIR=/tmp/triton NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TRITON_PRINT_AUTOTUNING=1 PYTHONFAULTHANDLER=1 TZ=UTC
pack() {
  tar czf $OUT/r.tgz -C $(dirname $R) $(basename $R)
  [ -d /tmp/triton ] && (cd /tmp && find triton -name '*.autotune.json' | tar czf $OUT/autotune.tgz -T -)
}
stamp() { while IFS= read -r l; do printf '%(%H:%M:%S)T %s\n' -1 "$l"; done; }
stacks() {  # PID S: after S seconds the bench's rank processes (spawned under PID's python) print their stacks
  sleep $2; local c
  for c in $(pgrep -P "$(pgrep -d, -P $1)" -f spawn_main); do echo "== SIGABRT to rank process $c (stacks in the log)"; kill -ABRT $c; done
}
smi() { command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=$Q --format=$1; }
T0=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
cap() { local w=$1 l=$(( $(left) - $2 )); [ $l -lt $w ] && w=$l; echo $w; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE $W/whl/*.whl 2>&1 | tail -2
[ "${WARM:-1}" = 1 ] && [ -f $W/autotune.tgz ] && tar xzf $W/autotune.tgz -C /tmp && echo "autotune cache: $(find /tmp/triton -name '*.autotune.json' | wc -l) carried"
cd $W/src  # python -m puts the current folder first: this tree's tpplan, not the checkout's
Q=name,uuid,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,memory.total,driver_version
date -u +%FT%TZ > $R/date.txt
smi csv > $R/smi-start.csv; cat $R/smi-start.csv
python3 -c "import torch, tpplan.bench.rank_sweep as d; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu', d.__file__)"
python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -1
timeout ${CHECK_S:-120} python3 $W/gpu_check.py ${CHECK_DEV:-cuda} 2>&1 | tee $R/check.txt
pack
if [ "$DEC" -gt 0 ]; then
  d=$(cap $DEC $(( ${RANK##*:} + 30 )))
  echo "== decode sweep ($d s) at $(( $(date +%s) - T0 )) s"
  timeout $(( d + 30 )) python3 -m tpplan.bench.decode_sweep $R/decode-sweep.json $d 2>&1 | tee $R/decode.log | tail -6
  smi csv,noheader >> $R/smi-after-decode.csv
  pack
fi
for spec in "$@"; do
  m=${spec%%:*}; lim=$(cap ${spec##*:} $(( ${RANK##*:} + 30 )))
  [ $lim -lt 20 ] && { echo "== $m skipped: $(left) s left"; continue; }
  echo "== $m ($lim s) at $(( $(date +%s) - T0 )) s"
  timeout -k 10 $lim python3 -m tpplan bench --model $m --plan baseline --workload seed-c8 --nproc 1 --backend ${BACKEND:-nccl} --iters 1 --warmup 2 --overhead --topology $TOPO --progress $BENCH_ARGS --out $R/$m.json --md $R/$m.md > >(stamp > $R/$m.log) 2>&1 &
  p=$!; stacks $p $(( lim - 8 )) & w=$!
  wait $p; rc=$?; kill $w 2>/dev/null; sleep 1
  echo "rc=$rc"; grep -v "autotuning for function" $R/$m.log | tail -3
  smi csv,noheader >> $R/smi-after-bench.csv
  pack
done
r=$(cap ${RANK##*:} 20)
echo "== rank sweep ${RANK%%:*} ($r s) at $(( $(date +%s) - T0 )) s"
[ $r -gt 10 ] && timeout $(( r + 15 )) python3 -m tpplan.bench.rank_sweep $R/rank-sweep.json $r ${RANK%%:*} 2>&1 | tee $R/rank.log | tail -6
smi csv > $R/smi-end.csv; cat $R/smi-end.csv
echo "total $(( $(date +%s) - T0 )) s"
pack

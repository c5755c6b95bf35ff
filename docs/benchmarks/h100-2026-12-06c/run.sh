#!/bin/bash
# One device call (2026-12-06c): checks, bench runs of several families, the decode sweep, then rank-sweep
# families, each cut to what is left of LIMIT_S. Usage: run.sh LIMIT_S TOPOLOGY DECODE_S RANK_FAMS:RANK_S MODEL:S ...
LIMIT=$1; TOPO=$2; DEC=$3; RANK=$4; shift 4
R=/tmp/r; mkdir -p $R
W=$PWD/.gpu34
export PYTHONPATH=/tmp/site:$W/src TRITON_CACHE_DIR=/tmp/triton NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
pack() { tar czf $OUT/r.tgz -C /tmp r; }
T0=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
cap() { local w=$1 l=$(( $(left) - $2 )); [ $l -lt $w ] && w=$l; echo $w; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $W/whl/*.whl 2>&1 | tail -2
cd $W/src  # python -m puts the current folder first: this tree's tpplan, not the checkout's
Q=name,uuid,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,memory.total,driver_version
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=$Q --format=csv > $R/smi-start.csv; cat $R/smi-start.csv
python3 -c "import torch, fla, tpplan.bench.rank_sweep as d; print('torch', torch.__version__, 'fla', fla.__version__, torch.cuda.get_device_name(), d.__file__)"
timeout 60 python3 $W/gpu_check.py cuda 2>&1 | tee $R/check.txt
pack
for spec in "$@"; do
  m=${spec%%:*}; lim=$(cap ${spec##*:} $(( DEC + ${RANK##*:} + 30 )))
  [ $lim -lt 20 ] && { echo "== $m skipped: $(left) s left"; continue; }
  echo "== $m ($lim s) at $(( $(date +%s) - T0 )) s"
  timeout $lim python3 -m tpplan bench --model $m --plan baseline --workload seed-c8 --nproc 1 --backend nccl --iters 1 --warmup 2 --overhead --topology $TOPO --no-progress --out $R/$m.json --md $R/$m.md > $R/$m.log 2>&1
  echo "rc=$?"; tail -2 $R/$m.log
  nvidia-smi --query-gpu=$Q --format=csv,noheader >> $R/smi-after-bench.csv
  pack
done
if [ "$DEC" -gt 0 ]; then
  d=$(cap $DEC $(( ${RANK##*:} + 25 )))
  echo "== decode sweep ($d s) at $(( $(date +%s) - T0 )) s"
  timeout $(( d + 30 )) python3 -m tpplan.bench.decode_sweep $R/decode-sweep.json $d 2>&1 | tee $R/decode.log | tail -6
  pack
fi
r=$(cap ${RANK##*:} 20)
echo "== rank sweep ${RANK%%:*} ($r s) at $(( $(date +%s) - T0 )) s"
[ $r -gt 10 ] && timeout $(( r + 15 )) python3 -m tpplan.bench.rank_sweep $R/rank-sweep.json $r ${RANK%%:*} 2>&1 | tee $R/rank.log | tail -6
nvidia-smi --query-gpu=$Q --format=csv > $R/smi-end.csv; cat $R/smi-end.csv
echo "total $(( $(date +%s) - T0 )) s"
pack

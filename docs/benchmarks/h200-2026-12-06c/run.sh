#!/bin/bash
# One device call (2026-12-06c, the H200 try): checks, the decode sweep first (issue 32), then bench runs of the
# given models (issue 34) in what is left of LIMIT_S. Results tarred to $OUT after each step, so a cut-off call still
# returns data. Usage: run.sh LIMIT_S TOPOLOGY DECODE_S MODEL ...   (R and SITE override /tmp/r and /tmp/site)
LIMIT=$1; TOPO=$2; DEC=$3; shift 3
R=${R:-/tmp/r}; SITE=${SITE:-/tmp/site}; mkdir -p $R
W=$PWD/.gpu34
export PYTHONPATH=$SITE:$W/src TRITON_CACHE_DIR=/tmp/triton NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
pack() { tar czf $OUT/r.tgz -C $(dirname $R) $(basename $R); }
T0=$(date +%s)
left() { echo $(( LIMIT - ($(date +%s) - T0) )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target $SITE $W/whl/*.whl 2>&1 | tail -2
cd $W/src  # python -m puts the current folder first: this tree's tpplan, not the checkout's
Q=name,uuid,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,memory.total,driver_version
date -u +%FT%TZ > $R/date.txt
nvidia-smi --query-gpu=$Q --format=csv > $R/smi-start.csv; cat $R/smi-start.csv
python3 -c "import torch, fla, tpplan.bench.decode_sweep as d; print('torch', torch.__version__, 'fla', fla.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu', d.__file__)"
timeout 45 python3 $W/gpu_check.py ${CHECK_DEV:-cuda} 2>&1 | tee $R/check.txt
pack
echo "== decode sweep ($DEC s) at $(( $(date +%s) - T0 )) s"
timeout $(( DEC + 25 )) python3 -m tpplan.bench.decode_sweep $R/decode-sweep.json $DEC 2>&1 | tee $R/decode.log | tail -6
nvidia-smi --query-gpu=$Q --format=csv,noheader >> $R/smi-after-decode.csv
pack
for m in "$@"; do
  lim=$(( $(left) - 8 ))
  [ $lim -lt 20 ] && { echo "== $m skipped: $(left) s left"; continue; }
  echo "== $m ($lim s) at $(( $(date +%s) - T0 )) s"
  timeout $lim python3 -m tpplan bench --model $m --plan baseline --workload seed-c8 --nproc 1 --backend nccl --iters 1 --warmup 2 --overhead --topology $TOPO --no-progress --out $R/$m.json --md $R/$m.md > $R/$m.log 2>&1
  echo "rc=$?"; tail -2 $R/$m.log
  nvidia-smi --query-gpu=$Q --format=csv,noheader >> $R/smi-after-bench.csv
  pack
done
nvidia-smi --query-gpu=$Q --format=csv > $R/smi-end.csv; cat $R/smi-end.csv
echo "total $(( $(date +%s) - T0 )) s"
pack

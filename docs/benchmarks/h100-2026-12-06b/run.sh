#!/bin/bash
# One device call: checks, bench runs of several families, the decode sweep. Usage: run.sh TOPOLOGY DECODE_S MODELS...
TOPO=$1; DEC=$2; shift 2
R=/tmp/r; mkdir -p $R
W=$PWD/.gpu34
export PYTHONPATH=/tmp/site:$W/src TRITON_CACHE_DIR=/tmp/triton NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
pack() { tar czf $OUT/r.tgz -C /tmp r; }
T0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $W/whl/*.whl 2>&1 | tail -2
cd $W/src  # python -m puts the current folder first: this tree's tpplan, not the checkout's
Q=name,uuid,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,memory.total,driver_version
nvidia-smi --query-gpu=$Q --format=csv > $R/smi-start.csv; cat $R/smi-start.csv
python3 -c "import torch, fla, tpplan.bench.decode_sweep as d; print('torch', torch.__version__, 'fla', fla.__version__, torch.cuda.get_device_name(), d.__file__)"
timeout 60 python3 $W/gpu_check.py cuda 2>&1 | tee $R/check.txt
pack
for spec in "$@"; do
  m=${spec%%:*}; lim=${spec##*:}
  echo "== $m ($lim s) at $(( $(date +%s) - T0 )) s"
  timeout $lim python3 -m tpplan bench --model $m --plan baseline --workload seed-c8 --nproc 1 --backend nccl --iters 1 --warmup 2 --overhead --topology $TOPO --no-progress --out $R/$m.json --md $R/$m.md > $R/$m.log 2>&1
  echo "rc=$?"; tail -4 $R/$m.log
  nvidia-smi --query-gpu=$Q --format=csv,noheader >> $R/smi-after-bench.csv
  pack
done
echo "== decode sweep ($DEC s) at $(( $(date +%s) - T0 )) s"
timeout $(( DEC + 40 )) python3 -m tpplan.bench.decode_sweep $R/decode-sweep.json $DEC 2>&1 | tee $R/decode.log | tail -8
nvidia-smi --query-gpu=$Q --format=csv > $R/smi-end.csv; cat $R/smi-end.csv
echo "total $(( $(date +%s) - T0 )) s"
pack

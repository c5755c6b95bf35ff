#!/bin/bash
# Device call E (2026-12-06e, issue 34): the engines' own kernels (vLLM 0.34.0's FA3, sgl-flash-mla 1.0.0's FlashMLA)
# unpacked from the carried .gpu34/engk/ to $ENG and given to tpplan by TPPLAN_ENGINE_KERNELS; then the GPU check
# (gpu_check.py beside this file: each engine kernel loaded / refused / its error against the fp32 reference), the
# rank sweep of the families that use them (masked: FA3; sparse: FlashMLA's sparse prefill), the decode sweep's
# MLA family (FlashMLA's decode), then one bench run per model; results tarred to $OUT/r.tgz after each step, so a
# call cut off still returns what it made. 06d's run.sh otherwise (progress lines stamped, Triton's autotune lines,
# SIGABRT stacks 8 s before a bench's limit, the autotune cache carried and returned).
# Usage: run.sh LIMIT_S TOPOLOGY RANK_FAMS:RANK_S DECODE_FAMS:DECODE_S MODEL:S ...
#   e.g. bash docs/benchmarks/h100-2026-12-06e/run.sh 570 h100x8-ib400 masked,sparse:150 decode_mla:60 \
#          gpt-oss-120b:100 gemma-3-4b-it:80 deepseek-v3.2:130
# A second call for the benches alone: CHECK_S=0 bash ... LIMIT TOPO none:0 none:0 MODEL:S ... (a family
# spec with 0 s, and CHECK_S=0, skip that step).
# Carried (git-ignored): .gpu34/whl/*.whl (fla ...), .gpu34/autotune.tgz, .gpu34/engk/ = _vllm_fa3_C.abi3.so.xz,
# vllm_flash_attn/{__init__,flash_attn_interface}.py (reference only), sgl_flash_mla-1.0.0-*.whl.
# The tpplan that runs is the checkout's ($PWD, i.e. main: SRC overrides, e.g. SRC=$PWD/.gpu34/src as 06d).
# A try without a GPU: R=/tmp/r SITE=/tmp/site ENG=/tmp/engk CHECK_DEV=cpu BACKEND=gloo OVERHEAD= bash ... (every engine line
# then says "refused (no CUDA device ...)", the sweeps run on the CPU's tiny path only where DEVICE allows).
LIMIT=$1; TOPO=$2; RANK=$3; DEC=$4; shift 4
R=${R:-/tmp/r}; SITE=${SITE:-/tmp/site}; ENG=${ENG:-/tmp/engk}; mkdir -p $R $ENG/vllm_flash_attn
W=$PWD/.gpu34; G=$(cd "$(dirname "$0")" && pwd); SRC=${SRC:-$PWD}
export PYTHONPATH=$SITE:$SRC TRITON_CACHE_DIR=/tmp/triton NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
export TRITON_PRINT_AUTOTUNING=1 PYTHONFAULTHANDLER=1 TZ=UTC TPPLAN_ENGINE_KERNELS=$ENG
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
# The engine kernels: FA3's .so from its xz (python's lzma: no xz binary needed), FlashMLA's wheel unzipped (a wheel
# is a zip; its package loads its own two .so files with torch.ops.load_library; --no-deps: it pins torch 2.14).
python3 - "$W/engk" "$ENG" <<'PY' 2>&1 | tee $R/engk-unpack.txt
import glob, lzma, shutil, sys, zipfile
src, eng = sys.argv[1:3]
for f in glob.glob(f"{src}/vllm_flash_attn/*.py"):
    shutil.copy(f, f"{eng}/vllm_flash_attn/")
for f in glob.glob(f"{src}/*.so.xz"):
    with lzma.open(f) as a, open(f"{eng}/vllm_flash_attn/" + f.split("/")[-1][:-3], "wb") as b:
        shutil.copyfileobj(a, b)
for f in glob.glob(f"{src}/*.whl"):
    zipfile.ZipFile(f).extractall(eng)
print("engine kernels unpacked:", sorted(glob.glob(f"{eng}/*/*.so")))
PY
[ "${WARM:-1}" = 1 ] && [ -f $W/autotune.tgz ] && tar xzf $W/autotune.tgz -C /tmp && echo "autotune cache: $(find /tmp/triton -name '*.autotune.json' | wc -l) carried"
cd $SRC  # python -m puts the current folder first: this tree's tpplan
Q=name,uuid,clocks.sm,clocks.max.sm,clocks.mem,power.draw,power.limit,temperature.gpu,memory.total,driver_version
date -u +%FT%TZ > $R/date.txt
smi csv > $R/smi-start.csv; cat $R/smi-start.csv
python3 -c "import torch, tpplan.bench.engine_kernels as e; print('torch', torch.__version__, torch.cuda.get_device_name() if torch.cuda.is_available() else 'cpu', e.__file__)"
python3 -c "import fla; print('fla', fla.__version__)" 2>&1 | tail -1
[ "${CHECK_S:-150}" -gt 0 ] && timeout ${CHECK_S:-150} python3 $G/gpu_check.py ${CHECK_DEV:-cuda} 2>&1 | tee $R/check.txt
pack
r=$(cap ${RANK##*:} 30)
echo "== rank sweep ${RANK%%:*} ($r s) at $(( $(date +%s) - T0 )) s"
[ $r -gt 10 ] && timeout $(( r + 15 )) python3 -m tpplan.bench.rank_sweep $R/rank-sweep.json $r ${RANK%%:*} 2>&1 | tee $R/rank.log | tail -6
pack
d=$(cap ${DEC##*:} 30)
echo "== decode sweep ${DEC%%:*} ($d s) at $(( $(date +%s) - T0 )) s"
[ $d -gt 10 ] && timeout $(( d + 15 )) python3 -m tpplan.bench.decode_sweep $R/decode-sweep.json $d ${DEC%%:*} 2>&1 | tee $R/decode.log | tail -6
smi csv,noheader >> $R/smi-after-sweeps.csv
pack
for spec in "$@"; do
  m=${spec%%:*}; lim=$(cap ${spec##*:} 10)
  [ $lim -lt 20 ] && { echo "== $m skipped: $(left) s left"; continue; }
  echo "== $m ($lim s) at $(( $(date +%s) - T0 )) s"
  timeout -k 10 $lim python3 -m tpplan bench --model $m --plan baseline --workload seed-c8 --nproc 1 --backend ${BACKEND:-nccl} --iters 1 --warmup 2 ${OVERHEAD---overhead} --topology $TOPO --progress $BENCH_ARGS --out $R/$m.json --md $R/$m.md > >(stamp > $R/$m.log) 2>&1 &
  p=$!; stacks $p $(( lim - 8 )) & w=$!
  wait $p; rc=$?; kill $w 2>/dev/null; sleep 1
  echo "rc=$rc"; grep -v "autotuning for function" $R/$m.log | tail -3
  smi csv,noheader >> $R/smi-after-bench.csv
  pack
done
smi csv > $R/smi-end.csv; cat $R/smi-end.csv
echo "total $(( $(date +%s) - T0 )) s"
pack

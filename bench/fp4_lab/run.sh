#!/bin/bash
cd "$(dirname "$0")"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
timeout 200 ./lab > $OUT/lab.log 2>&1; rc=$?; echo "lab rc $rc"
if [ $rc = 126 -o $rc = 127 ]; then
  echo "rebuilding there (rc $rc)"
  nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -Isrc bench/fp4_lab/lab.cu src/cuda/gemv.cu src/cuda/runtime.cu -o lab && timeout 200 ./lab > $OUT/lab.log 2>&1
fi
timeout 100 ncu --clock-control none --kernel-name regex:"gemv_kernel|fp4_stream" --section SpeedOfLight --section Occupancy --section SchedulerStats --section WarpStateStats --section LaunchStats ./lab profile > $OUT/ncu.txt 2>&1; echo "ncu rc $?"
grep -E "copy D2D|correctness|FAIL|skipped" $OUT/lab.log | head; grep -E "^(tile|stream)" $OUT/lab.log | grep -v skipped | sort -k7 -n -r | awk '{print}' | head -0
grep -E "^(tile w2|stream default)" $OUT/lab.log; tail -3 $OUT/lab.log
grep -E "gemv_kernel|fp4_stream|Duration|DRAM Throughput|Registers Per|Achieved Occupancy|Issued Warp|No Eligible|Theoretical Occ" $OUT/ncu.txt | cut -c1-150

root=$(pwd); source scripts/gpu_install.sh; source scripts/gpu_env.sh
export PYTHONPATH="$root/.gpu/pkgs${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_INTERPRET=0
mkdir -p $OUT; cp .gpu/COMMIT $OUT/; (nvidia-smi -L; lscpu | grep -m1 "Model name"; nproc; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)") > $OUT/env.txt 2>&1
cd $OUT; s=$SECONDS
echo "== gpu tests"; timeout 150 python3 -m pytest -q -m gpu $root/tests/ops/test_packed_attention.py $root/tests/ops/test_attention_aoti.py $root/tests/ops/test_sm90_compile.py -p no:cacheprovider --rootdir $root > gpu_tests.log 2>&1; echo "rc $? at $((SECONDS-s))s"; tail -5 gpu_tests.log
( timeout 260 taskset -c 0-7 python3 -m pytest -q -m gpu $root/tests/compile/test_constrained_graphs.py -p no:cacheprovider --rootdir $root > cgraph_test.log 2>&1; echo "cgraph rc $?" >> cgraph_test.log ) &
echo "== sweep"; timeout 200 taskset -c 8-15 python3 -m boundgen.bench.kernels --packed-sweep stacked --markdown packed_stacked.md > sweep.log 2>&1; echo "rc $? at $((SECONDS-s))s"; tail -45 sweep.log
echo "== floor"; timeout 60 taskset -c 8 python3 -m boundgen.bench.grpc_floor --server-cores 9-15 > floor.log 2>&1; echo "rc $?"; cat floor.log
echo "== pre"; for t in 1 4; do timeout 50 taskset -c 8-15 python3 -m boundgen.bench.pre --threads $t --rounds 10 --concurrency 1 4 --json pre_t$t.json > pre_t$t.log 2>&1; echo "rc $?"; grep -E "^## |emptied|^\| pre \||^\| 1 thread \|" pre_t$t.log; done
wait; echo "== constrained graphs test at $((SECONDS-s))s"; tail -15 cgraph_test.log

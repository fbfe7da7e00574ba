set -u
mkdir -p /tmp/at && tar xf .gpu-carry/v0.1.7.post2.tar.xz -C /tmp/at
export TEALITE_AITER_PATH=/tmp/at/v0.1.7.post2 PYTHONPATH=$PWD
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $OUT/gpu.txt
python3 -c "import torch, triton; print(torch.__version__, triton.__version__)" >> $OUT/gpu.txt
MAX_MINUTES=${MINUTES:-9} PYTHON=python3 ci/false_alarm_campaign.sh cuda ${CASES:-1000000} ${SEED:-101} /tmp/gpu-run > $OUT/campaign.out 2>&1
echo "rc=$?" >> $OUT/campaign.out
tar czf $OUT/gpu-run.tgz -C /tmp gpu-run

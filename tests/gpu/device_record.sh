#!/bin/sh
# Run on the lent GPU (device tool): record pd_nvml_facts' JSON and nvidia-smi's view beside it, then run
# the gpu-marked tests. Usage: sh tests/gpu/device_record.sh "$OUT"
out="${1:?output directory}"
export PYTHONPATH="$PWD/src"
python3 -m pd_appliance.gpu >"$out/nvml_facts.json" 2>"$out/nvml_facts.stderr"
echo "pd_nvml_facts rc=$?"
nvidia-smi --query-gpu=index,uuid,name,compute_cap,memory.total,pci.bus_id,pcie.link.gen.max,pcie.link.width.current,persistence_mode,driver_version --format=csv >"$out/nvidia_smi.csv" 2>&1
nvidia-smi topo -m >"$out/nvidia_smi_topo.txt" 2>&1
python3 tests/gpu/record_raw_nvml.py >"$out/nvml_raw.json" 2>"$out/nvml_raw.stderr"; echo "raw rc=$?"
for d in /sys/bus/pci/devices/*; do
  [ "$(cat "$d/vendor")" = 0x10de ] && echo "$(basename "$d") class=$(cat "$d/class") device=$(cat "$d/device") numa=$(cat "$d/numa_node") cpus=$(cat "$d/local_cpulist")"
done >"$out/sysfs_nvidia.txt" 2>&1
cat /sys/module/nvidia/version >>"$out/sysfs_nvidia.txt" 2>&1
python3 -c "import pynvml,sys; print(pynvml.__file__, sys.version)" >>"$out/sysfs_nvidia.txt" 2>&1
python3 -m pytest -m gpu tests/gpu -p no:cacheprovider -o addopts="" -q 2>&1 | tail -20
